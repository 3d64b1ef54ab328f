"""What ``hf-geonorm train`` takes: ``TrainOptions``, declared once, as a plain dataclass.

Each field carries its help and limits in its metadata and its choices in its type (``declarations`` says how),
from which the CLI generates the click options of ``train`` and ``sweep``; so an option's name, default, help and
limits are written here only, and the command line and ``validate`` refuse a value outside them with the same
message (``declarations.limit_problem``). ``trainer_arguments`` passes the options on to ``TrainingArguments``, and
``fields_used`` says which of them a run uses (``metrics.json``). ``validate`` checks the values before anything is
read or built.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from .._plumbing.declarations import OptionError, check_limits
from .presets import DEFAULT_POSITIONS, PRESETS, preset_positions

BRIDGE_ORDERS = ("together", "last-first")
TRACKERS = ("tensorboard", "trackio", "wandb")  # --report-to: each is its module's and its pip package's name
PRECISIONS = ("fp32", "bf16", "fp16")
PRESET_NAMES = tuple(PRESETS)
DATA_CACHE_ENV = "HF_GEONORM_DATA_CACHE"
BETA1, BETA2 = 0.9, 0.95  # AdamW's betas: beta2 is --adam-beta2's default
MAX_GRAD_NORM = 1.0
# The oldest transformers release a run works with (check_transformers_release), as (major, minor).
OLDEST_TRANSFORMERS = (5, 23)
MIN_LR_RATIO = 0.1
DEFAULT_TOKENIZER_VOCAB = 2048  # the tokenizer trained on the fly, unless --vocab-size or the config says
MIN_TOKENIZER_VOCAB = 260  # the byte-level alphabet's 256 bytes and the end-of-text token, and a few merges
TOKENIZER_SAMPLE_CHARS = 20_000_000  # the tokenizer trained on the fly learns from the first 20 MB of text
# A byte-level BPE tokenizer holds its 256 bytes and the end-of-text token, and learns at most one token per byte of
# the text it trains on (each merge joins two of the text's tokens into one); UTF-8 has at most 4 bytes a character.
BYTE_LEVEL_TOKENS = 257
# The BPE trainer of the tokenizers library reserves about 70 bytes of memory per token of its vocab_size when it
# starts (measured with tokenizers 0.22: 6.6 GB of address space for 10^8 tokens, 0.9 GB for 10^7), and aborts the
# whole process, without a Python exception, when the machine cannot give it.
TRAINER_BYTES_PER_TOKEN = 70


def machine_memory() -> int | None:
    """The machine's physical memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def trained_vocab_problem(vocab_size: int, text_bytes: int | None = None, asked: str = "--vocab-size") -> str | None:
    """Why a tokenizer of ``vocab_size`` tokens (``asked`` names where that number comes from) cannot be trained on
    the fly: more tokens than it can learn from ``text_bytes`` of text (None: the most it ever trains on), or more
    memory than the machine has for the tokenizers library's trainer; None when it can."""
    most = BYTE_LEVEL_TOKENS + (4 * TOKENIZER_SAMPLE_CHARS if text_bytes is None else text_bytes)
    if vocab_size > most:
        what = (f"at most {4 * TOKENIZER_SAMPLE_CHARS:,} bytes ({TOKENIZER_SAMPLE_CHARS // 10**6} million characters)"
                if text_bytes is None else f"{text_bytes:,} bytes")  # fmt: skip
        return (f"{asked} {vocab_size:,} is more than a tokenizer trained on the data can hold: byte-level BPE "
                f"has {BYTE_LEVEL_TOKENS} (bytes, end of text) and learns at most one more per byte it trains on, "
                f"here {what}, so {most:,} at most; give a smaller --vocab-size")  # fmt: skip
    memory = machine_memory()
    needed = vocab_size * TRAINER_BYTES_PER_TOKEN
    if memory is not None and needed > memory:
        return (f"{asked} {vocab_size:,} is more than this machine's memory can train: the tokenizers library "
                f"reserves about {TRAINER_BYTES_PER_TOKEN} bytes a token, {needed / 1e9:.1f} GB, and this machine has "
                f"{memory / 1e9:.1f} GB; give --vocab-size {memory // TRAINER_BYTES_PER_TOKEN:,} or less")  # fmt: skip
    return None


