"""Where the fused GeoNorm step runs, and the Triton side of it. ``geometry.geodesic_step`` computes its plain
settings (bridge 1, both clamps, no learnable step, a number alpha) with one autograd Function,
``geometry.FusedGeodesicStep``: on CUDA the Triton kernels (``triton_kernels.py``, imported on first use and only
where triton imports, launched from here), elsewhere their torch twin. This file says which calls it takes
(``can_fuse``), with which backend (``fused_backend``) and what its backward keeps (``kept_for_backward``), holds
the process-wide switch and the kernel's first-use check, and imports none of the math (``geometry.py`` imports
it).

The switch. ``HF_GEONORM_FUSED=0`` (read at import) or ``set_fused_enabled(False)`` turns the Function off for
the process: ``geodesic_step`` then composes every step. A switch, not a setting, because both compute the same
step: it exists to rule the kernel out when something looks wrong, and for higher-order gradients.

The first-use check. Until the kernels have been shown right on real GPUs, a process does not depend on them
being right: the first time ``geodesic_step`` would use the Triton kernel for a device, dtypes, clamp and saved
tensor (``kernel_passes_check``), it runs the kernel forward and backward on a small random batch against the
torch twin in float64 (``check_kernel``), with the bound tests/test_fused.py uses. If it raises or differs, a
warning naming ``HF_GEONORM_FUSED`` is given once and ``geodesic_step`` composes every step for the rest of the
process. It lives with the modelling code because a model loaded as remote code on a GPU runs it too.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Callable

import torch

from .settings import MAX_TURN, NORM_FLOOR

MAX_FUSED_WIDTH = 16384  # widest row the kernel keeps in registers; wider rows use the torch twin
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FUSED_DTYPES = (torch.float64, *KERNEL_DTYPES)
ENV_VAR = "HF_GEONORM_FUSED"


# ---- the switch ----


def _env_enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


_ENABLED = _env_enabled()


def set_fused_enabled(enabled: bool) -> None:
    """Turn the fused GeoNorm update (Triton on CUDA, its torch twin elsewhere) on or off for this process.
    Off, ``geometry.geodesic_step`` composes every step. The initial value comes from the environment variable
    ``HF_GEONORM_FUSED`` (``0``/``false``/``off`` disable it)."""
    global _ENABLED
    _ENABLED = bool(enabled)


def fused_enabled() -> bool:
    return _ENABLED


def can_fuse(x: torch.Tensor, u: torch.Tensor, alpha: float | torch.Tensor) -> bool:
    """Whether the Function takes ``geodesic_step(x, u, alpha, ...)`` at its plain settings: the switch is on,
    ``alpha`` is a number, and x and u have one shape, device and a dtype it computes in."""
    return (
        _ENABLED
        and isinstance(alpha, (int, float))
        and not isinstance(alpha, bool)
        and x.shape == u.shape
        and x.dtype in FUSED_DTYPES
        and u.dtype in FUSED_DTYPES
        and x.device == u.device
        and x.dim() >= 1
    )


def fused_backend(x: torch.Tensor, u: torch.Tensor | None = None) -> str:
    """Which implementation the Function uses for ``x`` (and ``u``): "triton" (CUDA, triton importable,
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
    "update" (``geometry.FusedGeodesicStep``, "Memory")."""
    if x.dtype in (torch.float32, torch.float64) and max_angle is not None and max_angle <= math.pi / 2:
        return "output"
    return "update"


def no_autocast(device: torch.device):
    """The fused step computes in its own dtypes: autocast off where the device type has autocast."""
    if device.type in ("cpu", "cuda", "xpu", "mps", "hpu"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


# ---- the Triton kernels: loaded on first use, launched here ----

_KERNELS: tuple[Callable, Callable] | None = None  # the forward and the backward kernel
_TRITON_MISSING = False


def triton_available() -> bool:
    """Whether the Triton kernels (``triton_kernels.py``, which needs ``triton``) import here (checked once): the
    rest of the modelling code must import, and checkpoints must load, where triton is not installed (remote code
    included), and ``import hf_geonorm`` should not pay for triton. With ``TRITON_INTERPRET=1`` set before
    triton's first import the kernels are Triton's interpreted ones and run on CPU tensors (tests)."""
    global _KERNELS, _TRITON_MISSING
    if _KERNELS is None and not _TRITON_MISSING:
        try:
            from .triton_kernels import geodesic_backward_kernel, geodesic_forward_kernel
        except Exception:  # ImportError, or a triton that cannot initialise on this machine
            _TRITON_MISSING = True
        else:
            _KERNELS = (geodesic_forward_kernel, geodesic_backward_kernel)
    return _KERNELS is not None


def _kernels() -> tuple[Callable, Callable]:
    """(the forward kernel, the backward kernel), or a RuntimeError that says what to install."""
    if not triton_available():
        raise RuntimeError("the fused GeoNorm kernel needs triton (pip install triton)")
    return _KERNELS


def forward_launch(x2, u2, out, stats, alpha: float, max_angle: float | None) -> tuple[tuple, dict]:
    """The forward kernel's arguments and launch options for these tensors: what ``triton_forward`` launches with,
    and what tests/test_kernel_compile.py compiles ahead of time for every GPU (Triton specialises each kernel on
    them: dtypes, constexprs, and pointers, strides and the width divisible by 16). With no clamp the kernel
    clamps the final angle at ``MAX_TURN``."""
    width = x2.shape[1]
    block = 1 << (width - 1).bit_length()  # the row in one power-of-two block
    warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
    limit = MAX_TURN if max_angle is None else float(max_angle)
    arguments = (x2, u2, out, stats, x2.stride(0), u2.stride(0), out.stride(0), width, float(alpha), limit,
                 NORM_FLOOR)  # fmt: skip
    return arguments, {"CLAMP": max_angle is not None, "BLOCK": block, "num_warps": warps}


def backward_launch(x2, v2, g2, stats, dx, du, alpha: float, max_angle: float | None, from_out: bool):
    """The backward kernel's arguments and launch options for these tensors (as ``forward_launch``)."""
    width = x2.shape[1]
    block = 1 << (width - 1).bit_length()
    warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
    limit = MAX_TURN if max_angle is None else float(max_angle)
    arguments = (x2, v2, g2, stats, dx, du, x2.stride(0), v2.stride(0), g2.stride(0), dx.stride(0), du.stride(0),
                 width, float(alpha), limit, NORM_FLOOR)  # fmt: skip
    return arguments, {"CLAMP": max_angle is not None, "FROM_OUT": from_out, "BLOCK": block, "num_warps": warps}


def triton_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None):
    """The forward kernel on [rows, width] tensors with unit column stride: (out, [rows, 3] float32 stats), or a
    RuntimeError that says what to install."""
    forward_kernel, _ = _kernels()
    rows, width = x2.shape
    out = torch.empty((rows, width), dtype=x2.dtype, device=x2.device)
    stats = torch.empty((rows, 3), dtype=torch.float32, device=x2.device)
    if rows == 0:
        return out, stats
    arguments, options = forward_launch(x2, u2, out, stats, alpha, max_angle)
    forward_kernel[(rows,)](*arguments, **options)
    return out, stats


