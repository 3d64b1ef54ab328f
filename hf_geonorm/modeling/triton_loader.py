"""The Triton kernels (``triton_kernels.py``), imported on first use and only where they can be: the rest of the
modelling code must import, and checkpoints must load, where triton is not installed (remote code included), and
``import hf_geonorm`` should not pay for triton. With ``TRITON_INTERPRET=1`` set before triton's first import
the kernels are Triton's interpreted ones and run on CPU tensors (tests)."""

from __future__ import annotations

from collections.abc import Callable

import torch

_KERNELS: tuple[Callable, Callable] | None = None
_TRITON_MISSING = False


def triton_available() -> bool:
    """Whether the Triton kernels (``triton_kernels.py``, which needs ``triton``) import here (checked once)."""
    global _KERNELS, _TRITON_MISSING
    if _KERNELS is None and not _TRITON_MISSING:
        try:
            from .triton_kernels import triton_backward, triton_forward
        except Exception:  # ImportError, or a triton that cannot initialise on this machine
            _TRITON_MISSING = True
        else:
            _KERNELS = (triton_forward, triton_backward)
    return _KERNELS is not None


def triton_forward(x2: torch.Tensor, u2: torch.Tensor, alpha: float, max_angle: float | None):
    """``triton_kernels.triton_forward``, or a RuntimeError that says what to install."""
    if not triton_available():
        raise RuntimeError("the fused GeoNorm kernel needs triton (pip install triton)")
    return _KERNELS[0](x2, u2, alpha, max_angle)


def triton_backward(x2, v2, g2, stats, alpha: float, max_angle: float | None, from_out: bool, u_dtype):
    """``triton_kernels.triton_backward``, or a RuntimeError that says what to install."""
    if not triton_available():
        raise RuntimeError("the fused GeoNorm kernel needs triton (pip install triton)")
    return _KERNELS[1](x2, v2, g2, stats, alpha, max_angle, from_out, u_dtype)
