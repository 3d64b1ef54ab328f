"""``hf-geonorm train``'s data made ready for Trainer: the tokenizer trained on the fly (on a bounded sample of the
corpus, cached), the training, validation and test blocks (``pipeline``), and the log lines that account for the
tokens: how many the data holds, how many train, and how many epochs ``--max-steps`` amounts to."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..loading import first_line
from .cache_checks import check_cache_folder, storage_errors
from .corpus import Corpus, corpus_documents
from .data import TokenBlocks, fast_tokenizer, train_tokenizer
from .options import TrainOptions
from .pipeline import (
    FORMAT,
    builds_here,
    prepare_blocks,
    streaming_blocks,
    streaming_holdout,
    wait_for,
    world_size,
)

TOKENIZER_SAMPLE_CHARS = 20_000_000  # the tokenizer trained on the fly learns from the first 20 MB of text
EPOCH_WARNING = 4


@dataclass
class TrainingData:
    """What Trainer gets: training blocks (memory-mapped, or a stream), and validation and test blocks (in memory:
    runs choose on validation and report on test)."""

    train: Any
    val: TokenBlocks
    test: TokenBlocks
    label: str


def corpus_tokenizer(corpus: Corpus, vocab_size: int, cache: Path, log: Any) -> Any:
    """A byte-level BPE tokenizer trained on the corpus's first ``TOKENIZER_SAMPLE_CHARS`` characters (whole
    documents): training on all of a large corpus would take long and hold it in memory, for little gain. Cached
    under ``cache`` by the data and the vocabulary, so that a second run (and its cached blocks) finds the same one."""
    check_cache_folder(cache)
    parts = [FORMAT, corpus.fingerprint, vocab_size, TOKENIZER_SAMPLE_CHARS]
    path = cache / f"tokenizer-{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]}.json"
    if not builds_here():
        wait_for(path)
    if path.is_file():
        try:
            cached = fast_tokenizer(str(path))
        except Exception as error:  # noqa: BLE001 - a damaged file of the cache: trained again
            warnings.warn(f"the cached tokenizer {path} does not load ({first_line(error)}): it is trained again",
                          stacklevel=3)  # fmt: skip
        else:
            log(f"the byte-level BPE tokenizer ({vocab_size} tokens) trained on this data before, from {path}")
            return cached
    sample, chars, complete = [], 0, True
    for doc in corpus_documents(corpus.shards):
        if chars >= TOKENIZER_SAMPLE_CHARS:
            complete = False
            break
        sample.append(doc)
        chars += len(doc)
    what = "all of the text" if complete else "a sample: the first documents of the text"
    log(f"training a byte-level BPE tokenizer ({vocab_size} tokens) on {what} ({len(sample):,} documents, "
        f"{chars / 1e6:.1f} MB) of {corpus.label}")  # fmt: skip
    trained = train_tokenizer(sample, vocab_size)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        with storage_errors(cache):
            cache.mkdir(parents=True, exist_ok=True)
            trained.backend_tokenizer.save(str(partial))
            os.replace(partial, path)  # whole or not there: a killed run leaves no half tokenizer behind
    finally:
        with contextlib.suppress(OSError):  # written only when the save failed part way
            partial.unlink(missing_ok=True)
    return fast_tokenizer(str(path))  # as a later run loads it: the same digest keys the same cached blocks


def training_data(corpus: Corpus, tokenizer: Any, options: TrainOptions, log: Any) -> TrainingData:
    """The training and validation blocks of ``corpus`` as ``options`` ask (cached or streamed, capped by
    ``max_tokens``); ``log`` says what the data holds and what ``max_steps`` makes of it."""
    length = options.seq_len
    per_step = options.batch_size * options.gradient_accumulation_steps * world_size()
    planned = options.max_steps * per_step * length
    steps = f"--max-steps {options.max_steps} x {per_step} blocks of {length} tokens = {planned:,} tokens"
    if options.streaming:
        if options.max_tokens is not None:
            raise ValueError(
                f"--max-tokens caps the cached data; with --streaming, --max-steps bounds the tokens ({steps}): "
                "drop --max-tokens"
            )
        held_out, held, tokens = streaming_holdout(corpus, tokenizer, length, options.eval_blocks)
        log(f"data: {corpus.label}, streamed: tokenized and packed as training reads it, so how many tokens it holds "
            f"is unknown in advance; validation and test: {len(held)} documents, {tokens['val']:,} and "
            f"{tokens['test']:,} tokens ({len(held_out['val'])} and {len(held_out['test'])} blocks evaluated); "
            f"{steps}")  # fmt: skip
        train = streaming_blocks(corpus, tokenizer, length, held, options.seed)
        return TrainingData(train, held_out["val"], held_out["test"], corpus.label)
    cache = Path(options.data_cache).expanduser()
    prepared = prepare_blocks(
        corpus, tokenizer, length, cache, options.eval_blocks, options.data_workers, builds_here()
    )
    meta = prepared.meta
    limit = None if options.max_tokens is None else options.max_tokens // length
    if limit is not None and limit < 1:
        raise ValueError(f"--max-tokens {options.max_tokens} is less than one block of --seq-len {length}")
    train = prepared.train(limit)
    train_tokens, all_train = len(train) * length, meta["train_blocks"] * length
    if limit is None:
        cap = ""
    elif limit < meta["train_blocks"]:
        cap = f", the first of its {all_train:,}: --max-tokens {options.max_tokens:,}"
    else:
        cap = f", all of it: --max-tokens {options.max_tokens:,} is more than it holds"
    how = (
        f"tokenized by an earlier run, read from the cache {prepared.folder}"
        if prepared.cached
        else f"tokenized in {prepared.seconds:.1f} s by {options.data_workers} process(es), cached in {prepared.folder}"
    )
    epochs = planned / train_tokens
    log(f"data: {corpus.label}: {meta['documents']:,} documents, {meta['tokens']:,} tokens (an end-of-text token "
        f"after each document); {how}")  # fmt: skip
    log(f"validation: {meta['val_documents']:,} documents, {meta['val_tokens']:,} tokens ({meta['val_blocks']} blocks "
        f"evaluated); test: {meta['test_documents']:,} documents, {meta['test_tokens']:,} tokens "
        f"({meta['test_blocks']} blocks evaluated at the end); training on {train_tokens:,} tokens "
        f"({len(train):,} blocks){cap}; {steps} = {epochs:.3g} epochs")  # fmt: skip
    if epochs > EPOCH_WARNING:
        warnings.warn(
            f"--max-steps {options.max_steps} goes over the training tokens {epochs:.1f} times (more than "
            f"{EPOCH_WARNING} epochs): the model will learn them by heart; give more data or fewer --max-steps",
            stacklevel=2,
        )
    return TrainingData(train, prepared.val(), prepared.test(), corpus.label)
