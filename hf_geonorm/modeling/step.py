"""``geonorm_step``, the model-level GeoNorm update: one call with one ``StepParams``, dispatched to the fused
Function (``step_autograd.py``) where it covers the call and to ``geometry.composed_geonorm_step`` elsewhere.

Not fused (the composed path is used): ``bridge < 1``, ``clamp="final"``, the learnable step scale/bias, a
tensor ``alpha``, x and u of different shapes, other dtypes, and everything while the switch is off
(``step_switch.py``). On CUDA the fused Function runs the Triton kernel once it has passed its first-use check
(``kernel_check.py``).
"""

from __future__ import annotations

import torch

from .geometry import StepParams, composed_geonorm_step
from .kernel_check import kernel_passes_check
from .step_autograd import FUSED_DTYPES, fused_backend, fused_geonorm_step
from .step_switch import fused_enabled


def can_fuse(x: torch.Tensor, u: torch.Tensor, params: StepParams) -> bool:
    """Whether ``geonorm_step(x, u, params)`` is computed by the fused Function."""
    alpha = params.alpha
    return (
        fused_enabled()
        and params.bridge == 1.0
        and params.clamp == "both"
        and params.step_scale is None
        and params.step_bias is None
        and isinstance(alpha, (int, float))
        and not isinstance(alpha, bool)
        and x.shape == u.shape
        and x.dtype in FUSED_DTYPES
        and u.dtype in FUSED_DTYPES
        and x.device == u.device
        and x.dim() >= 1
    )


def geonorm_step(x: torch.Tensor, u: torch.Tensor, params: StepParams) -> torch.Tensor:
    """The model-level residual update of the ``geo`` style, with the Pre-Norm bridge:
    ``geonorm_step(x, u, StepParams(alpha, max_angle=..., bridge=..., step_scale=..., step_bias=..., frame=...,
    clamp=...))``.

    bridge = 1 is the clamped GeoNorm step (radius |x| kept); bridge = 0 is the Pre-Norm update exactly (x + u, or
    in the ``frame``); in between the angle and radius interpolate (method.md, "The update" and "The bridge").

    With bridge 1, a number ``alpha`` and no learnable step, the fused Function computes it (the Triton kernel
    on CUDA once it has passed its first-use check, the torch twin elsewhere; ``HF_GEONORM_FUSED=0`` or
    ``set_fused_enabled(False)`` turns that off); everything else takes ``geometry.composed_geonorm_step``.
    Values and gradients are finite for 0 <= alpha <= ``settings.MAX_ALPHA``, the range the settings accept.
    """
    if not isinstance(params, StepParams):
        raise TypeError(
            "geonorm_step takes the step's settings as one StepParams: geonorm_step(x, u, StepParams(alpha, ...)); "
            f"got {type(params).__name__}"
        )
    if can_fuse(x, u, params):
        backend = fused_backend(x, u)
        if backend == "torch" or kernel_passes_check(x, u, params.max_angle):
            return fused_geonorm_step(x, u, params.alpha, params.max_angle, backend)
    return composed_geonorm_step(x, u, params)
