"""What a model of the post-normalising styles built from a config starts with, beyond the stock init
(method.md, "The family"): DeepNet's init for ``deepnorm`` (``deepnet_init_``), and a learned position table at
zero for ``post`` and ``deepnorm`` (``zero_positions_``). Weights converted from a trained model never pass here.

DeepNet (Wang et al., 2022, decoder-only formulas) draws every projection of a block from Xavier (Glorot) normal,
``N(0, gain^2 * 2 / (fan_in + fan_out))``, with gain ``beta = (8T)^(-1/4)`` on the feed-forward, value and output
projections and gain 1 on the query and key projections, for T decoder layers. The stock model's own init is
replaced, not scaled: GPT-2 and LLaMA draw N(0, 0.02) whatever the width, and beta times that gave GPT-2's
attention output projection at width 128 a std of 0.003 where DeepNet's formula gives 0.037. Biases stay as the stock
init leaves them (zero).

A learned position table (GPT-2's ``wpe``) starts at zero for ``post`` and ``deepnorm`` with
``post_zero_positions``: the stock N(0, 0.02) table is as large as the token embeddings, and a post-norm keeps
that random, position-only part of every state at its share through all blocks, where Pre-Norm's growing residual
stream dilutes it (docs/training.md, "Post-Norm on GPT-2", has the measurements).

Imports only torch and flat siblings (remote code).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .layouts import DEEPNORM_SCALED, LEARNED_POSITIONS, BlockLayout


def deepnet_beta(num_layers: int) -> float:
    """DeepNet's init gain for a decoder of ``num_layers`` layers: (8T)^(-1/4)."""
    return (8.0 * num_layers) ** -0.25


def xavier_normal_(weight: torch.Tensor, gain: float, fans: int) -> None:
    """Draw ``weight`` (or a view of it) in place from N(0, gain^2 * 2 / fans), ``fans`` = fan_in + fan_out."""
    weight.normal_(0.0, gain * math.sqrt(2.0 / fans))


def matrix_fans(weight: torch.Tensor) -> int:
    """fan_in + fan_out of one projection: the sum of its last two dimensions, whichever way round it stores them
    (nn.Linear is out x in, GPT-2's Conv1D in x out; a stacked expert tensor holds one matrix per expert)."""
    return weight.shape[-1] + weight.shape[-2]


@torch.no_grad()
def deepnet_init_(layer: nn.Module, layout: BlockLayout, num_layers: int, config: Any) -> None:
    """Draw the projections of one decoder ``layer`` as DeepNet does (module docstring).

    Every weight matrix of the feed-forward sublayer, and the value and output projections of the attention
    (``layouts.DEEPNORM_SCALED``) get gain beta; the attention's other matrices gain 1. A fused query/key/value
    weight (``BlockLayout.fused_values``) is three projections from the hidden state: its value rows get gain beta
    with fans hidden + value rows, its query and key rows gain 1 with fans 2 x hidden (exact for the queries, and
    for the keys where they have as many heads as the queries)."""
    beta = deepnet_beta(num_layers)
    for name, param in getattr(layer, layout.mlp).named_parameters():
        if name.endswith("weight") and param.dim() >= 2:
            xavier_normal_(param, beta, matrix_fans(param))
    attn = getattr(layer, layout.attn)
    values = layout.fused_values(attn, config) if layout.fused_values is not None else None
    hidden = config.hidden_size
    for name, param in attn.named_parameters():
        if not name.endswith("weight") or param.dim() < 2:
            continue
        if values is not None and values.untyped_storage().data_ptr() == param.untyped_storage().data_ptr():
            xavier_normal_(param, 1.0, 2 * hidden)
        else:
            xavier_normal_(param, beta if DEEPNORM_SCALED.search(name) else 1.0, matrix_fans(param))
    if values is not None:
        xavier_normal_(values, beta, hidden + values.numel() // hidden)


@torch.no_grad()
def zero_positions_(base_model: nn.Module) -> None:
    """Set the learned position table of ``base_model`` (``layouts.LEARNED_POSITIONS``), where it has one, to zero."""
    for name in LEARNED_POSITIONS:
        table = getattr(base_model, name, None)
        if isinstance(table, nn.Embedding) and not table.weight.is_meta:
            table.weight.zero_()
