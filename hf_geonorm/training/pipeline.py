"""The data ``hf-geonorm train`` trains on: a corpus (``corpus``) tokenized once with ``datasets``
(``Dataset.map``, batched, over ``--data-workers`` processes), packed into blocks of ``--seq-len`` tokens with the
end-of-text token after every document, and cached as Arrow files under ``--data-cache``, keyed by the data (its
files' sizes and content hashes), the tokenizer (its serialized JSON) and the block length, and verified when read
(``cache_checks``). Training reads the blocks memory-mapped, so memory does not grow with the corpus.
``--streaming`` tokenizes and packs on the fly instead.

Validation and test are held out by documents, disjoint from training and from each other: validation takes
documents 0, 20, 40, ... (one in ``VAL_EVERY``, in corpus order) and test documents 10, 30, 50, ... (``test_offset``:
the middle one of a corpus of fewer than 20), each until they hold ``--eval-blocks`` blocks' worth of tokens; the first
blocks each packs into are evaluated (``evaluated_blocks``). Runs choose on validation and report on test
(``hf-geonorm sweep``). The other documents, in order, pack into the training blocks (the last partial block is
dropped).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from ..files.atomic import atomic_directory
from .cache_checks import check_cache_folder, discard, entry_problem, file_checks, storage_errors
from .corpus import FORMAT, Corpus

VAL_EVERY = 20
ROWS_PER_PASS = 10_000  # tokenized documents packed at a time


def tokenizer_digest(tokenizer: Any) -> str:
    """A hash of what the tokenizer does: its serialized JSON (a slow tokenizer: its class and vocabulary)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else type(tokenizer).__name__ + json.dumps(
        sorted(tokenizer.get_vocab().items())
    )
    return hashlib.sha256(text.encode()).hexdigest()


def end_of_text(tokenizer: Any) -> list[int]:
    """The separator after each document: the end-of-text token (none for a tokenizer without one)."""
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []


def _tokenize(batch: dict[str, list[str]], tokenizer: Any, eos: list[int]) -> pa.Table:
    """The token ids of a batch of documents, each followed by ``eos``, as an Arrow column built from one flat
    array: no Python list per document for Arrow to convert, and no attention masks."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        ids = [encoding.ids for encoding in backend.encode_batch(batch["text"], add_special_tokens=False)]
    else:
        ids = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
    offsets = np.zeros(len(ids) + 1, dtype=np.int32)
    np.cumsum([len(doc) + len(eos) for doc in ids], out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(itertools.chain(doc, eos) for doc in ids), np.int32, offsets[-1])
    return pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))})


def evaluated_blocks(count: int, limit: int) -> int:
    """How many of ``count`` validation (or test) blocks are evaluated: at most ``limit`` (``--eval-blocks``), and
    from 8 on a multiple of 8, so that the processes of a run evaluate equal shares (Trainer fills an uneven last
    batch with repeated blocks, which would weigh them twice)."""
    count = min(count, limit)
    return count - count % 8 if count >= 8 else count


def test_offset(documents: int) -> int:
    """The first test document: the 10th, or the middle one of a corpus of fewer than ``VAL_EVERY`` documents."""
    return min(VAL_EVERY // 2, documents // 2)


def holdout_masks(lengths: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Which documents are validation and which test: every ``VAL_EVERY``-th from the first (validation) and from
    ``test_offset`` (test), each while the ones before hold fewer than ``budget`` tokens."""
    masks = []
    for first in (0, test_offset(len(lengths))):
        candidates = np.arange(first, len(lengths), VAL_EVERY)
        before = np.cumsum(lengths[candidates]) - lengths[candidates]
        mask = np.zeros(len(lengths), dtype=bool)
        mask[candidates[before < budget]] = True
        masks.append(mask)
    val, test = masks
    return val, test & ~val


class _Packer:
    """Token ids in, blocks of ``seq_len`` out, written as one Arrow stream (fixed-size lists of int32)."""

    def __init__(self, path: Path, seq_len: int) -> None:
        self.seq_len, self.blocks, self.rest = seq_len, 0, np.empty(0, dtype=np.int32)
        self.type = pa.list_(pa.int32(), seq_len)
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.sink, pa.schema([("input_ids", self.type)]))

    def add(self, ids: np.ndarray) -> None:
        ids = np.concatenate([self.rest, ids]) if len(self.rest) else ids
        count = len(ids) // self.seq_len
        if count:
            blocks = pa.FixedSizeListArray.from_arrays(pa.array(ids[: count * self.seq_len], pa.int32()), self.seq_len)
            self.writer.write_batch(pa.record_batch([blocks], names=["input_ids"]))
            self.blocks += count
        self.rest = ids[count * self.seq_len :]

    def close(self) -> None:
        self.writer.close()
        self.sink.close()


