"""The first-use check of the Triton kernel. Until the kernels have been shown right on real GPUs, a process does
not depend on them being right: the first time ``step.geodesic_step`` would use the Triton kernel for a device,
dtypes, clamp and saved tensor (``kernel_passes_check``), it runs the kernel forward and backward on a small random
batch against the torch twin in float64 (``check_kernel``), with the bound tests/test_fused.py uses. If it raises
or differs, a warning naming ``HF_GEONORM_FUSED`` is given once and ``step.geodesic_step`` uses the plain
implementation (``geometry.geodesic_step``) for the rest of the process. It lives with the modelling code because
a model loaded as remote code on a GPU runs it too.
"""

from __future__ import annotations

import math
import warnings

import torch

from .step_autograd import FusedGeoNormStep, kept_for_backward
from .step_switch import ENV_VAR
from .step_twin import no_autocast

_KERNEL_CHECKS: dict[tuple, str | None] = {}  # (device, x dtype, u dtype, clamped, keep) -> None or the problem
_kernel_failure: str | None = None  # once set, step.geodesic_step never uses the kernel again in this process


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
        with torch.inference_mode(False), torch.enable_grad(), no_autocast(device):
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
    """What made the kernel fail its first-use check in this process (then the plain implementation runs), or None."""
    return _kernel_failure


def kernel_passes_check(x: torch.Tensor, u: torch.Tensor, max_angle: float | None) -> bool:
    """Whether ``step.geodesic_step`` may use the Triton kernel for these tensors: ``check_kernel`` runs on first use
    per device, dtypes, clamp and saved tensor; after any failure (warned once) never again in this process."""
    global _kernel_failure
    if _kernel_failure is not None:
        return False
    keep = kept_for_backward(x, max_angle)
    key = (str(x.device), x.dtype, u.dtype, max_angle is None, keep)
    if key not in _KERNEL_CHECKS:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return False  # a CUDA graph being captured cannot run the check: plain until a call outside it
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
