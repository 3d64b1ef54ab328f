"""The data ``hf-geonorm train`` trains on: a corpus (``corpus``) tokenized once, in batches of about a megabyte of
text (``BATCH_CHARS``) in this process or in ``--data-workers`` processes, packed into blocks of ``--seq-len`` tokens
with the end-of-text token after every document as each batch arrives, and cached as Arrow files under
``--data-cache``, keyed by the data (its files' sizes and content hashes), the tokenizer (its serialized JSON) and the
block length, and verified when read (``cache_checks``). Neither preparing nor training holds the corpus: preparing
holds a few batches, and training reads the blocks memory-mapped. ``--streaming`` tokenizes and packs on the fly
instead.

Validation and test are held out by documents, disjoint from training and from each other: validation takes
documents 0, 20, 40, ... (one in ``VAL_EVERY``, in corpus order) and test documents 10, 30, 50, ... (``test_offset``:
the middle one of a corpus of fewer than 20), each until they hold ``--eval-blocks`` blocks' worth of tokens; the first
blocks each packs into are evaluated (``evaluated_blocks``). A held-out document longer than all that (more tokens than
``--eval-blocks`` blocks: a long JSON line, say) is cut: the tokens the evaluation still needs are held out, the rest
of it trains, so no split holds out more than twice what it evaluates. Runs choose on validation and report on test
(``hf-geonorm sweep``). The other documents, in order, pack into the training blocks (the last partial block is
dropped).
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
import pyarrow as pa
import torch
from torch.utils.data import Dataset

from ...files.atomic import atomic_directory
from .cache_checks import check_cache_folder, discard, entry_problem, file_checks, storage_errors
from .corpus import FORMAT, VAL_EVERY, Corpus, test_offset
from .token_batches import encode_documents, encoded_batches, end_of_text, stage_clock, text_batches

SPLITS = ("train", "val", "test")
# Of the packed blocks only (the tokenizer's cache keeps its key): 2, held-out documents longer than the evaluation
# are cut (``_HeldOut``) and meta.json records its key and counts, checked when read (``meta_problem``).
BLOCKS_FORMAT = 2
META_COUNTS = ("seq_len", "documents", "tokens", "val_documents", "val_tokens", "val_cut_tokens", "test_documents",
               "test_tokens", "test_cut_tokens", "train_blocks", "val_blocks", "test_blocks")  # fmt: skip


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


class _HeldOut:
    """Which documents are validation (1) and which test (2), decided as their token counts arrive in corpus order:
    every ``VAL_EVERY``-th from the first (validation) and from the test offset (``test_offset``, known once
    ``VAL_EVERY`` documents are read), each while the ones before hold fewer than ``budget`` tokens. A chosen
    document longer than ``budget`` (more than the whole evaluation) is held out only as far as the evaluation
    still needs; shorter ones are held out whole."""

    def __init__(self, budget: int) -> None:
        self.budget, self.documents = budget, 0
        self.before = {1: 0, 2: 0}  # the tokens of each split's candidates so far

    def codes(self, lengths: np.ndarray, test_first: int) -> tuple[np.ndarray, np.ndarray]:
        """0 (train), 1 (validation) or 2 (test) for each of the next documents, of ``lengths`` tokens, and how
        many of each one's first tokens that split holds out (the rest trains)."""
        number = np.arange(self.documents, self.documents + len(lengths))
        codes = np.zeros(len(lengths), dtype=np.int8)
        held = lengths.copy()
        for code, first in ((1, 0), (2, test_first)):
            candidates = np.flatnonzero(number % VAL_EVERY == first)
            sizes = lengths[candidates]
            before = self.before[code] + np.cumsum(sizes) - sizes
            taken = (before < self.budget) & (codes[candidates] == 0)  # a test document is never a validation one
            chosen = candidates[taken]
            codes[chosen] = code
            held[chosen] = np.where(sizes[taken] > self.budget, self.budget - before[taken], sizes[taken])
            self.before[code] += int(sizes.sum())
        self.documents += len(lengths)
        return codes, held


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
    the cache formats)."""
    parts = [FORMAT, corpus.fingerprint, tokenizer_digest(tokenizer), seq_len, VAL_EVERY, eval_blocks, BLOCKS_FORMAT]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def prepare_blocks(
    corpus: Corpus, tokenizer: Any, seq_len: int, cache: Path, eval_blocks: int, workers: int = 1, builder: bool = True
) -> Prepared:
    """The corpus's blocks from the cache, verified (``cache_checks.entry_problem``), else tokenized and packed into
    it. The cache folder is built in a temporary folder and moved into place whole, so a killed run never leaves
    one that a later run trusts; an entry that does not verify is rebuilt, with a warning naming it. Only the
    ``builder`` (the first process of a machine) builds; the others wait for an entry that verifies."""
    check_cache_folder(cache)
    key = blocks_key(corpus, tokenizer, seq_len, eval_blocks)
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
                meta = _build(corpus, tokenizer, seq_len, tmp, workers, eval_blocks)
                (tmp / "meta.json").write_text(json.dumps({"key": key, **meta}))
        except FileExistsError:  # another run on the same data finished first: its folder is as good
            pass
    return Prepared(folder, json.loads((folder / "meta.json").read_text()), False, time.perf_counter() - start)


def meta_problem(folder: Path, key: str, eval_blocks: int) -> str | None:
    """Why the ``meta.json`` of the entry ``folder``, whose files verify, does not describe them (naming what), or
    None: it names the entry's key, its counts are whole numbers, and its block counts are those of its Arrow files
    (a ``meta.json`` copied from another entry, or edited, is caught here)."""
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


def _build(corpus: Corpus, tokenizer: Any, seq_len: int, tmp: Path, workers: int, eval_blocks: int) -> dict[str, Any]:
    """Tokenize the corpus batch by batch and pack each batch's documents into the training, validation and test
    blocks as it arrives: nothing of the corpus is held but a few batches. The first batches wait until
    ``VAL_EVERY`` documents are read, which fixes the test offset (or the end of a smaller corpus)."""
    held, seconds = _HeldOut(eval_blocks * seq_len), dict.fromkeys(("read", "tokenize", "pack"), 0.0)
    packers = [_Packer(tmp / f"{split}.arrow", seq_len) for split in SPLITS]
    counts = np.zeros((len(SPLITS), 2), dtype=np.int64)  # per split: documents, tokens
    cut = [0, 0, 0]  # per split: the tokens of its documents cut that train (``_HeldOut``)

    def pack(ids: np.ndarray, lengths: np.ndarray, test_first: int) -> None:
        with stage_clock(seconds, "pack"):
            codes, kept = held.codes(lengths, test_first)
            token_codes = np.repeat(codes, lengths)
            starts = np.cumsum(lengths) - lengths
            for doc in np.flatnonzero(kept < lengths):  # a held-out document longer than the evaluation: cut
                token_codes[starts[doc] + kept[doc] : starts[doc] + lengths[doc]] = 0
                cut[codes[doc]] += int(lengths[doc] - kept[doc])
            for code, packer in enumerate(packers):
                packer.add(ids[token_codes == code])
                counts[code] += (np.count_nonzero(codes == code), np.count_nonzero(token_codes == code))

    waiting: list[tuple[np.ndarray, np.ndarray]] = []
    try:
        for batch in encoded_batches(corpus, tokenizer, workers, seconds):
            waiting.append(batch)
            if held.documents + sum(len(lengths) for _, lengths in waiting) >= VAL_EVERY:
                for ids, lengths in waiting:
                    pack(ids, lengths, VAL_EVERY // 2)
                waiting = []
        documents = held.documents + sum(len(lengths) for _, lengths in waiting)
        for ids, lengths in waiting:
            pack(ids, lengths, test_offset(documents))
    finally:
        for packer in packers:
            packer.close()
    if held.documents < 3:
        raise ValueError(
            f"the data holds {held.documents} document(s): validation and test hold out whole documents (one in "
            f"{VAL_EVERY} each), so training needs at least three; give more text"
        )
    blocks = dict(zip(SPLITS, (packer.blocks for packer in packers), strict=True))
    if min(blocks.values()) < 1:
        raise ValueError(
            f"the data gives {blocks['train']} training, {blocks['val']} validation and {blocks['test']} test blocks "
            f"of --seq-len {seq_len} ({int(counts[:, 1].sum())} tokens); give more text or a shorter --seq-len"
        )
    (_, train_tokens), (val_documents, val_tokens), (test_documents, test_tokens) = counts.tolist()
    return {
        "seq_len": seq_len, "documents": held.documents, "tokens": train_tokens + val_tokens + test_tokens,
        "val_documents": val_documents, "val_tokens": val_tokens, "val_cut_tokens": cut[1],
        "test_documents": test_documents, "test_tokens": test_tokens, "test_cut_tokens": cut[2],
        "train_blocks": blocks["train"], "val_blocks": evaluated_blocks(blocks["val"], eval_blocks),
        "test_blocks": evaluated_blocks(blocks["test"], eval_blocks),
        **{f"{stage}_seconds": value for stage, value in seconds.items()},
        "files": file_checks(tmp, [f"{split}.arrow" for split in SPLITS]),
    }  # fmt: skip


HeldOut = dict[tuple[int, int], int]  # (shard, document) -> how many of its first tokens are held out


def streaming_holdout(
    corpus: Corpus, tokenizer: Any, seq_len: int, eval_blocks: int
) -> tuple[dict[str, TokenBlocks], HeldOut, dict[str, int]]:
    """The validation and test blocks of a streamed corpus, by the rule of the cached ones (the same blocks for a
    corpus of ``VAL_EVERY`` documents or more; a document longer than the evaluation cut), read from its first
    documents; with the ``(shard, document)`` numbers they come from and the tokens of each held out, and each
    split's tokens."""
    budget, eos, held = eval_blocks * seq_len, end_of_text(tokenizer), {}
    ids: dict[str, list[int]] = {"val": [], "test": []}
    offset, number = VAL_EVERY // 2, 0
    for shard in range(len(corpus.shards)):
        for index, doc in enumerate(corpus.documents(shard)):
            split = {0: "val", offset: "test"}.get(number % VAL_EVERY)
            if split is not None and len(ids[split]) < budget:
                tokens = tokenizer(doc, add_special_tokens=False)["input_ids"] + eos
                kept = len(tokens) if len(tokens) <= budget else budget - len(ids[split])
                ids[split].extend(tokens[:kept])
                held[(shard, index)] = kept
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
    return blocks, held, {split: len(tokens) for split, tokens in ids.items()}


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
                trains[starts[offset] : starts[offset] + kept] = False
            first += len(texts)
            rest = np.concatenate([rest, ids[trains]])
            whole = len(rest) // seq_len * seq_len
            for block in rest[:whole].reshape(-1, seq_len).tolist():
                yield {"input_ids": block, "labels": block}
            rest = rest[whole:]
