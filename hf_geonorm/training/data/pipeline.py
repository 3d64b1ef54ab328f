"""The data ``hf-geonorm train`` trains on: a corpus (``corpus``) tokenized once, in batches of about a megabyte of
text (``BATCH_CHARS``) in this process or in ``--data-workers`` processes, packed into blocks of ``--seq-len`` tokens
with the end-of-text token after every document as each batch arrives, and cached as Arrow files under
``--data-cache``, keyed by the data (its files' sizes and content hashes), the tokenizer (its serialized JSON) and the
block length, and verified when read (``cache_checks``). Neither preparing nor training holds the corpus: preparing
holds a few batches, and training reads the blocks memory-mapped. ``--streaming`` tokenizes and packs on the fly
instead.

Validation and test are held out as ``split.held_out_plan`` decides, before any block is packed: whole files of a
folder (documents of other data), one in 20 each, until they hold ``--eval-blocks`` blocks' worth of tokens, without
the pieces that training text holds anyway (near-duplicates); the first blocks each packs into are evaluated
(``evaluated_blocks``). Runs choose on validation and report on test (``hf-geonorm sweep``). The other documents, in
order, pack into the training blocks (the last partial block is dropped).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..._plumbing.atomic import atomic_directory
from ..options import HELD_OUT_RULE, LEGACY_HELD_OUT_RULE
from .cache_checks import check_cache_folder, discard, entry_problem, file_checks, storage_errors
from .corpus import FORMAT, VAL_EVERY, Corpus
from .split import PAST, SPLIT_NAMES, HeldOutPlan, held_out_plan
from .token_batches import encode_documents, encoded_batches, end_of_text, stage_clock, text_batches

SPLITS = ("train", "val", "test")
# Of the packed blocks only (the tokenizer's cache keeps its key): 2, held-out documents longer than the evaluation
# are cut and meta.json records its key and counts, checked when read (``meta_problem``); 3, the held-out split of
# ``split``: whole files of a folder, without near-duplicates of training text; 4, its held-out rule 2, recorded in
# meta.json (an entry of rule 1 keeps format 3 and its key, so that a sweep begun under it finds its blocks).
BLOCKS_FORMATS = {LEGACY_HELD_OUT_RULE: 3, HELD_OUT_RULE: 4}
META_COUNTS = ("seq_len", "documents", "tokens", "val_documents", "val_tokens", "val_cut_tokens", "val_files",
               "val_removed", "test_documents", "test_tokens", "test_cut_tokens", "test_files", "test_removed",
               "dropped_documents", "dropped_tokens", "train_blocks", "val_blocks", "test_blocks")  # fmt: skip


def tokenizer_digest(tokenizer: Any) -> str:
    """A hash of what the tokenizer does: its serialized JSON (a slow tokenizer: its class and vocabulary)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else type(tokenizer).__name__ + json.dumps(
        sorted(tokenizer.get_vocab().items())
    )
    return hashlib.sha256(text.encode()).hexdigest()


def evaluated_blocks(count: int, limit: int) -> int:
    """How many of ``count`` validation (or test) blocks are evaluated: at most ``limit`` (``--eval-blocks``), and
    from 8 on a multiple of 8, so that the processes of a run evaluate equal shares (Trainer fills an uneven last
    batch with repeated blocks, which would weigh them twice)."""
    count = min(count, limit)
    return count - count % 8 if count >= 8 else count


class _Packer:
    """Token ids in, blocks of ``seq_len`` out, written as one Arrow stream (fixed-size lists of int32)."""

    def __init__(self, path: Path, seq_len: int) -> None:
        import pyarrow as pa  # datasets' (the train extra): imported where used, so that info reads runs without it

        self.seq_len, self.blocks, self.rest = seq_len, 0, np.empty(0, dtype=np.int32)
        self.type = pa.list_(pa.int32(), seq_len)
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.sink, pa.schema([("input_ids", self.type)]))

    def add(self, ids: np.ndarray) -> None:
        import pyarrow as pa

        ids = np.concatenate([self.rest, ids]) if len(self.rest) else ids
        count = len(ids) // self.seq_len
        if count:
            whole = np.ascontiguousarray(ids[: count * self.seq_len])  # as Arrow without a copy
            values = pa.Array.from_buffers(pa.int32(), len(whole), [None, pa.py_buffer(whole)])
            blocks = pa.FixedSizeListArray.from_arrays(values, self.seq_len)
            self.writer.write_batch(pa.record_batch([blocks], names=["input_ids"]))
            self.blocks += count
        self.rest = ids[count * self.seq_len :]

    def close(self) -> None:
        self.writer.close()
        self.sink.close()


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
        import pyarrow as pa

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


