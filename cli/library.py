"""The library's standard-library-only modules, read from their files without importing the package: importing
``hf_geonorm.X`` runs ``hf_geonorm/__init__`` (torch and transformers), and ``hf-geonorm --help`` must answer
without them. The commands that run build the library's own classes once torch is loaded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def library_module(relative: str) -> ModuleType:
    """The module of ``hf_geonorm/<relative>.py`` (``"errors"``, ``"training/options"``), loaded once from its file
    as ``hf_geonorm_cli._library.<name>``; it must import only the standard library."""
    name = "hf_geonorm_cli._library." + relative.replace("/", ".")
    if name not in sys.modules:
        package = importlib.util.find_spec("hf_geonorm")  # finds the package without running it
        path = Path(package.submodule_search_locations[0], *relative.split("/")).with_suffix(".py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses looks its module up
        spec.loader.exec_module(module)
    return sys.modules[name]
