"""Training GeoNorm models with transformers' Trainer: data, an on-the-fly tokenizer, the bridge anneal.

``hf-geonorm train`` is a thin command over :func:`run_training`. With no arguments it trains a tiny GeoNorm
GPT-2 on the Python standard library's own source files (present on every Python install, no download).
"""

from __future__ import annotations

import json
import math
import sysconfig
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from .patching import apply_geonorm, config_class_for, set_bridge
from .presets import fit_token_ids, preset_sizes
from .settings import GeoNormSettings

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".xml", ".c", ".h", ".js")


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
    resume: bool = False
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
        GeoNormSettings.from_object(GeoNormSettings(), **self.settings)
        return self


# ---- data ----


def stdlib_files() -> list[Path]:
    """The Python standard library's own top-level source files, sorted: text every Python install has."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def read_texts(data: str | None, max_chars: int) -> tuple[list[str], str]:
    """The documents of ``data`` (a text file, a folder of text files, or a ``datasets`` name) and a label.

    ``None`` reads the standard library's source. Reading stops after ``max_chars`` characters.
    """
    if data is None:
        files, label = stdlib_files(), "the Python standard library's source"
    else:
        path = Path(data)
        if path.is_file():
            files, label = [path], str(path)
        elif path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
            label = f"{len(files)} text files under {path}"
            if not files:
                raise ValueError(f"{data} holds no text files ({', '.join(TEXT_SUFFIXES)})")
        else:
            return _dataset_texts(data, max_chars), f"the datasets corpus {data!r}"
    texts, total = [], 0
    for file in files:
        text = file.read_text(encoding="utf-8", errors="replace")
        texts.append(text[: max_chars - total])
        total += len(texts[-1])
        if total >= max_chars:
            break
    if total == 0:
        raise ValueError(f"no text in {label}")
    return texts, label


def _dataset_texts(name: str, max_chars: int) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"--data {name!r} is neither a file nor a folder; reading a datasets corpus needs `pip install datasets`"
        ) from None
    try:
        corpus = datasets.load_dataset(name, split="train", streaming=True)
    except Exception as error:  # noqa: BLE001 - offline, unknown name, ...
        raise ValueError(f"cannot load the datasets corpus {name!r}: {str(error).splitlines()[0]}") from None
    texts, total = [], 0
    for row in corpus:
        text = row.get("text") if isinstance(row, dict) else None
        if not text:
            continue
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` (GPT-2's scheme), with one end-of-text token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


class TokenBlocks(Dataset):
    """Fixed-length blocks of token ids; each is its own label (the model shifts)."""

    def __init__(self, blocks: torch.Tensor) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[index], "labels": self.blocks[index]}


def token_blocks(tokenizer: Any, texts: list[str], seq_len: int) -> torch.Tensor:
    """All documents joined by the end-of-text token and cut into ``seq_len`` blocks (the tail dropped)."""
    separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        ids.extend(separator)
    count = len(ids) // seq_len
    if count < 2:
        raise ValueError(f"the data gives {len(ids)} tokens, fewer than two blocks of --seq-len {seq_len}")
    return torch.tensor(ids[: count * seq_len], dtype=torch.long).view(count, seq_len)


def split_blocks(blocks: torch.Tensor, val_fraction: float = 0.05) -> tuple[torch.Tensor, torch.Tensor]:
    """The last blocks (at least one, at most 64) are validation; the rest train."""
    n_val = min(64, max(1, int(len(blocks) * val_fraction)))
    return blocks[:-n_val], blocks[-n_val:]


# ---- model ----


def build_model(options: TrainOptions, tokenizer: Any) -> torch.nn.Module:
    """The model to train: a folder (config only: from scratch; with weights: loaded, converted when stock),
    or ``arch`` at ``preset`` size with dropout off. Settings given in ``options.settings`` override the
    folder's."""
    settings = options.settings
    if options.model is not None:
        config = AutoConfig.from_pretrained(options.model)
        has_weights = any(Path(options.model).glob("*.safetensors")) if Path(options.model).is_dir() else True
        if not config.model_type.startswith("geonorm_"):
            config = config_class_for(config.model_type).from_pretrained(options.model, **settings)
        else:
            for name, value in settings.items():
                setattr(config, name, value)
        if has_weights:
            model = AutoModelForCausalLM.from_pretrained(options.model, config=config)
            if settings:
                apply_geonorm(model, **settings)
            return model
        return AutoModelForCausalLM.from_config(config)
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
    config = family_config(**values, **settings)
    return AutoModelForCausalLM.from_config(config)