# A --model folder with trained weights is fine-tuned at FINE_TUNING_LR, the best of three rates a factor 3 apart on
# SmolLM2-135M (benchmarks/results/smollm2_tuning.md), with FINE_TUNING_WEIGHT_DECAY, the weight decay that
# measurement used; a model trained from scratch at the measured or published rate for its shape (``rate_rule``).
FINE_TUNING_LR = 1e-4
PRETRAINING_WEIGHT_DECAY, FINE_TUNING_WEIGHT_DECAY = 0.1, 0.0
WARMUP_SHARE = 10  # the default warm-up: a tenth of --max-steps (30 of the default 300)


MAX_TOKENS_PER_STEP = 1 << 24  # per process: 16.8M tokens, five times GPT-3's whole batch
MAX_SEED = 2**32 - 1  # numpy's seeds, which Trainer's set_seed draws on
# The default evaluation: EVAL_BLOCKS blocks' worth of documents held out for validation (and for test), all of them
# evaluated, or fewer of them where a run is so short that its evaluations would cost more than EVAL_SHARE of its
# compute (an evaluated block is one forward pass, a third of a trained block's forward and backward); the documents
# held out do not depend on the run's length. benchmarks/results/eval_cost.md measures both.
EVAL_BLOCKS = 64
EVAL_SHARE = 0.1
# The rule that picks the held-out files of a folder (``data.split``): 2, files in the order of their content's hash,
# each split taking them until it holds its evaluation, a long one too; 1, the rule before, files in path order and
# none longer than the evaluation. A sweep journal, a data cache entry or a checkpoint that does not record its rule
# was made under rule 1 and keeps it (``LEGACY_HELD_OUT_RULE``).
HELD_OUT_RULE = 2
LEGACY_HELD_OUT_RULE = 1
HELD_OUT_RULES = (LEGACY_HELD_OUT_RULE, HELD_OUT_RULE)
# Path options that an empty value would turn into the working folder: each refused, with what to give instead
EMPTY_REFUSED = {
    "output": "the folder to write",
    "data": "the text to train on (or leave --data out: the Python standard library's source)",
    "model": "the model folder or Hub id (or leave --model out: a model from --arch and --preset)",
    "tokenizer": "the tokenizer folder (or leave --tokenizer out)",
    "data_cache": "the folder to cache the tokenized data in (or leave --data-cache out)",
}
MIN_EVAL_BLOCKS = 8  # the held-out blocks are evaluated in multiples of 8 (data.prepare.evaluation_size)


def default_data_cache() -> str:
    """Where tokenized data is cached unless ``--data-cache`` says: ``$HF_GEONORM_DATA_CACHE``, else
    ``~/.cache/hf-geonorm/data`` (outside the run's folder, so that runs on the same data share it)."""
    return os.environ.get(DATA_CACHE_ENV) or str(Path("~/.cache/hf-geonorm/data").expanduser())


def trackers(report_to: str) -> list[str]:
    """The trackers of a ``--report-to`` value (``none``, one name, or a comma list); ``ValueError`` for an unknown
    name or one whose package is not installed (naming the pip package)."""
    names = [name.strip() for name in report_to.split(",") if name.strip()]
    if names == ["none"]:
        return []
    if not names or "none" in names:
        raise ValueError(f"--report-to is none or trackers joined by commas ({', '.join(TRACKERS)}); got {report_to!r}")
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"--report-to: unknown tracker {name!r}; choose from none, {', '.join(TRACKERS)}")
        if importlib.util.find_spec(name) is None:
            raise ValueError(f"--report-to {name}: the {name} package is not installed; pip install {name}")
    return names


def _lr_default_text() -> str:
    return (f"from scratch, the measured rate for the model's width, depth, architecture and norm style, or beyond "
            f"the measured shapes GPT-3's by size (the log says which); a --model with trained weights "
            f"{FINE_TUNING_LR:g}")