def blocks_key(corpus: Corpus, tokenizer: Any, seq_len: int, eval_blocks: int, rule: int) -> str:
    """The cache key of a corpus's blocks: the data, the tokenizer, the block length, the held-out blocks and the
    held-out rule (by the cache formats)."""
    parts = [FORMAT, corpus.fingerprint, tokenizer_digest(tokenizer), seq_len, VAL_EVERY, eval_blocks,
             BLOCKS_FORMATS[rule]]  # fmt: skip
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def prepare_blocks(
    corpus: Corpus, tokenizer: Any, seq_len: int, cache: Path, eval_blocks: int, workers: int = 1, builder: bool = True,
    rule: int = HELD_OUT_RULE,
) -> Prepared:  # fmt: skip
    """The corpus's blocks from the cache, verified (``cache_checks.entry_problem``), else tokenized and packed into
    it, validation and test held out by the held-out ``rule``. The cache folder is built in a temporary folder and
    moved into place whole, so a killed run never leaves one that a later run trusts; an entry that does not verify
    is rebuilt, with a warning naming it. Only the ``builder`` (the first process of a machine) builds; the others
    wait for an entry that verifies."""
    check_cache_folder(cache)
    key = blocks_key(corpus, tokenizer, seq_len, eval_blocks, rule)
    folder = cache / f"blocks-{key}"
    if not builder:
        wait_for_entry(folder, key, eval_blocks)
        return Prepared(folder, json.loads((folder / "meta.json").read_text()), cached=True, seconds=0.0)
    if os.path.lexists(folder):
        problem = entry_problem(folder) or meta_problem(folder, key, eval_blocks)
        if problem is None:
            return Prepared(folder, json.loads((folder / "meta.json").read_text()), cached=True, seconds=0.0)
        warnings.warn(f"the cached data {folder} does not verify, so it is rebuilt: {problem}", stacklevel=3)
        with storage_errors(cache):
            discard(folder)
    start = time.perf_counter()
    with storage_errors(cache):
        try:
            with atomic_directory(folder) as tmp:
                meta = _build(corpus, tokenizer, seq_len, tmp, workers, eval_blocks, rule)
                (tmp / "meta.json").write_text(json.dumps({"key": key, **meta}))
        except FileExistsError:  # another run on the same data finished first: its folder is as good
            pass
    return Prepared(folder, json.loads((folder / "meta.json").read_text()), False, time.perf_counter() - start)


def meta_problem(folder: Path, key: str, eval_blocks: int) -> str | None:
    """Why the ``meta.json`` of the entry ``folder``, whose files verify, does not describe them (naming what), or
    None: it names the entry's key, its counts are whole numbers, and its block counts are those of its Arrow files
    (a ``meta.json`` copied from another entry, or edited, is caught here)."""
    import pyarrow as pa

    meta_path = "its meta.json"  # the entry's folder is named by the caller's message
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))  # valid JSON: entry_problem
    if meta.get("key") != key:
        return f"{meta_path} is of another entry (its key is {meta.get('key')!r}, not {key!r})"
    wrong = [name for name in META_COUNTS if type(meta.get(name)) is not int or meta[name] < 0]
    if wrong:
        return f"{meta_path} records no count of {', '.join(wrong)}"
    for split in SPLITS:
        stream = pa.ipc.open_stream(pa.memory_map(str(folder / f"{split}.arrow")))
        width = stream.schema.field(0).type.list_size
        blocks = sum(batch.num_rows for batch in stream)
        expected = blocks if split == "train" else evaluated_blocks(blocks, eval_blocks)
        if width != meta["seq_len"] or meta[f"{split}_blocks"] != expected:
            return (f"{meta_path} records {meta[f'{split}_blocks']} {split} blocks of {meta['seq_len']} tokens, its "
                    f"{split}.arrow holds {expected} of {width}")  # fmt: skip
    return None


