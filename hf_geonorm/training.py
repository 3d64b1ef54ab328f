"""Training GeoNorm models with transformers' Trainer: the model to train, the bridge anneal, and the run.

``hf-geonorm train`` is a thin command over :func:`run_training`. With no arguments it trains a tiny GeoNorm
GPT-2 on the Python standard library's own source files (present on every Python install, no download).

What a run leaves in its output folder, also when it is stopped:

- checkpoints and ``final/`` appear whole or not at all (written in hidden temporary folders, then moved into
  place); ``metrics.json`` and ``loss_curve.png`` are replaced in one step;
- an error, Ctrl-C or SIGTERM removes the temporary folders; in an output folder the run created, what the run
  wrote is removed too (and the folder, when that leaves it empty) unless a checkpoint of the run is there to
  resume from; files others put there stay;
- a non-finite training or validation loss stops the run with an error naming the step, before that step's
  checkpoint; nothing is published as final, and ``metrics.json`` is always strict JSON;
- SIGKILL leaves a hidden temporary folder, which the next run in the same output folder removes;
- ``--force`` removes the earlier run's checkpoints, ``final/``, ``metrics.json`` and plot when training starts;
- a resumed run starts from the newest whole checkpoint, skipping damaged ones with a warning; a checkpoint whose
  tensors do not match the model (missing, unexpected, other shapes) is an error; a finished run is left as it is.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback, TrainerState, TrainingArguments

from .atomic import atomic_directory, remove_tree, terminate_raises
from .evaluation import NonFiniteError, explain_non_finite, residual_modules
from .hub import save_shareable
from .loading import (
    PICKLE_WEIGHTS,
    SettingsError,
    first_line,
    load_model,
    open_source,
    resolve_settings,
)
from .modeling.geometry import per_update
from .modeling.settings import GeoNormSettings
from .patching import config_class_for, family_for
from .presets import fit_token_ids, preset_sizes
from .training_checkpoints import (
    CHECKPOINT,
    AtomicCheckpointTrainer,
    check_resumable,
    check_resumable_adapters,
    checkpoints,
    disk_full_named,
    is_leftover,
    remove_leftovers,
    resume_checkpoint,
)
from .training_data import TokenBlocks, read_texts, split_blocks, token_blocks, tokenizer_from, train_tokenizer


@dataclass
class TrainOptions:
    """Everything ``hf-geonorm train`` takes; the defaults are the embedded run."""

    model: str | None = None
    arch: str = "gpt2"
    preset: str = "tiny"
    settings: dict[str, Any] = field(default_factory=dict)
    data: str | None = None
    tokenizer: str | None = None
    vocab_size: int = 2048
    seq_len: int = 128
    batch_size: int = 16
    max_steps: int = 300
    lr: float = 2e-3
    warmup_steps: int = 30
    weight_decay: float = 0.0
    precision: str = "fp32"
    compile: bool = False
    gradient_checkpointing: bool = False
    lora: bool = False
    fsdp: bool = False
    eval_every: int = 50
    save_every: int | None = None
    output: str = "geonorm-run"
    bridge_anneal: int | None = None
    bridge_order: str = "together"
    resume: bool = False
    force: bool = False
    seed: int = 0
    max_chars: int = 4_000_000

    def validate(self) -> TrainOptions:
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16; got {self.precision!r}")
        for name in ("seq_len", "batch_size", "max_steps", "eval_every", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be a positive number; got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0; got {self.warmup_steps}")
        if self.bridge_anneal is not None and self.bridge_anneal < 1:
            raise ValueError(f"bridge_anneal must be a positive number of steps; got {self.bridge_anneal}")
        if self.bridge_order not in BRIDGE_ORDERS:
            raise ValueError(f"bridge_order must be one of {', '.join(BRIDGE_ORDERS)}; got {self.bridge_order!r}")
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
        return self


# ---- model ----


def model_from_folder(folder: str, settings: dict[str, Any]) -> torch.nn.Module:
    """The model of a folder, as GeoNorm with ``settings`` applied: its safetensors weights loaded strictly (a
    stock checkpoint is converted), or, for a config written to train from scratch (``hf-geonorm init``: no
    ``architectures``), freshly initialised. Pickle-only folders, weight files under other names and saved models
    without weights are refused."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{folder} has no config.json; give a folder from hf-geonorm init (a config to train from scratch) or a "
            "saved model (config.json and model.safetensors)"
        )
    source = open_source(path)
    full = resolve_settings(settings, source)
    if source.is_geonorm:
        config = AutoConfig.from_pretrained(path)
        for name, value in full.items():
            setattr(config, name, value)
    else:
        config = config_class_for(source.model_type).from_pretrained(path, **full)
    if source.weight_files:
        return load_model(source, dtype="float32", config=config)
    patterns = ("*.safetensors", "*.bin", *PICKLE_WEIGHTS)
    stray = sorted({file.name for pattern in patterns for file in path.glob(pattern)})
    if stray:  # weights under another name, or pickles: training from scratch would silently drop them
        raise ValueError(
            f"{folder} holds {', '.join(stray)} but no model.safetensors or model.safetensors.index.json: hf-geonorm "
            "reads a model's weights from model.safetensors (one file) or the shards its index names, never from "
            "pickle files; save the model again with save_pretrained (it writes model.safetensors), or rename a "
            "single safetensors file to model.safetensors (a config to train from scratch, from hf-geonorm init, "
            "has no weight files)"
        )
    if source.config.get("architectures"):
        raise ValueError(
            f"{folder} holds the config.json of a saved {source.config['architectures'][0]} but no weights "
            "(model.safetensors): they are missing; give the folder with its weights (a config to train from "
            "scratch comes from hf-geonorm init)"
        )
    return AutoModelForCausalLM.from_config(config)


