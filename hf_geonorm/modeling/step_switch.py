"""Whether ``step.geodesic_step`` uses the fused Function (``step_autograd.py``) at all: one switch per process.

The environment variable ``HF_GEONORM_FUSED=0`` (read at import) or ``set_fused_enabled(False)`` turns the fused
Function off everywhere (``step.geodesic_step`` then uses the plain ``geometry.geodesic_step``);
``set_fused_enabled(True)`` turns it back on. Default: on. A switch, not a setting, because the two implementations
compute the same step: it exists to rule the kernel out when something looks wrong, and for higher-order gradients
(see ``step_autograd.py``).
"""

from __future__ import annotations

import os

ENV_VAR = "HF_GEONORM_FUSED"


def _env_enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


_ENABLED = _env_enabled()


def set_fused_enabled(enabled: bool) -> None:
    """Turn the fused GeoNorm update (Triton on CUDA, its torch twin elsewhere) on or off for this process.
    Off, ``step.geodesic_step`` uses the plain ``geometry.geodesic_step`` everywhere. The initial value comes from the
    environment variable ``HF_GEONORM_FUSED`` (``0``/``false``/``off`` disable it)."""
    global _ENABLED
    _ENABLED = bool(enabled)


def fused_enabled() -> bool:
    return _ENABLED