def wait_for_entry(folder: Path, key: str, eval_blocks: int, poll: float = 0.5) -> None:
    """Wait until the cache entry ``folder`` verifies: the builder of the run writes it, or rebuilds one that does
    not (checked again each time its ``meta.json`` is replaced)."""
    seen = None
    while True:
        with contextlib.suppress(FileNotFoundError):
            stat = os.stat(folder / "meta.json")
            if (stat.st_ino, stat.st_mtime_ns) != seen:
                if entry_problem(folder) is None and meta_problem(folder, key, eval_blocks) is None:
                    return
                seen = (stat.st_ino, stat.st_mtime_ns)
        time.sleep(poll)


def _build(corpus: Corpus, tokenizer: Any, seq_len: int, tmp: Path, workers: int, eval_blocks: int,
           rule: int) -> dict[str, Any]:  # fmt: skip
    """Decide what validation and test hold out (``split.held_out_plan``), then tokenize the corpus batch by batch
    and pack each batch's documents into the training, validation and test blocks as it arrives: nothing of the
    corpus is held but a few batches (and the held-out candidates)."""
    seconds = dict.fromkeys(("split", "read", "tokenize", "pack"), 0.0)
    with stage_clock(seconds, "split"):
        plan = held_out_plan(corpus, tokenizer, seq_len, eval_blocks, rule)
    numbers = np.array(sorted(plan.held), dtype=np.int64)
    plan_codes = np.array([plan.held[n][0] for n in numbers.tolist()], dtype=np.int8)
    plan_kept = np.array([plan.held[n][1] for n in numbers.tolist()], dtype=np.int64)
    packers = [_Packer(tmp / f"{split}.arrow", seq_len) for split in SPLITS]
    counts = np.zeros((PAST + 1, 2), dtype=np.int64)  # per code (train, val, test, dropped, past): documents, tokens
    cut = [0, 0, 0]  # per split: the tokens of its documents cut that train
    first = 0

    def pack(ids: np.ndarray, lengths: np.ndarray) -> None:
        nonlocal first
        with stage_clock(seconds, "pack"):
            number = np.arange(first, first + len(lengths))
            first += len(lengths)
            where = np.minimum(np.searchsorted(numbers, number), max(len(numbers) - 1, 0))
            hit = np.flatnonzero(numbers[where] == number) if len(numbers) else np.empty(0, dtype=np.int64)
            codes = np.zeros(len(lengths), dtype=np.int8)
            codes[hit] = plan_codes[where[hit]]
            token_codes = np.repeat(codes, lengths)
            starts = np.cumsum(lengths) - lengths
            for doc, kept in zip(hit.tolist(), plan_kept[where[hit]].tolist(), strict=True):
                if codes[doc] in SPLIT_NAMES and kept < lengths[doc]:  # a held-out document longer than the evaluation
                    token_codes[starts[doc] + kept : starts[doc] + lengths[doc]] = 0
                    cut[codes[doc]] += int(lengths[doc] - kept)
            for code in range(PAST + 1):
                if code < len(packers):
                    packers[code].add(ids[token_codes == code])
                counts[code] += (np.count_nonzero(codes == code), np.count_nonzero(token_codes == code))

    try:
        for ids, lengths in encoded_batches(corpus, tokenizer, workers, seconds):
            pack(ids, lengths)
    finally:
        for packer in packers:
            packer.close()
    blocks = dict(zip(SPLITS, (packer.blocks for packer in packers), strict=True))
    if min(blocks.values()) < 1:
        raise ValueError(
            f"the data gives {blocks['train']} training, {blocks['val']} validation and {blocks['test']} test blocks "
            f"of --seq-len {seq_len} ({int(counts[:3, 1].sum())} tokens); give more text or a shorter --seq-len"
        )
    (_, train_tokens), (val_documents, val_tokens), (test_documents, test_tokens), dropped, past = counts.tolist()
    return {
        "seq_len": seq_len, "documents": plan.documents, "tokens": int(counts[:, 1].sum()), "held_out_rule": rule,
        "held_out_by": "files" if plan.files else "documents", "why_not_files": plan.why_not_files,
        "val_documents": val_documents, "val_tokens": val_tokens, "val_cut_tokens": cut[1],
        "val_files": plan.held_files[1], "val_removed": plan.removed[1], "val_duplicates_kept": plan.duplicates_kept[1],
        "test_documents": test_documents, "test_tokens": test_tokens, "test_cut_tokens": cut[2],
        "test_files": plan.held_files[2], "test_removed": plan.removed[2],
        "test_duplicates_kept": plan.duplicates_kept[2], "dropped_documents": dropped[0], "dropped_tokens": dropped[1],
        "past_documents": past[0], "past_tokens": past[1],
        "train_blocks": blocks["train"], "val_blocks": evaluated_blocks(blocks["val"], eval_blocks),
        "test_blocks": evaluated_blocks(blocks["test"], eval_blocks),
        **{f"{stage}_seconds": value for stage, value in seconds.items()},
        "files": file_checks(tmp, [f"{split}.arrow" for split in SPLITS]),
    }  # fmt: skip


