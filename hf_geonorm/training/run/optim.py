"""The one optimizer recipe and learning-rate schedule: ``hf-geonorm train`` trains with Trainer's optimizer over
the parameter groups of ``decayed_parameter_names`` (any ``optim=`` of TrainingArguments keeps them) and with
``make_scheduler``.

AdamW with betas (0.9, ``beta2``), weight decay on the weight matrices only (never on norms, biases, embeddings
or GeoNorm's scalar ``step_scale``/``step_bias``), a linear warm-up to the peak over ``warmup`` steps and a cosine
decay to ``min_ratio`` of it at ``total`` steps, and the gradient norm clipped to 1.0.

What training with it takes, said before a run starts (``run_sizes``): in one process's memory the weights, their
gradients and AdamW's two moments (counted from the model's own tensors) and the activations of a step's blocks (an
estimate by tokens a step, ``--batch-size`` x ``--seq-len``, from the model's sizes); on disk ``final/`` and each
checkpoint (the weights and the moments, which ``--resume`` needs).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..options import MIN_LR_RATIO, TrainOptions


def lr_factor(step: int, warmup: int, total: int, min_ratio: float = MIN_LR_RATIO) -> float:
    """The learning rate of optimizer step ``step`` (0-based) as a share of the peak: ``(step + 1) / warmup``
    during the warm-up (the first step already moves), then a cosine from 1 down to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def peak_reached(lr: float, steps: int, warmup: int, total: int, min_ratio: float = MIN_LR_RATIO) -> float:
    """The highest learning rate of the first ``steps`` optimizer steps of the schedule ``lr_factor`` lays out."""
    return lr * max((lr_factor(step, warmup, total, min_ratio) for step in range(steps)), default=0.0)


def decayed_parameter_names(model: nn.Module) -> set[str]:
    """The names (as ``model.named_parameters`` gives them) of the parameters weight decay applies to: the weight
    matrices (two or more dimensions) of every module but the embeddings. Decay pulls a weight towards zero; a
    norm's gain, a bias, a step size or an embedding row has no reason to be small."""
    embeddings = {id(p) for module in model.modules() if isinstance(module, nn.Embedding) for p in module.parameters()}
    return {name for name, p in model.named_parameters() if p.ndim >= 2 and id(p) not in embeddings}


def make_scheduler(
    optimizer: torch.optim.Optimizer, warmup: int, total: int, min_ratio: float = MIN_LR_RATIO
) -> LambdaLR:
    """The schedule ``lr_factor`` over ``optimizer``'s peak learning rate; ``step()`` after every optimizer step."""
    return LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total, min_ratio))


GRADIENT_BYTES = 4  # float32: Trainer keeps the weights, their gradients and AdamW's moments in float32
ADAM_MOMENTS = 2
# The activations a step saves for its backward pass, in float32 values per token: per layer, a few states of the
# model's width (norm inputs and outputs, queries, keys, values, the attention's output, the residual update's) and
# of the MLP's inner width; and the logits, with their shifted copy, log-softmax and gradient. On SmolLM2-135M at
# 4 x 256 tokens a step: 2.27 GB, in a process that peaked at 4.65 GB with 2.15 GB of weights, gradients and moments
# and the libraries' own (benchmarks/fine_tune_memory.py).
LAYER_STATES, LAYER_INNER_STATES, LOGITS_COPIES = 10, 4, 4
CHECKPOINTS_KEPT = 2  # Trainer's save_total_limit while the run trains


def _bytes(tensors: dict[int, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass
class RunSizes:
    """The bytes a run takes: in memory (``weights``, ``gradients``, ``optimizer``, ``activations`` of ``tokens``
    tokens a step) and on disk (``final_model``: final/'s weights; ``checkpoint``: one checkpoint's weights and
    optimizer state; ``checkpoints``: how many the run writes)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    tokens: int
    final_model: int
    checkpoint: int
    checkpoints: int

    @property
    def memory(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "memory": self.memory}

    def lines(self, options: TrainOptions) -> list[str]:
        """What the run will take, in two log lines."""
        tokens = f"{options.batch_size} blocks of {options.seq_len} tokens a step"
        kept = ("kept at the end (--keep-checkpoints)" if options.keep_checkpoints else
                "removed once final/ is written (--keep-checkpoints keeps them)")  # fmt: skip
        return [
            f"memory, estimated: about {size(self.memory)} a process: weights {size(self.weights)}, gradients "
            f"{size(self.gradients)}, AdamW's two moments {size(self.optimizer)}, activations about "
            f"{size(self.activations)} ({tokens}, in float32; a smaller --batch-size with "
            "--gradient-accumulation-steps, or --gradient-checkpointing, holds less)",
            f"disk, estimated: final/ {size(self.final_model)}; checkpoints {size(self.checkpoint)} each (the weights "
            f"and the optimizer state --resume needs), {self.checkpoints} written, at most "
            f"{min(self.checkpoints, CHECKPOINTS_KEPT)} at a time, {kept}",
        ]


def size(count: int) -> str:
    """Bytes as a log line gives them: GB, MB or KB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if count >= scale:
            return f"{count / scale:.2f} {unit}"
    return f"{count / 1e3:.0f} KB"


def run_sizes(model: torch.nn.Module, options: TrainOptions, resumed_step: int = 0) -> RunSizes:
    """The sizes of a run of ``options`` on ``model`` (with its LoRA adapters when it trains them), from the step
    ``resumed_step`` on: each tensor counted once (a tied embedding and head are one)."""
    parameters = {p.data_ptr(): p for p in model.parameters()}
    trained = {key: p for key, p in parameters.items() if p.requires_grad}
    state = {t.data_ptr(): t for name, t in model.state_dict().items() if "lora_" not in name}  # final/: merged
    config = model.config
    width = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * width
    layers = config.num_hidden_layers
    per_token = LOGITS_COPIES * config.vocab_size + (
        layers * width + LAYER_STATES * width + LAYER_INNER_STATES * inner
        if options.gradient_checkpointing  # each layer's input, and one layer's states at a time, recomputed
        else layers * (LAYER_STATES * width + LAYER_INNER_STATES * inner)
    )
    tokens = options.batch_size * options.seq_len
    moments = sum(p.numel() for p in trained.values()) * GRADIENT_BYTES * ADAM_MOMENTS
    saved_weights = _bytes(trained) if options.lora else _bytes(state)  # a LoRA checkpoint: the adapters
    every = options.save_every or options.eval_every  # a checkpoint every so many steps, and one at the last
    checkpoints = options.max_steps // every - resumed_step // every + (options.max_steps % every != 0)
    return RunSizes(
        weights=_bytes(parameters),
        gradients=sum(p.numel() for p in trained.values()) * GRADIENT_BYTES,
        optimizer=moments,
        activations=tokens * per_token * GRADIENT_BYTES,
        tokens=tokens,
        final_model=_bytes(state),
        checkpoint=saved_weights + moments,
        checkpoints=checkpoints if options.max_steps > resumed_step else 0,
    )
