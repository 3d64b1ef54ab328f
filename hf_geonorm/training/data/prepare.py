"""``hf-geonorm train``'s data made ready for Trainer, in the order it flows: the documents of ``--data``
(``corpus``), the tokenizer (``tokenizer``), the training, validation and test blocks (``pipeline``), and the log
lines that account for the tokens: how many the data holds, how many train, and how many epochs ``--max-steps``
amounts to."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..options import TrainOptions
from .corpus import Corpus, HubSource, resolve_corpus
from .pipeline import TokenBlocks, prepare_blocks, streaming_blocks, streaming_holdout, tokenizer_digest
from .tokenizer import training_tokenizer

EPOCH_WARNING = 4


@dataclass
class TrainingData:
    """What Trainer gets: training blocks (memory-mapped, or a stream), and validation and test blocks (in memory:
    runs choose on validation and report on test); the tokenizer that made them, and whether it is the ``--model``
    folder's own."""

    train: Any
    val: TokenBlocks
    test: TokenBlocks
    label: str
    tokenizer: Any
    tokenizer_from_model: bool
    facts: dict[str, Any]  # what a sweep's journal records of the data: fingerprints and the splits' sizes


def world_size() -> int:
    """The number of training processes (torchrun sets ``WORLD_SIZE``), known before the Trainer starts."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def builds_here() -> bool:
    """Whether this process builds the caches (the first of its machine); the others wait for them."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def data_source(options: TrainOptions, log: Any) -> tuple[Corpus, Any, bool]:
    """The corpus ``options.data`` names and its tokenizer (and whether it is the ``--model`` folder's own), before
    any tokenizing: a resumed run compares both with its checkpoint's first."""
    hub = HubSource(options.data or "", options.data_config, options.data_split, options.data_revision)
    corpus = resolve_corpus(options.data, options.text_column, hub)
    tokenizer, from_model = training_tokenizer(options, corpus, builds_here(), log)
    return corpus, tokenizer, from_model


def training_data(options: TrainOptions, corpus: Corpus, tokenizer: Any, from_model: bool, log: Any) -> TrainingData:
    """The training, validation and test blocks of ``corpus`` as ``options`` ask (cached or streamed, capped by
    ``max_tokens``); ``log`` says what the data holds and what ``max_steps`` makes of it."""
    builder = builds_here()
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
        held_out, held, tokens = streaming_holdout(corpus, tokenizer, length, options.held_out_blocks())
        log(f"data: {corpus.label}, streamed: tokenized and packed as training reads it, so how many tokens it holds "
            f"is unknown in advance; validation and test: {len(held)} documents, {tokens['val']:,} and "
            f"{tokens['test']:,} tokens ({len(held_out['val'])} and {len(held_out['test'])} blocks evaluated); "
            f"{steps}")  # fmt: skip
        train = streaming_blocks(corpus, tokenizer, length, held, options.seed)
        facts = data_facts(corpus, tokenizer, None, {s: (None, tokens[s], len(held_out[s])) for s in ("val", "test")})
        return TrainingData(train, held_out["val"], held_out["test"], corpus.label, tokenizer, from_model, facts)
    cache = Path(options.data_cache).expanduser()
    workers = min(options.data_workers, os.cpu_count() or 1)
    if workers < options.data_workers:
        log(f"--data-workers {options.data_workers} is more than this machine's {workers} CPUs: tokenizing with "
            f"{workers}")
    prepared = prepare_blocks(corpus, tokenizer, length, cache, options.held_out_blocks(), workers, builder)
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
        else f"tokenized in {prepared.seconds:.1f} s by {workers} process(es), cached in {prepared.folder}"
    )
    epochs = planned / train_tokens
    log(f"data: {corpus.label}: {meta['documents']:,} documents, {meta['tokens']:,} tokens (an end-of-text token "
        f"after each document); {how}")  # fmt: skip
    log(f"validation: {meta['val_documents']:,} documents, {meta['val_tokens']:,} tokens ({meta['val_blocks']} blocks "
        f"evaluated); test: {meta['test_documents']:,} documents, {meta['test_tokens']:,} tokens "
        f"({meta['test_blocks']} blocks evaluated at the end); training on {train_tokens:,} tokens "
        f"({len(train):,} blocks){cap}; {steps} = {epochs:.3g} epochs")  # fmt: skip
    val_cut, test_cut = meta["val_cut_tokens"], meta["test_cut_tokens"]
    if val_cut or test_cut:
        log(f"held-out documents longer than the evaluation (more than --eval-blocks {options.eval_blocks} x "
            f"--seq-len {length} tokens) were cut: only the tokens it evaluates were held out, and their other "
            f"{val_cut + test_cut:,} tokens train (validation {val_cut:,}, test {test_cut:,})")  # fmt: skip
    if epochs > EPOCH_WARNING:
        warnings.warn(
            f"--max-steps {options.max_steps} goes over the training tokens {epochs:.1f} times (more than "
            f"{EPOCH_WARNING} epochs): the model will learn them by heart; give more data or fewer --max-steps",
            stacklevel=2,
        )
    held = {s: (meta[f"{s}_documents"], meta[f"{s}_tokens"], meta[f"{s}_blocks"]) for s in ("val", "test")}
    facts = data_facts(corpus, tokenizer, train_tokens, held)
    return TrainingData(train, prepared.val(), prepared.test(), corpus.label, tokenizer, from_model, facts)


def data_facts(
    corpus: Corpus, tokenizer: Any, train_tokens: int | None, held: dict[str, tuple[int | None, int, int]]
) -> dict[str, Any]:
    """What a run trained and was judged on: the data's and the tokenizer's fingerprints, the training tokens the
    run could draw from (None when streamed: unknown in advance), and each held-out split's documents, tokens and
    evaluated blocks."""
    facts: dict[str, Any] = {"fingerprint": corpus.fingerprint, "tokenizer": tokenizer_digest(tokenizer),
                             "train_tokens": train_tokens}  # fmt: skip
    for split, (documents, tokens, blocks) in held.items():
        facts |= {f"{split}_documents": documents, f"{split}_tokens": tokens, f"{split}_blocks": blocks}
    return facts
