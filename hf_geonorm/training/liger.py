"""Liger-Kernel's kernels on GeoNorm models: a ``geonorm_X`` model takes the patches Liger has for its stock type X.

Liger finds what to patch by ``config.model_type`` in one dict, ``MODEL_TYPE_TO_APPLY_LIGER_FN`` of
``liger_kernel.transformers.monkey_patch``, read by ``_apply_liger_kernel_to_instance`` (which Trainer's and TRL's
``use_liger_kernel=True`` call) and by ``AutoLigerKernelForCausalLM``. Each ``geonorm_X`` whose X is there gets X's
function: the parts a GeoNorm model shares with the stock one (its norms, MLP, rotary embedding and the causal LM's
forward, whose fused linear cross-entropy reads the hidden state the GeoNorm base model returns) take Liger's
kernels; the decoder layers' forwards, which call the GeoNorm update, and the ``GeoNormResidual`` modules are
checked to be left as they are after each patch of a model.

Importing Liger's dict imports every Liger kernel (about a second), so ``import hf_geonorm`` does not import it: the
entries go in when Liger's module is imported (a finder on ``sys.meta_path`` that watches for that one module and
removes itself), or at once where it already is. The remote code (``hf_geonorm.modeling``) knows nothing of Liger.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from torch import nn

from ..modeling.decoder_layers import GeoNormDecoderLayer
from ..modeling.layouts import LAYOUTS
from ..modeling.residual import GeoNormResidual

LIGER_PATCHES = "liger_kernel.transformers.monkey_patch"  # the module holding Liger's dict of patches by model type


def geonorm_parts(model: nn.Module) -> dict[str, type]:
    """The modules that make a model GeoNorm (decoder layers and residual updates), by name, with their classes."""
    return {
        name: type(module)
        for name, module in model.named_modules()
        if isinstance(module, (GeoNormDecoderLayer, GeoNormResidual))
    }


def check_geonorm_kept(model: nn.Module, before: dict[str, type]) -> None:
    """``ValueError`` if a patch changed the class or bound its own ``forward`` on a module of ``before``."""
    for name, cls in before.items():
        module = model.get_submodule(name)
        if type(module) is not cls or "forward" in vars(module):
            raise ValueError(
                f"Liger's patch replaced {name} ({cls.__name__}) of this GeoNorm model, so the GeoNorm update would "
                "not run; do not use this model: build it again and use a liger-kernel release hf-geonorm supports, "
                "or leave Liger off (use_liger_kernel=False)"
            )


def geonorm_liger_patch(stock_patch: Callable[..., None]) -> Callable[..., None]:
    """Liger's patch function of a stock type, for the GeoNorm type: the same patch (and signature, which Liger
    reads to pick the keyword arguments it passes), then the check that the GeoNorm update is untouched."""

    @functools.wraps(stock_patch)
    def apply_liger_kernel_to_geonorm(*args: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        before = geonorm_parts(model) if model is not None else {}
        stock_patch(*args, **kwargs)
        check_geonorm_kept(model, before)

    return apply_liger_kernel_to_geonorm


def register_liger_patches(liger_patches: ModuleType, stock_types: Sequence[str] = tuple(LAYOUTS)) -> list[str]:
    """Give every ``geonorm_X`` whose X Liger patches X's patch (an entry already there is kept); the GeoNorm types
    given one."""
    table = liger_patches.MODEL_TYPE_TO_APPLY_LIGER_FN
    registered = []
    for stock_type in stock_types:
        if stock_type in table:
            table.setdefault(f"geonorm_{stock_type}", geonorm_liger_patch(table[stock_type]))
            registered.append(f"geonorm_{stock_type}")
    return registered


class _RegisteringLoader(importlib.abc.Loader):
    """The loader of Liger's module, which registers the GeoNorm types once the module has run."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        register_liger_patches(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... of the file loader
        return getattr(self.loader, name)


class LigerImportWatch(importlib.abc.MetaPathFinder):
    """Finds nothing but Liger's module of patches, which it leaves to the path finder and loads through
    ``_RegisteringLoader``; removes itself from ``sys.meta_path`` when it has."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != LIGER_PATCHES:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _RegisteringLoader(spec.loader)
        return spec


def enable_liger_kernels() -> None:
    """Register the GeoNorm types with Liger now if its module is imported, else when it is (nothing where
    liger-kernel is not installed)."""
    loaded = sys.modules.get(LIGER_PATCHES)
    if loaded is not None:
        register_liger_patches(loaded)
    elif importlib.util.find_spec("liger_kernel") is not None:
        if not any(isinstance(finder, LigerImportWatch) for finder in sys.meta_path):
            sys.meta_path.insert(0, LigerImportWatch())
