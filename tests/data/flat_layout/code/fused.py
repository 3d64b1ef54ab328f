"""``geonorm_step``, the model-level GeoNorm update, and its fused form: one autograd Function with Triton kernels
on CUDA (``fused_kernels.py``) and a torch twin elsewhere.

The fused Function computes ``geometry.composed_geonorm_step(x, u, alpha, max_angle)`` with ``bridge == 1``, a
Python-number ``alpha`` and no learnable step scale/bias (docs/method.md, "The update"): per row (one token,
along the hidden dim), with c = <u,x>/|x|^2 and t = u - c x, ``geometry.geonorm_rotation`` gives the angle theta
and the step size applied, step = theta/(|t|/|x|), and

    out = A x + B t,   A = cos(theta),   B = sin_over(theta) step
                       (B = alpha sin_over(theta) where no clamp is active, sin(theta) |x|/|t| where one is),

so every row needs only the per-row numbers <x,x>, <u,x> and |t|^2. The backward is written out in the same
per-row scalars (``_gradient_scalars``):

    dx = (A - cB) g + P u + (c^2 k + G/|x|) x,      du = B g + k u + P x,

with k, P, G per-row scalars formed from <g,x>, <g,u> and the forward's numbers. A row whose state is shorter
than ``geometry.NORM_FLOOR`` does not move: out = x, dx = g, du = 0.

Memory. The forward keeps x (which the sublayer's input norm keeps anyway), three numbers per row, and
either u or its own output ``out``. Where the output is float32/float64 and the angle is clamped at most
pi/2 (the defaults; also a float32 state under bf16 autocast), it keeps ``out``, which the next norm keeps
anyway, and the backward forms u = (out - A x)/B + c x implicitly (its coefficients are rewritten onto
``out`` and x). With theta <= pi/2, B is not small where u matters, and the rounding of ``out`` reaches the
gradients at the float32 level of their own size (tests check them against the composed path). Then a
GeoNorm step costs no activation memory beyond a Pre-Norm residual add (which keeps nothing). A
bfloat16/float16 state, no clamp or a clamp above pi/2 keep u instead. (As for any saved tensor, changing
``out`` in place before the backward makes autograd raise its usual error.)

Not fused (``geometry.composed_geonorm_step`` is used): ``bridge < 1``, ``geo_clamp="final"``, the learnable
step scale/bias, a tensor ``alpha``, x and u of different shapes, other dtypes. The Triton kernel computes in
float32, so float64 takes the torch twin; rows wider than ``MAX_FUSED_WIDTH`` take the twin too. Double backward
(``create_graph=True``) differentiates the composed path where u was kept, and raises where ``out`` was kept (turn
the fused update off for higher-order gradients).

Under ``torch.compile`` the torch twin is traced (Inductor fuses it into its own kernels), never the
hand-written kernel, so compiled graphs contain no opaque call and no graph break.

First-use check. Until the kernels have been shown right on real GPUs, a process does not depend on them being
right: the first time ``geonorm_step`` would use the Triton kernel for a device, dtypes, clamp and saved tensor
(``kernel_passes_check``), it runs the kernel forward and backward on a small random batch against the torch
twin in float64 (``check_kernel``), with the bound tests/test_fused.py uses. If it raises or differs, a warning
naming ``HF_GEONORM_FUSED`` is given once and ``geonorm_step`` uses the composed path for the rest of the process.

Switch: the environment variable ``HF_GEONORM_FUSED=0`` (read at import) or ``set_fused_enabled(False)``
turns the fused Function off everywhere (``geonorm_step`` then uses its composed autograd path);
``set_fused_enabled(True)`` turns it back on. Default: on.

This file is copied beside saved checkpoints as remote code: it imports torch, the standard library and its
flat siblings; triton only through ``fused_kernels.py``, inside ``try``, so it imports fine where triton is not
installed.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from typing import NamedTuple

import torch

from .geometry import (
    composed_geonorm_step,
    compute_dtype,
    floored_norm,
    geonorm_rotation,
    row_norm,
    sin_over,
    tangent_coefficient,
    tangent_from,
)

ENV_VAR = "HF_GEONORM_FUSED"
MAX_FUSED_WIDTH = 16384  # widest row the kernel keeps in registers; wider rows use the torch twin
_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FUSED_DTYPES = (torch.float64, *_KERNEL_DTYPES)


def _env_enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


_ENABLED = _env_enabled()


def set_fused_enabled(enabled: bool) -> None:
    """Turn the fused GeoNorm update (Triton on CUDA, its torch twin elsewhere) on or off for this process.
    Off, ``geonorm_step`` uses its composed autograd path everywhere. The initial value comes from the
    environment variable ``HF_GEONORM_FUSED`` (``0``/``false``/``off`` disable it)."""
    global _ENABLED
    _ENABLED = bool(enabled)


def fused_enabled() -> bool:
    return _ENABLED


# ----------------------------------------------------------------------------------------------------------
# the per-row scalars of the torch twin (fused_kernels.py spells the same lines out in Triton)
# ----------------------------------------------------------------------------------------------------------
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


def _no_autocast(device: torch.device):
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


# ----------------------------------------------------------------------------------------------------------
# the Triton kernels, imported on first use
# ----------------------------------------------------------------------------------------------------------
_KERNELS = None
_TRITON_MISSING = False


def triton_available() -> bool:
    """Whether the Triton kernels (``fused_kernels.py``, which needs ``triton``) import here (checked once)."""
    global _KERNELS, _TRITON_MISSING
    if _KERNELS is None and not _TRITON_MISSING:
        try:
            from .fused_kernels import triton_backward, triton_forward
        except Exception:  # ImportError, or a triton that cannot initialise on this machine
            _TRITON_MISSING = True
        else:
            _KERNELS = (triton_forward, triton_backward)
    return _KERNELS is not None


def triton_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None):
    if not triton_available():
        raise RuntimeError("the fused GeoNorm kernel needs triton (pip install triton)")
    return _KERNELS[0](x2, u2, alpha, max_angle)


def triton_backward(x2, v2, g2, stats, alpha: float, max_angle: float | None, from_out: bool, u_dtype):
    if not triton_available():
        raise RuntimeError("the fused GeoNorm kernel needs triton (pip install triton)")
    return _KERNELS[1](x2, v2, g2, stats, alpha, max_angle, from_out, u_dtype)


# ----------------------------------------------------------------------------------------------------------
# the autograd Function
# ----------------------------------------------------------------------------------------------------------
def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


class FusedGeoNormStep(torch.autograd.Function):
    """geonorm_step(x, u, alpha, max_angle) with bridge 1. ``backend``: "triton" or "torch"; ``keep``:
    "output" or "update", what the backward reads besides x (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, u, alpha, max_angle, backend, keep):
        x2, u2 = _rows(x), _rows(u)
        if backend == "triton":
            out2, stats = triton_forward(x2, u2, alpha, max_angle)
        else:
            with _no_autocast(x.device):
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
                    "double backward: call hf_geonorm.fused.set_fused_enabled(False) (or set HF_GEONORM_FUSED=0) "
                    "for higher-order gradients"
                )
            with torch.enable_grad():
                xd = x if x.requires_grad else x.detach().requires_grad_()
                ud = v if v.requires_grad else v.detach().requires_grad_()
                out = composed_geonorm_step(xd, ud, ctx.alpha, ctx.max_angle)
                dx, du = torch.autograd.grad(out, (xd, ud), grad_out, create_graph=True)
            return dx, du, None, None, None, None
        x2, v2, g2 = _rows(x), _rows(v), _rows(grad_out)
        args = (ctx.alpha, ctx.max_angle, ctx.from_out, ctx.u_dtype)
        if ctx.backend == "triton":
            dx, du = triton_backward(x2, v2, g2, stats, *args)
        else:
            with _no_autocast(x.device):
                dx, du = torch_backward(x2, v2, g2, stats, *args)
        return dx.view(x.shape), du.view(x.shape), None, None, None, None


