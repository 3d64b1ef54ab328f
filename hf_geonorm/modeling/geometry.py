"""The geodesic update on the sphere, its clamp rule and its layer-wise step sizes: the one place where the
method's math lives (method.md, "The update" and "Step sizes").

All functions act along the last dimension, one token at a time. bf16/fp16 inputs are computed in float32 and
cast back; float64 stays float64. Degenerate inputs (a zero update, an update parallel to ``x``, a zero step)
return ``x`` with finite gradients. A state shorter than ``NORM_FLOOR`` has no direction to turn from and is
left where it is (method.md, "Choices the paper leaves open").

The update reads as method.md writes it (``geodesic_step``): ``tangent``, the angle with its clamp
(``clamped_turn``), then ``exp_map``; the bridge's angle and radius are ``bridge_turn``. The residual module
(``residual.py``) composes the bridge, the frames and the learnable step around these. The per-row pieces
(``floored_norm``, ``tangent_coefficient``, ``tangent_from``, ``geonorm_angle``, ``geonorm_rotation``,
``prenorm_rotation``) are shared with the fused torch twin in ``step_twin.py``, the other implementation of
``geodesic_step``; the Triton kernels (``triton_kernels.py``) spell the same lines out in Triton's language.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .settings import DECAYS

# No step turns a state further than this, also with no clamp (``max_angle=None``): pi takes a state to its
# antipode, the end of every geodesic that is the shortest path (the exponential map is one-to-one only up to
# there). Turning further winds back around the circle; its angle, linear in alpha, has gradients of order alpha
# per step, which compound over the layers past float16's range from alpha ~ 1e2 and past float32's from ~1e4.
MAX_TURN = math.pi
# States shorter than this have no usable direction (torch.nn.functional.normalize uses the same eps): the
# GeoNorm step leaves them where they are, and every division by |x| is by at least this.
NORM_FLOOR = 1e-12


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any input is float64; everything else is computed in float32."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(dim=-1, keepdim=True)


def row_norm(a: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(a, dim=-1, keepdim=True)


def sin_over(theta: torch.Tensor) -> torch.Tensor:
    """sin(theta) / theta with the limit 1 at 0 (smooth value and gradient)."""
    return torch.sinc(theta / math.pi)


def floored_norm(norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(max(|x|, NORM_FLOOR), |x| >= NORM_FLOOR): the norm used in divisions, and whether the state moves."""
    return norm.clamp_min(NORM_FLOOR), norm >= NORM_FLOOR


def tangent_coefficient(ux: torch.Tensor, x_norm: torch.Tensor) -> torch.Tensor:
    """c = <u,x>/|x|^2, the part of ``u`` along ``x`` (``x_norm`` floored)."""
    return ux / x_norm / x_norm


