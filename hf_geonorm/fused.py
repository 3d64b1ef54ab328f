"""A fused GeoNorm update: one autograd Function with a Triton kernel on CUDA and a torch twin elsewhere.

What it computes is ``geometry.geonorm_step(x, u, alpha, max_angle)`` with ``bridge == 1``, a Python-number
``alpha`` and no learnable step scale/bias (GEONORM.md, "The update"): per row (one token, along the hidden
dim), with t = u - (<u,x>/|x|^2) x,

    theta = min(alpha min(|t|/|x|, max_angle), max_angle)        (theta = alpha |t|/|x| when max_angle is None)
    out   = cos(theta) x + B t,   B = alpha sinc(theta)           where no clamp is active,
                                  B = sin(theta) |x| / |t|        where one is (theta is then a constant),

so ``out = (A - B c) x + B u`` with per-row scalars A = cos(theta), c = <u,x>/|x|^2: every row needs only
the two dot products <x,x>, <u,x> and |t|. The backward is written out in the same per-row scalars:

    dx = (A - cB) g + P u + (c^2 k + [|x| not floored] G/|x|) x,      du = B g + k u + P x,

with k, P, G per-row scalars formed from <g,x>, <g,u> and the forward's scalars (see ``_backward_scalars``).
Nothing of the size of ``x`` is stored for the backward beyond ``x`` and ``u`` themselves (which the
surrounding model keeps alive anyway): the Triton backward recomputes the reductions from ``x`` and ``u``,
which it must read anyway to form dx and du; the torch twin keeps three float32 numbers per row.

Kernel (CUDA, ``triton`` importable): one program per row; the whole row of ``x`` and ``u`` is loaded once
into registers (in float32 whatever the input dtype), the reductions <x,x> and <u,x> run over it, then
|t|^2 = sum (u - c x)^2 over the same registers (no second read of memory; this is used instead of the
identity |t|^2 = <u,u> - <u,x>^2/<x,x>, which cancels catastrophically when u is nearly parallel to x),
and the output is written once in the input dtype. The backward kernel reads x, u and the output gradient
once, forms <x,x>, <u,x>, <g,x>, <g,u> and |t|^2 the same way and writes dx and du once. Rows wider than
``MAX_FUSED_WIDTH`` use the torch twin.

What falls back to the composed torch path of ``geometry.geonorm_step`` (the fused Function is not used):
``bridge < 1``, the learnable step scale/bias, a tensor ``alpha``, float64 on the kernel (the torch twin
handles it), x and u of different shapes or dtypes, and double backward (the backward of the backward is
taken through the composed path, so ``create_graph=True`` still gives exact second derivatives).

Under ``torch.compile`` the torch twin is traced (Inductor fuses it into its own kernels), never the
hand-written kernel, so compiled graphs have no opaque custom call and no graph break.

Switch: the environment variable ``HF_GEONORM_FUSED=0`` (read at import) or ``set_fused_enabled(False)``
turns the fused Function off everywhere (the composed autograd path of ``geometry.geonorm_step`` is used,
as before this module existed); ``set_fused_enabled(True)`` turns it back on. Default: on.

This file is copied beside saved checkpoints as remote code: it imports only torch (triton lazily, inside
``try``, so the module imports fine where triton is not installed).
"""

import math
import os

import torch

ENV_VAR = "HF_GEONORM_FUSED"
MAX_FUSED_WIDTH = 16384  # widest row the kernel keeps in registers; wider rows use the torch twin


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
# per-row scalars, shared by the torch twin (the Triton kernels spell out the same lines with tl.*)
# ----------------------------------------------------------------------------------------------------------
def _floor(dtype: torch.dtype) -> float:
    """sqrt(tiny): the lower bound of |x| in divisions (as in geometry._norm_floor)."""
    return math.sqrt(torch.finfo(dtype).tiny)


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
    """Coefficients of dx = a1 g + a2 u + a3 x and du = B g + k u + P x (see the module docstring)."""
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


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vecdot(a, b).unsqueeze(-1)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def torch_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None):
    """The torch twin of the forward kernel on [rows, width] tensors: (out, (<x,x>, <u,x>, |t|^2))."""
    cd = _compute_dtype(x2.dtype)
    x, u = x2.to(cd), u2.to(cd)
    floor = _floor(cd)
    xn_raw = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    xx = xn_raw * xn_raw
    ux = _dot(u, x)
    c = ux / (xn_raw.clamp_min(floor) ** 2)
    tt = torch.linalg.vector_norm(torch.addcmul(u, x, c, value=-1.0), dim=-1, keepdim=True) ** 2
    a, b, c, *_ = _forward_scalars(xx, ux, tt, alpha, max_angle, floor)
    out = (x * (a - b * c)).addcmul_(u, b)
    return out.to(x2.dtype), (xx, ux, tt)


