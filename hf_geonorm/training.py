"""Training GeoNorm models with transformers' Trainer: the model to train, the bridge anneal, and the run.

``hf-geonorm train`` is a thin command over :func:`run_training`. With no arguments it trains a tiny GeoNorm
GPT-2 on the Python standard library's own source files (present on every Python install, no download).

What a run leaves in its output folder, also when it is stopped:

- checkpoints and ``final/`` appear whole or not at all (written in hidden temporary folders, then moved into
  place); ``metrics.json`` and ``loss_curve.png`` are replaced in one step;
- an error, Ctrl-C or SIGTERM removes the temporary folders, and an output folder the run created is removed
  again unless it holds a checkpoint to resume from;
- SIGKILL leaves a hidden temporary folder, which the next run in the same output folder removes;
- a resumed run starts from the newest whole checkpoint, skipping damaged ones with a warning.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
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
from .evaluation import residual_modules
from .geometry import per_update
from .hub import save_shareable
from .loading import PICKLE_WEIGHTS, check_weight_files, first_line, load_model, open_source, resolve_settings
from .patching import config_class_for, family_for
from .presets import fit_token_ids, preset_sizes
from .settings import GeoNormSettings
from .training_checkpoints import (
    AtomicCheckpointTrainer,
    check_resumable,
    checkpoints,
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
        if self.fsdp and not torch.accelerator.is_available():
            raise ValueError(
                "--fsdp: accelerate shards with FSDP on GPUs only, and this machine has none; drop --fsdp (under "
                "torchrun the CPU processes then train with DDP)"
            )
        if self.resume and self.force:
            raise ValueError("resume and force exclude each other: --resume continues the run, --force starts anew")
        GeoNormSettings.from_object(GeoNormSettings(), **self.settings)
        return self


# ---- model ----


def model_from_folder(folder: str, settings: dict[str, Any]) -> torch.nn.Module:
    """The model of a folder, as GeoNorm with ``settings`` applied: its safetensors weights loaded strictly (a
    stock checkpoint is converted), or, for a config written to train from scratch (``hf-geonorm init``: no
    ``architectures``), freshly initialised. Pickle-only folders and saved models without weights are refused."""
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
    if any(next(path.glob(pattern), None) for pattern in PICKLE_WEIGHTS):
        check_weight_files(source)  # raises: pickle weights are never loaded
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
    config = family_config(**values, **options.settings)
    return AutoModelForCausalLM.from_config(config)


BRIDGE_ORDERS = ("together", "last-first")
MIN_COST = 0.01  # nats: the least share weight of an update in a last-first anneal


def last_first_bridges(progress: float, weights: list[float]) -> list[float]:
    """Per-update bridge values ``progress`` (0 to 1) of the way through a last-first anneal: the updates reach 1
    one at a time, from the last to the first, update j over a share of the anneal proportional to weights[j]."""
    if progress >= 1.0:
        return [1.0] * len(weights)  # exactly: the sum of the shares may differ from the total by rounding
    total, values, done = sum(weights), [0.0] * len(weights), 0.0
    for j in reversed(range(len(weights))):
        values[j] = min(1.0, max(0.0, (progress * total - done) / weights[j]))
        done += weights[j]
    return values


def anneal_weights(costs: list[float]) -> list[float]:
    """The share weight of each update in a last-first anneal: the loss its conversion alone costs
    (``geo_bridge_costs``), at least ``MIN_COST`` (the updates that cost most take longest)."""
    return [max(cost, MIN_COST) for cost in costs]


class BridgeAnneal(TrainerCallback):
    """Anneal ``geo_bridge`` from its starting value to 1.0 over ``steps`` optimiser steps: the path from a
    converted Pre-Norm checkpoint (bridge 0: its exact outputs) to pure GeoNorm (docs/method.md, "The bridge").

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
        self.model.config.geo_bridge = self.value_at(state.global_step)  # the model reads its config

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if state.log_history:  # the Trainer has already stored a copy of ``logs`` there (a list: its mean)
            value = self.value_at(state.global_step)
            state.log_history[-1]["geo_bridge"] = value if isinstance(value, float) else sum(value) / len(value)


