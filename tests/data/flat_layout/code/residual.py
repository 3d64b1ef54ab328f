"""One residual-update module for the whole family: pre, post, sandwich, deepnorm and geo.

A block asks its residual module what each sublayer reads (``sublayer_input``) and how the state moves
given the sublayer's update (``forward``). Parameters exist only where a style needs them: the output
norm of ``sandwich`` and the scale/bias of ``geo_learnable_step``.

The settings have one home, the model's config: a residual module keeps a reference to it and reads the step
size, clamp, radius and bridge from it at every forward (docs/method.md, "Step sizes"), so assigning
``model.config.geo_alpha`` changes the model at once. The two settings that decide which modules and
parameters exist (``norm_style``, ``geo_learnable_step``) are fixed when the module is built; the config
refuses to change them while a module reads it (``settings_in_use``).
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

import torch
from torch import nn

from .fused import geonorm_step
from .geometry import entry_rescale, per_update, prenorm_update, step_sizes
from .settings import GeoNormSettings

_LIVE_RESIDUALS: weakref.WeakSet[GeoNormResidual] = weakref.WeakSet()


def settings_in_use(config: Any) -> bool:
    """Whether a live GeoNorm residual module reads its settings from ``config`` (it is a built model's)."""
    return any(residual.config is config for residual in list(_LIVE_RESIDUALS))


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
    """The residual update of one sublayer (or one parallel pair) of decoder layer ``layer_index``.

    ``config`` holds the settings (a model's config, or a ``GeoNormSettings``); it is read at every forward.
    ``sublayer`` is this update's place in its layer (0 attention, 1 feed-forward) and ``sublayers`` the layer's
    number of updates (1 for parallel blocks): a ``geo_alpha`` list with one value per update is read by them.
    """

    def __init__(
        self,
        config: Any,
        layer_index: int,
        num_layers: int,
        output_norm: nn.Module | None = None,
        sublayer: int = 0,
        sublayers: int = 1,
    ) -> None:
        super().__init__()
        settings = GeoNormSettings.from_object(config).validate(num_layers)
        self.config = config
        self.norm_style = settings.norm_style
        self.layer_index = layer_index
        self.num_layers = num_layers
        self.sublayer = sublayer
        self.sublayers = sublayers
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
        _LIVE_RESIDUALS.add(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Copies (``copy.deepcopy``, pickle) read their own copy of the config, and count as its users too."""
        super().__setstate__(state)
        _LIVE_RESIDUALS.add(self)

    def fits(self, settings: GeoNormSettings) -> bool:
        """Whether this module has the parameters ``settings`` ask for (same style, same learnable step)."""
        learnable = settings.norm_style == "geo" and settings.geo_learnable_step
        return settings.norm_style == self.norm_style and learnable == (self.step_scale is not None)

    @property
    def deepnorm_alpha(self) -> float:
        """DeepNet's residual scale (2T)^(1/4)."""
        return (2.0 * self.num_layers) ** 0.25

    @property
    def update_index(self) -> int:
        """This update's place among all the model's updates, in the order they run."""
        return self.layer_index * self.sublayers + self.sublayer

    @property
    def step_size(self) -> float:
        """a_k of this update, from the config's ``geo_alpha`` and ``geo_decay``."""
        sizes = step_sizes(self.config.geo_decay, self.config.geo_alpha, self.num_layers, self.sublayers)
        return sizes[self.update_index]

    @property
    def bridge(self) -> float:
        """This update's ``geo_bridge`` (a number, or a list with one value per layer or per update)."""
        bridge = self.config.geo_bridge
        if not isinstance(bridge, list):
            return bridge
        return per_update("geo_bridge", bridge, self.num_layers, self.sublayers)[self.update_index]

    @property
    def frame(self) -> tuple[float, float] | None:
        """(c, c_next / c) of this update from ``geo_frames``: the scale of the Pre-Norm state before it and the
        change to the next update's scale (none after the last update). None without frames."""
        frames = self.config.geo_frames
        if frames is None:
            return None
        scales = per_update("geo_frames", frames, self.num_layers, self.sublayers)
        i = self.update_index
        return scales[i], (scales[i + 1] / scales[i] if i + 1 < len(scales) else 1.0)

    def extra_repr(self) -> str:
        if self.norm_style != "geo":
            return f"norm_style={self.norm_style!r}"
        return (
            f"norm_style='geo', step_size={self.step_size:.4g}, max_angle={self.config.geo_max_angle}, "
            f"bridge={self.bridge:g}, radius={self.config.geo_radius!r}"
        )

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """Put the state on its sphere before the first block (``geo`` with ``geo_radius='sqrt_d'``)."""
        if self.norm_style != "geo":
            return x
        return entry_rescale(x, self.config.geo_radius, self.bridge)

    def sublayer_input(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """What the sublayer reads: N(x), or x itself for the post-normalising styles."""
        if self.norm_style in ("post", "deepnorm"):
            return x
        return norm(x)

    def forward(
        self, x: torch.Tensor, update: torch.Tensor, norm: nn.Module, first_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The new state from the state ``x`` and the sublayer's ``update``. ``first_tokens`` (bool, broadcast
        against ``x[..., 0]``) marks the rows at position 0 that take the Pre-Norm update (``x + u``, or in the
        frame of ``geo_frames``) under ``geo_first_token_prenorm`` (docs/method.md, "Converting a pretrained model")."""
        style = self.norm_style
        if style == "pre":
            return x + update
        if style == "geo":
            config, frame = self.config, self.frame
            out = geonorm_step(x, update, self.step_size, config.geo_max_angle, self.bridge, self.step_scale,
                               self.step_bias, frame, config.geo_clamp)  # fmt: skip
            if first_tokens is not None and config.geo_first_token_prenorm:
                out = torch.where(first_tokens.unsqueeze(-1), prenorm_update(x, update, frame), out)
            return out
        if style == "post":
            return norm(x + update)
        if style == "deepnorm":
            return norm(self.deepnorm_alpha * x + update)
        return x + self.output_norm(update)