# (shard, document) -> how many of its first tokens do not train (None: none of it trains)
HeldOut = dict[tuple[int, int], int | None]


def streaming_holdout(
    corpus: Corpus, tokenizer: Any, seq_len: int, eval_blocks: int, rule: int = HELD_OUT_RULE
) -> tuple[dict[str, TokenBlocks], HeldOut, HeldOutPlan]:
    """The validation and test blocks of a streamed corpus, by the plan of the cached ones (``split``: the same
    blocks, by the same held-out ``rule``), with the ``(shard, document)`` numbers of the documents held out,
    removed or past their split's budget and how many of each one's first tokens do not train, and the plan."""
    plan = held_out_plan(corpus, tokenizer, seq_len, eval_blocks, rule)
    held = {plan.key(number): kept if code in SPLIT_NAMES else None for number, (code, kept) in plan.held.items()}
    blocks = {}
    for code, split in ((1, "val"), (2, "test")):
        tokens = plan.split_ids(code)
        count = evaluated_blocks(len(tokens) // seq_len, eval_blocks)
        if count < 1:
            raise ValueError(
                f"the data's {SPLIT_NAMES[code]} {'files' if plan.files else 'documents'} give {len(tokens)} tokens, "
                f"less than one block of --seq-len {seq_len}; give more text or a shorter --seq-len"
            )
        blocks[split] = TokenBlocks(torch.tensor(tokens[: count * seq_len], dtype=torch.long).view(count, seq_len))
    return blocks, held, plan


def streaming_blocks(corpus: Corpus, tokenizer: Any, seq_len: int, held: HeldOut, seed: int) -> Any:
    """A ``datasets.IterableDataset`` of training blocks tokenized and packed as they are read, one shard (file)
    after the other, without the held-out tokens ``held``; shuffled in a buffer of 1,000 blocks. Each shard
    packs on its own: its last partial block is dropped (the cached pipeline drops only the corpus's last), so
    ``ValueError`` when no shard gives a block: the run would train 0 steps and call it done."""
    import datasets

    shards = list(range(len(corpus.shards)))  # a list: the stream's readers share it out
    if next(_stream_blocks(shards, corpus, held, tokenizer, seq_len), None) is None:
        raise ValueError(
            f"--streaming packs each of the {len(shards)} file(s) of {corpus.label} on its own and drops its last "
            f"partial block: none gives a training block of --seq-len {seq_len} tokens (besides the validation and "
            "test documents), so nothing would train; drop --streaming (the cached data packs across files), give "
            "a shorter --seq-len, or longer files"
        )
    ids = datasets.List(datasets.Value("int64"), length=seq_len)
    stream = datasets.IterableDataset.from_generator(
        _stream_blocks, features=datasets.Features({"input_ids": ids, "labels": ids}),
        gen_kwargs={"shards": shards, "corpus": corpus, "held": held, "tokenizer": tokenizer, "seq_len": seq_len},
    )  # fmt: skip
    return stream.shuffle(seed=seed, buffer_size=1000)


def _stream_blocks(
    shards: list[int], corpus: Corpus, held: HeldOut, tokenizer: Any, seq_len: int
) -> Iterator[dict[str, list[int]]]:
    eos = end_of_text(tokenizer)
    for number in shards:
        rest, first = np.empty(0, dtype=np.int32), 0
        for texts in text_batches(corpus.documents(number)):
            ids, lengths = encode_documents(texts, tokenizer, eos)
            trains = np.ones(len(ids), dtype=bool)
            starts = np.cumsum(lengths) - lengths
            for offset in range(len(texts)):
                kept = held.get((number, first + offset), 0)
                trains[starts[offset] : starts[offset] + (lengths[offset] if kept is None else kept)] = False
            first += len(texts)
            rest = np.concatenate([rest, ids[trains]])
            whole = len(rest) // seq_len * seq_len
            for block in rest[:whole].reshape(-1, seq_len).tolist():
                yield {"input_ids": block, "labels": block}
            rest = rest[whole:]