def _flat_ids(rows: pa.ChunkedArray, keep: np.ndarray) -> np.ndarray:
    kept = rows.filter(pa.array(keep))
    return kept.combine_chunks().flatten().to_numpy() if len(kept) else np.empty(0, dtype=np.int32)


class TokenBlocks(Dataset):
    """Fixed-length blocks of token ids; each is its own label (the model shifts)."""

    def __init__(self, blocks: torch.Tensor) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


class ArrowBlocks(Dataset):
    """The blocks of an Arrow file, memory-mapped: each is its own label (the model shifts). ``limit``: only the
    first blocks (``--max-tokens``)."""

    def __init__(self, path: Path, seq_len: int, limit: int | None = None) -> None:
        self.table = pa.ipc.open_stream(pa.memory_map(str(path))).read_all()  # zero-copy over the mapped file
        self.views = [c.flatten().to_numpy().reshape(-1, seq_len) for c in self.table.column(0).chunks if len(c)]
        self.starts = np.cumsum([0] + [len(v) for v in self.views]).tolist()
        self.length = self.starts[-1] if limit is None else min(limit, self.starts[-1])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.length:
            raise IndexError(index)
        chunk = bisect.bisect_right(self.starts, index) - 1
        block = torch.from_numpy(self.views[chunk][index - self.starts[chunk]].astype(np.int64))
        return {"input_ids": block, "labels": block}


@dataclass
class Prepared:
    """The packed blocks of a corpus in the cache: where they are and what they hold."""

    folder: Path
    meta: dict[str, float]  # counts, and the seconds each stage of the build took
    cached: bool  # from an earlier run
    seconds: float  # to tokenize and pack (0 from the cache)

    def train(self, limit: int | None = None) -> ArrowBlocks:
        return ArrowBlocks(self.folder / "train.arrow", self.meta["seq_len"], limit)

    def val(self) -> TokenBlocks:
        return self._held("val")

    def test(self) -> TokenBlocks:
        return self._held("test")

    def _held(self, split: str) -> TokenBlocks:
        blocks = ArrowBlocks(self.folder / f"{split}.arrow", self.meta["seq_len"], self.meta[f"{split}_blocks"])
        return TokenBlocks(torch.stack([blocks[i]["input_ids"] for i in range(len(blocks))]))


def blocks_key(corpus: Corpus, tokenizer: Any, seq_len: int, eval_blocks: int) -> str:
    """The cache key of a corpus's blocks: the data, the tokenizer, the block length and the held-out blocks (and
    the cache format)."""
    parts = [FORMAT, corpus.fingerprint, tokenizer_digest(tokenizer), seq_len, VAL_EVERY, eval_blocks]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def prepare_blocks(
    corpus: Corpus, tokenizer: Any, seq_len: int, cache: Path, eval_blocks: int, workers: int = 1, builder: bool = True
) -> Prepared:
    """The corpus's blocks from the cache, verified (``cache_checks.entry_problem``), else tokenized and packed into
    it. The cache folder is built in a temporary folder and moved into place whole, so a killed run never leaves
    one that a later run trusts; an entry that does not verify is rebuilt, with a warning naming it. Only the
    ``builder`` (the first process of a machine) builds; the others wait for an entry that verifies."""
    check_cache_folder(cache)
    folder = cache / f"blocks-{blocks_key(corpus, tokenizer, seq_len, eval_blocks)}"
    if not builder:
        wait_for_entry(folder)
        return Prepared(folder, json.loads((folder / "meta.json").read_text()), cached=True, seconds=0.0)
    if os.path.lexists(folder):
        problem = entry_problem(folder)
        if problem is None:
            return Prepared(folder, json.loads((folder / "meta.json").read_text()), cached=True, seconds=0.0)
        warnings.warn(f"the cached data {folder} does not verify ({problem}): it is rebuilt", stacklevel=3)
        with storage_errors(cache):
            discard(folder)
    start = time.perf_counter()
    with storage_errors(cache):
        try:
            with atomic_directory(folder) as tmp:
                meta = _build(corpus, tokenizer, seq_len, tmp, workers, eval_blocks)
                (tmp / "meta.json").write_text(json.dumps(meta))
        except FileExistsError:  # another run on the same data finished first: its folder is as good
            pass
    return Prepared(folder, json.loads((folder / "meta.json").read_text()), False, time.perf_counter() - start)


