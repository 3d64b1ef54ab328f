"""The corpora the held-out split's tests write: files of marked paragraphs, near-copies, and the hash order the
held-out rule ranks files by, shared by the split's tests and the rule's."""

from __future__ import annotations

import hashlib
import random
import re
import textwrap
from pathlib import Path

from transformers import AutoTokenizer

from hf_geonorm.training.data.pipeline import ArrowBlocks

from .helpers import STDLIB

VOCABULARY = sorted(set(re.findall(r"[a-z]{3,}", (STDLIB / "textwrap.py").read_text())))
EVAL = ["--eval-blocks", "32"]  # 2,048 tokens a split: a whole file of two pieces fits


def paragraph(marker: str, rng: random.Random) -> str:
    """A marker, then random words to a little over 1,000 characters, in lines of at most 70."""
    words = [marker]
    while sum(map(len, words)) + len(words) < 1_050:
        words.append(rng.choice(VOCABULARY))
    return textwrap.fill(" ".join(words), 70)


def file_paragraphs(number: int, count: int = 2) -> list[str]:
    rng = random.Random(number)
    return [paragraph(f"M{number:02d}{n:02d}", rng) for n in range(count)]


def write(path: Path, paragraphs: list[str]) -> None:
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")


def near_copy(paragraphs: list[str], number: int, rng: random.Random) -> list[str]:
    """The paragraphs with their markers renamed to file ``number``'s and one word in 40 replaced."""
    copied = []
    for place, text in enumerate(paragraphs):
        words = text.split()
        words[0] = f"M{number:02d}{place:02d}"
        for index in range(1, len(words), 40):
            words[index] = rng.choice(VOCABULARY)
        copied.append(textwrap.fill(" ".join(words), 70))
    return copied


def ranked(folder: Path) -> list[str]:
    """The names (without .txt) of the folder's files in the order the held-out rule deals them, written out: by
    the SHA-256 of their bytes, then their path. Validation's candidates are ranks 0, 20, ..., test's 10, 30, ...."""
    paths = sorted(folder.iterdir())
    return [path.stem for path in sorted(paths, key=lambda path: (hashlib.sha256(path.read_bytes()).hexdigest(),
                                                                  str(path)))]  # fmt: skip


def markers(run: Path, cache: Path) -> dict[str, set[str]]:
    """The markers in each split's blocks (train, val, test), decoded with the run's tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(run / "final")
    [entry] = cache.glob("blocks-*")
    found = {}
    for split in ("train", "val", "test"):
        ids = [t for view in ArrowBlocks(entry / f"{split}.arrow", 64).views for t in view.ravel().tolist()]
        found[split] = set(re.findall(r"M\d{4}", tokenizer.decode(ids)))
    return found


def files_of(found: set[str]) -> set[str]:
    return {marker[1:3] for marker in found}
