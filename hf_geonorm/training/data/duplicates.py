"""Which held-out candidates training holds anyway (``TrainingOverlap``): near-duplicates found with ``datasketch``'s
MinHash and MinHashLSH, so that validation and test do not score text the model trained on under another name (a
copied or generated file, a repeated paragraph).

- Shingles: a piece's word 5-grams (``SHINGLE_WORDS``; words are runs of non-whitespace, so code keeps its
  punctuation; a piece of fewer than 5 words is one shingle), each hashed with CRC-32, the hash MinHash permutes.
- Candidates: the held-out candidates (a few times the evaluation, ``split``) are indexed in a MinHashLSH of
  ``NUM_PERM`` = 64 permutations in ``LSH_BANDS`` = 32 bands of 2 rows, and every training piece is queried against
  it once, never compared with every candidate: a pair of Jaccard similarity 0.3 is found with probability 0.95
  (0.2: 0.73; 0.5 and more: 1.00), so a candidate whose text lies half in one training piece and half in the next
  is found through both.
- Coverage, exact: for each pair found, the candidate's shingles that the training piece holds are marked. A
  candidate is a near-duplicate when at least half of its shingles are marked (``COVERED``): most of its text is in
  training, in one piece or spread over a few.
- Cost: a training piece fewer than ``SHARED`` (5%) of whose shingles occur in any candidate is not sketched or
  queried: its Jaccard similarity with every candidate is below 0.05, where LSH would find a pair with probability
  0.08 at most. On the study corpus (100 MB of Python) that leaves a third of the pieces to sketch, and the whole
  check takes about half the time tokenizing takes.

Memory holds the candidates' shingles and sketches only, whatever the size of the training text.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

SHINGLE_WORDS = 5
NUM_PERM = 64
LSH_BANDS, LSH_ROWS = 32, 2
COVERED = 0.5
SHARED = 0.05
_SEED = 1  # datasketch's default permutations: the same sketches in every run


def shingles(text: str) -> np.ndarray:
    """The CRC-32 hashes of the word 5-grams of ``text``, sorted and unique (one shingle of all its words when it
    has fewer than ``SHINGLE_WORDS``)."""
    words = text.split()
    if len(words) < SHINGLE_WORDS:
        grams = [" ".join(words)] if words else []
    else:
        grams = map(" ".join, zip(*(words[start:] for start in range(SHINGLE_WORDS)), strict=False))
    return np.unique(np.fromiter(map(zlib.crc32, map(str.encode, grams)), dtype=np.uint32))


class TrainingOverlap:
    """The held-out candidates (``pool``: a key for each, and its text) in an LSH index; training text added
    (``add_training``) marks the candidates' shingles it holds, and ``coverage`` says which share of a candidate's
    shingles training holds."""

    def __init__(self, pool: Mapping[Any, str]) -> None:
        from datasketch import MinHash, MinHashLSH

        self._permutations = MinHash(num_perm=NUM_PERM, seed=_SEED).permutations
        self._query = self._new_sketch()  # one sketch, cleared for each training piece
        self.shingles = {key: shingles(text) for key, text in pool.items()}
        self.every = np.unique(np.concatenate([np.empty(0, dtype=np.uint32), *self.shingles.values()]))
        self.marked = {key: np.zeros(len(found), dtype=bool) for key, found in self.shingles.items()}
        self.lsh = MinHashLSH(num_perm=NUM_PERM, params=(LSH_BANDS, LSH_ROWS))
        self.sketches = {}
        for key, found in self.shingles.items():
            if len(found):
                self.sketches[key] = self._new_sketch()
                self.sketches[key].update_batch(found.tolist())
                self.lsh.insert(key, self.sketches[key])

    def _new_sketch(self) -> Any:
        """An empty MinHash of the shingles' CRC-32 hashes (``hashfunc=int``: they are hashed already)."""
        from datasketch import MinHash

        return MinHash(num_perm=NUM_PERM, hashfunc=int, permutations=self._permutations, scheme="affine32")

    def add_training(self, text: str) -> None:
        """Mark the candidates' shingles that ``text``, a training piece, holds (of the candidates LSH finds)."""
        found = shingles(text)
        if len(found) and len(self.every) and _within(found, self.every).mean() >= SHARED:
            self._query.clear()
            self._query.update_batch(found.tolist())
            for key in self.lsh.query(self._query):
                self.marked[key] |= _within(self.shingles[key], found)

    def neighbours(self, key: Any) -> list[Any]:
        """The other candidates LSH finds near candidate ``key``."""
        return [other for other in self.lsh.query(self.sketches[key]) if other != key] if key in self.sketches else []

    def coverage(self, key: Any, training: Iterable[Any] = ()) -> float:
        """The share of candidate ``key``'s shingles that training holds: the training text added, and the
        candidates ``training`` (those that train after all), where LSH finds them near it."""
        marked = self.marked[key].copy()
        others = set(training)
        for other in self.neighbours(key):
            if other in others:
                marked |= _within(self.shingles[key], self.shingles[other])
        return float(marked.mean()) if len(marked) else 0.0

    def duplicate(self, key: Any, training: Iterable[Any] = ()) -> bool:
        """Whether training holds at least ``COVERED`` of candidate ``key``'s shingles."""
        return self.coverage(key, training) >= COVERED


def _within(values: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in ``among`` (both sorted and unique)."""
    found = np.searchsorted(among, values)
    return among[np.minimum(found, len(among) - 1)] == values
