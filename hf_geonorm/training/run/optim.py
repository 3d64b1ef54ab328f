"""The one optimizer recipe and learning-rate schedule: ``hf-geonorm train`` trains with Trainer's optimizer over
the parameter groups of ``decayed_parameter_names`` (any ``optim=`` of TrainingArguments keeps them) and with
``make_scheduler``.

AdamW with betas (0.9, ``beta2``), weight decay on the weight matrices only (never on norms, biases, embeddings
or GeoNorm's scalar ``step_scale``/``step_bias``), a linear warm-up to the peak over ``warmup`` steps and a cosine
decay to ``min_ratio`` of it at ``total`` steps, and the gradient norm clipped to 1.0.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ..options import MIN_LR_RATIO


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
