"""The fused GeoNorm step as one autograd Function (``FusedGeoNormStep``): the Triton kernels on CUDA
(``triton_loader.py``), their torch twin elsewhere (``step_twin.py``), chosen per call by ``fused_backend``.

It computes ``geometry.geodesic_step`` with a Python-number ``alpha``, and takes the same arguments (``step.py``
chooses between the two; ``step_twin.py`` writes the math out). The Triton kernel computes in float32,
so float64 takes the torch twin; rows wider than ``MAX_FUSED_WIDTH`` take the twin too.

Memory. The forward keeps x (which the sublayer's input norm keeps anyway), three numbers per row, and
either u or its own output ``out``. Where the output is float32/float64 and the angle is clamped at most
pi/2 (the defaults; also a float32 state under bf16 autocast), it keeps ``out``, which the next norm keeps
anyway, and the backward forms u = (out - A x)/B + c x implicitly (its coefficients are rewritten onto
``out`` and x). With theta <= pi/2, B is not small where u matters, and the rounding of ``out`` reaches the
gradients at the float32 level of their own size (tests check them against the plain implementation). Then a
GeoNorm step costs no activation memory beyond a Pre-Norm residual add (which keeps nothing). A
bfloat16/float16 state, no clamp or a clamp above pi/2 keep u instead. (As for any saved tensor, changing
``out`` in place before the backward makes autograd raise its usual error.)

Double backward (``create_graph=True``) differentiates ``geometry.geodesic_step`` where u was kept, and raises where
``out`` was kept (turn the fused update off for higher-order gradients: ``step_switch.py``).

Under ``torch.compile`` the torch twin is traced (Inductor fuses it into its own kernels), never the
hand-written kernel, so compiled graphs contain no opaque call and no graph break.
"""

from __future__ import annotations

import math

import torch

from .geometry import geodesic_step
from .step_twin import no_autocast, torch_backward, torch_forward
from .triton_loader import triton_available, triton_backward, triton_forward

MAX_FUSED_WIDTH = 16384  # widest row the kernel keeps in registers; wider rows use the torch twin
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FUSED_DTYPES = (torch.float64, *KERNEL_DTYPES)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


class FusedGeoNormStep(torch.autograd.Function):
    """geometry.geodesic_step(x, u, alpha, max_angle). ``backend``: "triton" or "torch";
    ``keep``: "output" or "update", what the backward reads besides x (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, u, alpha, max_angle, backend, keep):
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
        if torch.is_grad_enabled():  # create_graph=True: differentiate the plain implementation instead
            if ctx.from_out:
                raise RuntimeError(
                    "the fused GeoNorm update keeps its output, not the update, for the backward and has no "
                    "double backward: call hf_geonorm.modeling.step_switch.set_fused_enabled(False) "
                    "(or set HF_GEONORM_FUSED=0) for higher-order gradients"
                )
            with torch.enable_grad():
                xd = x if x.requires_grad else x.detach().requires_grad_()
                ud = v if v.requires_grad else v.detach().requires_grad_()
                out = geodesic_step(xd, ud, ctx.alpha, ctx.max_angle)
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


def fused_backend(x: torch.Tensor, u: torch.Tensor | None = None) -> str:
    """Which implementation the fused Function uses for ``x`` (and ``u``): "triton" (CUDA, triton importable,
    not while torch.compile traces, a width the kernel holds, float32/bfloat16/float16) or "torch"."""
    if (
        x.is_cuda
        and x.dtype in KERNEL_DTYPES
        and (u is None or u.dtype in KERNEL_DTYPES)
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


def fused_geonorm_step(
    x: torch.Tensor,
    u: torch.Tensor,
    alpha: float,
    max_angle: float | None,
    backend: str | None = None,
    keep: str | None = None,
) -> torch.Tensor:
    """The fused implementation of ``geometry.geodesic_step`` (a number ``alpha``; the same arguments first).
    ``backend`` None picks ``fused_backend``; "triton" on CPU tensors runs Triton's interpreter (TRITON_INTERPRET=1
    before triton's import; tests). ``keep`` None picks ``kept_for_backward``. No first-use check here: that is
    ``step.geodesic_step``'s."""
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
