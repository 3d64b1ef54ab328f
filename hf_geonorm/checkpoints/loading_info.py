"""What transformers' loading info (``output_loading_info=True``) may say of a GeoNorm load: tensors missing,
left over or of the wrong shape are errors (transformers only logs them), except the tensors GeoNorm adds on
purpose."""

from __future__ import annotations

import warnings
from collections.abc import Collection
from typing import Any

from torch import nn

from ..modeling.residual import GeoNormResidual


def geonorm_keys(model: nn.Module) -> set[str]:
    """The state-dict keys of the parameters GeoNorm adds on purpose (those of its residual modules)."""
    keys = set()
    for name, module in model.named_modules():
        if isinstance(module, GeoNormResidual):
            keys.update(f"{name}.{key}" for key in module.state_dict())
    return keys


def _is_geonorm_key(key: str) -> bool:
    return any(part.startswith("geonorm_") for part in key.split("."))


def check_loading_info(where: str, info: dict[str, Any], may_miss: set[str], allow_missing: bool = False) -> None:
    """Refuse what transformers accepts with a log line: tensors missing from the checkpoint (left at their
    random initialisation), tensors the model has no place for, and tensors of the wrong shape. The tensors
    GeoNorm adds on purpose (its residual modules') may be missing or left over. ``allow_missing`` turns missing
    and unexpected keys into a warning; a wrong shape is always an error. Only the GeoNorm tensors that are new
    to the source may be missing: a GeoNorm checkpoint must hold those its own settings have (the learnable step
    of ``geo_learnable_step``, the output norms of ``sandwich``): ``may_miss``. ``where`` names the weights."""
    mismatched = sorted(info.get("mismatched_keys") or [])
    if mismatched:
        key, found, expected = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise ValueError(
            f"{where}: tensor {key} has shape {list(found)}, but config.json asks for {list(expected)}{more}; "
            "the weights do not belong to this config (fix config.json or use the matching weights)"
        )
    missing = sorted(k for k in info.get("missing_keys") or [] if k not in may_miss)
    unexpected = sorted(k for k in info.get("unexpected_keys") or [] if not _is_geonorm_key(k))
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing ({tensor_names(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s) ({tensor_names(unexpected)})")
    if not problems:
        return
    message = f"{where}: {' and '.join(problems)}"
    if allow_missing:
        warnings.warn(f"{message}; the missing ones keep their random initialisation", stacklevel=3)
        return
    raise ValueError(
        f"{message}: the checkpoint does not match its config (missing tensors would be random); use complete "
        "weights, or allow it (--allow-missing, allow_missing=True)"
    )


def tensor_names(keys: Collection[str], limit: int = 4) -> str:
    """The first ``limit`` of ``keys`` in order, and how many more: what a refused load names."""
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f", ... {len(keys) - limit} more" if len(keys) > limit else "")