class BridgeAnneal(TrainerCallback):
    """Anneal ``geo_bridge`` linearly from its starting value to 1.0 over ``steps`` optimiser steps: the path
    from a converted Pre-Norm checkpoint (bridge 0: its exact outputs) to pure GeoNorm."""

    def __init__(self, model: torch.nn.Module, steps: int, start: float) -> None:
        self.model, self.steps, self.start = model, steps, float(start)

    def value_at(self, step: int) -> float:
        return min(1.0, self.start + (1.0 - self.start) * step / self.steps)

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's callback signature
        set_bridge(self.model, self.value_at(state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001
        if state.log_history:  # the Trainer has already stored a copy of ``logs`` there
            state.log_history[-1]["geo_bridge"] = self.value_at(state.global_step)


class RemoteCodeOnSave(TrainerCallback):
    """Give every Trainer checkpoint of a GeoNorm model its remote code and ``auto_map``."""

    def on_save(self, args, state, control, **kwargs):  # noqa: ANN001
        from .export import add_remote_code

        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and (checkpoint / "config.json").exists():
            add_remote_code(checkpoint)


def _plot_losses(history: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    train = [(h["step"], h["loss"]) for h in history if "loss" in h]
    evals = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
    fig, ax = plt.subplots(figsize=(6, 4))
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train loss")
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], marker="o", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _fsdp_arguments(options: TrainOptions) -> dict[str, Any]:
    """FSDP2 (fully_shard) over the decoder layers, when asked for; run under torchrun or accelerate launch."""
    if not options.fsdp:
        return {}
    return {"fsdp": "full_shard auto_wrap", "fsdp_config": {"fsdp_version": 2, "reshard_after_forward": True}}


def run_training(options: TrainOptions, log: Any = print) -> dict[str, Any]:
    """Train as ``options`` say; write checkpoints, the final model (with remote code), ``metrics.json`` and
    ``loss_curve.png`` under ``options.output``; return the metrics."""
    options.validate()
    torch.manual_seed(options.seed)
    output = Path(options.output)
    texts, label = read_texts(options.data, options.max_chars)
    if options.tokenizer is not None:
        tokenizer = AutoTokenizer.from_pretrained(options.tokenizer)
    elif options.model is not None and (Path(options.model) / "tokenizer.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(options.model)
    else:
        log(f"training a byte-level BPE tokenizer ({options.vocab_size} tokens) on {label}")
        tokenizer = train_tokenizer(texts, options.vocab_size)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    train_blocks, val_blocks = split_blocks(token_blocks(tokenizer, texts, options.seq_len))
    model = build_model(options, tokenizer)
    if options.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, fan_in_fan_out=model.config.model_type
                                                 == "geonorm_gpt2"))  # fmt: skip
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"data: {label}: {len(train_blocks)} train and {len(val_blocks)} validation blocks of {options.seq_len} "
        f"tokens; model: {type(model).__name__}, {n_params / 1e6:.2f}M parameters, norm_style "
        f"{getattr(model.config, 'norm_style', '?')}"
    )
    callbacks: list[TrainerCallback] = [RemoteCodeOnSave()]
    if options.bridge_anneal is not None:
        callbacks.append(BridgeAnneal(model, options.bridge_anneal, model.config.geo_bridge))
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
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=TokenBlocks(train_blocks),
        eval_dataset=TokenBlocks(val_blocks),
        callbacks=callbacks,
    )
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=True if options.resume else None)
    seconds = time.perf_counter() - start
    final_eval = trainer.evaluate()
    final_dir = output / "final"
    to_save = model.merge_and_unload() if options.lora else model
    if options.fsdp:
        trainer.save_model(str(final_dir))  # gathers the sharded weights; remote code added below
    main_process = trainer.is_world_process_zero()
    if main_process:
        from .export import add_remote_code, save_with_remote_code

        if options.fsdp:
            (final_dir / "training_args.bin").unlink(missing_ok=True)  # a pickle; the final folder is safetensors only
            tokenizer.save_pretrained(final_dir)
            add_remote_code(final_dir)
        else:
            save_with_remote_code(to_save, final_dir, tokenizer=tokenizer)
    history = trainer.state.log_history
    tokens = options.max_steps * options.batch_size * options.seq_len
    metrics = {
        "final_eval_loss": final_eval["eval_loss"],
        "final_eval_perplexity": math.exp(final_eval["eval_loss"]),
        "train_seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "steps": trainer.state.global_step,
        "parameters": n_params,
        "model_type": to_save.config.model_type,
        "settings": to_save.config.geonorm_settings().to_dict(),
        "data": label,
        "options": {k: v for k, v in asdict(options).items()},
        "log_history": history,
    }
    if not main_process:
        return metrics
    (output / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str), encoding="utf-8")
    plotted = _plot_losses(history, output / "loss_curve.png")
    log(
        f"final validation loss {metrics['final_eval_loss']:.4f} (perplexity {metrics['final_eval_perplexity']:.2f}); "
        f"{metrics['tokens_per_second']:.0f} tokens/s; model in {final_dir}; metrics in {output / 'metrics.json'}"
        + (f"; loss curve in {output / 'loss_curve.png'}" if plotted else "")
    )
    return metrics
