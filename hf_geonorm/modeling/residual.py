"""One residual-update module for the whole family, every norm style declared in ``norm_styles.py``.

A block asks its residual module what each sublayer reads (``sublayer_input``) and how the state moves
given the sublayer's update (``forward``): the rule of the style's declaration (``norm_styles.py``). Parameters
exist only where a style needs them: the output norm of ``sandwich`` and the scale/bias of ``geo_learnable_step``.
The ``geo`` style's update (``geodesic``) is written out here: the GeoNorm update of ``geometry.py`` (tangent, the
angle with its clamp, the exponential map; ``step.py`` picks its implementation), with the bridge, the frames and
the learnable step around it.

The settings have one home, the model's config: a residual module keeps a reference to it and reads the clamp,
radius and the per-update values of the ``UpdateSchedule`` it shares with the model's other residual modules
(step sizes, bridges, frames; method.md, "Step sizes") from it at every forward, so assigning
``model.config.geo_alpha`` changes the model at once; the schedule is computed again only after such an
assignment. The two settings that decide which modules and parameters exist (``norm_style``,
``geo_learnable_step``) are fixed when the module is built; the config refuses to change them while a module
reads it (``settings_in_use``).
"""

from __future__ import annotations

import copy
import math
import weakref
from dataclasses import KW_ONLY, dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from .geometry import (
    bridge_turn,
    clamped_turn,
    entry_rescale,
    exp_map,
    in_compute_dtype,
    per_update,
    prenorm_update,
    step_sizes,
    tangent,
)
from .norm_styles import NORM_STYLE_DECLARATIONS, NormStyle
from .settings import GeoNormSettings
from .step import geodesic_step

_LIVE_RESIDUALS: weakref.WeakSet[GeoNormResidual] = weakref.WeakSet()


@dataclass(frozen=True, eq=False)
class StepParams:
    """Everything one update of the ``geo`` style reads besides the state x and the update u, as one object.
    ``eq=False``: the learnable scale and bias are tensors, compared by identity.

    ``alpha`` the step size a_k (a number, or a tensor); ``max_angle`` the clamp (None: none, the turn still stops
    at ``geometry.MAX_TURN``); ``bridge`` 1 for the GeoNorm step, 0 for the Pre-Norm update, in between the
    interpolation; ``step_scale``/``step_bias`` the learnable step (``geo_learnable_step``); ``frame``
    (c, c_next / c) the Pre-Norm frame of ``geo_frames``; ``clamp`` "both" (base angle and final angle) or "final"
    (method.md, "The update", "The bridge"). Every field but ``alpha`` is given by keyword:
    ``StepParams(0.5, max_angle=None, bridge=0.3)``."""

    alpha: float | torch.Tensor
    _: KW_ONLY
    max_angle: float | None = math.pi / 4
    bridge: float = 1.0
    step_scale: torch.Tensor | None = None
    step_bias: torch.Tensor | None = None
    frame: tuple[float, float] | None = None
    clamp: str = "both"

    @property
    def is_geodesic_step(self) -> bool:
        """Whether these are the plain GeoNorm update's settings (bridge 1, both clamps, no learnable step), which
        ``step.geodesic_step`` computes (fused where it can be)."""
        return self.bridge == 1.0 and self.clamp == "both" and self.step_scale is None and self.step_bias is None


def geonorm_step(x: torch.Tensor, u: torch.Tensor, params: StepParams) -> torch.Tensor:
    """The update of the ``geo`` style, with the Pre-Norm bridge: bridge = 1 is the clamped GeoNorm step (radius |x|
    kept), bridge = 0 the Pre-Norm update exactly (x + u, or in the ``frame``), in between the angle and radius
    interpolate (method.md, "The update" and "The bridge").

    The plain GeoNorm update goes to ``step.geodesic_step`` (the fused implementation where it covers the call;
    ``HF_GEONORM_FUSED=0`` or ``step_switch.set_fused_enabled(False)`` turns that off); every other setting is
    composed around the same pieces by ``composed_geonorm_step``."""
    if not isinstance(params, StepParams):
        raise TypeError(
            "geonorm_step takes the step's settings as one StepParams: geonorm_step(x, u, StepParams(alpha, ...)); "
            f"got {type(params).__name__}"
        )
    if params.is_geodesic_step:
        return geodesic_step(x, u, params.alpha, params.max_angle)  # fused where it can be (step.py)
    return composed_geonorm_step(x, u, params)


