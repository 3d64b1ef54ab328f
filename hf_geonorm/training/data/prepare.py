"""The data step of ``hf-geonorm train``: the data made ready for Trainer, in the order it flows: the documents of
``--data`` (``corpus``), the tokenizer (``tokenizer``), then the training, validation and test blocks (``pipeline``),
with the log lines that account for the tokens: how many the data holds, how many train, and how many epochs
``--max-steps`` amounts to. The step takes what it needs of the options (``DataRequest``); its tokenizing waits until
the run has checked a resumed run against its record (``data_source``, then ``training_data``). Before the run writes
anything, ``check_output_apart`` keeps its output and the data apart."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..options import EVAL_BLOCKS, EVAL_SHARE, MIN_EVAL_BLOCKS, TrainOptions
from .corpus import Corpus, HubSource, resolve_corpus
from .pipeline import TokenBlocks, prepare_blocks, streaming_blocks, streaming_holdout, tokenizer_digest
from .split import DROPPED, PAST, HeldOutPlan
from .tokenizer import training_tokenizer

EPOCH_WARNING = 4


@dataclass(frozen=True)
class DataRequest:
    """What the data step takes of a run's options: the corpus (``data``, the config, split and revision of a
    ``datasets`` corpus, the rows' ``text_column``), the tokenizer (the ``model`` folder's, ``tokenizer``'s, or one of
    ``vocab_size`` tokens trained on the corpus), the blocks (``seq_len`` tokens; ``held_out_blocks`` of documents
    held out for validation and for test, of which each evaluation reads ``evaluated_blocks``, all of them when None;
    ``max_tokens``, ``streaming`` and the ``seed`` of a stream's order; the ``held_out_rule`` that picks them), where
    they are cached and by how many processes (``cache``, ``workers``), and the steps they feed (``max_steps`` of
    ``blocks_per_step`` blocks, for the log)."""

    data: str | None
    data_config: str | None
    data_split: str
    data_revision: str | None
    text_column: str
    model: str | None
    tokenizer: str | None
    vocab_size: int | None
    seq_len: int
    held_out_blocks: int
    evaluated_blocks: int | None
    max_tokens: int | None
    streaming: bool
    seed: int
    cache: Path
    workers: int
    max_steps: int
    blocks_per_step: int
    held_out_rule: int


def data_request(options: TrainOptions) -> DataRequest:
    """What the data step takes of ``options``, in this run of ``world_size`` processes."""
    return DataRequest(
        data=options.data,
        data_config=options.data_config,
        data_split=options.data_split,
        data_revision=options.data_revision,
        text_column=options.text_column,
        model=options.model,
        tokenizer=options.tokenizer,
        vocab_size=options.vocab_size,
        seq_len=options.seq_len,
        held_out_blocks=options.held_out_blocks(),
        evaluated_blocks=evaluation_size(options, world_size()),
        max_tokens=options.max_tokens,
        streaming=options.streaming,
        seed=options.seed,
        cache=Path(options.data_cache).expanduser(),
        workers=options.data_workers,
        max_steps=options.max_steps,
        blocks_per_step=options.batch_size * options.gradient_accumulation_steps * world_size(),
        held_out_rule=options.held_out_rule,
    )


def check_output_apart(data: str | None, output: Path, given: str) -> None:
    """``ValueError`` when the run's ``output`` folder (``--output``, as ``given``) is the ``data`` folder or lies
    inside it (the next run over the data would read the run's checkpoints and final model as data), or the data
    lies inside it (a run writes there, and ``--force`` removes what it holds); links resolved. Checked before
    anything is written."""
    if data is None or not os.path.lexists(Path(data).expanduser()):
        return  # the standard library, or a datasets name
    path = Path(data).expanduser()
    read, written = path.resolve(), output.resolve()
    if path.is_dir() and (written == read or read in written.parents):
        where = "is" if written == read else "is inside"
        raise ValueError(f"--output {given} {where} the --data folder {data}: the next run over {data} would "
                         "read the run's checkpoints and final model as data; give another --output, outside "
                         "it")  # fmt: skip
    if written in read.parents:
        raise ValueError(f"--data {data} is inside the --output folder {given}, where the run writes its files (and "
                         "--force removes the earlier run's); give another --output, apart from the data")  # fmt: skip


def evaluations(options: TrainOptions) -> int:
    """How many evaluations a run makes: at step 0, every --eval-every steps, at the end when that is not one of
    them, and the test evaluation."""
    return 1 + options.max_steps // options.eval_every + (options.max_steps % options.eval_every > 0) + 1


def evaluation_size(options: TrainOptions, processes: int = 1) -> int:
    """How many held-out blocks each evaluation reads: ``eval_blocks`` when given, else ``EVAL_BLOCKS`` or the most
    (a multiple of 8, at least ``MIN_EVAL_BLOCKS``) whose evaluations cost at most ``EVAL_SHARE`` of the trained
    blocks' compute."""
    if options.eval_blocks is not None:
        return options.eval_blocks
    trained = options.max_steps * options.batch_size * options.gradient_accumulation_steps * processes
    affordable = int(EVAL_SHARE * 3 * trained / evaluations(options))
    return max(MIN_EVAL_BLOCKS, min(EVAL_BLOCKS, affordable - affordable % MIN_EVAL_BLOCKS))


@dataclass(frozen=True)
class DataSource:
    """The corpus and the tokenizer that tokenizes it (and whether it is the ``--model`` folder's own), before any
    tokenizing; ``tokenizer_hash`` is the tokenizer's digest (``pipeline.tokenizer_digest``), which a resumed run's
    record holds."""

    corpus: Corpus
    tokenizer: Any
    tokenizer_from_model: bool
    tokenizer_hash: str


@dataclass
class TrainingData:
    """What Trainer gets: training blocks (memory-mapped, or a stream), and validation and test blocks (in memory:
    runs choose on validation and report on test); the tokenizer that made them, and whether it is the ``--model``
    folder's own."""

    train: Any
    val: TokenBlocks
    test: TokenBlocks
    label: str
    name: str  # the data as a model card names it (``Corpus.shared_name``: no folder of this machine)
    tokenizer: Any
    tokenizer_from_model: bool
    facts: dict[str, Any]  # what a sweep's journal records of the data: fingerprints and the splits' sizes


def world_size() -> int:
    """The number of training processes (torchrun sets ``WORLD_SIZE``), known before the Trainer starts."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def builds_here() -> bool:
    """Whether this process builds the caches (the first of its machine); the others wait for them."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def data_source(request: DataRequest, log: Any) -> DataSource:
    """The corpus ``request.data`` names and its tokenizer, before any tokenizing: a resumed run compares both with
    its checkpoint's first."""
    hub = HubSource(request.data or "", request.data_config, request.data_split, request.data_revision)
    corpus = resolve_corpus(request.data, request.text_column, hub)
    tokenizer, from_model = training_tokenizer(
        corpus, request.model, request.tokenizer, request.vocab_size, request.cache, builds_here(), log,
        request.held_out_rule,
    )
    return DataSource(corpus, tokenizer, from_model, tokenizer_digest(tokenizer))


def training_data(source: DataSource, request: DataRequest, log: Any) -> TrainingData:
    """The training, validation and test blocks of the source's corpus as ``request`` asks (cached or streamed,
    capped by ``max_tokens``), each evaluation reading the first ``evaluated_blocks`` held-out blocks; ``log`` says
    what the data holds and what ``max_steps`` makes of it."""
    data = _blocks(source, request, log)
    evaluated = request.evaluated_blocks
    if evaluated is not None and evaluated < max(len(data.val), len(data.test)):
        data.val, data.test = TokenBlocks(data.val.blocks[:evaluated]), TokenBlocks(data.test.blocks[:evaluated])
        log(f"each evaluation reads the first {evaluated} of those blocks (validation, and test at the end): the "
            "default for a run this short, a tenth of its training compute at most; --eval-blocks N evaluates "
            "N")  # fmt: skip
    return data


def _blocks(source: DataSource, request: DataRequest, log: Any) -> TrainingData:
    corpus, tokenizer, from_model = source.corpus, source.tokenizer, source.tokenizer_from_model
    builder = builds_here()
    length = request.seq_len
    per_step = request.blocks_per_step
    planned = request.max_steps * per_step * length
    steps = f"--max-steps {request.max_steps} x {per_step} blocks of {length} tokens = {planned:,} tokens"
    if request.streaming:
        if request.max_tokens is not None:
            raise ValueError(
                f"--max-tokens caps the cached data; with --streaming, --max-steps bounds the tokens ({steps}): "
                "drop --max-tokens"
            )
        held_out, held, plan = streaming_holdout(corpus, tokenizer, length, request.held_out_blocks,
                                                 request.held_out_rule)  # fmt: skip
        splits = {name: _plan_counts(plan, code, len(held_out[name])) for code, name in ((1, "val"), (2, "test"))}
        log(f"data: {corpus.label}, streamed: tokenized and packed as training reads it, so how many tokens it holds "
            f"is unknown in advance (the split read it once); {steps}")  # fmt: skip
        dropped = [kept for code, kept in plan.held.values() if code == DROPPED]
        past = sum(code == PAST for code, _ in plan.held.values())
        _log_held_out(plan.files, plan.why_not_files, splits, (len(dropped), sum(dropped)), (past, None), log)
        train = streaming_blocks(corpus, tokenizer, length, held, request.seed)
        facts = data_facts(corpus, tokenizer, None, {s: (None, c["tokens"], c["blocks"]) for s, c in splits.items()})
        return TrainingData(train, held_out["val"], held_out["test"], corpus.label, corpus.shared_name, tokenizer,
                            from_model, facts)  # fmt: skip
    workers = min(request.workers, os.cpu_count() or 1)
    if workers < request.workers:
        log(f"--data-workers {request.workers} is more than this machine's {workers} CPUs: tokenizing with {workers}")
    prepared = prepare_blocks(corpus, tokenizer, length, request.cache, request.held_out_blocks, workers, builder,
                              request.held_out_rule)  # fmt: skip
    meta = prepared.meta
    limit = None if request.max_tokens is None else request.max_tokens // length
    if limit is not None and limit < 1:
        raise ValueError(f"--max-tokens {request.max_tokens} is less than one block of --seq-len {length}")
    train = prepared.train(limit)
    train_tokens, all_train = len(train) * length, meta["train_blocks"] * length
    if limit is None:
        cap = ""
    elif limit < meta["train_blocks"]:
        cap = f", the first of its {all_train:,}: --max-tokens {request.max_tokens:,}"
    else:
        cap = f", all of it: --max-tokens {request.max_tokens:,} is more than it holds"
    how = (
        f"tokenized by an earlier run, read from the cache {prepared.folder}"
        if prepared.cached
        else f"tokenized in {prepared.seconds:.1f} s by {workers} process(es), cached in {prepared.folder}"
    )
    epochs = planned / train_tokens
    log(f"data: {corpus.label}: {meta['documents']:,} documents, {meta['tokens']:,} tokens (an end-of-text token "
        f"after each document); {how}")  # fmt: skip
    counted = ("documents", "files", "tokens", "blocks", "removed", "duplicates_kept")
    splits = {name: {what: meta[f"{name}_{what}"] for what in counted} for name in ("val", "test")}
    _log_held_out(meta["held_out_by"] == "files", meta["why_not_files"], splits,
                  (meta["dropped_documents"], meta["dropped_tokens"]),
                  (meta.get("past_documents", 0), meta.get("past_tokens", 0)), log)  # fmt: skip
    log(f"training on {train_tokens:,} tokens ({len(train):,} blocks){cap}; {steps} = {epochs:.3g} epochs")
    val_cut, test_cut = meta["val_cut_tokens"], meta["test_cut_tokens"]
    if val_cut or test_cut:
        log(f"held-out documents longer than the evaluation (more than --eval-blocks {request.held_out_blocks} x "
            f"--seq-len {length} tokens) were cut: only the tokens it evaluates were held out, and their other "
            f"{val_cut + test_cut:,} tokens train (validation {val_cut:,}, test {test_cut:,})")  # fmt: skip
    if epochs > EPOCH_WARNING:
        warnings.warn(
            f"--max-steps {request.max_steps} goes over the training tokens {epochs:.1f} times (more than "
            f"{EPOCH_WARNING} epochs): the model will learn them by heart; give more data or fewer --max-steps",
            stacklevel=2,
        )
    held = {s: (meta[f"{s}_documents"], meta[f"{s}_tokens"], meta[f"{s}_blocks"]) for s in ("val", "test")}
    facts = data_facts(corpus, tokenizer, train_tokens, held)
    return TrainingData(train, prepared.val(), prepared.test(), corpus.label, corpus.shared_name, tokenizer,
                        from_model, facts)  # fmt: skip


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


def _plan_counts(plan: HeldOutPlan, code: int, blocks: int) -> dict[str, Any]:
    """What a streamed run's log says of split ``code`` (``_log_held_out``), from its plan."""
    documents = sum(c == code for c, _ in plan.held.values())
    return {"documents": documents, "files": plan.held_files[code], "tokens": len(plan.split_ids(code)),
            "blocks": blocks, "removed": plan.removed[code], "duplicates_kept": plan.duplicates_kept[code]}  # fmt: skip


def _log_held_out(
    files: bool, why_not_files: str | None, splits: dict[str, dict[str, Any]], dropped: tuple[int, int],
    past: tuple[int, int | None], log: Any,
) -> None:  # fmt: skip
    """The log of what validation and test hold out (``split``): whole files and their pieces, or documents; the
    pieces of held-out files past what the splits evaluate (``past``: pieces and tokens, None where a stream has not
    counted them); the pieces removed as near-duplicates of training text; and warnings where a folder is held out by
    pieces, or a split keeps near-duplicates."""
    if why_not_files:
        warnings.warn(f"validation and test are held out by pieces of files, not whole files: {why_not_files}; a "
                      "held-out piece may then come from a file whose other pieces train (near-duplicates of training "
                      "text are still removed): give more files, or shorter ones", stacklevel=3)  # fmt: skip
    parts = []
    for name, label, when in (("val", "validation", ""), ("test", "test", ", evaluated at the end")):
        counts = splits[name]
        what = (f"{counts['files']:,} file{'s' * (counts['files'] != 1)} ({counts['documents']:,} pieces)" if files
                else f"{counts['documents']:,} documents")  # fmt: skip
        parts.append(f"{label}: {what}, {counts['tokens']:,} tokens ({counts['blocks']} blocks held out{when})")
        if counts["duplicates_kept"]:
            warnings.warn(f"the {label} candidates are near-duplicates of training text (the data repeats itself), "
                          f"and without them {label} would hold no block: they are held out anyway, so the {label} "
                          "loss partly measures text the model trained on; give more varied text",
                          stacklevel=3)  # fmt: skip
    log("; ".join(parts) + ("; whole files, none of whose pieces train" if files else ""))
    if past[0]:
        tokens = "" if past[1] is None else f" ({past[1]:,} tokens)"
        log(f"{past[0]:,} pieces{tokens} of the held-out files come after what validation and test hold out "
            "(--eval-blocks x --seq-len tokens each): they neither train nor are evaluated")  # fmt: skip
    removed = splits["val"]["removed"] + splits["test"]["removed"]
    if not files:
        fate = "they train"
    elif not dropped[0]:
        fate = "they train: their files are not held out"
    else:
        fate = (f"{dropped[0]:,} of them ({dropped[1]:,} tokens), pieces of held-out files, neither train nor are "
                "evaluated" + ("; the others train: their files are not held out" if dropped[0] < removed else ""))
    log(f"removed as near-duplicates of training text: {splits['val']['removed']:,} validation and "
        f"{splits['test']['removed']:,} test {'pieces' if files else 'documents'} (at least half of their word "
        f"5-grams are in training, found by MinHash LSH); {fate}")  # fmt: skip