def fused_backend(x: torch.Tensor, u: torch.Tensor | None = None) -> str:
    """Which implementation the fused Function uses for ``x`` (and ``u``): "triton" (CUDA, triton importable,
    not while torch.compile traces, a width the kernel holds, float32/bfloat16/float16) or "torch"."""
    if (
        x.is_cuda
        and x.dtype in _KERNEL_DTYPES
        and (u is None or u.dtype in _KERNEL_DTYPES)
        and 0 < x.shape[-1] <= MAX_FUSED_WIDTH
        and not torch.compiler.is_compiling()
        and triton_available()
    ):
        return "triton"
    return "torch"


def kept_for_backward(x: torch.Tensor, max_angle: float | None) -> str:
    """"output" where the state's dtype is float32/float64 and the angle is clamped at most pi/2, else
    "update" (see the module docstring)."""
    if x.dtype in (torch.float32, torch.float64) and max_angle is not None and max_angle <= math.pi / 2:
        return "output"
    return "update"


def can_fuse(x: torch.Tensor, u: torch.Tensor, alpha, bridge, step_scale, step_bias, clamp: str = "both") -> bool:
    """Whether ``geonorm_step`` with these arguments is computed by the fused Function."""
    return (
        _ENABLED
        and bridge == 1.0
        and clamp == "both"
        and step_scale is None
        and step_bias is None
        and isinstance(alpha, (int, float))
        and not isinstance(alpha, bool)
        and x.shape == u.shape
        and x.dtype in _FUSED_DTYPES
        and u.dtype in _FUSED_DTYPES
        and x.device == u.device
        and x.dim() >= 1
    )


