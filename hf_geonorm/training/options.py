"""What ``hf-geonorm train`` takes (``TrainOptions``), checked before anything is read or built."""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..loading import SettingsError, first_line
from ..modeling.settings import GeoNormSettings
from .optim import BETA2, MIN_LR_RATIO

BRIDGE_ORDERS = ("together", "last-first")
TRACKERS = ("tensorboard", "trackio", "wandb")  # --report-to: each is its module's and its pip package's name
DATA_CACHE_ENV = "HF_GEONORM_DATA_CACHE"


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


@dataclass
class TrainOptions:
    """Everything ``hf-geonorm train`` takes; the defaults are the embedded run."""

    model: str | None = None
    arch: str = "gpt2"
    preset: str = "tiny"
    settings: dict[str, Any] = field(default_factory=dict)
    data: str | None = None
    tokenizer: str | None = None
    vocab_size: int | None = None  # of the tokenizer trained on the fly; None: model.DEFAULT_TOKENIZER_VOCAB
    seq_len: int = 128
    batch_size: int = 16
    gradient_accumulation_steps: int = 1
    max_steps: int = 300
    lr: float = 2e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    adam_beta2: float = BETA2
    min_lr_ratio: float = MIN_LR_RATIO
    precision: str = "fp32"
    compile: bool = False
    gradient_checkpointing: bool = False
    lora: bool = False
    fsdp: bool = False
    eval_every: int = 50
    logging_steps: int = 10
    report_to: str = "none"
    save_every: int | None = None
    output: str = "geonorm-run"
    bridge_anneal: int | None = None
    bridge_order: str = "together"
    resume: bool = False
    force: bool = False
    seed: int = 0
    max_tokens: int | None = None
    streaming: bool = False
    data_workers: int = 1
    data_cache: str = field(default_factory=default_data_cache)

    def validate(self) -> TrainOptions:
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16; got {self.precision!r}")
        for name in (
            "seq_len", "batch_size", "gradient_accumulation_steps", "max_steps", "eval_every", "logging_steps",
            "data_workers",
        ):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer; got {getattr(self, name)}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive integer; got {self.vocab_size}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer (or None: all of the data); got {self.max_tokens}")
        if not self.data_cache:
            raise ValueError("data_cache must name a folder")
        trackers(self.report_to)
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be a positive number; got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0; got {self.warmup_steps}")
        if not 0 <= self.weight_decay < math.inf:
            raise ValueError(f"weight_decay must be a number >= 0; got {self.weight_decay}")
        if not 0 <= self.adam_beta2 < 1:
            raise ValueError(f"adam_beta2 must be in [0, 1); got {self.adam_beta2}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1]; got {self.min_lr_ratio}")
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