def triton_backward(x2, v2, g2, stats, alpha: float, max_angle: float | None, from_out: bool, u_dtype):
    """The backward kernel: (dx, du) from x, v (u, or the forward's output with ``from_out``), the output
    gradient and the forward's row numbers."""
    _, backward_kernel = _kernels()
    rows, width = x2.shape
    dx = torch.empty((rows, width), dtype=x2.dtype, device=x2.device)
    du = torch.empty((rows, width), dtype=u_dtype, device=x2.device)
    if rows == 0:
        return dx, du
    arguments, options = backward_launch(x2, v2, g2, stats, dx, du, alpha, max_angle, from_out)
    backward_kernel[(rows,)](*arguments, **options)
    return dx, du


# ---- the kernel's first-use check ----

_KERNEL_CHECKS: dict[tuple, str | None] = {}  # (device, x dtype, u dtype, clamped, keep) -> None or the problem
_kernel_failure: str | None = None  # once set, geodesic_step never uses the kernel again in this process


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
    step: type[torch.autograd.Function],
    device: torch.device | str,
    x_dtype: torch.dtype = torch.float32,
    u_dtype: torch.dtype | None = None,
    width: int = 96,
    max_angle: float | None = math.pi / 4,
    keep: str | None = None,
) -> str | None:
    """Run the Triton kernel forward and backward once on a small random batch and compare it with the torch
    twin computed in float64 on the same (rounded) inputs, both through ``step`` (``geometry.FusedGeodesicStep``,
    which computes with this file's launch and the twin). None if it agrees, else what went wrong.

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
        out = step.apply(xs, us, 0.7, max_angle, backend, keep)
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
    """What made the kernel fail its first-use check in this process (then the composed path runs), or None."""
    return _kernel_failure


def kernel_passes_check(
    step: type[torch.autograd.Function], x: torch.Tensor, u: torch.Tensor, max_angle: float | None
) -> bool:
    """Whether ``geodesic_step`` may use the Triton kernel through ``step`` for these tensors: ``check_kernel`` runs
    on first use per device, dtypes, clamp and saved tensor; after any failure (warned once) never again in this
    process."""
    global _kernel_failure
    if _kernel_failure is not None:
        return False
    keep = kept_for_backward(x, max_angle)
    key = (str(x.device), x.dtype, u.dtype, max_angle is None, keep)
    if key not in _KERNEL_CHECKS:
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return False  # a CUDA graph being captured cannot run the check: composed until a call outside it
        problem = check_kernel(step, x.device, x.dtype, u.dtype, x.shape[-1], max_angle, keep)
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
