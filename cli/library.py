"""The library's standard-library-only modules, read from their files without importing the package: importing
``hf_geonorm.X`` runs ``hf_geonorm/__init__`` (torch and transformers), and ``hf-geonorm --help`` must answer
without them. The commands that run build the library's own classes once torch is loaded.

The modules are imported under ``hf_geonorm_cli._library``, a package whose folders are the library's own but whose
``__init__`` files never run, so that one of them may import another (``from ..modeling.settings import ...``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

MIRROR = "hf_geonorm_cli._library"


def library_module(relative: str) -> ModuleType:
    """The module of ``hf_geonorm/<relative>.py`` (``"errors"``, ``"training/options"``), imported once from its
    file as ``hf_geonorm_cli._library.<name>``; it, and the library modules it imports, must import only the
    standard library."""
    if MIRROR not in sys.modules:
        _mirror_packages()
    return importlib.import_module(MIRROR + "." + relative.replace("/", "."))


def _mirror_packages() -> None:
    """``hf_geonorm_cli._library`` and one package per package folder of ``hf_geonorm`` (``training/sweep`` too),
    each searching that folder, none running its ``__init__``."""
    package = importlib.util.find_spec("hf_geonorm")  # finds the package without running it
    root = Path(package.submodule_search_locations[0])
    folders = [root, *sorted(path.parent for path in root.rglob("*/__init__.py"))]
    for folder in folders:
        name = ".".join((MIRROR, *folder.relative_to(root).parts))
        module = ModuleType(name)
        module.__path__ = [str(folder)]
        module.__package__ = name
        sys.modules[name] = module