def fused_geonorm_step(
    x: torch.Tensor,
    u: torch.Tensor,
    alpha: float,
    max_angle: float | None,
    backend: str | None = None,
    keep: str | None = None,
) -> torch.Tensor:
    """The fused GeoNorm step (bridge 1, scalar alpha). ``backend`` None picks ``fused_backend``; "triton" on
    CPU tensors runs Triton's interpreter (TRITON_INTERPRET=1 before triton's import; tests). ``keep`` None
    picks ``kept_for_backward``. No first-use check here: that is ``geonorm_step``'s."""
    backend = fused_backend(x, u) if backend is None else backend
    if backend not in ("triton", "torch"):
        raise ValueError(f"backend must be 'triton' or 'torch'; got {backend!r}")
    ma = None if max_angle is None else float(max_angle)
    keep = kept_for_backward(x, ma) if keep is None else keep
    if keep not in ("output", "update"):
        raise ValueError(f"keep must be 'output' or 'update'; got {keep!r}")
    if keep == "output" and (ma is None or ma > math.pi / 2):
        raise ValueError("keep='output' needs max_angle <= pi/2 (u is rebuilt from the output, dividing by sin)")
    return FusedGeoNormStep.apply(x, u, float(alpha), ma, backend, keep)


# ----------------------------------------------------------------------------------------------------------
# the first-use check of the Triton kernel
# ----------------------------------------------------------------------------------------------------------
_KERNEL_CHECKS: dict[tuple, str | None] = {}  # (device, x dtype, u dtype, clamped, keep) -> None or the problem
_kernel_failure: str | None = None  # once set, geonorm_step never uses the kernel again in this process


def _ulp(dtype: torch.dtype) -> float:
    """One unit in the last place, relative, for the final rounding to ``dtype`` (0 for float32: it is within
    the arithmetic noise)."""
    return {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}.get(dtype, 0.0)


def _excess(actual: torch.Tensor, exact: torch.Tensor) -> float:
    """How far ``actual`` lies beyond |actual - exact| <= ulp |exact| + 2e-6 max|exact| (float32 arithmetic
    noise relative to the tensor's largest entry), the bound of tests/test_fused.py; positive is a failure."""
    a, e = actual.double(), exact.double()
    bound = _ulp(actual.dtype) * e.abs() + 2e-6 * e.abs().max() + 1e-30
    if not torch.isfinite(a).all():
        return math.inf
    return ((a - e).abs() - bound).max().item()


