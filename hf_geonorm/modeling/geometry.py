"""The geodesic update on the sphere, its clamp rule and its layer-wise step sizes: the one place where the
method's math lives (method.md, "The update" and "Step sizes").

All functions act along the last dimension, one token at a time. bf16/fp16 inputs are computed in float32 and
cast back; float64 stays float64. Degenerate inputs (a zero update, an update parallel to ``x``, a zero step)
return ``x`` with finite gradients. A state shorter than ``NORM_FLOOR`` has no direction to turn from and is
left where it is (method.md, "Choices the paper leaves open").

``geodesic_step`` is the update, and the one place that picks how it is computed: the composition it writes out
as method.md does (``tangent``, the angle with its clamp ``clamped_turn``, the bridge ``bridge_turn``, then
``exp_map``), or, at its plain settings, ``FusedGeodesicStep``: one autograd Function (the Triton kernel on CUDA,
launched by ``fused.py``; its torch twin, at the end of this file, elsewhere) that computes the same step from the
same per-row pieces (``floored_norm``, ``tangent_coefficient``, ``tangent_from``, ``geonorm_rotation``,
``exp_map``) and keeps less for the backward. The Triton kernels (``triton_kernels.py``) spell those lines out in
Triton's language.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .fused import (
    can_fuse,
    fused_backend,
    kept_for_backward,
    kernel_passes_check,
    no_autocast,
    triton_backward,
    triton_forward,
)
from .settings import DECAYS, MAX_TURN, NORM_FLOOR


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any input is float64; everything else is computed in float32."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(dim=-1, keepdim=True)


def row_norm(a: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(a, dim=-1, keepdim=True)


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
    """The clamp rule (method.md, "The model-level step and its clamp"): (theta, step, clamped) of the GeoNorm
    step for rows with |t| = ``t_norm`` and floored |x| = ``x_norm``.

    theta = min(a (c min(base, max) + b), max) of the base angle base = |t|/|x|; without the learnable step c = 1
    and b = 0; with ``max_angle=None`` the base angle is not clamped and theta = min(a base, ``MAX_TURN``): no step
    passes the antipode. ``clamp="final"`` leaves the base angle unclamped: theta = min(a (c base + b), max), the
    rule for small calibrated steps on large base angles.

    step = theta/base is the step size actually applied: alpha (times the learnable scale) where theta is linear
    in |t| (no clamp active, no bias), which keeps value and gradient finite as t -> 0; less where a clamp is
    active. ``clamped`` marks the rows where a clamp is active (with ``max_angle=None``, where theta stops at
    ``MAX_TURN``). Rows that do not move (``moves`` false), and with a bias rows with no tangent, get theta = 0.
    The step is then ``exp_map(x, t, theta, step)``.
    """
    base = t_norm / x_norm
    limit = MAX_TURN if max_angle is None else max_angle
    capped = base if max_angle is None or clamp == "final" else base.clamp_max(max_angle)
    if step_scale is not None:
        capped = step_scale * capped
    if step_bias is not None:
        capped = capped + step_bias
    theta = (alpha * capped).clamp_max(limit)
    slope = alpha * step_scale if step_scale is not None else alpha
    linear = slope * torch.ones_like(base)
    has_t = base > 0
    base_safe = torch.where(has_t, base, torch.ones_like(base))
    clamped = slope * base > limit
    if max_angle is not None and clamp == "both":
        clamped = clamped | (base > max_angle)
    if step_bias is not None:  # theta is not linear in |t|: no turn without a direction
        theta = torch.where(has_t, theta, torch.zeros_like(theta))
        step = torch.where(has_t, theta / base_safe, linear)
    else:  # a clamp is active only where |t| > 0
        step = torch.where(clamped, theta / base_safe, linear)
    zero = torch.zeros_like(theta)
    return torch.where(moves, theta, zero), torch.where(moves, step, zero), clamped


def geonorm_angle(
    base_angle: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
    clamp: str = "both",
) -> torch.Tensor:
    """GeoNorm's rotation angle from positive base angles |t|/|x| (``geonorm_rotation``'s theta)."""
    ones = torch.ones_like(base_angle)
    return geonorm_rotation(base_angle, ones, ones > 0, alpha, max_angle, step_scale, step_bias, clamp)[0]


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


def exp_map(
    x: torch.Tensor, v: torch.Tensor, angle: torch.Tensor | None = None, step: torch.Tensor | None = None
) -> torch.Tensor:
    """Follow the great circle through ``x`` with initial velocity ``v`` (tangent at ``x``), times ``step`` where
    given (a factor per row: the step size a turn applies to its tangent).

    exp_map(x, v) = cos(|v|/|x|) x + |x| sin(|v|/|x|) v/|v|, written as cos(th) x + (sin(th)/th) v so that
    v = 0 is smooth. The result keeps |x|; a state shorter than ``NORM_FLOOR`` stays where it is. ``angle`` is
    th = |step v|/|x| where the caller has it already (``geonorm_rotation`` gives it with its clamp exact, and the
    step size it applies); it is then used as it is, and ``x`` and ``v`` must be in the dtype to compute in.
    """
    if angle is not None:
        coefficient = torch.sinc(angle / math.pi)  # sin(th)/th, 1 at 0
        if step is not None:
            coefficient = coefficient * step
        return torch.addcmul(v * coefficient, x, torch.cos(angle))
    dtype = x.dtype
    x, v = in_compute_dtype(x, v)
    x_norm, moves = floored_norm(row_norm(x))
    theta = torch.where(moves, row_norm(v) / x_norm, torch.zeros_like(x_norm))
    return exp_map(x, moves.to(x.dtype) * v, theta).to(dtype)


class Turn(NamedTuple):
    """One step's turn, per row: the angle theta, step = theta / (|t|/|x|) (the factor on the tangent t, so that
    ``exp_map(x, t, theta, step)`` turns x by theta), and the norms |x| (floored) and |t| it was formed from."""

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
    towards its tangent ``t``: theta and the step size applied from ``geonorm_rotation``, which says how each case
    is kept finite. ``x`` and ``t`` in the dtype to compute in."""
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
    way. The state is then radius/|x| ``exp_map(x, t, theta, step)``."""
    lam = float(bridge)
    c = tangent_coefficient(row_dot(u, x), turn.x_norm)
    scale = 1.0 if frame is None else frame[0]  # the Pre-Norm update in the frame is c u on x
    theta_pre, step_pre = prenorm_rotation(scale * turn.t_norm, turn.x_norm, scale * c)
    theta = (1.0 - lam) * theta_pre + lam * turn.theta
    step = (1.0 - lam) * scale * step_pre + lam * turn.step
    radius = (1.0 - lam) * row_norm(prenorm_update(x, u, frame)) + lam * turn.x_norm
    return Turn(theta, step, turn.x_norm, turn.t_norm), radius / turn.x_norm


def geodesic_step(
    x: torch.Tensor,
    u: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None = math.pi / 4,
    *,
    bridge: float = 1.0,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
    frame: tuple[float, float] | None = None,
    clamp: str = "both",
    fused: bool = True,
) -> torch.Tensor:
    """The GeoNorm update of the state ``x`` by the sublayer's update ``u`` with step size ``alpha`` (method.md,
    "The update"): the tangent t of ``u`` at ``x``, the angle with its clamp, then the exponential map; the state
    keeps its radius |x|. ``max_angle=None``: no clamp, the turn stops at the antipode (``MAX_TURN``): the plain
    geodesic update exp_map(x, alpha tangent(x, u)).

    ``bridge`` 1 is the GeoNorm step, 0 the Pre-Norm update exactly (x + u, or in the ``frame`` (c, c_next / c)
    of ``geo_frames``: ``prenorm_update``), in between angle and radius interpolate (method.md, "The bridge");
    ``step_scale``/``step_bias`` are the learnable step (``geo_learnable_step``); ``clamp`` "both" (base angle
    and final angle) or "final" (method.md, "Converting a pretrained model").

    The one place that picks the implementation: the plain step (bridge 1, both clamps, no learnable step, a
    number ``alpha``) runs as ``FusedGeodesicStep`` (the Triton kernel on CUDA once it has passed its first-use
    check, its torch twin elsewhere) unless ``fused=False`` or the process switched it off
    (``fused.set_fused_enabled``, ``HF_GEONORM_FUSED=0``); everything else, and tensors the Function does not
    take, runs the composition below, differentiated by autograd. Both compute the same step (tests/test_fused.py).
    Values and gradients are finite for 0 <= alpha <= ``settings.MAX_ALPHA``, the range the settings accept.
    """
    if bridge == 0.0:
        return prenorm_update(x, u, frame)  # the Pre-Norm end of the bridge, exactly
    plain = bridge == 1.0 and clamp == "both" and step_scale is None and step_bias is None
    if fused and plain and can_fuse(x, u, alpha):
        backend = fused_backend(x, u)
        if backend == "torch" or kernel_passes_check(FusedGeodesicStep, x, u, max_angle):
            return FusedGeodesicStep.apply(x, u, float(alpha), max_angle, backend)
    dtype = x.dtype
    x, u = in_compute_dtype(x, u)
    t = tangent(x, u)
    turn = clamped_turn(x, t, alpha, max_angle, step_scale, step_bias, clamp)
    if bridge == 1.0:
        return exp_map(x, t, turn.theta, turn.step).to(dtype)
    turn, radius = bridge_turn(x, u, turn, bridge, frame)
    return (radius * exp_map(x, t, turn.theta, turn.step)).to(dtype)


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


# ---- the fused implementation of the plain step, and its torch twin ----
#
# Per row (one token), with c = <u,x>/|x|^2 and t = u - c x, ``geonorm_rotation`` gives the angle theta and the step
# size applied, step = theta/(|t|/|x|), and
#
#     out = exp_map(x, t, theta, step) = A x + B t,   A = cos(theta),   B = sin_over(theta) step
#                      (B = alpha sin_over(theta) where no clamp is active, sin(theta) |x|/|t| where one is),
#
# so every row needs only the per-row numbers <x,x>, <u,x> and |t|^2, which the forward keeps. The backward is
# written out in the same per-row scalars (``_gradient_scalars``):
#
#     dx = (A - cB) g + P u + (c^2 k + G/|x|) x,      du = B g + k u + P x,
#
# with k, P, G per-row scalars formed from <g,x>, <g,u> and the forward's numbers. A row whose state is shorter
# than ``NORM_FLOOR`` does not move: out = x, dx = g, du = 0. The torch twin (``torch_forward``, ``torch_backward``)
# is line for line what the Triton kernels compute; the kernels compute in float32, so float64 takes the twin, and
# rows wider than ``fused.MAX_FUSED_WIDTH`` too. Under ``torch.compile`` the twin is traced (Inductor fuses it into
# its own kernels), never the hand-written kernel, so compiled graphs contain no opaque call and no graph break.


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


class FusedGeodesicStep(torch.autograd.Function):
    """``geodesic_step(x, u, alpha, max_angle)`` with a number ``alpha``, as one Function:
    ``FusedGeodesicStep.apply(x, u, alpha, max_angle, backend=None, keep=None)``. ``backend`` "triton" or "torch"
    (None: ``fused.fused_backend``; "triton" on CPU tensors runs Triton's interpreter, TRITON_INTERPRET=1 before
    triton's import; tests); ``keep`` "output" or "update", what the backward reads besides x (None:
    ``fused.kept_for_backward``). No first-use check here: that is ``geodesic_step``'s.

    Memory. The forward keeps x (which the sublayer's input norm keeps anyway), three numbers per row, and either u
    or its own output ``out``. Where the output is float32/float64 and the angle is clamped at most pi/2 (the
    defaults; also a float32 state under bf16 autocast), it keeps ``out``, which the next norm keeps anyway, and the
    backward forms u = (out - A x)/B + c x implicitly (its coefficients are rewritten onto ``out`` and x). With
    theta <= pi/2, B is not small where u matters, and the rounding of ``out`` reaches the gradients at the float32
    level of their own size (tests check them against the composed path). Then a GeoNorm step costs no activation
    memory beyond a Pre-Norm residual add (which keeps nothing). A bfloat16/float16 state, no clamp or a clamp
    above pi/2 keep u instead. (As for any saved tensor, changing ``out`` in place before the backward makes
    autograd raise its usual error.)

    Double backward (``create_graph=True``) differentiates the composed path where u was kept, and raises where
    ``out`` was kept (turn the fused update off for higher-order gradients: ``fused.set_fused_enabled``)."""

    @staticmethod
    def forward(ctx, x, u, alpha, max_angle, backend=None, keep=None):
        backend = fused_backend(x, u) if backend is None else backend
        if backend not in ("triton", "torch"):
            raise ValueError(f"backend must be 'triton' or 'torch'; got {backend!r}")
        max_angle = None if max_angle is None else float(max_angle)
        keep = kept_for_backward(x, max_angle) if keep is None else keep
        if keep not in ("output", "update"):
            raise ValueError(f"keep must be 'output' or 'update'; got {keep!r}")
        if keep == "output" and (max_angle is None or max_angle > math.pi / 2):
            raise ValueError("keep='output' needs max_angle <= pi/2 (u is rebuilt from the output, dividing by sin)")
        alpha = float(alpha)
        x2, u2 = _rows(x), _rows(u)
        if backend == "triton":
            out2, stats = triton_forward(x2, u2, alpha, max_angle)
        else:
            with no_autocast(x.device):
                out2, stats = torch_forward(x2, u2, alpha, max_angle)
        out = out2.view(x.shape)
        from_out = keep == "output"
        ctx.save_for_backward(x, out if from_out else u, stats)
        ctx.alpha, ctx.max_angle, ctx.backend, ctx.from_out, ctx.u_dtype = alpha, max_angle, backend, from_out, u.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, v, stats = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the composed path instead
            if ctx.from_out:
                raise RuntimeError(
                    "the fused GeoNorm update keeps its output, not the update, for the backward and has no "
                    "double backward: call hf_geonorm.modeling.fused.set_fused_enabled(False) "
                    "(or set HF_GEONORM_FUSED=0) for higher-order gradients"
                )
            with torch.enable_grad():
                xd = x if x.requires_grad else x.detach().requires_grad_()
                ud = v if v.requires_grad else v.detach().requires_grad_()
                out = geodesic_step(xd, ud, ctx.alpha, ctx.max_angle, fused=False)
                dx, du = torch.autograd.grad(out, (xd, ud), grad_out, create_graph=True)
            return dx, du, None, None, None, None
        x2, v2, g2 = _rows(x), _rows(v), _rows(grad_out)
        args = (ctx.alpha, ctx.max_angle, ctx.from_out, ctx.u_dtype)
        if ctx.backend == "triton":
            dx, du = triton_backward(x2, v2, g2, stats, *args)
        else:
            with no_autocast(x.device):
                dx, du = torch_backward(x2, v2, g2, stats, *args)
        return dx.view(x.shape), du.view(x.shape), None, None, None, None


class RowStep(NamedTuple):
    """The per-row numbers of one step, each [rows, 1]: out = a x + b t."""

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    x_norm: torch.Tensor
    t_norm: torch.Tensor
    theta: torch.Tensor
    sinc: torch.Tensor
    clamped: torch.Tensor
    moves: torch.Tensor


def torch_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None):
    """The torch twin of the forward kernel on [rows, width] tensors: (out, [rows, 3] <x,x>, <u,x>, |t|^2).
    The angle comes from the row numbers the backward reads (``_row_step``), so both see the same angle."""
    cd = compute_dtype(x2.dtype, u2.dtype)
    x, u = x2.to(cd), u2.to(cd)
    buf = torch.empty_like(x)
    x_norm_raw = row_norm(x)
    ux = torch.mul(u, x, out=buf).sum(dim=-1, keepdim=True)
    t = tangent_from(u, x, tangent_coefficient(ux, floored_norm(x_norm_raw)[0]), out=buf)
    xx, tt = x_norm_raw * x_norm_raw, row_norm(t) ** 2
    x_norm, moves = floored_norm(xx.sqrt())
    theta, step, _ = geonorm_rotation(tt.sqrt(), x_norm, moves, alpha, max_angle)
    out = exp_map(x, t, theta, step)
    return out.to(x2.dtype), torch.cat((xx, ux, tt), dim=-1)


def _row_step(xx, ux, tt, alpha: float, max_angle: float | None) -> RowStep:
    """The step's per-row numbers from <x,x>, <u,x> and |t|^2 (all [rows, 1])."""
    x_norm, moves = floored_norm(xx.sqrt())
    t_norm = tt.sqrt()
    theta, step, clamped = geonorm_rotation(t_norm, x_norm, moves, alpha, max_angle)
    sinc = torch.sinc(theta / math.pi)  # sin_over(theta) = sin(theta)/theta, 1 at 0
    c = tangent_coefficient(ux, x_norm)
    return RowStep(torch.cos(theta), sinc * step, c, x_norm, t_norm, theta, sinc, clamped, moves)


def _q(theta: torch.Tensor) -> torch.Tensor:
    """(cos(theta) - sin_over(theta)) / theta^2 = sinc'(theta)/theta, with its series near 0 (limit -1/3)."""
    small = 0.05 if theta.dtype == torch.float64 else 0.5
    t2 = theta * theta
    series = -1.0 / 3.0 + t2 * (1.0 / 30.0 + t2 * (-1.0 / 840.0 + t2 * (1.0 / 45360.0 - t2 / 3991680.0)))
    safe = torch.where(theta < small, torch.ones_like(theta), theta)
    direct = (torch.cos(safe) - torch.sin(safe) / safe) / (safe * safe)
    return torch.where(theta < small, series, direct)


def _gradient_scalars(gx, gu, s: RowStep, alpha: float):
    """(A - cB, P, a3, k): dx = (A - cB) g + P u + a3 x and du = B g + k u + P x; 0 on rows that do not move.
    Ordered so that no intermediate overflows where the result does not."""
    c, xn, tn, theta = s.c, s.x_norm, s.t_norm, s.theta
    gt = gu - c * gx  # <g, t>
    sg = alpha * _q(theta) * gt - s.sinc * gx
    k1 = alpha / xn
    k = k1 * (k1 * sg)  # (alpha/|x|)^2 S
    gn = -(theta / xn) * (theta * sg)  # d loss / d|x| through theta
    tn_safe = torch.where(s.clamped, tn, torch.ones_like(tn))
    sin = torch.sin(theta)
    k = torch.where(s.clamped, -sin * (xn / tn_safe) * (gt / tn_safe) / tn_safe, k)
    gn = torch.where(s.clamped, gt * sin / tn_safe, gn)
    bt = s.b * gx  # <dL/dt, x>
    p = -(c * k) - bt / xn / xn
    a3 = c * (c * k) + (gn + 2.0 * bt * c / xn) / xn
    zero = torch.zeros_like(k)
    return s.a - c * s.b, torch.where(s.moves, p, zero), torch.where(s.moves, a3, zero), torch.where(s.moves, k, zero)


def torch_backward(x2, v2, g2, stats, alpha: float, max_angle: float | None, from_out: bool, u_dtype):
    """The torch twin of the backward kernel: (dx, du) from x, v (u, or the forward's output with
    ``from_out``), the output gradient and the forward's row numbers. Two full-size allocations."""
    cd = stats.dtype
    x, v, g = x2.to(cd), v2.to(cd), g2.to(cd)
    xx, ux, tt = stats[:, 0:1], stats[:, 1:2], stats[:, 2:3]
    dx, du = torch.empty_like(x), torch.empty_like(x)
    gx = torch.mul(g, x, out=dx).sum(dim=-1, keepdim=True)
    gv = torch.mul(g, v, out=du).sum(dim=-1, keepdim=True)
    s = _row_step(xx, ux, tt, alpha, max_angle)
    if from_out:  # u = out/B + (c - A/B) x; B = 0 only where alpha = 0 or the row does not move: P = k = 0
        inv_b = torch.where(s.b != 0, 1.0 / torch.where(s.b != 0, s.b, torch.ones_like(s.b)), torch.zeros_like(s.b))
        gu = (gv - s.a * gx) * inv_b + s.c * gx
    else:
        gu = gv
    a1, p, a3, k = _gradient_scalars(gx, gu, s, alpha)
    if from_out:  # the coefficients rewritten onto out and x
        shift = s.c - s.a * inv_b
        p, k, a3, px = p * inv_b, k * inv_b, a3 + p * shift, p + k * shift
    else:
        px = p
    torch.mul(g, a1, out=dx).addcmul_(v, p).addcmul_(x, a3)
    torch.mul(g, s.b, out=du).addcmul_(v, k).addcmul_(x, px)
    return dx.to(x2.dtype), du.to(u_dtype)