def torch_backward(x2, u2, g2, row_stats, alpha: float, max_angle: float | None):
    """The torch twin of the backward kernel: (dx, du) from x, u, the output gradient and the per-row
    <x,x>, <u,x>, |t|^2 (recomputed when ``row_stats`` is None)."""
    cd = _compute_dtype(x2.dtype)
    x, u, g = x2.to(cd), u2.to(cd), g2.to(cd)
    floor = _floor(cd)
    if row_stats is None:
        xx, ux = _dot(x, x), _dot(u, x)
        c = ux / xx.sqrt().clamp_min(floor) ** 2
        tt = torch.linalg.vector_norm(torch.addcmul(u, x, c, value=-1.0), dim=-1, keepdim=True) ** 2
    else:
        xx, ux, tt = row_stats
    scalars = _forward_scalars(xx, ux, tt, alpha, max_angle, floor)
    a1, p, a3, b, k = _backward_scalars(xx, ux, _dot(g, x), _dot(g, u), scalars, alpha, floor)
    dx = (g * a1).addcmul_(u, p).addcmul_(x, a3)
    du = (g * b).addcmul_(u, k).addcmul_(x, p)
    return dx.to(x2.dtype), du.to(u2.dtype)


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
# triton); their annotations are strings for the same reason. Each kernel handles one row.
def _geonorm_fwd_kernel(X, U, OUT, stride_x, stride_u, stride_o, N, alpha, max_angle, floor,
                        CLAMP: "tl.constexpr", BLOCK: "tl.constexpr"):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    # --- per-row scalars (the same lines as in the backward kernel and _forward_scalars) ---
    xx = tl.sum(x * x, axis=0)
    ux = tl.sum(u * x, axis=0)
    xn = tl.maximum(tl.sqrt(xx), floor)
    c = ux / (xn * xn)
    t = u - c * x
    tn = tl.sqrt(tl.sum(t * t, axis=0))
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
    # --- the update ---
    out = (a - b * c) * x + b * u
    tl.store(OUT + row * stride_o + cols, out.to(OUT.dtype.element_ty), mask=mask)


def _geonorm_bwd_kernel(X, U, G, DX, DU, stride_x, stride_u, stride_g, stride_dx, stride_du, N, alpha, max_angle,
                        floor, CLAMP: "tl.constexpr", BLOCK: "tl.constexpr"):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    # --- per-row scalars, recomputed (as in the forward kernel) ---
    xx = tl.sum(x * x, axis=0)
    ux = tl.sum(u * x, axis=0)
    xn = tl.maximum(tl.sqrt(xx), floor)
    c = ux / (xn * xn)
    t = u - c * x
    tn = tl.sqrt(tl.sum(t * t, axis=0))
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
    # --- the backward scalars (as in _backward_scalars) ---
    gx = tl.sum(g * x, axis=0)
    gu = tl.sum(g * u, axis=0)
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
    # --- the gradients ---
    dx = (a - c * b) * g + p * u + a3 * x
    du = b * g + k * u + p * x
    tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DU + row * stride_du + cols, du.to(DU.dtype.element_ty), mask=mask)


def _kernels():
    """(forward kernel, backward kernel), wrapped once per interpreter mode (TRITON_INTERPRET=1 at the first
    call in that mode gives interpreted kernels that run on CPU tensors)."""
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