@dataclass
class TrainOptions:
    """Everything ``hf-geonorm train`` takes; the defaults are the embedded run. ``settings`` are the GeoNorm
    settings (``--norm-style``, ``--alpha``, ...: their options are shared with ``convert`` and ``init``)."""

    model: str | None = field(default=None, metadata={"help": (
        "A config folder from `hf-geonorm init` (trained from scratch) or a checkpoint folder (stock ones are "
        "converted; fine-tuned)."), "path": "existing folder", "default_text": "--arch at --preset size"})
    arch: str = field(default="gpt2", metadata={"help": "Stock model type to build when --model is not given."})
    # from the API also the sizes themselves (layers, width, heads: a mapping), as presets.preset_sizes takes them
    preset: Literal[PRESET_NAMES] | dict[str, int] = field(default="tiny", metadata={"help": (
        "Model size when --model is not given.")})
    settings: dict[str, Any] = field(default_factory=dict)
    data: str | None = field(default=None, metadata={"help": (
        "A text file, a folder of text files, a JSON lines or parquet file (its --text-column), a folder saved by "
        "`Dataset.save_to_disk`, or a `datasets` name."), "default_text": "the Python standard library's source"})
    text_column: str = field(default="text", metadata={"help": (
        "The column of JSON lines, CSV, parquet or `datasets` rows that holds the text.")})
    data_config: str | None = field(default=None, metadata={"help": (
        "The configuration of a `datasets` corpus (e.g. wikitext-2-raw-v1); with it, a local folder is read as a "
        "`datasets` dataset."), "metavar": "NAME"})  # fmt: skip
    data_split: str = field(default="train", metadata={"help": (
        "The split of a `datasets` corpus (or of a `save_to_disk` folder holding several) to train on; validation "
        "and test are held out of it by documents."), "metavar": "NAME"})  # fmt: skip
    data_revision: str | None = field(default=None, metadata={"help": (
        "The revision (branch, tag or commit) of a `datasets` corpus on the Hub; it keys the cache."),
        "metavar": "REV"})  # fmt: skip
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer folder.", "default_text": (
        "the model folder's, else a byte-level BPE trained on the data")})
    vocab_size: int | None = field(default=None, metadata={"help": (
        "Vocabulary of the tokenizer trained on the fly (not with a --model folder that has a tokenizer)."),
        "ge": MIN_TOKENIZER_VOCAB, "default_text": str(DEFAULT_TOKENIZER_VOCAB)})  # fmt: skip
    max_tokens: int | None = field(default=None, metadata={"help": "Train on the first N tokens of the data.",
                                                           "ge": 1, "metavar": "N", "default_text": "all of it"})
    streaming: bool = field(default=False, metadata={"help": (
        "Tokenize and pack the data as training reads it (a file, a folder or a `datasets` name), with no cache "
        "and no count of its tokens in advance.")})  # fmt: skip
    # which rule picks the held-out files (``HELD_OUT_RULE``): set by a sweep resumed from a journal, or a run
    # resumed from a checkpoint, begun under rule 1, so that its split stays what it was; no option of the command
    # line
    held_out_rule: int = HELD_OUT_RULE
    data_workers: int = field(default=1, metadata={"help": "Processes that tokenize the data.", "ge": 1})
    data_cache: str = field(default_factory=default_data_cache, metadata={"help": (
        "Folder the tokenized data (Arrow files) is cached in, shared by runs on the same data."), "path": "folder",
        "metavar": "DIR", "default_text": f"${DATA_CACHE_ENV}, else ~/.cache/hf-geonorm/data"})  # fmt: skip
    seq_len: int = field(default=128, metadata={"help": (
        "Tokens per block: the documents, each closed by the end-of-text token, are packed into blocks of this "
        "length (validation and test documents, held out one in 20 each, into their own). A model built from "
        f"--arch gets its preset's positions (tiny {preset_positions('tiny')}, the others {DEFAULT_POSITIONS}), or "
        "this many when longer."), "ge": 2})  # fmt: skip
    batch_size: int = field(default=16, metadata={"help": (
        "Blocks per step and process (with several processes the global batch is this times their number); also "
        "the evaluation batch."), "ge": 1})  # fmt: skip
    gradient_accumulation_steps: int = field(default=1, metadata={"help": (
        "Batches whose gradients add up to one optimizer step: each step trains on --batch-size x N x processes "
        "blocks, with the memory of --batch-size."), "ge": 1, "metavar": "N"})  # fmt: skip
    max_steps: int = field(default=300, metadata={"help": (
        "Optimizer steps the run ends at (a resumed run counts its checkpoint's steps)."), "ge": 1})
    lr: float | None = field(default=None, metadata={"help": (
        "Peak learning rate of AdamW: reached after --warmup-steps, then a cosine decay to --min-lr-ratio times it "
        "at --max-steps."), "gt": 0, "default_text": _lr_default_text()})  # fmt: skip
    # who gave ``lr`` when a program did rather than --lr (``rate_rule.SWEEP_RATE``: a rate of a sweep's grid), for
    # the card's and metrics.json's rate source; no option of the command line, no part of a sweep's key
    lr_source: str | None = None
    warmup_steps: int | None = field(default=None, metadata={"help": (
        "Steps over which the learning rate rises linearly to --lr (step s of them at (s+1)/STEPS of it)."),
        "ge": 0, "default_text": f"a {WARMUP_SHARE}th of --max-steps"})  # fmt: skip
    min_lr_ratio: float = field(default=MIN_LR_RATIO, metadata={"help": (
        "Where the cosine decay ends, as a share of --lr."), "ge": 0, "le": 1})
    weight_decay: float | None = field(default=None, metadata={"help": (
        "AdamW weight decay, on the weight matrices only (not on norms, biases, embeddings or GeoNorm's step "
        "parameters)."), "ge": 0, "default_text": f"{PRETRAINING_WEIGHT_DECAY:g} from scratch, "
        f"{FINE_TUNING_WEIGHT_DECAY:g} for a --model with trained weights"})  # fmt: skip
    adam_beta2: float = field(default=BETA2, metadata={"help": (
        f"AdamW's second-moment decay (beta1 is {BETA1}); gradients are clipped to norm {MAX_GRAD_NORM}."),
        "ge": 0, "lt": 1})  # fmt: skip
    precision: Literal[PRECISIONS] = field(default="fp32", metadata={"help": (
        "Arithmetic: fp32, or bfloat16 / float16 (CUDA) mixed precision."),
        "flags": {"--bf16": "bf16", "--fp16": "fp16"}})  # fmt: skip
    compile: bool = field(default=False, metadata={"help": "torch.compile the model."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": (
        "Recompute activations in the backward pass.")})
    fsdp: bool = field(default=False, metadata={"help": (
        "Shard parameters with FSDP2 (launch with torchrun or accelerate).")})
    lora: bool = field(default=False, metadata={"help": (
        "Train LoRA adapters (PEFT) instead of all weights; merged at the end.")})
    eval_every: int = field(default=50, metadata={"help": (
        "Steps between evaluations (and checkpoints); the first is at step 0."), "ge": 1})
    eval_blocks: int | None = field(default=None, metadata={"help": (
        "Blocks of --seq-len tokens evaluated for the validation loss, and as many for the test loss at the end: "
        "the held-out documents are taken until they fill them."), "ge": 1,
        "default_text": f"{EVAL_BLOCKS} held out, of which fewer (at least {MIN_EVAL_BLOCKS}) are evaluated where "
        f"evaluating all would cost more than {EVAL_SHARE:.0%} of the run's compute"})  # fmt: skip
    save_every: int | None = field(default=None, metadata={"help": "Steps between checkpoints.", "ge": 1,
                                                           "default_text": "--eval-every"})  # fmt: skip
    logging_steps: int = field(default=10, metadata={"help": (
        "Steps between the logged training loss, learning rate and gradient norm."), "ge": 1})
    report_to: str = field(default="none", metadata={"help": (
        "Where the logs also go: none, or tensorboard, trackio, wandb (a comma list); tensorboard writes under "
        "--output/runs."), "metavar": "TRACKERS"})  # fmt: skip
    bridge_anneal: int | None = field(default=None, metadata={"help": (
        "Anneal geo_bridge from the model's value b to 1.0 over STEPS steps (uptraining a converted Pre-Norm "
        "checkpoint into GeoNorm): step s runs at b + (1 - b) s/STEPS, 1.0 from step STEPS on (at most "
        "--max-steps)."), "ge": 1, "metavar": "STEPS"})  # fmt: skip
    bridge_order: Literal[BRIDGE_ORDERS] = field(default="together", metadata={"help": (
        "together: every update's bridge moves at once; last-first: one update at a time from the last, the "
        "updates whose conversion costs most taking longest (needs --bridge-anneal and a checkpoint converted "
        "with --calibrate).")})  # fmt: skip
    output: str = field(default="geonorm-run", metadata={"help": (
        "Folder for checkpoints, the final model, metrics.json and loss_curve.png."), "path": "folder"})
    keep_checkpoints: bool = field(default=False, metadata={"help": (
        "Keep the checkpoints once final/ and metrics.json are written: a finished run removes them (final/ is the "
        "model; their optimizer state, twice the weights again, serves only --resume).")})  # fmt: skip
    resume: bool = field(default=False, metadata={"help": (
        "Resume from the newest whole checkpoint in --output (a finished run is left as it is).")})
    force: bool = field(default=False, metadata={"help": (
        "Start a new run in a non-empty --output: the earlier run's checkpoints, final/, metrics.json and "
        "loss_curve.png are removed when training starts; other files stay.")})  # fmt: skip
    seed: int = field(default=0, metadata={"help": (
        "Seed of the model's initialisation and of the order the training blocks are drawn in."), "ge": 0,
        "le": MAX_SEED})  # fmt: skip

    def held_out_blocks(self) -> int:
        """The blocks' worth of documents held out for validation and for test: ``eval_blocks``, else
        ``EVAL_BLOCKS`` (whatever the run's length, so the training documents do not change with it)."""
        return EVAL_BLOCKS if self.eval_blocks is None else self.eval_blocks

    def validate(self) -> TrainOptions:
        import torch

        from ..errors import SettingsError, first_line
        from ..modeling.settings import GeoNormSettings

        check_transformers_release()  # before any option: no value makes an older transformers train
        for name, what in EMPTY_REFUSED.items():
            value = getattr(self, name)
            if value is not None and not os.fspath(value).strip():
                raise OptionError(f"--{name.replace('_', '-')} is empty (an unset shell variable?); give {what}")
        check_limits(self)
        problem = None if self.vocab_size is None else trained_vocab_problem(self.vocab_size)
        if problem is not None:  # before the tokenizers library would abort the process trying
            raise OptionError(problem)
        if self.max_tokens is not None and self.max_tokens < self.seq_len:
            raise OptionError(
                f"--max-tokens {self.max_tokens} is less than one block of --seq-len {self.seq_len}: give at least "
                f"{self.seq_len}"
            )
        per_step = self.batch_size * self.gradient_accumulation_steps * self.seq_len
        if per_step > MAX_TOKENS_PER_STEP:
            raise OptionError(
                f"--batch-size {self.batch_size} x --gradient-accumulation-steps {self.gradient_accumulation_steps} x "
                f"--seq-len {self.seq_len} = {per_step:,} tokens per optimizer step, beyond the limit of "
                f"{MAX_TOKENS_PER_STEP:,}: give fewer accumulation steps"
            )
        if not self.data_cache:
            raise ValueError("data_cache must name a folder")
        if self.held_out_rule not in HELD_OUT_RULES:
            raise ValueError(f"held_out_rule must be one of {HELD_OUT_RULES}; got {self.held_out_rule!r}")
        trackers(self.report_to)
        if self.bridge_anneal is not None and self.bridge_anneal > self.max_steps:
            raise ValueError(
                f"--bridge-anneal {self.bridge_anneal} is longer than --max-steps {self.max_steps}: the bridge would "
                f"stop short of 1.0; give a --bridge-anneal of at most {self.max_steps}, or more --max-steps"
            )
        if self.bridge_order != "together" and self.bridge_anneal is None:
            raise ValueError(
                f"--bridge-order {self.bridge_order} needs --bridge-anneal STEPS: it orders the updates of an anneal, "
                "and without one the bridge does not move"
            )
        if self.fsdp and not torch.accelerator.is_available():
            raise ValueError(
                "--fsdp: accelerate shards with FSDP on GPUs only, and this machine has none; drop --fsdp (under "
                "torchrun the CPU processes then train with DDP)"
            )
        if self.resume and self.force:
            raise ValueError("resume and force exclude each other: --resume continues the run, --force starts anew")
        try:
            GeoNormSettings.from_object(GeoNormSettings(), **self.settings)
        except ValueError as error:  # the settings are the caller's (command-line options)
            raise SettingsError(first_line(error)) from None
        if self.model is None:
            from ..checkpoints.patching import family_for

            family_for(self.arch)  # an unknown architecture, named with the supported ones
        return self


