"""Whether ``geonorm_step`` uses the fused Function (``step_autograd.py``) at all: one switch per process.

The environment variable ``HF_GEONORM_FUSED=0`` (read at import) or ``set_fused_enabled(False)`` turns the fused
Function off everywhere (``geonorm_step`` then uses its composed autograd path); ``set_fused_enabled(True)``
turns it back on. Default: on. A switch, not a setting, because the two paths compute the same step: it exists
to rule the kernel out when something looks wrong, and for higher-order gradients (see ``step_autograd.py``).
"""

from __future__ import annotations

import os

ENV_VAR = "HF_GEONORM_FUSED"


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
