"""One residual-update module for the whole family: the five norm styles are one ``match`` over ``norm_style`` in
``GeoNormResidual.forward`` (method.md, "The family"); the rest of each style is declared in ``norm_styles.py``.

A block asks its residual module what each sublayer reads (``sublayer_input``) and how the state moves given the
sublayer's update (``forward``). Parameters exist only where a style needs them: the output norm of ``sandwich``
and the scale/bias of ``geo_learnable_step``. The ``geo`` case is the GeoNorm update of ``geometry.py``
(``geodesic_step``: tangent, the angle with its clamp, the exponential map; it picks its implementation), with
this update's step size, bridge and frame and the first-token rule.

The settings have one home, the model's config: a residual module keeps a reference to it and reads the clamp,
radius and the per-update values of the ``UpdateSchedule`` it shares with the model's other residual modules
(step sizes, bridges, frames; method.md, "Step sizes") from it at every forward, so assigning
``model.config.geo_alpha`` changes the model at once; the schedule is computed again only after such an
assignment. The two settings that decide which modules and parameters exist (``norm_style``,
``geo_learnable_step``) are fixed when the module is built; the config of a built model refuses to change them
(``model_mixins.GeoNormConfigMixin``).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .geometry import entry_rescale, geodesic_step, per_update, prenorm_update, step_sizes
from .norm_styles import NORM_STYLE_DECLARATIONS, NormStyle
from .settings import GeoNormSettings


class UpdateSchedule:
    """The per-update values of a model's residual updates, in the order they run: step sizes a_k (``geo_alpha``,
    ``geo_decay``), bridges (``geo_bridge``) and frames (``geo_frames``: (c, c_next / c) per update). One object,
    shared by the residual modules of a model: computed from ``config`` once, and again when one of those settings
    has been assigned a new value since (a list changed in place is not seen; assignments are what the config
    validates)."""

    SOURCES = ("geo_decay", "geo_alpha", "geo_bridge", "geo_frames")

    def __init__(self, config: Any, num_layers: int, sublayers: int) -> None:
        self.config, self.num_layers, self.sublayers = config, num_layers, sublayers
        self.computed_from: tuple[Any, ...] | None = None  # the setting values the lists below were computed from
        self.step_sizes: list[float] = []
        self.bridges: list[float] = []
        self.frames: list[tuple[float, float]] | None = None

    def current(self) -> UpdateSchedule:
        """This schedule, computed again first if a setting it is computed from was assigned since."""
        values = tuple(getattr(self.config, name) for name in self.SOURCES)
        then = self.computed_from
        if then is None or any(new is not old for new, old in zip(values, then, strict=True)):
            decay, alpha, bridge, frames = values
            layers, sublayers = self.num_layers, self.sublayers
            self.step_sizes = step_sizes(decay, alpha, layers, sublayers)
            if isinstance(bridge, list):
                self.bridges = per_update("geo_bridge", bridge, layers, sublayers)
            else:
                self.bridges = [bridge] * (layers * sublayers)
            if frames is None:
                self.frames = None
            else:
                scales = per_update("geo_frames", frames, layers, sublayers)
                nexts = [scales[i + 1] / scales[i] for i in range(len(scales) - 1)] + [1.0]
                self.frames = list(zip(scales, nexts, strict=True))
            self.computed_from = values
        return self


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
    ``schedule`` is the model's ``UpdateSchedule`` (a module built alone gets its own).
    """

    def __init__(
        self,
        config: Any,
        layer_index: int,
        num_layers: int,
        output_norm: nn.Module | None = None,
        sublayer: int = 0,
        sublayers: int = 1,
        schedule: UpdateSchedule | None = None,
    ) -> None:
        super().__init__()
        settings = GeoNormSettings.from_object(config).validate(num_layers)
        self.norm_style = settings.norm_style
        self.style: NormStyle = NORM_STYLE_DECLARATIONS[settings.norm_style]
        self.place(config, layer_index, num_layers, sublayer, sublayers, schedule)
        if self.style.output_norms:
            if output_norm is None:
                raise ValueError(f"norm_style={self.norm_style!r} needs an output norm for each sublayer")
            self.output_norm = output_norm
        if self.style.geodesic and settings.geo_learnable_step:
            self.step_scale = nn.Parameter(torch.ones(()))
            self.step_bias = nn.Parameter(torch.zeros(()))
        else:
            self.step_scale = None
            self.step_bias = None

    def place(
        self,
        config: Any,
        layer_index: int,
        num_layers: int,
        sublayer: int = 0,
        sublayers: int = 1,
        schedule: UpdateSchedule | None = None,
    ) -> None:
        """Where this update sits and what it reads (the arguments of ``__init__``): set when it is built, and again
        when ``apply_geonorm`` keeps it in a model patched anew."""
        self.config = config
        self.layer_index = layer_index
        self.num_layers = num_layers
        self.sublayer = sublayer
        self.sublayers = sublayers
        self.schedule = schedule if schedule is not None else UpdateSchedule(config, num_layers, sublayers)

    def fits(self, settings: GeoNormSettings) -> bool:
        """Whether this module has the parameters ``settings`` ask for (same style, same learnable step)."""
        learnable = NORM_STYLE_DECLARATIONS[settings.norm_style].geodesic and settings.geo_learnable_step
        return settings.norm_style == self.norm_style and learnable == (self.step_scale is not None)

    @property
    def update_index(self) -> int:
        """This update's place among all the model's updates, in the order they run."""
        return self.layer_index * self.sublayers + self.sublayer

    @property
    def step_size(self) -> float:
        """a_k of this update, from the config's ``geo_alpha`` and ``geo_decay``."""
        return self.schedule.current().step_sizes[self.update_index]

    @property
    def bridge(self) -> float:
        """This update's ``geo_bridge`` (a number, or a list with one value per layer or per update)."""
        return self.schedule.current().bridges[self.update_index]

    @property
    def frame(self) -> tuple[float, float] | None:
        """(c, c_next / c) of this update from ``geo_frames``: the scale of the Pre-Norm state before it and the
        change to the next update's scale (none after the last update). None without frames."""
        frames = self.schedule.current().frames
        return None if frames is None else frames[self.update_index]

    def extra_repr(self) -> str:
        if not self.style.geodesic:
            return f"norm_style={self.norm_style!r}"
        return (
            f"norm_style={self.norm_style!r}, step_size={self.step_size:.4g}, max_angle={self.config.geo_max_angle}, "
            f"bridge={self.bridge:g}, radius={self.config.geo_radius!r}"
        )

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """A decoder layer's input, as its first update reads it: in layer 0 the embeddings put on their sphere
        (``geo`` with ``geo_radius='sqrt_d'``), or, for the styles that normalise after the update (post,
        deepnorm), scaled or normalised as ``post_embedding_norm`` says; in every other layer ``x`` itself."""
        if self.layer_index != 0:
            return x
        if self.style.geodesic:
            return entry_rescale(x, self.config.geo_radius, self.bridge)
        embedding_norm = self.config.post_embedding_norm
        if not self.style.normalises_after or embedding_norm == "none":
            return x
        if embedding_norm == "sqrt_d":
            return x * math.sqrt(x.shape[-1])
        return F.layer_norm(x, x.shape[-1:], eps=1e-5)

    def sublayer_input(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """What the sublayer reads: N(x), or x itself for the styles that normalise after the update."""
        if self.style.normalises_after:
            return x
        return norm(x)

    def forward(
        self, x: torch.Tensor, update: torch.Tensor, norm: nn.Module, first_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The new state from the state ``x`` and the sublayer's ``update`` u, by the rule of the style (method.md,
        "The family"; N is the block's ``norm`` before the sublayer). ``first_tokens`` (bool, broadcast against
        ``x[..., 0]``) marks the rows at position 0 that ``geo`` keeps on the Pre-Norm update under
        ``geo_first_token_prenorm`` (method.md, "Converting a pretrained model")."""
        match self.norm_style:
            case "pre":
                return x + update
            case "post":
                return norm(x + update)
            case "sandwich":
                return x + self.output_norm(update)
            case "deepnorm":
                return norm((2.0 * self.num_layers) ** 0.25 * x + update)  # DeepNet's alpha = (2T)^(1/4)
            case "geo":
                config, schedule, i = self.config, self.schedule.current(), self.update_index
                frame = None if schedule.frames is None else schedule.frames[i]
                out = geodesic_step(
                    x, update, schedule.step_sizes[i], config.geo_max_angle, bridge=schedule.bridges[i],
                    step_scale=self.step_scale, step_bias=self.step_bias, frame=frame, clamp=config.geo_clamp,
                )  # fmt: skip
                if first_tokens is not None and config.geo_first_token_prenorm:
                    out = torch.where(first_tokens.unsqueeze(-1), prenorm_update(x, update, frame), out)
                return out
            case _:  # a style declared with a rule of its own (norm_styles.py)
                return self.style.rule(self, x, update, norm, first_tokens)


def residual_modules(model: nn.Module) -> list[tuple[int, str, GeoNormResidual]]:
    """(layer, sublayer, GeoNormResidual) for every residual update, in order."""
    found: list[tuple[int, str, GeoNormResidual]] = []
    for module in model.modules():
        attn = getattr(module, "geonorm_attn_residual", None)
        if isinstance(attn, GeoNormResidual):
            mlp = getattr(module, "geonorm_mlp_residual", None)
            k = attn.layer_index + 1
            if isinstance(mlp, GeoNormResidual):
                found += [(k, "attn", attn), (k, "mlp", mlp)]
            else:
                found.append((k, "attn+mlp", attn))
    return sorted(found, key=lambda item: (item[0], item[1] == "mlp"))