# ---- outputs ----


def _replace_file(path: Path, write: Any) -> None:
    """``write(tmp)`` to a hidden file next to ``path``, then move it over ``path`` in one step."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
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


def _prepare_output(options: TrainOptions, output: Path, main: bool, log: Any) -> tuple[Path | None, int]:
    """Clean up after killed runs, check the output folder, and find the checkpoint to resume from (and its
    step). ``--force`` starts anew: the checkpoints of the earlier run are removed."""
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
        if step == options.max_steps and main:
            log(f"{checkpoint.name} is at --max-steps {step}: nothing left to train; writing the final model from it")
        return checkpoint, step
    if output.is_dir() and any(not is_leftover(entry) for entry in output.iterdir()) and not options.force:
        raise ValueError(f"--output {output} is not empty; pass --resume to continue it or --force to start anew")
    if options.force and main:
        earlier = checkpoints(output)
        for _, folder in earlier:
            remove_tree(folder)
        if earlier:
            log(f"--force: removed {len(earlier)} checkpoint(s) of an earlier run in {output}")
    return None, 0


@contextlib.contextmanager
def _output_removed_on_failure(output: Path, main: bool, log: Any) -> Iterator[None]:
    """On an error, Ctrl-C or SIGTERM: remove the output folder (and the parents) this run created, unless it
    holds a checkpoint to resume from."""
    created = [] if output.exists() else [output, *(p for p in output.parents if not p.exists())]
    with terminate_raises():
        try:
            yield
        except BaseException:
            if main and created:
                if checkpoints(output):
                    log(f"the run stopped; its checkpoints are in {output}: continue with --resume")
                else:
                    remove_tree(output)
                    for parent in created[1:]:  # deepest first
                        with contextlib.suppress(OSError):
                            parent.rmdir()
            raise


def run_training(options: TrainOptions, log: Any = print) -> dict[str, Any]:
    """Train as ``options`` say; write checkpoints, the final model (with remote code and a model card),
    ``metrics.json`` and ``loss_curve.png`` under ``options.output``; return the metrics."""
    options.validate()
    output = Path(options.output).expanduser().absolute()
    main = _is_main_process()
    with _output_removed_on_failure(output, main, log):
        return _run(options, output, main, log)


def _run(options: TrainOptions, output: Path, main: bool, log: Any) -> dict[str, Any]:
    checkpoint, resumed_step = _prepare_output(options, output, main, log)
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
        check_resumable(model, checkpoint, ignore=("geo_bridge",) if options.bridge_anneal else ())
    if options.lora:
        from peft import LoraConfig, get_peft_model

        conv1d = family_for(model.config.model_type).layout.conv1d  # GPT-2's Conv1D stores weights transposed
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, fan_in_fan_out=conv1d))
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"data: {label}: {len(train_blocks)} train and {len(val_blocks)} validation blocks of {options.seq_len} "
        f"tokens; model: {type(model).__name__}, {n_params / 1e6:.2f}M parameters, norm_style "
        f"{getattr(model.config, 'norm_style', '?')}"
    )
    callbacks: list[TrainerCallback] = []
    if options.bridge_anneal is not None:
        callbacks.append(BridgeAnneal(model, options.bridge_anneal, model.config.geo_bridge, options.bridge_order))
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
        report_to=[],
        seed=options.seed,
        data_seed=options.seed,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        **_fsdp_arguments(options),
    )
    trainer = AtomicCheckpointTrainer(
        model=model,
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
        with atomic_directory(final_dir, force=True) as tmp:
            save_shareable(to_save, tmp, tokenizer=tokenizer, **({"state_dict": state_dict} if state_dict else {}))
    steps_run = trainer.state.global_step - resumed_step
    tokens = steps_run * options.batch_size * trainer.args.world_size * options.seq_len
    metrics = {
        "final_eval_loss": final_eval["eval_loss"],
        "final_eval_perplexity": math.exp(final_eval["eval_loss"]),
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
    text = json.dumps(metrics, indent=2, default=str)
    _replace_file(output / "metrics.json", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    curve = output / "loss_curve.png"
    try:
        plot_losses(metrics["log_history"], curve)
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