def build_model(options: TrainOptions, tokenizer: Any) -> torch.nn.Module:
    """The model to train: ``options.model`` (see ``model_from_folder``), or ``arch`` at ``preset`` size with
    dropout off. Settings given in ``options.settings`` override the folder's."""
    if options.model is not None:
        return model_from_folder(options.model, options.settings)
    family_config = config_class_for(options.arch)
    values = preset_sizes(family_config, options.preset, max_length=options.seq_len)
    values["vocab_size"] = int(math.ceil(len(tokenizer) / 64) * 64)
    for name in ("bos_token_id", "eos_token_id"):
        values[name] = getattr(tokenizer, name)
    # no padding row: blocks are never padded, and a zero embedding row is a fixed point of the geodesic step
    # (a token whose id is also the pad id, often eos, would never move off zero)
    values["pad_token_id"] = None
    fit_token_ids(values, family_config)
    defaults = family_config()
    for name, value in vars(defaults).items():  # pretraining from scratch: no dropout, as nanoGPT and LLaMA
        if (name.endswith("pdrop") or name.endswith("dropout")) and isinstance(value, float):
            values[name] = 0.0
    try:
        config = family_config(**values, **options.settings)
    except ValueError as error:  # the preset's sizes are valid: the caller's settings do not fit them
        raise SettingsError(first_line(error)) from None
    return AutoModelForCausalLM.from_config(config)


BRIDGE_ORDERS = ("together", "last-first")
MIN_COST = 0.01  # nats: the least share weight of an update in a last-first anneal


def last_first_bridges(progress: float, weights: list[float]) -> list[float]:
    """Per-update bridge values ``progress`` (0 to 1) of the way through a last-first anneal: the updates reach 1
    one at a time, from the last to the first, update j over a share of the anneal proportional to weights[j]."""
    if progress >= 1.0:
        return [1.0] * len(weights)  # exactly: the sum of the shares may differ from the total by rounding
    largest = max(weights)
    scaled = [w / largest for w in weights]  # at most 1 each: huge finite weights (1e308) sum without overflow
    total, values, done = sum(scaled), [0.0] * len(scaled), 0.0
    for j in reversed(range(len(scaled))):
        reached = progress * total - done
        if scaled[j] > 0.0:
            values[j] = min(1.0, max(0.0, reached / scaled[j]))
        else:  # a share too small for a float (1e-320 of the largest): done as soon as its turn comes
            values[j] = 1.0 if reached > 0.0 else 0.0
        done += scaled[j]
    return values


