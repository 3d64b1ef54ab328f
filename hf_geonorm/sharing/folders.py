"""GeoNorm model folders on disk: a config-only folder with its code, and completing a folder written by another
tool.

A model's own ``save_pretrained`` writes its remote code (``remote_code.write_remote_code``); the functions here
cover the folders that are not written by a GeoNorm model's ``save_pretrained``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..checkpoints.patching import family_for
from ..modeling.remote_code import write_remote_code


def add_remote_code(path: str | os.PathLike) -> dict[str, str]:
    """Give a saved GeoNorm folder that lacks them (written by another tool, or by an older hf-geonorm) its
    modelling source and ``auto_map``; returns the ``auto_map``."""
    path = Path(path)
    config_path = path / "config.json"
    model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type", "")
    if not str(model_type).startswith("geonorm_"):
        raise ValueError(f"{config_path} has model_type {model_type!r}; remote code is written for GeoNorm models only")
    family = family_for(model_type)
    write_remote_code(path, family)
    return json.loads(config_path.read_text(encoding="utf-8"))["auto_map"]


def save_config_with_remote_code(config: Any, path: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Save a GeoNorm config (no weights: a model to train from scratch) with ``auto_map`` and the source."""
    model_type = config.model_type
    if not model_type.startswith("geonorm_"):
        raise ValueError(f"expected a GeoNorm config, got model_type {model_type!r}")
    path = Path(path)
    config.save_pretrained(path)
    write_remote_code(path, family_for(model_type))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path
