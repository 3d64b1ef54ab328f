"""The geodesic update on the sphere and its layer-wise step sizes (GEONORM.md, "The update").

All functions act along the last dimension, one token at a time. Low-precision inputs (bf16/fp16) are
computed in float32 and cast back; float64 stays float64. Degenerate inputs (a zero update, an update
parallel to ``x``, a zero step) return ``x`` with finite gradients.
"""

from __future__ import annotations

import math

import torch

from .fused import can_fuse, fused_geonorm_step

DECAYS = ("harmonic", "sqrt", "linear", "constant")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(dim=-1, keepdim=True)


def _norm(a: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(a, dim=-1, keepdim=True)


def _tiny(t: torch.Tensor) -> float:
    return torch.finfo(t.dtype).tiny


def _norm_floor(t: torch.Tensor) -> float:
    """Lower bound for |x| in divisions: sqrt(tiny), so |x|^2 does not underflow to 0 and |v|/|x| stays
    finite for a zero row (a padding token) instead of giving 0/0 or cos(inf) = NaN."""
    return math.sqrt(torch.finfo(t.dtype).tiny)


def _sin_over(theta: torch.Tensor) -> torch.Tensor:
    """sin(theta) / theta with the limit 1 at 0 (smooth value and gradient)."""
    return torch.sinc(theta / math.pi)


def _as_compute(alpha: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor | float:
    if isinstance(alpha, torch.Tensor):
        return alpha.to(device=like.device, dtype=like.dtype)
    return float(alpha)


def tangent(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Project ``u`` onto the tangent space of the sphere through ``x``: u - (<u,x>/<x,x>) x."""
    dtype = x.dtype
    cd = _compute_dtype(torch.promote_types(x.dtype, u.dtype))
    x, u = x.to(cd), u.to(cd)
    t = u - (_dot(u, x) / _dot(x, x).clamp_min(_tiny(x))) * x
    return t.to(dtype)


def exp_map(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Follow the great circle through ``x`` with initial velocity ``v`` (tangent at ``x``).

    exp_map(x, v) = cos(|v|/|x|) x + |x| sin(|v|/|x|) v/|v|, written as cos(th) x + (sin(th)/th) v so that
    v = 0 is smooth. The result keeps |x|.
    """
    dtype = x.dtype
    cd = _compute_dtype(torch.promote_types(x.dtype, v.dtype))
    x, v = x.to(cd), v.to(cd)
    theta = _norm(v) / _norm(x).clamp_min(_norm_floor(x))
    out = torch.cos(theta) * x + _sin_over(theta) * v
    return out.to(dtype)


def geodesic_update(x: torch.Tensor, u: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """exp_map(x, alpha * tangent(x, u)): rotate ``x`` by alpha |tangent|/|x| towards the update."""
    dtype = x.dtype
    cd = _compute_dtype(torch.promote_types(x.dtype, u.dtype))
    x, u = x.to(cd), u.to(cd)
    out = exp_map(x, _as_compute(alpha, x) * tangent(x, u))
    return out.to(dtype)


def step_sizes(decay: str, alpha: float | list[float] | tuple[float, ...], num_layers: int) -> list[float]:
    """The per-layer step sizes a_k, k = 1..num_layers.

    harmonic a/k, sqrt a/sqrt(k), linear a(T+1-k)/T, constant a. A sequence of ``num_layers`` values is
    taken as the a_k themselves (no decay applied on top).
    """
    if decay not in DECAYS:
        raise ValueError(f"geo_decay must be one of {', '.join(DECAYS)}; got {decay!r}")
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive integer; got {num_layers!r}")
    if isinstance(alpha, (list, tuple)):
        if len(alpha) != num_layers:
            raise ValueError(
                f"geo_alpha given as a list must have one value per layer ({num_layers}); got {len(alpha)}"
            )
        return [float(a) for a in alpha]
    a = float(alpha)
    ks = range(1, num_layers + 1)
    if decay == "harmonic":
        return [a / k for k in ks]
    if decay == "sqrt":
        return [a / math.sqrt(k) for k in ks]
    if decay == "linear":
        return [a * (num_layers + 1 - k) / num_layers for k in ks]
    return [a for _ in ks]


def geonorm_angle(
    base_angle: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """GeoNorm's rotation angle from the base angle |tangent|/|x|.

    theta = min(a (c min(base, max) + b), max); without the learnable step c = 1 and b = 0; with
    ``max_angle=None`` both clamps are off and theta = a base.
    """
    base = base_angle if max_angle is None else base_angle.clamp_max(max_angle)
    if step_scale is not None:
        base = step_scale * base
    if step_bias is not None:
        base = base + step_bias
    theta = alpha * base
    return theta if max_angle is None else theta.clamp_max(max_angle)


def geonorm_step(
    x: torch.Tensor,
    u: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None = math.pi / 4,
    bridge: float = 1.0,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The model-level residual update of the ``geo`` style, with the Pre-Norm bridge.

    bridge = 1 is the clamped GeoNorm step (radius |x| kept); bridge = 0 is x + u exactly; in between
    the angle and radius interpolate (GEONORM.md, "The bridge").

    With bridge 1, a number ``alpha`` and no learnable step, the fused Function of ``fused.py`` computes it
    (a Triton kernel on CUDA, its per-row-scalar torch twin elsewhere; ``HF_GEONORM_FUSED=0`` or
    ``fused.set_fused_enabled(False)`` turns that off); everything else takes ``composed_geonorm_step``.
    """
    if can_fuse(x, u, alpha, bridge, step_scale, step_bias):
        return fused_geonorm_step(x, u, alpha, max_angle)
    return composed_geonorm_step(x, u, alpha, max_angle, bridge, step_scale, step_bias)


def composed_geonorm_step(
    x: torch.Tensor,
    u: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None = math.pi / 4,
    bridge: float = 1.0,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``geonorm_step`` composed of torch operations, differentiated by autograd (every setting)."""
    dtype = x.dtype
    cd = _compute_dtype(torch.promote_types(x.dtype, u.dtype))
    x, u = x.to(cd), u.to(cd)
    x_norm = _norm(x).clamp_min(_norm_floor(x))
    t = u - (_dot(u, x) / (x_norm * x_norm)) * x
    t_norm = _norm(t)
    has_t = t_norm > 0
    t_norm_safe = torch.where(has_t, t_norm, torch.ones_like(t_norm))
    alpha = _as_compute(alpha, x)

    base = t_norm / x_norm
    theta_geo = geonorm_angle(base, alpha, max_angle, step_scale, step_bias)
    # theta_geo / |t|. Where the angle is linear in |t| (no clamp active, no bias) it is a c/|x| exactly,
    # which keeps value and gradient finite as t -> 0; a clamp is only active where |t| > 0.
    linear = (alpha * step_scale if step_scale is not None else alpha) / x_norm
    if step_bias is not None:
        theta_geo = torch.where(has_t, theta_geo, torch.zeros_like(theta_geo))
        per_t_geo = torch.where(has_t, theta_geo / t_norm_safe, linear * torch.ones_like(t_norm))
    elif max_angle is None:
        per_t_geo = linear * torch.ones_like(t_norm)
    else:
        clamped = (base > max_angle) | (linear * t_norm > max_angle)
        per_t_geo = torch.where(clamped, theta_geo / t_norm_safe, linear * torch.ones_like(t_norm))

    if bridge == 1.0:
        theta, per_t, radius = theta_geo, per_t_geo, None
    else:
        lam = float(bridge)
        along = x_norm + _dot(u, x) / x_norm  # |x| + <u, x>/|x|: the component of x + u along x
        theta_pre = torch.atan2(t_norm, along)
        # atan2(|t|, c) / |t|, with its limit 1/c as |t| -> 0 (c > 0 there unless x + u is antiparallel)
        per_t_pre = torch.where(
            has_t, theta_pre / t_norm_safe, 1.0 / torch.where(along != 0, along, torch.ones_like(along))
        )
        theta = (1.0 - lam) * theta_pre + lam * theta_geo
        per_t = (1.0 - lam) * per_t_pre + lam * per_t_geo
        radius = (1.0 - lam) * _norm(x + u) + lam * x_norm

    # |x| (cos(th) x/|x| + sin(th) t/|t|) = cos(th) x + (sin(th)/th) (th/|t|) |x| t
    if radius is None:
        out = torch.cos(theta) * x + _sin_over(theta) * per_t * x_norm * t
    else:
        out = radius * (torch.cos(theta) * (x / x_norm) + _sin_over(theta) * per_t * t)
    return out.to(dtype)


def prenorm_angle(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The angle between x and x + u: the rotation a Pre-Norm update makes on the sphere (never clamped)."""
    cd = _compute_dtype(torch.promote_types(x.dtype, u.dtype))
    x, u = x.to(cd), u.to(cd)
    x_norm = _norm(x).clamp_min(_norm_floor(x))
    t = u - (_dot(u, x) / (x_norm * x_norm)) * x
    return torch.atan2(_norm(t), x_norm + _dot(u, x) / x_norm).squeeze(-1)


def entry_rescale(h: torch.Tensor, radius: str, bridge: float = 1.0) -> torch.Tensor:
    """Put the first block's input on its sphere: unchanged for ``embedding``; for ``sqrt_d``
    h <- h (sqrt(d)/|h|)^bridge (bridge 1: the sphere of radius sqrt(hidden_size))."""
    if radius == "embedding" or bridge == 0.0:
        return h
    dtype = h.dtype
    h = h.to(_compute_dtype(dtype))
    scale = (math.sqrt(h.shape[-1]) / _norm(h).clamp_min(_norm_floor(h))) ** float(bridge)
    return (h * scale).to(dtype)
