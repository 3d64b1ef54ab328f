"""The corpus's documents tokenized in batches of bounded text, the third step of the data (documents, tokenizer,
token batches, blocks): ``BATCH_CHARS`` characters at a time go to the tokenizer, in this process or in
``--data-workers`` processes of one tokenizer thread each, and come back in corpus order as flat int32 arrays with
each document's token count. Memory holds a few batches, whatever the size of the corpus or of its documents.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import multiprocessing
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..._plumbing.children import environment_set
from .corpus import Corpus

BATCH_CHARS = 1 << 20  # the text of one tokenizer call
ENCODE_PIECE_CHARS = 2_000  # the pieces of a document the tokenizer takes, where that is exact (piece_cuts)


def end_of_text(tokenizer: Any) -> list[int]:
    """The separator after each document: the end-of-text token (none for a tokenizer without one)."""
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def text_batches(documents: Iterable[str]) -> Iterator[list[str]]:
    """Documents in order, in batches of ``BATCH_CHARS`` characters (and at most one document more): what one call
    of the tokenizer takes, so that its encodings (about 40 times the text in memory) stay small whatever the corpus
    and its documents."""
    batch: list[str] = []
    size = 0
    for doc in documents:
        batch.append(doc)
        size += len(doc)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def piece_cuts(backend: Any) -> re.Pattern | None:
    """Where a ``tokenizers`` tokenizer can take a document in pieces and give the very tokens of the whole: before
    an ASCII space or line end that an ASCII letter, digit or punctuation mark follows (one that starts no added
    token), for a byte-level tokenizer with GPT-2's split pattern (the one trained on the fly, GPT-2's own): no
    normalizer, no prefix space, no truncation or padding, added tokens without whitespace or stripping. None for
    any other.

    Why it is exact: the pattern ends a piece before the last character of a whitespace run that a non-space
    character follows (a last space joins the next word, a last line end is a piece of its own), matching resumes
    there as at the start of a text (the pattern looks only ahead), and the run's earlier whitespace ends the first
    part as one piece either way; added tokens are found first, and none can start at the character after the cut.
    Pieces matter because the tokenizer's time per character grows with the length of its input."""
    from tokenizers import pre_tokenizers

    split = backend.pre_tokenizer
    if not (isinstance(split, pre_tokenizers.ByteLevel) and split.use_regex and not split.add_prefix_space):
        return None
    if backend.normalizer is not None or backend.truncation is not None or backend.padding is not None:
        return None
    added = list(backend.get_added_tokens_decoder().values())
    if any(t.lstrip or t.rstrip or t.single_word or not t.content or any(map(str.isspace, t.content)) for t in added):
        return None
    starts = {t.content[0] for t in added}
    following = "".join(re.escape(chr(code)) for code in range(0x21, 0x7F) if chr(code) not in starts)
    return re.compile(f"[ \\n](?=[{following}])")


def _pieces(text: str, cuts: re.Pattern) -> list[str]:
    """``text`` cut at the first place ``cuts`` allows once a piece holds ``ENCODE_PIECE_CHARS`` characters."""
    pieces, start = [], 0
    while len(text) - start > ENCODE_PIECE_CHARS:
        found = cuts.search(text, start + ENCODE_PIECE_CHARS)
        if found is None:
            break
        pieces.append(text[start : found.start()])
        start = found.start()
    pieces.append(text[start:])
    return pieces


def encode_documents(texts: list[str], tokenizer: Any, eos: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The token ids of a batch of documents, each followed by ``eos``, as one flat int32 array (no Python list per
    token to keep), and each document's token count (its ``eos`` included). A document goes to the tokenizer in
    pieces where that gives its very tokens (``piece_cuts``), else whole."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        parts, counts = tokenizer(texts, add_special_tokens=False)["input_ids"], [1] * len(texts)
    else:
        cuts = piece_cuts(backend)
        pieces = [_pieces(text, cuts) if cuts else [text] for text in texts]
        flat_pieces = [piece for doc in pieces for piece in doc]
        encodings = backend.encode_batch_fast(flat_pieces, add_special_tokens=False)  # no offsets: a fifth faster
        parts = [encoding.ids for encoding in encodings]
        counts = [len(doc) for doc in pieces]
    sequence, first = [], 0  # each document's parts, then its separator
    for count in counts:
        sequence += parts[first : first + count]
        sequence.append(eos)
        first += count
    sizes = np.fromiter(map(len, sequence), np.int64, len(sequence))
    lengths = np.add.reduceat(sizes, np.cumsum([0, *counts[:-1]]) + np.arange(len(counts)))
    return np.fromiter(itertools.chain.from_iterable(sequence), np.int32, sizes.sum()), lengths


_WORKER: dict[str, Any] = {}  # a tokenizing process's tokenizer and separator (``_tokenizer_pool``)


def _start_worker(tokenizer: Any, eos: list[int]) -> None:
    _WORKER.update(tokenizer=tokenizer, eos=eos)


def _encode_in_worker(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return encode_documents(texts, _WORKER["tokenizer"], _WORKER["eos"])


@contextlib.contextmanager
def _tokenizer_pool(tokenizer: Any, eos: list[int], workers: int) -> Iterator[Any]:
    """``workers`` processes of one tokenizer thread each (``TOKENIZERS_PARALLELISM=false``, which also spares the
    tokenizers' warning about a fork after their threads ran), forked on Linux: nothing to import or copy.

    The workers are forked with SIGTERM's default action, not the process's raising handler (``terminate_raises``,
    there for folders a worker never writes), and a block that ends well ends them by their queue (close, join),
    not by ``Pool.terminate``'s SIGTERM: a worker that SIGTERM reached while it started could swallow the raise and
    wait for tasks for ever, and the pool's join with it (seen in CI)."""
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    in_main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if in_main else None
    if handler is not None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with environment_set({"TOKENIZERS_PARALLELISM": "false"}):
            pool = multiprocessing.get_context(method).Pool(workers, _start_worker, (tokenizer, eos))
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)
    try:
        yield pool
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()


@contextlib.contextmanager
def stage_clock(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Add the time the block takes to ``seconds[stage]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] += time.perf_counter() - start


def _timed(items: Iterator[Any], seconds: dict[str, float], stage: str) -> Iterator[Any]:
    """``items``, with the time spent producing them added to ``seconds[stage]``."""
    while True:
        with stage_clock(seconds, stage):
            item = next(items, None)
        if item is None:
            return
        yield item


def encoded_batches(
    corpus: Corpus, tokenizer: Any, workers: int, seconds: dict[str, float]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The corpus's batches of documents tokenized (``encode_documents``), in order: here, or by ``workers``
    processes with at most two batches each under way, so that memory holds a few batches whatever the corpus.
    ``seconds`` gets the time spent reading the documents and tokenizing (or waiting for the processes)."""
    eos = end_of_text(tokenizer)
    batches = _timed(text_batches(corpus.all_documents()), seconds, "read")
    if workers == 1:
        for texts in batches:
            with stage_clock(seconds, "tokenize"):
                encoded = encode_documents(texts, tokenizer, eos)
            yield encoded
        return
    with _tokenizer_pool(tokenizer, eos, workers) as pool:
        pending: collections.deque = collections.deque()
        for texts in itertools.chain(batches, [None]):
            if texts is not None:
                pending.append(pool.apply_async(_encode_in_worker, (texts,)))
            while pending and (texts is None or len(pending) > 2 * workers):
                with stage_clock(seconds, "tokenize"):
                    encoded = pending.popleft().get()
                yield encoded
