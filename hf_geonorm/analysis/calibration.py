"""Step sizes for converting a pretrained Pre-Norm model, measured from the model itself.

Pre-Norm is GeoNorm with a step size 1/s_k that differs per token and per update (hf_geonorm/modeling/method.md,
"Pre-Norm as GeoNorm"). ``calibrate`` reads text through the Pre-Norm model and, for every update, takes the median over
tokens of the step size a GeoNorm update would need to turn the state by the angle Pre-Norm turned it:

    a = θ_pre · R / |t|,    θ_pre = angle between h and h + u,    t = tangent(h, u)

with R the radius the token has on GeoNorm's sphere (``|h_0|`` for ``geo_radius="embedding"``, ``sqrt(d)`` for
``"sqrt_d"``). The result is a ``geo_alpha`` list with one value per update, meant for ``geo_max_angle=None``:
a pretrained model's base angles ``|t| / R`` are far above any clamp. The first position of every window is
left out: in pretrained models it carries a far larger norm than the other tokens (the attention sink) and a
step size a hundred times smaller (hf_geonorm/modeling/method.md, "Converting a pretrained model").

It also measures the frames: c = median |h_0| / |h| before every update, the scale that brings the Pre-Norm state
to the embeddings' size. Along the bridge the Pre-Norm part of each update then runs on c times the Pre-Norm state
(``geo_frames``), next to GeoNorm updates that keep that size, so that layers can be bridged one at a time.

``bridge_costs`` then measures, on the converted model, what each update costs when it alone becomes GeoNorm:
the loss it adds to the text. A last-first bridge anneal gives each update time in proportion
(``geo_bridge_costs``; in SmolLM2-135M the feed-forward updates of the first three layers carry most of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..modeling.geometry import prenorm_angle, tangent
from ..modeling.residual import residual_modules
from ..modeling.settings import RADII, computes_prenorm
from .evaluation import perplexity, read_with_hooks


@dataclass
class Calibration:
    """What ``calibrate`` measured, one value per update in the order the updates run: the GeoNorm step sizes
    (for ``geo_alpha``) and the Pre-Norm frames (for ``geo_frames``)."""

    step_sizes: list[float]
    frames: list[float]


def calibrate(model: nn.Module, windows: list[list[int]], radius: str = "embedding") -> Calibration:
    """Step sizes and frames of the Pre-Norm ``model`` (patched, with residual modules), measured on the token
    ``windows`` (each at least two tokens long)."""
    if radius not in RADII:
        raise ValueError(f"radius must be one of {', '.join(RADII)}; got {radius!r}")
    if not computes_prenorm(model.config):
        raise ValueError(
            "calibration measures the step sizes a Pre-Norm model takes; this model computes "
            f"norm_style={model.config.norm_style!r} with geo_bridge={getattr(model.config, 'geo_bridge', None)} "
            "(calibrate the stock checkpoint, or a conversion with geo_bridge=0)"
        )
    if not windows or any(len(w) < 2 for w in windows):
        raise ValueError("calibration needs text windows of at least two tokens each")
    modules = [module for _, _, module in residual_modules(model)]
    if not modules:
        raise ValueError("the model has no GeoNorm residual modules (patch it with apply_geonorm first)")
    steps: list[list[torch.Tensor]] = [[] for _ in modules]
    scales: list[list[torch.Tensor]] = [[] for _ in modules]
    entry_norm: list[torch.Tensor] = []

    def make_hook(index: int) -> Any:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            x, u = args[0].detach().double(), args[1].detach().double()
            x_norm = torch.linalg.vector_norm(x, dim=-1)
            if index == 0:
                entry_norm.append(x_norm)
            sphere = entry_norm[-1] if radius == "embedding" else torch.full_like(x_norm, math.sqrt(x.shape[-1]))
            t = tangent(x, u)
            need = prenorm_angle(x, u) * sphere / torch.linalg.vector_norm(t, dim=-1).clamp_min(1e-30)
            steps[index].append(need[:, 1:].flatten())
            scales[index].append((entry_norm[-1] / x_norm.clamp_min(1e-30))[:, 1:].flatten())

        return hook

    read_with_hooks(model, windows, [(module, make_hook(i)) for i, module in enumerate(modules)])
    medians = [[float(torch.cat(v).median()) for v in measured] for measured in (steps, scales)]
    medians[1][0] = 1.0  # the state enters the first update as it is: its frame is 1 for bridge 0 to be exact
    return Calibration(*medians)


def bridge_costs(model: nn.Module, windows: list[list[int]]) -> list[float]:
    """Per update, in nats per token: the loss on the token ``windows`` when only that update of the converted
    ``model`` (GeoNorm with ``geo_frames``) is at bridge 1, less the loss with every update at bridge 0 (the Pre-Norm
    original). One forward pass over the windows per update, plus one; the model's own bridge is left as it was."""
    modules = [module for _, _, module in residual_modules(model)]
    if getattr(model.config, "norm_style", None) != "geo" or not modules or any(m.frame is None for m in modules):
        raise ValueError(
            "bridge costs are measured on a GeoNorm conversion with geo_frames (convert the Pre-Norm checkpoint "
            "with --calibrate TEXT)"
        )
    saved = model.config.geo_bridge
    losses = []
    try:
        for j in range(-1, len(modules)):
            model.config.geo_bridge = [1.0 if i == j else 0.0 for i in range(len(modules))]
            losses.append(math.log(perplexity(model, windows, "bridge costs")))
    finally:
        model.config.geo_bridge = saved
    if not all(math.isfinite(loss) for loss in losses):
        raise ValueError("an update gave a non-finite loss at bridge 1; use more or other calibration text")
    return [loss - losses[0] for loss in losses[1:]]