def wait_for_entry(folder: Path, poll: float = 0.5) -> None:
    """Wait until the cache entry ``folder`` verifies: the builder of the run writes it, or rebuilds one that does
    not (checked again each time its ``meta.json`` is replaced)."""
    seen = None
    while True:
        with contextlib.suppress(FileNotFoundError):
            stat = os.stat(folder / "meta.json")
            if (stat.st_ino, stat.st_mtime_ns) != seen:
                if entry_problem(folder) is None:
                    return
                seen = (stat.st_ino, stat.st_mtime_ns)
        time.sleep(poll)


def _build(corpus: Corpus, tokenizer: Any, seq_len: int, tmp: Path, workers: int, eval_blocks: int) -> dict[str, float]:
    import datasets

    work = tmp / "work"  # datasets' own Arrow files: the documents and their token ids
    progress, start = datasets.is_progress_bar_enabled(), time.perf_counter()
    datasets.disable_progress_bars()
    try:
        docs = datasets.Dataset.from_generator(
            _documents_of, gen_kwargs={"corpus": corpus}, cache_dir=str(work),
            features=datasets.Features({"text": datasets.Value("string")}),
        )  # fmt: skip
        read = time.perf_counter()
        ids = docs.map(
            _tokenize, batched=True, batch_size=1000, num_proc=workers if workers > 1 else None,
            remove_columns=["text"], fn_kwargs={"tokenizer": tokenizer, "eos": end_of_text(tokenizer)},
            features=datasets.Features({"input_ids": datasets.List(datasets.Value("int32"))}),
            new_fingerprint=f"tokenized-{tokenizer_digest(tokenizer)[:16]}",
        )  # fmt: skip
    except datasets.exceptions.DatasetGenerationError as error:  # a user mistake in a shard, a full disk: its own
        raise (error.__cause__ if isinstance(error.__cause__, (ValueError, OSError)) else error) from None
    finally:
        if progress:
            datasets.enable_progress_bars()
    tokenized = time.perf_counter()
    rows = ids.data.table.column("input_ids")
    lengths = np.concatenate([np.zeros(0, dtype=np.int64), *(c.value_lengths().to_numpy() for c in rows.chunks)])
    if len(lengths) < 3:
        raise ValueError(
            f"the data holds {len(lengths)} document(s): validation and test hold out whole documents (one in "
            f"{VAL_EVERY} each), so training needs at least three; give more text"
        )
    val, test = holdout_masks(lengths, eval_blocks * seq_len)
    packers = {split: _Packer(tmp / f"{split}.arrow", seq_len) for split in ("train", "val", "test")}
    for first in range(0, len(lengths), ROWS_PER_PASS):
        part = rows.slice(first, ROWS_PER_PASS)
        keep_val, keep_test = val[first : first + ROWS_PER_PASS], test[first : first + ROWS_PER_PASS]
        packers["train"].add(_flat_ids(part, ~(keep_val | keep_test)))
        packers["val"].add(_flat_ids(part, keep_val))
        packers["test"].add(_flat_ids(part, keep_test))
    for packer in packers.values():
        packer.close()
    del docs, ids, rows
    shutil.rmtree(work)
    counts = {split: packer.blocks for split, packer in packers.items()}
    if min(counts.values()) < 1:
        raise ValueError(
            f"the data gives {counts['train']} training, {counts['val']} validation and {counts['test']} test blocks "
            f"of --seq-len {seq_len} ({int(lengths.sum())} tokens); give more text or a shorter --seq-len"
        )
    return {
        "seq_len": seq_len, "documents": len(lengths), "tokens": int(lengths.sum()),
        "val_documents": int(val.sum()), "val_tokens": int(lengths[val].sum()),
        "test_documents": int(test.sum()), "test_tokens": int(lengths[test].sum()),
        "train_blocks": counts["train"], "val_blocks": evaluated_blocks(counts["val"], eval_blocks),
        "test_blocks": evaluated_blocks(counts["test"], eval_blocks),
        "read_seconds": read - start, "tokenize_seconds": tokenized - read,
        "pack_seconds": time.perf_counter() - tokenized, "files": file_checks(tmp, [f"{n}.arrow" for n in packers]),
    }  # fmt: skip


