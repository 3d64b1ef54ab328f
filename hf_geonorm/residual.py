"""One residual-update module for the whole family: pre, post, sandwich, deepnorm and geo.

A block asks its residual module what each sublayer reads (``sublayer_input``) and how the state moves
given the sublayer's update (``forward``). Parameters exist only where a style needs them: the output
norm of ``sandwich`` and the scale/bias of ``geo_learnable_step``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from .geometry import entry_rescale, geonorm_step
from .settings import GeoNormSettings


def identity_norm_like(norm: nn.Module, weight_offset: float = 0.0) -> nn.Module:
    """A fresh norm of the same kind as ``norm`` that starts as the plain normalisation
    (effective weight 1, bias 0). ``weight_offset`` is 1 for norms that compute (offset + w) x."""
    new = copy.deepcopy(norm)
    with torch.no_grad():
        for name, param in new.named_parameters(recurse=False):
            if name == "weight":
                param.fill_(1.0 - weight_offset)
            elif name == "bias":
                param.zero_()
    return new


class GeoNormResidual(nn.Module):
    """The residual update of one sublayer (or one parallel pair) of decoder layer ``layer_index``."""

    def __init__(
        self,
        settings: GeoNormSettings,
        layer_index: int,
        num_layers: int,
        step_size: float,
        output_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.norm_style = settings.norm_style
        self.layer_index = layer_index
        self.step_size = float(step_size)
        self.max_angle = settings.geo_max_angle
        self.bridge = settings.geo_bridge
        self.radius = settings.geo_radius
        self.deepnorm_alpha = (2.0 * num_layers) ** 0.25
        if self.norm_style == "sandwich":
            if output_norm is None:
                raise ValueError("norm_style='sandwich' needs an output norm for each sublayer")
            self.output_norm = output_norm
        if self.norm_style == "geo" and settings.geo_learnable_step:
            self.step_scale = nn.Parameter(torch.ones(()))
            self.step_bias = nn.Parameter(torch.zeros(()))
        else:
            self.step_scale = None
            self.step_bias = None

    def extra_repr(self) -> str:
        if self.norm_style != "geo":
            return f"norm_style={self.norm_style!r}"
        return (
            f"norm_style='geo', step_size={self.step_size:.4g}, max_angle={self.max_angle}, "
            f"bridge={self.bridge}, radius={self.radius!r}"
        )

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """Put the state on its sphere before the first block (``geo`` with ``geo_radius='sqrt_d'``)."""
        if self.norm_style != "geo":
            return x
        return entry_rescale(x, self.radius, self.bridge)

    def sublayer_input(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """What the sublayer reads: N(x), or x itself for the post-normalising styles."""
        if self.norm_style in ("post", "deepnorm"):
            return x
        return norm(x)

    def forward(self, x: torch.Tensor, update: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """The new state from the state ``x`` and the sublayer's ``update``."""
        style = self.norm_style
        if style == "pre":
            return x + update
        if style == "geo":
            return geonorm_step(
                x, update, self.step_size, self.max_angle, self.bridge, self.step_scale, self.step_bias
            )
        if style == "post":
            return norm(x + update)
        if style == "deepnorm":
            return norm(self.deepnorm_alpha * x + update)
        return x + self.output_norm(update)
