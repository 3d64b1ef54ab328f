"""The Triton kernels of the fused GeoNorm update (``fused.py`` says what they compute, launches them and
says when they run).

One program per row (one token): the whole row of ``x`` and ``u`` is loaded once into registers, in float32
whatever the input dtypes; the reductions <x,x> and <u,x> run over it, then |t|^2 = sum (u - c x)^2 over the
same registers (no second read of memory; used instead of the identity |t|^2 = <u,u> - <u,x>^2/<x,x>, which
cancels catastrophically when u is nearly parallel to x); the output is written once in x's dtype and the three
row numbers once. The backward kernel reads x, u (or the output) and the output gradient once, forms <g,x> and
<g,u> (or <g,out>) and writes dx and du once.

Both kernels get their per-row numbers from the one helper ``_row_step``: ``geometry.geonorm_rotation`` and the
step's coefficients spelled out in Triton's language (Triton cannot call torch code). The backward-only numbers
are ``_row_gradients``, the Triton spelling of ``fused._gradient_scalars``. tests/test_fused.py runs both
kernels against the composed torch path through Triton's interpreter.

``fused.py`` imports this module only where triton imports (on first use, so ``import hf_geonorm`` does
not pay for triton; with TRITON_INTERPRET=1 set before that, the kernels are Triton's interpreted ones and run
on CPU).
"""

from __future__ import annotations  # kernel annotations (tl.constexpr) stay unevaluated strings

try:  # transformers' remote-code check skips imports inside try: checkpoints load where triton is missing
    import triton
    import triton.language as tl
except ImportError as missing:
    raise ImportError("the fused GeoNorm kernels need triton (pip install triton)") from missing


@triton.jit
def _row_tangent(xx, ux, floor):
    """|x| floored, c = <u,x>/|x|^2 and whether the row moves (geometry.floored_norm, tangent_coefficient)."""
    norm = tl.sqrt(xx)
    xn = tl.maximum(norm, floor)
    return xn, ux / xn / xn, norm >= floor


@triton.jit
def _row_step(xx, ux, tt, alpha, max_angle, floor, CLAMP: tl.constexpr):
    """From <x,x>, <u,x> and |t|^2: A = cos(theta) and B = sin_over(theta) step of out = A x + B t, with
    c = <u,x>/|x|^2, |x| (floored), |t|, theta, sin_over(theta), the clamped and the moving rows."""
    xn, c, moves = _row_tangent(xx, ux, floor)
    tn = tl.sqrt(tt)
    base = tn / xn
    if CLAMP:
        theta = tl.minimum(alpha * tl.minimum(base, max_angle), max_angle)
        clamped = (base > max_angle) | (alpha * base > max_angle)
    else:  # no clamp: max_angle is settings.MAX_TURN, which only the final angle meets
        theta = tl.minimum(alpha * base, max_angle)
        clamped = alpha * base > max_angle
    step = tl.where(clamped, theta / tl.where(base > 0.0, base, 1.0), alpha)
    theta = tl.where(moves, theta, 0.0)
    step = tl.where(moves, step, 0.0)
    small = theta < 1e-3
    theta_safe = tl.where(small, 1.0, theta)
    sinc = tl.where(small, 1.0 - theta * theta / 6.0, tl.sin(theta_safe) / theta_safe)
    return tl.cos(theta), sinc * step, c, xn, tn, theta, sinc, clamped, moves


@triton.jit
def _row_gradients(gx, gu, a, b, c, xn, tn, theta, sinc, clamped, moves, alpha):
    """(A - cB, P, a3, k): dx = (A - cB) g + P u + a3 x and du = B g + k u + P x."""
    gt = gu - c * gx
    t2 = theta * theta  # q = (cos(theta) - sin_over(theta)) / theta^2, its series below 0.5
    series = -1.0 / 3.0 + t2 * (1.0 / 30.0 + t2 * (-1.0 / 840.0 + t2 * (1.0 / 45360.0 - t2 / 3991680.0)))
    th = tl.where(theta < 0.5, 1.0, theta)
    q = tl.where(theta < 0.5, series, (tl.cos(th) - tl.sin(th) / th) / (th * th))
    s = alpha * q * gt - sinc * gx
    k1 = alpha / xn
    tn_safe = tl.where(tn > 0.0, tn, 1.0)
    sin = tl.sin(theta)
    k = tl.where(clamped, -sin * (xn / tn_safe) * (gt / tn_safe) / tn_safe, k1 * (k1 * s))
    gn = tl.where(clamped, gt * sin / tn_safe, -(theta / xn) * (theta * s))
    bt = b * gx
    p = tl.where(moves, -(c * k) - bt / xn / xn, 0.0)
    a3 = tl.where(moves, c * (c * k) + (gn + 2.0 * bt * c / xn) / xn, 0.0)
    return a - c * b, p, a3, tl.where(moves, k, 0.0)


@triton.jit
def geodesic_forward_kernel(X, U, OUT, STATS, stride_x, stride_u, stride_o, N, alpha, max_angle, floor,
                            CLAMP: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    xx = tl.sum(x * x, axis=0)
    ux = tl.sum(u * x, axis=0)
    _, c, _ = _row_tangent(xx, ux, floor)
    t = u - c * x
    tt = tl.sum(t * t, axis=0)
    a, b, c, xn, tn, theta, sinc, clamped, moves = _row_step(xx, ux, tt, alpha, max_angle, floor, CLAMP)
    out = a * x + b * t
    tl.store(OUT + row * stride_o + cols, out.to(OUT.dtype.element_ty), mask=mask)
    tl.store(STATS + row * 3, xx)
    tl.store(STATS + row * 3 + 1, ux)
    tl.store(STATS + row * 3 + 2, tt)


@triton.jit
def geodesic_backward_kernel(X, V, G, STATS, DX, DU, stride_x, stride_v, stride_g, stride_dx, stride_du, N,
                             alpha, max_angle, floor, CLAMP: tl.constexpr, FROM_OUT: tl.constexpr,
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
    a, b, c, xn, tn, theta, sinc, clamped, moves = _row_step(xx, ux, tt, alpha, max_angle, floor, CLAMP)
    if FROM_OUT:  # v is the output: u = out/B + (c - A/B) x
        inv_b = tl.where(b != 0.0, 1.0 / tl.where(b != 0.0, b, 1.0), 0.0)
        gu = (gv - a * gx) * inv_b + c * gx
    else:
        gu = gv
    a1, p, a3, k = _row_gradients(gx, gu, a, b, c, xn, tn, theta, sinc, clamped, moves, alpha)
    if FROM_OUT:  # the coefficients rewritten onto out and x
        shift = c - a * inv_b
        a3 = a3 + p * shift
        px = p + k * shift
        p = p * inv_b
        k = k * inv_b
    else:
        px = p
    dx = a1 * g + p * v + a3 * x
    du = b * g + k * v + px * x
    tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    tl.store(DU + row * stride_du + cols, du.to(DU.dtype.element_ty), mask=mask)