def _documents_of(corpus: Corpus) -> Iterator[dict[str, str]]:
    for doc in corpus.all_documents():
        yield {"text": doc}


def streaming_holdout(
    corpus: Corpus, tokenizer: Any, seq_len: int, eval_blocks: int
) -> tuple[dict[str, TokenBlocks], frozenset, dict[str, int]]:
    """The validation and test blocks of a streamed corpus, by the rule of the cached ones (the same blocks for a
    corpus of ``VAL_EVERY`` documents or more), read from its first documents; with the ``(shard, document)``
    numbers they come from, and each split's tokens."""
    budget, eos, held = eval_blocks * seq_len, end_of_text(tokenizer), []
    ids: dict[str, list[int]] = {"val": [], "test": []}
    offset, number = VAL_EVERY // 2, 0
    for shard in range(len(corpus.shards)):
        for index, doc in enumerate(corpus.documents(shard)):
            split = {0: "val", offset: "test"}.get(number % VAL_EVERY)
            if split is not None and len(ids[split]) < budget:
                ids[split].extend(tokenizer(doc, add_special_tokens=False)["input_ids"] + eos)
                held.append((shard, index))
            number += 1
            if min(map(len, ids.values())) >= budget:
                break
        else:
            continue
        break
    blocks = {}
    for split, tokens in ids.items():
        count = evaluated_blocks(len(tokens) // seq_len, eval_blocks)
        if count < 1:
            raise ValueError(
                f"the data's {'validation' if split == 'val' else 'test'} documents give {len(tokens)} tokens, less "
                f"than one block of --seq-len {seq_len} (streamed, the test documents are the 10th, 30th, ...); give "
                "more text or a shorter --seq-len"
            )
        blocks[split] = TokenBlocks(torch.tensor(tokens[: count * seq_len], dtype=torch.long).view(count, seq_len))
    return blocks, frozenset(held), {split: len(tokens) for split, tokens in ids.items()}


def streaming_blocks(corpus: Corpus, tokenizer: Any, seq_len: int, held: frozenset, seed: int) -> Any:
    """A ``datasets.IterableDataset`` of training blocks tokenized and packed as they are read, one shard (file)
    after the other, without the validation documents ``held``; shuffled in a buffer of 1,000 blocks. Each shard
    packs on its own: its last partial block is dropped (the cached pipeline drops only the corpus's last)."""
    import datasets

    shards = list(range(len(corpus.shards)))  # a list: the stream's readers share it out
    ids = datasets.List(datasets.Value("int64"), length=seq_len)
    stream = datasets.IterableDataset.from_generator(
        _stream_blocks, features=datasets.Features({"input_ids": ids, "labels": ids}),
        gen_kwargs={"shards": shards, "corpus": corpus, "held": held, "tokenizer": tokenizer, "seq_len": seq_len},
    )  # fmt: skip
    return stream.shuffle(seed=seed, buffer_size=1000)


def _stream_blocks(
    shards: list[int], corpus: Corpus, held: frozenset, tokenizer: Any, seq_len: int
) -> Iterator[dict[str, list[int]]]:
    eos = end_of_text(tokenizer)
    for number in shards:
        rest: list[int] = []
        batch: list[str] = []
        docs = (doc for index, doc in enumerate(corpus.documents(number)) if (number, index) not in held)
        for doc in _then_none(docs):
            if doc is not None:
                batch.append(doc)
            if batch and (doc is None or len(batch) == 256):
                for tokens in tokenizer(batch, add_special_tokens=False)["input_ids"]:
                    rest.extend(tokens + eos)
                batch = []
                whole = len(rest) // seq_len * seq_len
                for start in range(0, whole, seq_len):
                    block = rest[start : start + seq_len]
                    yield {"input_ids": block, "labels": block}
                rest = rest[whole:]


def _then_none(items: Iterator[str]) -> Iterator[str | None]:
    yield from items
    yield None
