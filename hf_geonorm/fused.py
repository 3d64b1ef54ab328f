"""A fused GeoNorm update: one autograd Function with a Triton kernel on CUDA and a torch twin elsewhere.

What it computes is ``geometry.geonorm_step(x, u, alpha, max_angle)`` with ``bridge == 1``, a Python-number
``alpha`` and no learnable step scale/bias (GEONORM.md, "The update"): per row (one token, along the hidden
dim), with c = <u,x>/|x|^2 and t = u - c x,

    theta = min(alpha min(|t|/|x|, max_angle), max_angle)        (theta = alpha |t|/|x| when max_angle is None)
    out   = A x + B t,   A = cos(theta),   B = alpha sinc(theta)  where no clamp is active,
                                           B = sin(theta) |x|/|t| where one is (theta is then a constant),

so every row needs only the per-row numbers <x,x>, <u,x> and |t|^2. The backward is written out in the same
per-row scalars (``_backward_scalars``):

    dx = (A - cB) g + P u + (c^2 k + [|x| not floored] G/|x|) x,      du = B g + k u + P x,

with k, P, G per-row scalars formed from <g,x>, <g,u> and the forward's numbers.

Memory. The forward keeps x (which the sublayer's input norm keeps anyway), three numbers per row, and
either u or its own output ``out``. Where the output is float32/float64 and the angle is clamped at most
pi/2 (the defaults; also a float32 state under bf16 autocast), it keeps ``out``, which the next norm keeps
anyway, and the backward forms u = (out - A x)/B + c x implicitly (its coefficients are rewritten onto
``out`` and x). With theta <= pi/2, B is not small where u matters, and the rounding of ``out`` reaches the
gradients at the float32 level of their own size (tests check them against the composed path). Then a
GeoNorm step costs no activation memory beyond a Pre-Norm residual add (which keeps nothing). A
bfloat16/float16 state, no clamp or a clamp above pi/2 keep u instead. (As for any saved tensor, changing
``out`` in place before the backward makes autograd raise its usual error.)

Kernel (CUDA, ``triton`` importable): one program per row; the whole row of ``x`` and ``u`` is loaded once
into registers (in float32 whatever the input dtypes), the reductions <x,x> and <u,x> run over it, then
|t|^2 = sum (u - c x)^2 over the same registers (no second read of memory; used instead of the identity
|t|^2 = <u,u> - <u,x>^2/<x,x>, which cancels catastrophically when u is nearly parallel to x), the output is
written once in x's dtype and the three row numbers once. The backward kernel reads x, u (or out) and the
output gradient once, forms <g,x> and <g,u> (or <g,out>) and writes dx and du once. Rows wider than
``MAX_FUSED_WIDTH`` use the torch twin.

Not fused (``geometry.composed_geonorm_step`` is used): ``bridge < 1``, the learnable step scale/bias, a tensor
``alpha``, x and u of different shapes, other dtypes. The Triton kernel computes in float32, so float64 takes
the torch twin. Double backward (``create_graph=True``) differentiates the composed path where u was kept,
and raises where ``out`` was kept (turn the fused update off for higher-order gradients).

Under ``torch.compile`` the torch twin is traced (Inductor fuses it into its own kernels), never the
hand-written kernel, so compiled graphs contain no opaque call and no graph break.

Switch: the environment variable ``HF_GEONORM_FUSED=0`` (read at import) or ``set_fused_enabled(False)``
turns the fused Function off everywhere (``geonorm_step`` then uses its composed autograd path, as before this
module existed); ``set_fused_enabled(True)`` turns it back on. Default: on.

This file is copied beside saved checkpoints as remote code: it imports only torch (triton lazily, inside
``try``, so the module imports fine where triton is not installed).
"""

from __future__ import annotations  # kernel annotations (tl.constexpr) stay unevaluated strings

import contextlib
import math
import os

import torch

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
# per-row scalars of the torch twin (the Triton kernels spell out the same lines with tl.*)
# ----------------------------------------------------------------------------------------------------------
def _floor(dtype: torch.dtype) -> float:
    """sqrt(tiny): the lower bound of |x| in divisions (as in geometry._norm_floor)."""
    return math.sqrt(torch.finfo(dtype).tiny)


