"""LoRA's default target modules for the ``geonorm_X`` types, put into PEFT's table whenever PEFT is imported.

PEFT finds the modules ``LoraConfig()`` without ``target_modules`` wraps by the model's ``config.model_type`` in one
dict, ``peft.utils.constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`` (its LoRA tuner keeps a reference
to that same dict), and has no other hook for a model type it does not know. So the entries go into that dict:
at once when PEFT is imported already, otherwise right after ``peft.utils.constants`` is first imported, by a
finder on ``sys.meta_path``. This module is part of the remote code (it imports only the standard library), so a
folder loaded with ``trust_remote_code=True`` gets the same default targets as the plugin, whichever of the model
and peft a script imports first; importing it does not import PEFT.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

PEFT_CONSTANTS = "peft.utils.constants"  # the module holding PEFT's table of LoRA's default targets


def add_lora_targets(constants: types.ModuleType, targets: Iterable[tuple[str, tuple[str, ...]]]) -> None:
    """Put ``(model_type, target module names)`` pairs into PEFT's LoRA table; an entry already there is kept."""
    table = constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    for model_type, names in targets:
        table.setdefault(model_type, list(names))


class _ThenLoader(importlib.abc.Loader):
    """A module's own loader, and ``then(module)`` right after the module has run."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[types.ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        self.then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ...: the real loader's
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` right after the module ``name`` is first imported, whoever imports it: finds the
    module with the other finders and wraps its loader. Leaves ``sys.meta_path`` once ``then`` has run (an import
    that fails part way leaves it in place for the next try). Several may wait for one module (the plugin's and
    each folder's copy of the remote code): each asks the others once, so their loaders nest and all run."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]) -> None:
        self.name, self.then = name, then
        self.searching = False

    def _done(self, module: types.ModuleType) -> None:
        self.then(module)
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: types.ModuleType | None = None) -> Any:
        if fullname != self.name or self.searching:  # another waiting finder asking back
            return None
        self.searching = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = None if finder is self or find is None else find(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.searching = False
        if spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self._done)
        return spec


def when_imported(name: str, then: Callable[[types.ModuleType], None]) -> None:
    """``then(module)`` now if the module ``name`` is imported already, otherwise right after its first import."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def register_lora_targets(targets: Iterable[tuple[str, tuple[str, ...]]]) -> None:
    """Give each model type its LoRA targets in PEFT's table, now or when PEFT is imported."""
    pairs = list(targets)
    when_imported(PEFT_CONSTANTS, lambda constants: add_lora_targets(constants, pairs))