def triton_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None) -> torch.Tensor:
    fwd, _ = _kernels()
    rows, width = x2.shape
    out = torch.empty((rows, width), dtype=x2.dtype, device=x2.device)
    if rows == 0:
        return out
    block, warps = _launch_config(width)
    fwd[(rows,)](
        x2, u2, out, x2.stride(0), u2.stride(0), out.stride(0), width, float(alpha),
        float(max_angle or 0.0), _floor(torch.float32), CLAMP=max_angle is not None, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return out


def triton_backward(x2, u2, g2, alpha: float, max_angle: float | None):
    _, bwd = _kernels()
    rows, width = x2.shape
    g2 = g2 if g2.stride(-1) == 1 else g2.contiguous()
    dx = torch.empty((rows, width), dtype=x2.dtype, device=x2.device)
    du = torch.empty((rows, width), dtype=u2.dtype, device=u2.device)
    if rows == 0:
        return dx, du
    block, warps = _launch_config(width)
    bwd[(rows,)](
        x2, u2, g2, dx, du, x2.stride(0), u2.stride(0), g2.stride(0), dx.stride(0), du.stride(0), width,
        float(alpha), float(max_angle or 0.0), _floor(torch.float32),
        CLAMP=max_angle is not None, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return dx, du


# ----------------------------------------------------------------------------------------------------------
# the autograd Function and the dispatch
# ----------------------------------------------------------------------------------------------------------
def _composed_step(x: torch.Tensor, u: torch.Tensor, alpha: float, max_angle: float | None) -> torch.Tensor:
    from .geometry import composed_geonorm_step

    return composed_geonorm_step(x, u, alpha, max_angle)


class FusedGeoNormStep(torch.autograd.Function):
    """geonorm_step(x, u, alpha, max_angle) with bridge 1: ``backend`` is "triton" or "torch"."""

    @staticmethod
    def forward(ctx, x, u, alpha, max_angle, backend):
        shape = x.shape
        x2, u2 = _rows(x), _rows(u)
        if backend == "triton":
            out, stats = triton_forward(x2, u2, alpha, max_angle), ()
        else:
            out, stats = torch_forward(x2, u2, alpha, max_angle)
        ctx.save_for_backward(x, u, *stats)
        ctx.alpha, ctx.max_angle, ctx.backend = alpha, max_angle, backend
        return out.view(shape)

    @staticmethod
    def backward(ctx, grad_out):
        x, u, *stats = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiate the composed path instead
            with torch.enable_grad():
                xd = x.detach().requires_grad_() if not x.requires_grad else x
                ud = u.detach().requires_grad_() if not u.requires_grad else u
                out = _composed_step(xd, ud, ctx.alpha, ctx.max_angle)
                dx, du = torch.autograd.grad(out, (xd, ud), grad_out, create_graph=True)
            return dx, du, None, None, None
        x2, u2, g2 = _rows(x), _rows(u), _rows(grad_out)
        if ctx.backend == "triton":
            dx, du = triton_backward(x2, u2, g2, ctx.alpha, ctx.max_angle)
        else:
            dx, du = torch_backward(x2, u2, g2, tuple(stats) or None, ctx.alpha, ctx.max_angle)
        return dx.view(x.shape), du.view(u.shape), None, None, None


_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def fused_backend(x: torch.Tensor) -> str:
    """Which implementation the fused Function uses for ``x``: "triton" (CUDA, triton importable, not while
    torch.compile traces, a width the kernel holds, a kernel dtype) or "torch"."""
    if (
        x.is_cuda
        and x.dtype in _KERNEL_DTYPES
        and 0 < x.shape[-1] <= MAX_FUSED_WIDTH
        and not torch.compiler.is_compiling()
        and triton_available()
    ):
        return "triton"
    return "torch"


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
        and x.dtype == u.dtype
        and x.dtype in (torch.float64, *_KERNEL_DTYPES)
        and x.device == u.device
        and x.dim() >= 1
    )


def fused_geonorm_step(
    x: torch.Tensor, u: torch.Tensor, alpha: float, max_angle: float | None, backend: str | None = None
) -> torch.Tensor:
    """The fused GeoNorm step (bridge 1, scalar alpha). ``backend`` None picks ``fused_backend(x)``;
    "triton" on CPU tensors needs TRITON_INTERPRET=1 (tests)."""
    backend = fused_backend(x) if backend is None else backend
    if backend not in ("triton", "torch"):
        raise ValueError(f"backend must be 'triton' or 'torch'; got {backend!r}")
    ma = None if max_angle is None else float(max_angle)
    return FusedGeoNormStep.apply(x, u, float(alpha), ma, backend)