def composed_geonorm_step(x: torch.Tensor, u: torch.Tensor, params: StepParams) -> torch.Tensor:
    """``geonorm_step`` for every setting, composed of torch operations and differentiated by autograd: the update
    as method.md writes it (tangent, the angle with its clamp, the exponential map), with the learnable step
    on the angle and the bridge to the Pre-Norm update around it."""
    if params.bridge == 0.0:
        return prenorm_update(x, u, params.frame)  # the Pre-Norm end of the bridge, exactly
    dtype = x.dtype
    x, u = in_compute_dtype(x, u)
    t = tangent(x, u)
    turn = clamped_turn(x, t, params.alpha, params.max_angle, params.step_scale, params.step_bias, params.clamp)
    if params.bridge == 1.0:
        return exp_map(x, turn.step * t, turn.theta).to(dtype)
    turn, radius = bridge_turn(x, u, turn, params.bridge, params.frame)
    return (radius * exp_map(x, turn.step * t, turn.theta)).to(dtype)


def settings_in_use(config: Any) -> bool:
    """Whether a live GeoNorm residual module reads its settings from ``config`` (it is a built model's)."""
    return any(residual.config is config for residual in list(_LIVE_RESIDUALS))


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
        self.config = config
        self.norm_style = settings.norm_style
        self.style: NormStyle = NORM_STYLE_DECLARATIONS[settings.norm_style]
        self.layer_index = layer_index
        self.num_layers = num_layers
        self.sublayer = sublayer
        self.sublayers = sublayers
        self.schedule = schedule if schedule is not None else UpdateSchedule(config, num_layers, sublayers)
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
        _LIVE_RESIDUALS.add(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Copies (``copy.deepcopy``, pickle) read their own copy of the config, and count as its users too."""
        super().__setstate__(state)
        _LIVE_RESIDUALS.add(self)

    def fits(self, settings: GeoNormSettings) -> bool:
        """Whether this module has the parameters ``settings`` ask for (same style, same learnable step)."""
        learnable = NORM_STYLE_DECLARATIONS[settings.norm_style].geodesic and settings.geo_learnable_step
        return settings.norm_style == self.norm_style and learnable == (self.step_scale is not None)

    @property
    def residual_scale(self) -> float | None:
        """The style's factor on the state (DeepNet's alpha, (2T)^(1/4)), or None where it has none."""
        scale = self.style.residual_scale
        return None if scale is None else scale(self.num_layers)

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
        """The first block's input: put on its sphere (``geo`` with ``geo_radius='sqrt_d'``), or, for the styles
        that normalise after the update (post, deepnorm), the embeddings scaled or normalised as
        ``post_embedding_norm`` says."""
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
        """The new state from the state ``x`` and the sublayer's ``update``: the rule of the style's declaration
        (``norm_styles.py``). ``first_tokens`` (bool, broadcast against ``x[..., 0]``) marks the rows at position 0
        that ``geo`` keeps on the Pre-Norm update (``geodesic``)."""
        return self.style.rule(self, x, update, norm, first_tokens)

    def geodesic(self, x: torch.Tensor, update: torch.Tensor, first_tokens: torch.Tensor | None) -> torch.Tensor:
        """The ``geo`` update of this place in the model: its step size, bridge and frame from the schedule, the
        clamp and the learnable step (``geonorm_step``); the rows of ``first_tokens`` take the Pre-Norm update
        (``x + u``, or in the frame of ``geo_frames``) under ``geo_first_token_prenorm`` (method.md,
        "Converting a pretrained model")."""
        config, schedule, i = self.config, self.schedule.current(), self.update_index
        frame = None if schedule.frames is None else schedule.frames[i]
        params = StepParams(
            schedule.step_sizes[i], max_angle=config.geo_max_angle, bridge=schedule.bridges[i],
            step_scale=self.step_scale, step_bias=self.step_bias, frame=frame, clamp=config.geo_clamp,
        )  # fmt: skip
        out = geonorm_step(x, update, params)
        if first_tokens is not None and config.geo_first_token_prenorm:
            out = torch.where(first_tokens.unsqueeze(-1), prenorm_update(x, update, frame), out)
        return out


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
