"""The library's standard-library-only modules (the options' declarations, the settings, the errors), imported
under their own names without running ``hf_geonorm/__init__``: that ``__init__`` imports torch and transformers,
and ``hf-geonorm --help`` must answer without them.

Each module is imported once, as ``hf_geonorm.<name>``: when a command then imports the library, the package reuses
these same modules (``hf_geonorm/__init__`` binds them as its attributes), so a declaration read for ``--help`` is
the one the library checks the values with. The package itself is not left in ``sys.modules``: the first import of
a module not read here (every command's entry point reaches one at the top of the package: ``patching``,
``loading``, ``conversion``) runs ``hf_geonorm/__init__`` first, as any import of the library does."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

PACKAGE = "hf_geonorm"


def library_module(relative: str) -> ModuleType:
    """The module ``hf_geonorm.<relative>`` (``"errors"``, ``"training/options"``); it, and the library modules it
    imports, must import only the standard library, and so must the ``__init__`` of each package it is in below
    ``hf_geonorm`` itself."""
    name = ".".join((PACKAGE, *relative.split("/")))
    if name in sys.modules or PACKAGE in sys.modules:
        return importlib.import_module(name)
    with _package_unrun():
        return importlib.import_module(name)


@contextlib.contextmanager
def _package_unrun() -> Iterator[None]:
    """``hf_geonorm`` in ``sys.modules`` as a module that has its path but has not run its ``__init__``, while the
    block imports modules below it; removed afterwards, so that the first import of the package runs it."""
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without running it
    unrun = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = unrun
    try:
        yield
    finally:
        if sys.modules.get(PACKAGE) is unrun:
            del sys.modules[PACKAGE]