def tangent_from(u: torch.Tensor, x: torch.Tensor, c: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """t = u - c x: the update projected onto the tangent space at ``x`` (``out``: a buffer, no autograd)."""
    return torch.addcmul(u, x, c, value=-1.0, out=out)


def _as_compute(alpha: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor | float:
    if isinstance(alpha, torch.Tensor):
        return alpha.to(device=like.device, dtype=like.dtype)
    return float(alpha)


def geonorm_angle(
    base_angle: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
    clamp: str = "both",
) -> torch.Tensor:
    """The clamp rule: GeoNorm's rotation angle from the base angle |tangent|/|x|.

    theta = min(a (c min(base, max) + b), max); without the learnable step c = 1 and b = 0; with
    ``max_angle=None`` the base angle is not clamped and theta = min(a base, ``MAX_TURN``): no step passes the
    antipode. ``clamp="final"`` leaves the base angle unclamped: theta = min(a (c base + b), max), the rule for
    small calibrated steps on large base angles.
    """
    base = base_angle if max_angle is None or clamp == "final" else base_angle.clamp_max(max_angle)
    if step_scale is not None:
        base = step_scale * base
    if step_bias is not None:
        base = base + step_bias
    return (alpha * base).clamp_max(MAX_TURN if max_angle is None else max_angle)


def geonorm_rotation(
    t_norm: torch.Tensor,
    x_norm: torch.Tensor,
    moves: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
    clamp: str = "both",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(theta, step, clamped) of the GeoNorm step for rows with |t| = ``t_norm`` and floored |x| = ``x_norm``.

    theta is ``geonorm_angle`` of the base angle |t|/|x|, and step = theta/base the step size actually applied:
    alpha (times the learnable scale) where theta is linear in |t| (no clamp active, no bias), which keeps value
    and gradient finite as t -> 0; less where a clamp is active. ``clamped`` marks the rows where a clamp is
    active (with ``max_angle=None``, where theta stops at ``MAX_TURN``). Rows that do not move (``moves`` false)
    get theta = step = 0. The step is then cos(theta) x + sin_over(theta) step t.
    """
    base = t_norm / x_norm
    theta = geonorm_angle(base, alpha, max_angle, step_scale, step_bias, clamp)
    slope = alpha * step_scale if step_scale is not None else alpha
    linear = slope * torch.ones_like(base)
    has_t = base > 0
    base_safe = torch.where(has_t, base, torch.ones_like(base))
    clamped = slope * base > (MAX_TURN if max_angle is None else max_angle)
    if max_angle is not None and clamp == "both":
        clamped = clamped | (base > max_angle)
    if step_bias is not None:  # theta is not linear in |t|: no turn without a direction
        theta = torch.where(has_t, theta, torch.zeros_like(theta))
        step = torch.where(has_t, theta / base_safe, linear)
    else:  # a clamp is active only where |t| > 0
        step = torch.where(clamped, theta / base_safe, linear)
    zero = torch.zeros_like(theta)
    return torch.where(moves, theta, zero), torch.where(moves, step, zero), clamped


def prenorm_rotation(t_norm: torch.Tensor, x_norm: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta, theta/base) of a Pre-Norm update x -> x + u: the angle between x and x + u, atan2(|t|, |x| + <u,x>/|x|),
    never clamped, and its ratio to the base angle |t|/|x| (limit 1/(1 + <u,x>/|x|^2) as |t| -> 0)."""
    along = 1.0 + c  # the component of x + u along x, in units of |x|
    base = t_norm / x_norm
    theta = torch.atan2(base, along)
    has_t = base > 0
    base_safe = torch.where(has_t, base, torch.ones_like(base))
    along_safe = torch.where(along != 0, along, torch.ones_like(along))
    return theta, torch.where(has_t, theta / base_safe, 1.0 / along_safe)


def tangent(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Project ``u`` onto the tangent space of the sphere through ``x``: u - (<u,x>/<x,x>) x."""
    dtype = x.dtype
    cd = compute_dtype(x.dtype, u.dtype)
    x, u = x.to(cd), u.to(cd)
    x_norm, _ = floored_norm(row_norm(x))
    return tangent_from(u, x, tangent_coefficient(row_dot(u, x), x_norm)).to(dtype)


def in_compute_dtype(x: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` and ``u`` in the dtype the step is computed in (``compute_dtype``)."""
    cd = compute_dtype(x.dtype, u.dtype)
    return x.to(cd), u.to(cd)


def exp_map(x: torch.Tensor, v: torch.Tensor, angle: torch.Tensor | None = None) -> torch.Tensor:
    """Follow the great circle through ``x`` with initial velocity ``v`` (tangent at ``x``).

    exp_map(x, v) = cos(|v|/|x|) x + |x| sin(|v|/|x|) v/|v|, written as cos(th) x + (sin(th)/th) v so that
    v = 0 is smooth. The result keeps |x|; a state shorter than ``NORM_FLOOR`` stays where it is. ``angle`` is
    th = |v|/|x| where the caller has it already (``clamped_turn`` gives it with its clamp exact); it is then
    used as it is, and ``x`` and ``v`` must be in the dtype to compute in.
    """
    if angle is not None:
        return torch.cos(angle) * x + sin_over(angle) * v
    dtype = x.dtype
    x, v = in_compute_dtype(x, v)
    x_norm, moves = floored_norm(row_norm(x))
    theta = torch.where(moves, row_norm(v) / x_norm, torch.zeros_like(x_norm))
    keep_v = moves.to(x.dtype)
    return (torch.cos(theta) * x + sin_over(theta) * keep_v * v).to(dtype)


class Turn(NamedTuple):
    """One step's turn, per row: the angle theta, step = theta / (|t|/|x|) (the factor on the tangent t, so that
    ``exp_map(x, step * t, theta)`` turns x by theta), and the norms |x| (floored) and |t| it was formed from."""

    theta: torch.Tensor
    step: torch.Tensor
    x_norm: torch.Tensor
    t_norm: torch.Tensor


def clamped_turn(
    x: torch.Tensor,
    t: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
    clamp: str = "both",
) -> Turn:
    """The angle with its clamp (method.md, "The model-level step and its clamp") of the step from ``x``
    towards its tangent ``t``: theta from ``geonorm_angle`` of the base angle |t|/|x| (``geonorm_rotation`` says
    how each case is kept finite). ``x`` and ``t`` in the dtype to compute in."""
    x_norm, moves = floored_norm(row_norm(x))
    t_norm = row_norm(t)
    theta, step, _ = geonorm_rotation(
        t_norm, x_norm, moves, _as_compute(alpha, x), max_angle, step_scale, step_bias, clamp
    )
    return Turn(theta, step, x_norm, t_norm)


def bridge_turn(
    x: torch.Tensor, u: torch.Tensor, turn: Turn, bridge: float, frame: tuple[float, float] | None = None
) -> tuple[Turn, torch.Tensor]:
    """The bridge (method.md, "The bridge") between the Pre-Norm update of ``x`` by ``u`` (in the ``frame``,
    see ``prenorm_update``) and the GeoNorm ``turn`` of ``clamped_turn``: the turn whose angle and step are
    interpolated with weight ``bridge`` on the GeoNorm side, and the new radius over |x|, interpolated the same
    way. The state is then radius/|x| ``exp_map(x, step * t, theta)``."""
    lam = float(bridge)
    c = tangent_coefficient(row_dot(u, x), turn.x_norm)
    scale = 1.0 if frame is None else frame[0]  # the Pre-Norm update in the frame is c u on x
    theta_pre, step_pre = prenorm_rotation(scale * turn.t_norm, turn.x_norm, scale * c)
    theta = (1.0 - lam) * theta_pre + lam * turn.theta
    step = (1.0 - lam) * scale * step_pre + lam * turn.step
    radius = (1.0 - lam) * row_norm(prenorm_update(x, u, frame)) + lam * turn.x_norm
    return Turn(theta, step, turn.x_norm, turn.t_norm), radius / turn.x_norm


def geodesic_step(x: torch.Tensor, u: torch.Tensor, alpha: float | torch.Tensor,
                  max_angle: float | None = math.pi / 4) -> torch.Tensor:  # fmt: skip
    """The GeoNorm update as method.md writes it ("The update"): the tangent t of ``u`` at ``x``, the angle
    with its clamp, then the exponential map; the state keeps its radius |x|. ``max_angle=None``: no clamp, the
    turn stops at the antipode (``MAX_TURN``). This is the plain implementation; the fused one
    (``step_autograd.fused_geonorm_step``) computes the same, and ``step.geodesic_step`` chooses between them."""
    dtype = x.dtype
    x, u = in_compute_dtype(x, u)
    t = tangent(x, u)
    turn = clamped_turn(x, t, alpha, max_angle)
    return exp_map(x, turn.step * t, turn.theta).to(dtype)


def geodesic_update(x: torch.Tensor, u: torch.Tensor, alpha: float | torch.Tensor) -> torch.Tensor:
    """exp_map(x, alpha * tangent(x, u)): rotate ``x`` by alpha |tangent|/|x| towards the update, stopping at the
    antipode (``MAX_TURN``: beyond it the geodesic winds back). This is the GeoNorm step with no clamp, and is
    computed by it."""
    return geodesic_step(x, u, alpha, max_angle=None)


def step_sizes(
    decay: str, alpha: float | list[float] | tuple[float, ...], num_layers: int, sublayers: int = 1
) -> list[float]:
    """The step sizes a_k in the order the updates run: layer 1's ``sublayers`` updates, then layer 2's, and so on.

    harmonic a/k, sqrt a/sqrt(k), linear a(T+1-k)/T, constant a; every sublayer of layer k takes layer k's value.
    A sequence of ``num_layers`` values is taken as the a_k themselves (no decay applied on top), one of
    ``num_layers * sublayers`` values as one step size per update (attention, then feed-forward, of each layer).
    """
    if decay not in DECAYS:
        raise ValueError(f"geo_decay must be one of {', '.join(DECAYS)}; got {decay!r}")
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive integer; got {num_layers!r}")
    if isinstance(alpha, (list, tuple)):
        return per_update("geo_alpha", alpha, num_layers, sublayers)
    a = float(alpha)
    ks = range(1, num_layers + 1)
    if decay == "harmonic":
        per_layer = [a / k for k in ks]
    elif decay == "sqrt":
        per_layer = [a / math.sqrt(k) for k in ks]
    elif decay == "linear":
        per_layer = [a * (num_layers + 1 - k) / num_layers for k in ks]
    else:
        per_layer = [a for _ in ks]
    return [a for a in per_layer for _ in range(sublayers)]


def per_update(name: str, values: list[float] | tuple[float, ...], num_layers: int, sublayers: int) -> list[float]:
    """One value per update from a setting's list: ``num_layers * sublayers`` values as they are, ``num_layers``
    values each repeated for the layer's ``sublayers`` updates."""
    if len(values) == num_layers * sublayers:
        return [float(v) for v in values]
    if len(values) != num_layers:
        each = f" or one per update ({num_layers * sublayers})" if sublayers > 1 else ""
        raise ValueError(
            f"{name} given as a list must have one value per layer ({num_layers}){each}; got {len(values)}"
        )
    return [float(v) for v in values for _ in range(sublayers)]


def updates_per_layer(alpha: float | list[float] | tuple[float, ...], num_layers: int) -> int:
    """2 when ``geo_alpha`` is a list with one value per update of a two-update block, else 1 (for display)."""
    return 2 if isinstance(alpha, (list, tuple)) and len(alpha) == 2 * num_layers != num_layers else 1


def prenorm_update(x: torch.Tensor, u: torch.Tensor, frame: tuple[float, float] | None = None) -> torch.Tensor:
    """The Pre-Norm update x + u; with a ``frame`` (c, r), on a state that is c times the Pre-Norm state and is
    handed on as the next update's frame (r = c_next / c): r (x + c u). A chain of framed updates is the Pre-Norm
    model's state times the last c, which the final norm does not see (method.md, "Converting a pretrained
    model")."""
    if frame is None:
        return x + u
    c, ratio = frame
    return ratio * (x + c * u)


def prenorm_angle(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The angle between x and x + u: the rotation a Pre-Norm update makes on the sphere (never clamped)."""
    cd = compute_dtype(x.dtype, u.dtype)
    x, u = x.to(cd), u.to(cd)
    x_norm, _ = floored_norm(row_norm(x))
    c = tangent_coefficient(row_dot(u, x), x_norm)
    theta, _ = prenorm_rotation(row_norm(tangent_from(u, x, c)), x_norm, c)
    return theta.squeeze(-1)


def entry_rescale(h: torch.Tensor, radius: str, bridge: float = 1.0) -> torch.Tensor:
    """Put the first block's input on its sphere: unchanged for ``embedding``; for ``sqrt_d``
    h <- h (sqrt(d)/|h|)^bridge (bridge 1: the sphere of radius sqrt(hidden_size)). A state shorter than
    ``NORM_FLOOR`` has no direction and is left as it is."""
    if radius == "embedding" or bridge == 0.0:
        return h
    dtype = h.dtype
    h = h.to(compute_dtype(dtype))
    h_norm, moves = floored_norm(row_norm(h))
    scale = torch.where(moves, (math.sqrt(h.shape[-1]) / h_norm) ** float(bridge), torch.ones_like(h_norm))
    return (h * scale).to(dtype)