def _compute_dtype(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in (a, b) else torch.float32


def _q(theta: torch.Tensor) -> torch.Tensor:
    """(theta cos(theta) - sin(theta)) / theta^3 = sinc'(theta)/theta, with its series near 0 (limit -1/3)."""
    small = 0.05 if theta.dtype == torch.float64 else 0.5
    t2 = theta * theta
    series = -1.0 / 3.0 + t2 * (1.0 / 30.0 + t2 * (-1.0 / 840.0 + t2 * (1.0 / 45360.0 - t2 / 3991680.0)))
    safe = torch.where(theta < small, torch.ones_like(theta), theta)
    direct = (safe * torch.cos(safe) - torch.sin(safe)) / (safe * safe * safe)
    return torch.where(theta < small, series, direct)


def _forward_scalars(xx, ux, tt, alpha: float, max_angle: float | None, floor: float):
    """A, B, c and what the backward needs, from <x,x>, <u,x> and |t|^2 (all [rows, 1])."""
    xn = xx.sqrt().clamp_min(floor)
    c = ux / (xn * xn)
    tn = tt.sqrt()
    base = tn / xn
    theta_lin = alpha * base
    if max_angle is None:
        theta, clamped = theta_lin, None
    else:
        theta = (alpha * base.clamp_max(max_angle)).clamp_max(max_angle)
        clamped = (base > max_angle) | (theta_lin > max_angle)
    sinc = torch.sinc(theta / math.pi)
    b = alpha * sinc
    if clamped is not None:
        tn_safe = torch.where(clamped, tn, torch.ones_like(tn))
        b = torch.where(clamped, torch.sin(theta) * xn / tn_safe, b)
    return torch.cos(theta), b, c, xn, tn, theta, sinc, clamped


def _backward_scalars(xx, ux, gx, gu, scalars, alpha: float, floor: float):
    """(A - cB, P, a3, B, k): dx = (A - cB) g + P u + a3 x and du = B g + k u + P x."""
    a, b, c, xn, tn, theta, sinc, clamped = scalars
    gt = gu - c * gx  # <g, t>
    s = alpha * _q(theta) * gt - sinc * gx
    k1 = alpha / xn
    k = k1 * (k1 * s)  # (alpha/|x|)^2 S, ordered so a floored |x| does not overflow
    gn = -(theta * (theta / xn)) * s  # d loss / d|x| through theta
    if clamped is not None:
        tn_safe = torch.where(clamped, tn, torch.ones_like(tn))
        sin = torch.sin(theta)
        k = torch.where(clamped, -sin * (xn / tn_safe) * (gt / tn_safe) / tn_safe, k)
        gn = torch.where(clamped, gt * sin / tn_safe, gn)
    tx = ux - c * xx  # <t, x>: 0 unless |x| is floored
    big_tx = b * gx + k * tx  # <dL/dt, x>
    p = -c * k - big_tx / (xn * xn)
    gn_total = gn + 2.0 * big_tx * c / xn
    not_floored = xx.sqrt() >= floor
    a3 = c * c * k + torch.where(not_floored, gn_total / xn, torch.zeros_like(gn_total))
    return a - c * b, p, a3, b, k


def _no_autocast(device: torch.device):
    """The twin computes in its own dtypes: autocast off where the device type has autocast."""
    if device.type in ("cpu", "cuda", "xpu", "mps", "hpu"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _row_norm(a: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(a, dim=-1, keepdim=True)


def torch_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None):
    """The torch twin of the forward kernel on [rows, width] tensors: (out, [rows, 3] <x,x>, <u,x>, |t|^2).
    One full-size allocation in float32 (the output, used as scratch for t first)."""
    cd = _compute_dtype(x2.dtype, u2.dtype)
    x, u = x2.to(cd), u2.to(cd)
    floor = _floor(cd)
    buf = torch.empty_like(x)
    xn_raw = _row_norm(x)
    ux = torch.mul(u, x, out=buf).sum(dim=-1, keepdim=True)
    c = ux / xn_raw.clamp_min(floor) ** 2
    t = torch.addcmul(u, x, c, value=-1.0, out=buf)
    xx, tt = xn_raw * xn_raw, _row_norm(t) ** 2
    a, b, *_ = _forward_scalars(xx, ux, tt, alpha, max_angle, floor)
    out = t.mul_(b).addcmul_(x, a)  # A x + B t
    return out.to(x2.dtype), torch.cat((xx, ux, tt), dim=-1)


def torch_backward(x2, v2, g2, stats, alpha: float, max_angle: float | None, from_out: bool, u_dtype):
    """The torch twin of the backward kernel: (dx, du) from x, v (u, or the forward's output with
    ``from_out``), the output gradient and the forward's row numbers. Two full-size allocations."""
    cd = stats.dtype
    x, v, g = x2.to(cd), v2.to(cd), g2.to(cd)
    floor = _floor(cd)
    xx, ux, tt = stats[:, 0:1], stats[:, 1:2], stats[:, 2:3]
    dx, du = torch.empty_like(x), torch.empty_like(x)
    gx = torch.mul(g, x, out=dx).sum(dim=-1, keepdim=True)
    gv = torch.mul(g, v, out=du).sum(dim=-1, keepdim=True)
    scalars = _forward_scalars(xx, ux, tt, alpha, max_angle, floor)
    a, b, c = scalars[:3]
    if from_out:  # u = out/B + (c - A/B) x; B = 0 only where alpha = 0, and then P = k = 0
        inv_b = torch.where(b != 0, 1.0 / torch.where(b != 0, b, torch.ones_like(b)), torch.zeros_like(b))
        gu = (gv - a * gx) * inv_b + c * gx
    else:
        gu = gv
    a1, p, a3, b, k = _backward_scalars(xx, ux, gx, gu, scalars, alpha, floor)
    if from_out:
        shift = c - a * inv_b
        p, k, a3, pk = p * inv_b, k * inv_b, a3 + p * shift, p + k * shift  # coefficients on out and x
    else:
        pk = p
    torch.mul(g, a1, out=dx).addcmul_(v, p).addcmul_(x, a3)
    torch.mul(g, b, out=du).addcmul_(v, k).addcmul_(x, pk)
    return dx.to(x2.dtype), du.to(u_dtype)


# ----------------------------------------------------------------------------------------------------------
# Triton kernels, built on first use (triton imported lazily; TRITON_INTERPRET=1 builds interpreted ones)
# ----------------------------------------------------------------------------------------------------------
triton = None
tl = None
_KERNELS: dict = {}
_TRITON_MISSING = False


def triton_available() -> bool:
    """Whether ``triton`` can be imported here (checked once)."""
    global triton, tl, _TRITON_MISSING
    if triton is not None:
        return True
    if _TRITON_MISSING:
        return False
    try:
        import triton as _triton
        import triton.language as _tl
    except Exception:  # ImportError, or a triton that cannot initialise on this machine
        _TRITON_MISSING = True
        return False
    triton, tl = _triton, _tl
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


# The kernels are plain functions here, wrapped by triton.jit in _kernels() (so this module imports without
# triton); the annotations are strings (future import), so tl need not exist at import. One program per row.
def _geonorm_fwd_kernel(X, U, OUT, STATS, stride_x, stride_u, stride_o, N, alpha, max_angle, floor,
                        CLAMP: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    xx = tl.sum(x * x, axis=0)
    ux = tl.sum(u * x, axis=0)
    xn = tl.maximum(tl.sqrt(xx), floor)
    c = ux / (xn * xn)
    t = u - c * x
    tt = tl.sum(t * t, axis=0)
    # --- per-row scalars (as in _forward_scalars and the backward kernel) ---
    tn = tl.sqrt(tt)
    base = tn / xn
    theta_lin = alpha * base
    if CLAMP:
        theta = tl.minimum(alpha * tl.minimum(base, max_angle), max_angle)
        clamped = (base > max_angle) | (theta_lin > max_angle)
    else:
        theta = theta_lin
        clamped = base < 0.0  # never
    small = theta < 1e-3
    theta_safe = tl.where(small, 1.0, theta)
    sinc = tl.where(small, 1.0 - theta * theta / 6.0, tl.sin(theta_safe) / theta_safe)
    tn_safe = tl.where(tn > 0.0, tn, 1.0)
    b = tl.where(clamped, tl.sin(theta) * xn / tn_safe, alpha * sinc)
    a = tl.cos(theta)
    # --- the update and the row numbers ---
    out = a * x + b * t
    tl.store(OUT + row * stride_o + cols, out.to(OUT.dtype.element_ty), mask=mask)
    tl.store(STATS + row * 3, xx)
    tl.store(STATS + row * 3 + 1, ux)
    tl.store(STATS + row * 3 + 2, tt)


def _geonorm_bwd_kernel(X, V, G, STATS, DX, DU, stride_x, stride_v, stride_g, stride_dx, stride_du, N, alpha,
                        max_angle, floor, CLAMP: tl.constexpr, FROM_OUT: tl.constexpr,
                        BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + row * stride_v + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    xx = tl.load(STATS + row * 3)
    ux = tl.load(STATS + row * 3 + 1)
    tt = tl.load(STATS + row * 3 + 2)
    gx = tl.sum(g * x, axis=0)
    gv = tl.sum(g * v, axis=0)
    # --- per-row scalars (as in the forward kernel) ---
    xn = tl.maximum(tl.sqrt(xx), floor)
    c = ux / (xn * xn)
    tn = tl.sqrt(tt)
    base = tn / xn
    theta_lin = alpha * base
    if CLAMP:
        theta = tl.minimum(alpha * tl.minimum(base, max_angle), max_angle)
        clamped = (base > max_angle) | (theta_lin > max_angle)
    else:
        theta = theta_lin
        clamped = base < 0.0  # never
    small = theta < 1e-3
    theta_safe = tl.where(small, 1.0, theta)
    sinc = tl.where(small, 1.0 - theta * theta / 6.0, tl.sin(theta_safe) / theta_safe)
    tn_safe = tl.where(tn > 0.0, tn, 1.0)
    sin = tl.sin(theta)
    b = tl.where(clamped, sin * xn / tn_safe, alpha * sinc)
    a = tl.cos(theta)
    if FROM_OUT:  # v is the output: u = out/B + (c - A/B) x
        inv_b = tl.where(b != 0.0, 1.0 / tl.where(b != 0.0, b, 1.0), 0.0)
        gu = (gv - a * gx) * inv_b + c * gx
    else:
        gu = gv
    # --- the backward scalars (as in _backward_scalars) ---
    gt = gu - c * gx
    t2 = theta * theta  # q = (theta cos theta - sin theta) / theta^3, its series below 0.5
    series = -1.0 / 3.0 + t2 * (1.0 / 30.0 + t2 * (-1.0 / 840.0 + t2 * (1.0 / 45360.0 - t2 / 3991680.0)))
    th = tl.where(theta < 0.5, 1.0, theta)
    q = tl.where(theta < 0.5, series, (th * tl.cos(th) - tl.sin(th)) / (th * th * th))
    s = alpha * q * gt - sinc * gx
    k1 = alpha / xn
    k = tl.where(clamped, -sin * (xn / tn_safe) * (gt / tn_safe) / tn_safe, k1 * (k1 * s))
    gn = tl.where(clamped, gt * sin / tn_safe, -(theta * (theta / xn)) * s)
    tx = ux - c * xx
    big_tx = b * gx + k * tx
    p = -c * k - big_tx / (xn * xn)
    gn_total = gn + 2.0 * big_tx * c / xn
    a3 = c * c * k + tl.where(tl.sqrt(xx) >= floor, gn_total / xn, 0.0)
    a1 = a - c * b
    if FROM_OUT:
        shift = c - a * inv_b
        pv = p * inv_b
        kv = k * inv_b
        a3 = a3 + p * shift
        px = p + k * shift
    else:
        pv = p
        kv = k
        px = p
    # --- the gradients ---
    dx = a1 * g + pv * v + a3 * x
    du = b * g + kv * v + px * x
    tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DU + row * stride_du + cols, du.to(DU.dtype.element_ty), mask=mask)


def _kernels():
    """(forward kernel, backward kernel), wrapped once per interpreter mode (Triton's interpreter needs
    TRITON_INTERPRET=1 set before triton is first imported; its kernels run on CPU tensors)."""
    key = _interpreting()
    if key not in _KERNELS:
        if not triton_available():
            raise RuntimeError("the fused GeoNorm kernel needs triton")
        _KERNELS[key] = (triton.jit(_geonorm_fwd_kernel), triton.jit(_geonorm_bwd_kernel))
    return _KERNELS[key]


def _launch_config(width: int) -> tuple[int, int]:
    block = triton.next_power_of_2(width)
    warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
    return block, warps


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def triton_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None):
    fwd, _ = _kernels()
    rows, width = x2.shape
    out = torch.empty((rows, width), dtype=x2.dtype, device=x2.device)
    stats = torch.empty((rows, 3), dtype=torch.float32, device=x2.device)
    if rows == 0:
        return out, stats
    block, warps = _launch_config(width)
    fwd[(rows,)](
        x2, u2, out, stats, x2.stride(0), u2.stride(0), out.stride(0), width, float(alpha),
        float(max_angle or 0.0), _floor(torch.float32), CLAMP=max_angle is not None, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return out, stats


def triton_backward(x2, v2, g2, stats, alpha: float, max_angle: float | None, from_out: bool, u_dtype):
    _, bwd = _kernels()
    rows, width = x2.shape
    dx = torch.empty((rows, width), dtype=x2.dtype, device=x2.device)
    du = torch.empty((rows, width), dtype=u_dtype, device=x2.device)
    if rows == 0:
        return dx, du
    block, warps = _launch_config(width)
    bwd[(rows,)](
        x2, v2, g2, stats, dx, du, x2.stride(0), v2.stride(0), g2.stride(0), dx.stride(0), du.stride(0), width,
        float(alpha), float(max_angle or 0.0), _floor(torch.float32),
        CLAMP=max_angle is not None, FROM_OUT=from_out, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return dx, du


# ----------------------------------------------------------------------------------------------------------
# the autograd Function and the dispatch
# ----------------------------------------------------------------------------------------------------------
def _composed_step(x: torch.Tensor, u: torch.Tensor, alpha: float, max_angle: float | None) -> torch.Tensor:
    from .geometry import composed_geonorm_step

    return composed_geonorm_step(x, u, alpha, max_angle)


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
                out = _composed_step(xd, ud, ctx.alpha, ctx.max_angle)
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


def can_fuse(x: torch.Tensor, u: torch.Tensor, alpha, bridge, step_scale, step_bias) -> bool:
    """Whether ``geonorm_step`` with these arguments is computed by the fused Function."""
    return (
        _ENABLED
        and bridge == 1.0
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
    picks ``kept_for_backward``."""
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
