"""The one place where the implementation of the GeoNorm update is chosen: ``geodesic_step`` computes
``geometry.geodesic_step(x, u, alpha, max_angle)`` with the fused Function (``step_autograd.py``: the Triton
kernel on CUDA once it has passed its first-use check, ``kernel_check.py``; its torch twin elsewhere) where that
covers the call, and with the plain ``geometry.geodesic_step`` elsewhere. Both take the same arguments and
compute the same step; tests/test_fused.py checks the fused one against the plain one. (The modelling modules
import names with ``from .x import y``: that is how transformers finds a saved folder's remote code.)

The plain one runs for a tensor ``alpha``, x and u of different shapes, devices or other dtypes, and everything
while the switch is off (``step_switch.py``).
"""

from __future__ import annotations

import torch

from .geometry import geodesic_step as plain_geodesic_step
from .kernel_check import kernel_passes_check
from .step_autograd import FUSED_DTYPES, fused_backend, fused_geonorm_step
from .step_switch import fused_enabled


def can_fuse(x: torch.Tensor, u: torch.Tensor, alpha: float | torch.Tensor) -> bool:
    """Whether ``geodesic_step(x, u, alpha, ...)`` is computed by the fused Function."""
    return (
        fused_enabled()
        and isinstance(alpha, (int, float))
        and not isinstance(alpha, bool)
        and x.shape == u.shape
        and x.dtype in FUSED_DTYPES
        and u.dtype in FUSED_DTYPES
        and x.device == u.device
        and x.dim() >= 1
    )


def geodesic_step(
    x: torch.Tensor, u: torch.Tensor, alpha: float | torch.Tensor, max_angle: float | None
) -> torch.Tensor:
    """``geometry.geodesic_step(x, u, alpha, max_angle)``, by the fused Function where it covers the call (on CUDA
    the Triton kernel once it has passed its first-use check), else by the plain implementation. Values and
    gradients are finite for 0 <= alpha <= ``settings.MAX_ALPHA``, the range the settings accept."""
    if can_fuse(x, u, alpha):
        backend = fused_backend(x, u)
        if backend == "torch" or kernel_passes_check(x, u, max_angle):
            return fused_geonorm_step(x, u, alpha, max_angle, backend)
    return plain_geodesic_step(x, u, alpha, max_angle)
