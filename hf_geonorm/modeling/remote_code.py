"""The one writer of a GeoNorm folder's remote code: the flat modelling source, ``auto_map`` in ``config.json``
and the method specification, so that the folder loads with ``trust_remote_code=True`` where hf-geonorm is not
installed (and says what it computes).

Every model save calls ``write_remote_code`` (``GeoNormPreTrainedMixin.save_pretrained``); transformers' own
per-class copier (``register_for_auto_class``) is switched off for the GeoNorm classes, so each file is written
once. This module is itself part of the remote code: it imports only the standard library and transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from transformers.dynamic_module_utils import get_relative_imports
from transformers.utils import TRANSFORMERS_DYNAMIC_MODULE_NAME

ENTRY_MODULE = "modeling_geonorm"
AUTO_CLASSES = ("AutoConfig", "AutoModel", "AutoModelForCausalLM")
# The specification (method.md, beside this module) as it is written beside the code; the model card links it.
METHOD_SPEC = "geonorm_method.md"


def module_closure(entry: Path) -> tuple[list[Path], list[str]]:
    """``entry`` and every file it reaches through ``from .x import``, recursively, as transformers finds them
    when it loads a folder: (the files present, the names of those missing)."""
    present: list[Path] = []
    missing: list[str] = []
    queue = [entry]
    while queue:
        path = queue.pop(0)
        if path in present or path.name in missing:
            continue
        if not path.is_file():
            missing.append(path.name)
            continue
        present.append(path)
        queue += [path.with_name(f"{name}.py") for name in sorted(get_relative_imports(path))]
    return present, missing


def remote_code_files() -> list[Path]:
    """The source files of a saved GeoNorm folder: ``modeling_geonorm.py`` first, then its flat siblings."""
    present, missing = module_closure(Path(__file__).with_name(f"{ENTRY_MODULE}.py"))
    if missing:  # an installation problem, not a user mistake
        raise RuntimeError(f"the GeoNorm modelling source is incomplete: {', '.join(missing)} missing")
    return present


def _running_as_remote_code() -> bool:
    return __name__.split(".")[0] == TRANSFORMERS_DYNAMIC_MODULE_NAME


def method_spec_file(loaded_from: str | os.PathLike | None = None) -> Path | None:
    """Where the method specification is read from: ``method.md`` beside this module (package data of
    ``hf_geonorm.modeling``); running as remote code, the folder the model was loaded from, when it has one (None
    otherwise: transformers copies only the ``.py`` files of a folder into its module cache)."""
    if _running_as_remote_code():
        candidate = Path(loaded_from) / METHOD_SPEC if loaded_from else None
        return candidate if candidate is not None and candidate.is_file() else None
    spec = Path(__file__).with_name("method.md")
    if not spec.is_file():
        raise RuntimeError("the GeoNorm method specification (method.md) is not installed with hf_geonorm.modeling")
    return spec


def auto_map(family: Any) -> dict[str, str]:
    """``auto_map`` of a GeoNorm family (anything with ``config_class``, ``base_class``, ``causal_class`` and
    ``head_classes``, the other heads by Auto class name): every Auto class the family has a class for."""
    classes = dict(zip(AUTO_CLASSES, (family.config_class, family.base_class, family.causal_class), strict=True))
    classes.update(family.head_classes)
    for cls in classes.values():
        if cls.__module__.rsplit(".", 1)[-1] != ENTRY_MODULE:
            raise RuntimeError(f"{cls.__name__} is defined in {cls.__module__}, not in {ENTRY_MODULE}.py")
    return {auto: f"{ENTRY_MODULE}.{cls.__name__}" for auto, cls in classes.items()}


def write_remote_code(
    folder: str | os.PathLike, family: Any, loaded_from: str | os.PathLike | None = None
) -> list[str]:
    """Make the saved folder ``folder`` load without the plugin: copy the modelling source and the method
    specification into it, then set ``auto_map`` in its ``config.json`` (replaced in one step, after the code is
    there). The in-memory config is not touched. Returns the names of the files copied."""
    folder = Path(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    copies = {source.name: source for source in remote_code_files()}
    spec = method_spec_file(loaded_from)
    if spec is not None:
        copies[METHOD_SPEC] = spec
    for name, source in copies.items():
        (folder / name).write_bytes(source.read_bytes())
    config["auto_map"] = auto_map(family)
    partial = config_path.with_name(f".{config_path.name}.partial")
    partial.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, config_path)
    return list(copies)