def check_transformers_release() -> None:
    """``UnsupportedTransformers`` (one line naming the release needed) below the oldest transformers a run works
    with: ``TrainingArguments(activation_checkpointing=...)``, which ``--gradient-checkpointing`` sets, is 5.23's.
    Loading, inference and ``generate`` run from the oldest release of the modelling code's range."""
    from ..modeling import transformers_versions as versions

    if versions.INSTALLED < OLDEST_TRANSFORMERS:
        needed = f">={'.'.join(map(str, OLDEST_TRANSFORMERS))},{versions.SUPPORTED_RANGE.split(',')[1]}"
        raise versions.UnsupportedTransformers(
            f"hf-geonorm train needs transformers {needed} (TrainingArguments' activation_checkpointing), but "
            f"{versions.INSTALLED_VERSION} is installed: pip install 'transformers{needed}'"
        )


def trainer_arguments(options: TrainOptions) -> dict[str, Any]:
    """The ``TrainingArguments`` the options set, each under the name Trainer gives the same value."""
    arguments = {
        "per_device_train_batch_size": options.batch_size,
        "per_device_eval_batch_size": options.batch_size,
        "gradient_accumulation_steps": options.gradient_accumulation_steps,
        "max_steps": options.max_steps,
        "learning_rate": options.lr,
        "warmup_steps": options.warmup_steps,
        "weight_decay": options.weight_decay,
        "adam_beta2": options.adam_beta2,
        "bf16": options.precision == "bf16",
        "fp16": options.precision == "fp16",
        "torch_compile": options.compile,
        "activation_checkpointing": options.gradient_checkpointing,
        "eval_steps": options.eval_every,
        "save_steps": options.save_every or options.eval_every,
        "logging_steps": options.logging_steps,
        "report_to": trackers(options.report_to),
        "seed": options.seed,
        "data_seed": options.seed,
        # a stream: every process reads its own shards, rather than the first process reading for all
        "accelerator_config": {"dispatch_batches": False} if options.streaming else None,
    }
    if options.fsdp:  # FSDP2 (fully_shard) over the decoder layers; run under torchrun or accelerate launch
        arguments |= {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": True}}
    return arguments


def fields_used(options: TrainOptions) -> dict[str, Any]:
    """The fields of ``options`` that apply to its run, with their values, as ``metrics.json`` records them:
    ``model``, else ``arch`` and ``preset``; ``lr_source`` only where a program gave the rate; the bridge's anneal
    and order only with an anneal."""
    unused = {"arch", "preset"} if options.model is not None else {"model"}
    if options.lr_source is None:
        unused.add("lr_source")
    if options.bridge_anneal is None:
        unused |= {"bridge_anneal", "bridge_order"}
    return {name: value for name, value in asdict(options).items() if name not in unused}
