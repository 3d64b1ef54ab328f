"""The torch twin of the Triton kernels: the fused GeoNorm step's forward and backward in per-row scalars, line
for line what ``triton_kernels.py`` computes, for every device and for ``torch.compile`` (which traces this,
never the hand-written kernel, so compiled graphs contain no opaque call and no graph break).

The fused step is ``geometry.geodesic_step`` with a Python-number ``alpha`` (method.md, "The update"): per
row (one token, along the hidden dim), with c = <u,x>/|x|^2 and t = u - c x, ``geometry.geonorm_rotation`` gives
the angle theta and the step size applied, step = theta/(|t|/|x|), and

    out = A x + B t,   A = cos(theta),   B = sin_over(theta) step
                       (B = alpha sin_over(theta) where no clamp is active, sin(theta) |x|/|t| where one is),

so every row needs only the per-row numbers <x,x>, <u,x> and |t|^2. The backward is written out in the same
per-row scalars (``_gradient_scalars``):

    dx = (A - cB) g + P u + (c^2 k + G/|x|) x,      du = B g + k u + P x,

with k, P, G per-row scalars formed from <g,x>, <g,u> and the forward's numbers. A row whose state is shorter
than ``geometry.NORM_FLOOR`` does not move: out = x, dx = g, du = 0. With ``from_out`` the backward reads the
forward's output instead of u (``step_autograd.py``, "Memory") and forms u = (out - A x)/B + c x implicitly.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from .geometry import (
    compute_dtype,
    floored_norm,
    geonorm_rotation,
    row_norm,
    sin_over,
    tangent_coefficient,
    tangent_from,
)


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


def _q(theta: torch.Tensor) -> torch.Tensor:
    """(cos(theta) - sin_over(theta)) / theta^2 = sinc'(theta)/theta, with its series near 0 (limit -1/3)."""
    small = 0.05 if theta.dtype == torch.float64 else 0.5
    t2 = theta * theta
    series = -1.0 / 3.0 + t2 * (1.0 / 30.0 + t2 * (-1.0 / 840.0 + t2 * (1.0 / 45360.0 - t2 / 3991680.0)))
    safe = torch.where(theta < small, torch.ones_like(theta), theta)
    direct = (torch.cos(safe) - torch.sin(safe) / safe) / (safe * safe)
    return torch.where(theta < small, series, direct)


def _row_step(xx, ux, tt, alpha: float, max_angle: float | None) -> RowStep:
    """The step's per-row numbers from <x,x>, <u,x> and |t|^2 (all [rows, 1])."""
    x_norm, moves = floored_norm(xx.sqrt())
    t_norm = tt.sqrt()
    theta, step, clamped = geonorm_rotation(t_norm, x_norm, moves, alpha, max_angle)
    sinc = sin_over(theta)
    c = tangent_coefficient(ux, x_norm)
    return RowStep(torch.cos(theta), sinc * step, c, x_norm, t_norm, theta, sinc, clamped, moves)


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


def no_autocast(device: torch.device):
    """The twin computes in its own dtypes: autocast off where the device type has autocast."""
    if device.type in ("cpu", "cuda", "xpu", "mps", "hpu"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def torch_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None):
    """The torch twin of the forward kernel on [rows, width] tensors: (out, [rows, 3] <x,x>, <u,x>, |t|^2).
    One full-size allocation in float32 (the output, used as scratch for t first)."""
    cd = compute_dtype(x2.dtype, u2.dtype)
    x, u = x2.to(cd), u2.to(cd)
    buf = torch.empty_like(x)
    x_norm_raw = row_norm(x)
    ux = torch.mul(u, x, out=buf).sum(dim=-1, keepdim=True)
    t = tangent_from(u, x, tangent_coefficient(ux, floored_norm(x_norm_raw)[0]), out=buf)
    xx, tt = x_norm_raw * x_norm_raw, row_norm(t) ** 2
    s = _row_step(xx, ux, tt, alpha, max_angle)
    out = t.mul_(s.b).addcmul_(x, s.a)  # A x + B t
    return out.to(x2.dtype), torch.cat((xx, ux, tt), dim=-1)


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