def check_kernel(
    device: torch.device | str,
    x_dtype: torch.dtype = torch.float32,
    u_dtype: torch.dtype | None = None,
    width: int = 96,
    max_angle: float | None = math.pi / 4,
    keep: str | None = None,
) -> str | None:
    """Run the Triton kernel forward and backward once on a small random batch and compare it with the torch
    twin computed in float64 on the same (rounded) inputs. None if it agrees, else what went wrong.

    The rows cover both sides of the clamp, a zero update, an update parallel to x and a zero state. The global
    random state, autograd mode and autocast of the caller are left as they were."""
    device = torch.device(device)
    u_dtype = x_dtype if u_dtype is None else u_dtype
    if keep is None:
        keep = kept_for_backward(torch.empty(0, dtype=x_dtype), max_angle)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, width, generator=gen, dtype=torch.float64) * 2.0
    u = torch.randn(16, width, generator=gen, dtype=torch.float64)
    u = u * torch.logspace(-1.5, 1.0, 16, dtype=torch.float64)[:, None]  # base angles from ~0.02 to ~5
    grad = torch.randn(16, width, generator=gen, dtype=torch.float64)
    u[1] = 0.0
    u[2] = 2.0 * x[2]
    x[3] = 0.0
    x, u, grad = x.to(device, x_dtype), u.to(device, u_dtype), grad.to(device, x_dtype)

    def run(backend: str, xs: torch.Tensor, us: torch.Tensor, gs: torch.Tensor):
        xs, us = xs.detach().clone().requires_grad_(), us.detach().clone().requires_grad_()
        out = FusedGeoNormStep.apply(xs, us, 0.7, max_angle, backend, keep)
        out.backward(gs)
        return out.detach(), xs.grad, us.grad

    try:
        with torch.inference_mode(False), torch.enable_grad(), _no_autocast(device):
            got = run("triton", x, u, grad)
            exact = run("torch", x.double(), u.double(), grad.double())
    except Exception as error:  # a kernel that does not build or launch here
        return f"it raised {type(error).__name__}: {error}"
    for name, mine, theirs in zip(("the output", "grad x", "grad u"), got, exact, strict=True):
        excess = _excess(mine, theirs)
        if excess > 0:
            return f"{name} differs from the torch twin by {excess:.3g} beyond the tests' bound"
    return None


def kernel_failure() -> str | None:
    """What made the kernel fail its first-use check in this process (then the composed path runs), or None."""
    return _kernel_failure


def kernel_passes_check(x: torch.Tensor, u: torch.Tensor, max_angle: float | None) -> bool:
    """Whether ``geonorm_step`` may use the Triton kernel for these tensors: ``check_kernel`` runs on first use
    per device, dtypes, clamp and saved tensor; after any failure (warned once) never again in this process."""
    global _kernel_failure
    if _kernel_failure is not None:
        return False
    keep = kept_for_backward(x, max_angle)
    key = (str(x.device), x.dtype, u.dtype, max_angle is None, keep)
    if key not in _KERNEL_CHECKS:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return False  # a CUDA graph being captured cannot run the check: composed until a plain call
        problem = check_kernel(x.device, x.dtype, u.dtype, x.shape[-1], max_angle, keep)
        _KERNEL_CHECKS[key] = problem
        if problem is not None:
            _kernel_failure = f"{key[0]} ({x.dtype} state, {u.dtype} update): {problem}"
            warnings.warn(
                f"hf_geonorm: the fused GeoNorm Triton kernel failed its first-use check on {_kernel_failure}. "
                f"GeoNorm uses the composed torch path for the rest of this process (correct, slower). Set "
                f"{ENV_VAR}=0 to skip the kernel and this check; please report this with your GPU, torch and "
                "triton versions.",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
    return _KERNEL_CHECKS[key] is None


# ----------------------------------------------------------------------------------------------------------
# the model-level step
# ----------------------------------------------------------------------------------------------------------
def geonorm_step(
    x: torch.Tensor,
    u: torch.Tensor,
    alpha: float | torch.Tensor,
    max_angle: float | None = math.pi / 4,
    bridge: float = 1.0,
    step_scale: torch.Tensor | None = None,
    step_bias: torch.Tensor | None = None,
    frame: tuple[float, float] | None = None,
    clamp: str = "both",
) -> torch.Tensor:
    """The model-level residual update of the ``geo`` style, with the Pre-Norm bridge.

    bridge = 1 is the clamped GeoNorm step (radius |x| kept); bridge = 0 is the Pre-Norm update exactly (x + u, or
    in the ``frame``); in between the angle and radius interpolate (docs/method.md, "The update" and "The bridge").

    With bridge 1, a number ``alpha`` and no learnable step, the fused Function computes it (the Triton kernel
    on CUDA once it has passed its first-use check, the torch twin elsewhere; ``HF_GEONORM_FUSED=0`` or
    ``set_fused_enabled(False)`` turns that off); everything else takes ``geometry.composed_geonorm_step``.
    Values and gradients are finite for 0 <= alpha <= ``geometry.MAX_ALPHA``, the range the settings accept.
    """
    if can_fuse(x, u, alpha, bridge, step_scale, step_bias, clamp):
        backend = fused_backend(x, u)
        if backend == "torch" or kernel_passes_check(x, u, max_angle):
            return fused_geonorm_step(x, u, alpha, max_angle, backend)
    return composed_geonorm_step(x, u, alpha, max_angle, bridge, step_scale, step_bias, frame, clamp)