def anneal_weights(costs: list[float]) -> list[float]:
    """The share weight of each update in a last-first anneal: the loss its conversion alone costs
    (``geo_bridge_costs``), at least ``MIN_COST`` (the updates that cost most take longest)."""
    return [max(cost, MIN_COST) for cost in costs]


class BridgeAnneal(TrainerCallback):
    """Anneal ``geo_bridge`` from its starting value to 1.0 over ``steps`` optimiser steps: the path from a
    converted Pre-Norm checkpoint (bridge 0: its exact outputs) to pure GeoNorm (docs/method.md, "The bridge").

    The schedule: optimiser step s (1-based) runs at ``value_at(s)``, ``start + (1 - start) * s / steps`` for
    ``"together"``, so the last anneal step (s = ``steps``) and every step after it run at exactly 1.0, and the
    model saved after it has bridge 1.0. The value logged at step s is the one step s ran at.

    ``order="together"`` moves every update's bridge linearly at once; ``"last-first"`` converts the updates one at
    a time from the last to the first, each over a share of the steps weighted by ``anneal_weights``; it needs the
    frames and bridge costs of ``convert --calibrate`` (without frames the Pre-Norm part of a half-bridged model is
    off scale)."""

    def __init__(self, model: torch.nn.Module | None, steps: int, start: float, order: str = "together") -> None:
        if order not in BRIDGE_ORDERS:
            raise ValueError(f"the bridge order must be one of {', '.join(BRIDGE_ORDERS)}; got {order!r}")
        self.model, self.steps, self.start, self.order = model, steps, start, order
        if order == "last-first":
            found = residual_modules(model)
            modules, layers = [module for _, _, module in found], len({layer for layer, _, _ in found})
            costs = getattr(model.config, "geo_bridge_costs", None)
            if not modules or any(module.frame is None for module in modules) or costs is None:
                raise ValueError(
                    "the last-first bridge order needs the Pre-Norm frames and bridge costs (geo_frames, "
                    "geo_bridge_costs) of a calibrated conversion: convert the Pre-Norm checkpoint with --bridge 0 "
                    "--calibrate TEXT first"
                )
            self.weights = anneal_weights(per_update("geo_bridge_costs", costs, layers, len(modules) // max(layers, 1)))
            self.start = [module.bridge for module in modules]

    def value_at(self, step: int) -> float | list[float]:
        """The bridge that optimiser step ``step`` (1-based) runs at, and the model holds after it (0: the start)."""
        progress = min(1.0, step / self.steps)
        if not isinstance(self.start, list):  # together, from one value
            return self.start + (1.0 - self.start) * progress
        if self.order == "together":
            shares = [progress] * len(self.start)
        else:
            shares = last_first_bridges(progress, self.weights)
        values = [1.0 if share >= 1.0 else b + (1.0 - b) * share for b, share in zip(self.start, shares, strict=True)]
        return 1.0 if all(v == 1.0 for v in values) else values

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's callback signature
        self.model.config.geo_bridge = self.value_at(state.global_step + 1)  # the model reads its config

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if state.log_history:  # the Trainer has already stored a copy of ``logs`` there (a list: its mean)
            value = self.value_at(state.global_step)  # what the step just taken ran at
            state.log_history[-1]["geo_bridge"] = value if isinstance(value, float) else sum(value) / len(value)


# ---- the run ----


class CheckedTrainer(AtomicCheckpointTrainer):
    """The Trainer of ``hf-geonorm train``: it stops at the first non-finite training or validation loss with a
    ``NonFiniteError`` naming the step, before anything of that step is saved (transformers' Trainer trains on,
    and its logs hide NaN losses), so no NaN model is ever published as a checkpoint or as final."""

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not torch.isfinite(loss).all():
            self._stop(f"the training loss at step {self.state.global_step + 1}", loss.item(), inputs["input_ids"])
        return loss

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        metrics = super().evaluate(*args, **kwargs)
        loss = metrics.get("eval_loss")
        if loss is not None and not math.isfinite(loss):
            self._stop(f"the validation loss at step {self.state.global_step}", loss, self.eval_dataset.blocks)
        return metrics

    def _stop(self, what: str, value: float, blocks: torch.Tensor) -> None:
        # the diagnosis runs the model again: in one process only (sharded models forward in all at once)
        why = f" ({explain_non_finite(self.model, blocks[:1].tolist())})" if self.args.world_size == 1 else ""
        raise NonFiniteError(
            f"{what} is {value}{why}; the run stops, with no final model: lower --lr (it is "
            f"{self.args.learning_rate:g}), or train in fp32 rather than fp16/bf16"
        )


def strict_json(value: Any) -> str:
    """``value`` as strict JSON (what every JSON parser reads): NaN and infinities, which ``json.dumps`` would
    write as the bare words NaN and Infinity, become null."""

    def finite(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return None
        if isinstance(item, dict):
            return {key: finite(v) for key, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [finite(v) for v in item]
        return item

    return json.dumps(finite(value), indent=2, default=str, allow_nan=False)


def _replace_file(path: Path, write: Any) -> None:
    """``write(tmp)`` to a hidden file next to ``path``, then move it over ``path`` in one step."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with disk_full_named(tmp, path):
            write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def plot_losses(history: list[dict[str, Any]], path: Path) -> None:
    """Draw the training and validation losses of a Trainer ``log_history`` to the PNG file ``path``."""
    from matplotlib.figure import Figure

    train = [(h["step"], h["loss"]) for h in history if "loss" in h]
    evals = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train loss")
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], marker="o", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend()
    fig.tight_layout()
    _replace_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def _fsdp_arguments(options: TrainOptions) -> dict[str, Any]:
    """FSDP2 (fully_shard) over the decoder layers, when asked for; run under torchrun or accelerate launch."""
    if not options.fsdp:
        return {}
    return {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": True}}  # wraps decoder layers


def _is_main_process() -> bool:
    """Rank 0 (or a single process), known before the Trainer starts the process group."""
    return os.environ.get("RANK", "0") == "0"


RESULTS = ("final", "metrics.json", "loss_curve.png")  # what a finished run adds beside its checkpoints


def _prepare_output(options: TrainOptions, output: Path, main: bool) -> tuple[Path | None, int]:
    """Clean up after killed runs, check the output folder, and find the checkpoint to resume from (and its
    step)."""
    if output.is_symlink() and not output.exists():
        raise ValueError(
            f"--output {output} is a dangling symbolic link (to {os.readlink(output)}, which does not exist); create "
            "the folder it points to, remove the link, or give another --output"
        )
    if main:
        for line in remove_leftovers(output):
            warnings.warn(line, stacklevel=3)
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is a file; give a folder")
    if options.resume:
        checkpoint, step = resume_checkpoint(output, warn=main)
        if step > options.max_steps:
            raise ValueError(
                f"--resume: {checkpoint.name} is at step {step} already, beyond --max-steps {options.max_steps}: "
                f"nothing to train; give a --max-steps above {step}"
            )
        return checkpoint, step
    if output.is_dir() and any(not is_leftover(entry) for entry in output.iterdir()) and not options.force:
        raise ValueError(f"--output {output} is not empty; pass --resume to continue it or --force to start anew")
    return None, 0


def _finished_metrics(output: Path, step: int) -> dict[str, Any] | None:
    """The metrics of the run in ``output`` when it finished at ``step`` (its final model and metrics.json are
    written), else None: a run killed while writing them is completed by ``--resume`` instead."""
    try:
        metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(metrics, dict) and metrics.get("steps") == step and (output / "final" / "config.json").is_file():
        return metrics
    return None


def _clear_earlier_run(output: Path, log: Any) -> None:
    """``--force``: remove the earlier run's checkpoints and results before this run trains, so that a run killed
    later never leaves them beside its own as if they were its results. Each is first renamed to a hidden
    temporary name in one step (a SIGKILL leaves that, which the next run removes), then removed."""
    earlier = [folder for _, folder in checkpoints(output)] + [output / name for name in RESULTS]
    removed = []
    for path in earlier:
        if not os.path.lexists(path):
            continue
        hidden = path.with_name(f".{path.name}.partial-{os.getpid()}-earlier")
        os.rename(path, hidden)
        remove_tree(hidden)
        removed.append(path.name)
    if removed:
        log(f"--force: removed the earlier run's {', '.join(removed)} in {output}")


@contextlib.contextmanager
def _output_removed_on_failure(output: Path, main: bool, log: Any) -> Iterator[list[Path]]:
    """On an error, Ctrl-C or SIGTERM in an output folder this run created: remove what the run put there (the
    paths the block adds to the yielded list) and the folders it created when they are empty, unless a
    checkpoint of the run is left to resume from. Whatever else is there (put by another process) stays."""
    created = [] if os.path.lexists(output) else [output, *(p for p in output.parents if not p.exists())]
    published: list[Path] = []
    with terminate_raises():
        try:
            yield published
        except BaseException:
            if main and created:
                if any(p.exists() for p in published if CHECKPOINT.fullmatch(p.name)):
                    log(f"the run stopped; its checkpoints are in {output}: continue with --resume")
                else:
                    for path in published:
                        remove_tree(path)
                    for folder in created:  # deepest first; only when empty
                        with contextlib.suppress(OSError):
                            folder.rmdir()
            raise


def run_training(options: TrainOptions, log: Any = print) -> dict[str, Any]:
    """Train as ``options`` say; write checkpoints, the final model (with remote code and a model card),
    ``metrics.json`` and ``loss_curve.png`` under ``options.output``; return the metrics. A resumed run that
    already finished returns its metrics and writes nothing."""
    options.validate()
    output = Path(options.output).expanduser().absolute()
    main = _is_main_process()
    with _output_removed_on_failure(output, main, log) as published:
        return _run(options, output, main, log, published)


def _run(options: TrainOptions, output: Path, main: bool, log: Any, published: list[Path]) -> dict[str, Any]:
    checkpoint, resumed_step = _prepare_output(options, output, main)
    if checkpoint is not None and resumed_step == options.max_steps:
        finished = _finished_metrics(output, resumed_step)
        if finished is not None:
            if main:
                log(
                    f"the run in {output} already finished at step {resumed_step}; nothing to do (its final model "
                    f"and metrics.json are left as they are; give a --max-steps above {resumed_step} to train on)"
                )
            return finished
        if main:
            log(f"{checkpoint.name} is at --max-steps {resumed_step}: nothing left to train; writing the final model")
    torch.manual_seed(options.seed)
    texts, label = read_texts(options.data, options.max_chars)
    if options.tokenizer is not None:
        tokenizer = tokenizer_from(options.tokenizer)
    elif options.model is not None and (Path(options.model) / "tokenizer.json").exists():
        tokenizer = tokenizer_from(options.model)
    else:
        log(f"training a byte-level BPE tokenizer ({options.vocab_size} tokens) on {label}")
        tokenizer = train_tokenizer(texts, options.vocab_size)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train_blocks, val_blocks = split_blocks(token_blocks(tokenizer, texts, options.seq_len))
    model = build_model(options, tokenizer)
    if checkpoint is not None:
        ignore = ("geo_bridge",) if options.bridge_anneal else ()
        check_resumable(model, checkpoint, ignore=ignore, given=options.settings)
    if options.lora:
        from peft import LoraConfig, get_peft_model

        conv1d = family_for(model.config.model_type).layout.conv1d  # GPT-2's Conv1D stores weights transposed
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, fan_in_fan_out=conv1d))
        if checkpoint is not None:
            check_resumable_adapters(model, checkpoint)
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"data: {label}: {len(train_blocks)} train and {len(val_blocks)} validation blocks of {options.seq_len} "
        f"tokens; model: {type(model).__name__}, {n_params / 1e6:.2f}M parameters, norm_style "
        f"{getattr(model.config, 'norm_style', '?')}"
    )
    callbacks: list[TrainerCallback] = []
    if options.bridge_anneal is not None:
        anneal = BridgeAnneal(model, options.bridge_anneal, model.config.geo_bridge, options.bridge_order)
        model.config.geo_bridge = anneal.value_at(resumed_step)  # what the checkpoint last ran at (0: the start)
        callbacks.append(anneal)
    args = TrainingArguments(
        output_dir=str(output),
        max_steps=options.max_steps,
        per_device_train_batch_size=options.batch_size,
        per_device_eval_batch_size=options.batch_size,
        learning_rate=options.lr,
        warmup_steps=options.warmup_steps,
        weight_decay=options.weight_decay,
        lr_scheduler_type="cosine",
        bf16=options.precision == "bf16",
        fp16=options.precision == "fp16",
        torch_compile=options.compile,
        activation_checkpointing=options.gradient_checkpointing,
        eval_strategy="steps",
        eval_steps=options.eval_every,
        logging_steps=max(1, min(10, options.eval_every)),
        save_strategy="steps",
        save_steps=options.save_every or options.eval_every,
        save_total_limit=2,
        logging_nan_inf_filter=False,  # a NaN loss is an error (CheckedTrainer), never averaged away
        report_to=[],
        seed=options.seed,
        data_seed=options.seed,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        **_fsdp_arguments(options),
    )
    trainer = CheckedTrainer(
        model=model,
        published=published,
        args=args,
        train_dataset=TokenBlocks(train_blocks),
        eval_dataset=TokenBlocks(val_blocks),
        callbacks=callbacks,
    )
    if options.fsdp and not trainer.is_fsdp_enabled:
        raise ValueError(
            f"--fsdp: accelerate did not shard this {trainer.accelerator.distributed_type.value} run with FSDP; "
            "launch it with torchrun or accelerate launch on GPUs, or drop --fsdp"
        )
    if options.force and main:
        _clear_earlier_run(output, log)
    start = time.perf_counter()
    if checkpoint is not None and resumed_step == options.max_steps:  # e.g. killed while writing final/
        trainer._load_from_checkpoint(str(checkpoint))  # what train() would do first, then run one step too many
        trainer.state = TrainerState.load_from_json(str(checkpoint / "trainer_state.json"))
    else:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint is not None else None)
    seconds = time.perf_counter() - start
    final_eval = trainer.evaluate()
    to_save = model.merge_and_unload() if options.lora else model
    # FSDP: every process takes part in gathering the full weights; the main process writes them
    state_dict = trainer.accelerator.get_state_dict(trainer.model) if trainer.is_fsdp_enabled else None
    final_dir = output / "final"
    if trainer.is_world_process_zero():
        with atomic_directory(final_dir, force=True) as tmp, disk_full_named(tmp, final_dir):
            save_shareable(to_save, tmp, tokenizer=tokenizer, **({"state_dict": state_dict} if state_dict else {}))
        published.append(final_dir)
    steps_run = trainer.state.global_step - resumed_step
    tokens = steps_run * options.batch_size * trainer.args.world_size * options.seq_len
    loss = final_eval["eval_loss"]  # finite: CheckedTrainer.evaluate
    metrics = {
        "final_eval_loss": loss,
        "final_eval_perplexity": math.exp(loss) if loss < math.log(sys.float_info.max) else math.inf,
        "steps": trainer.state.global_step,
        "resumed_from_step": resumed_step,
        "train_seconds": seconds,  # this process's trainer.train(), evaluations and checkpoints included
        "tokens_per_second": tokens / seconds if steps_run else 0.0,  # tokens of the steps run, all processes
        "parameters": n_params,
        "model_type": to_save.config.model_type,
        "settings": to_save.config.geonorm_settings().to_dict(),
        "data": label,
        "options": asdict(options),
        "log_history": trainer.state.log_history,
    }
    if not trainer.is_world_process_zero():
        return metrics
    text = strict_json(metrics)
    _replace_file(output / "metrics.json", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    published.append(output / "metrics.json")
    curve = output / "loss_curve.png"
    try:
        plot_losses(metrics["log_history"], curve)
        published.append(curve)
    except Exception as error:  # noqa: BLE001 - the run is done; the plot is reported as not written
        warnings.warn(f"{curve} was not written: {type(error).__name__}: {first_line(error)}", stacklevel=2)
        curve = None
    resumed = f" (steps {resumed_step + 1}-{metrics['steps']} in this run)" if resumed_step else ""
    log(
        f"final validation loss {metrics['final_eval_loss']:.4f} (perplexity {metrics['final_eval_perplexity']:.2f}); "
        f"{metrics['tokens_per_second']:.0f} tokens/s{resumed}; model in {final_dir}; metrics in "
        f"{output / 'metrics.json'}" + (f"; loss curve in {curve}" if curve else "")
    )
    return metrics
