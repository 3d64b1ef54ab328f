"""The private transformers attributes hf-geonorm touches (hf_geonorm.training.run.transformers_internals): each is in
the installed transformers with the signature hf-geonorm relies on, the package touches none that the module does
not name, and the check finds a renamed method or a changed signature. Also the shape of the stock decoder layer
classes that setting a layer's class to a GeoNorm decoder layer relies on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedConfig, PreTrainedModel, Trainer, TrainerCallback

from hf_geonorm.modeling.blocks import check_stock_layer_class
from hf_geonorm.modeling.transformers_versions import UnsupportedTransformers
from hf_geonorm.training.run import transformers_internals as internals

from support.tiny_models import CASES, layers_of, stock_model

PACKAGE = Path(__file__).resolve().parents[2] / "hf_geonorm"
# the transformers classes whose private attributes hf-geonorm's classes could override or read
TRANSFORMERS_CLASSES = (Trainer, TrainerCallback, PreTrainedModel, PreTrainedConfig)


def test_every_named_internal_is_in_the_installed_transformers_as_hf_geonorm_uses_it():
    assert internals.problems() == []
    internals.check_trainer_overrides()


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def assigned(node: ast.AST) -> list[ast.expr]:
    """The targets ``node`` assigns (``a = ...`` and ``a: T = ...``)."""
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign) else []


def private_names() -> dict[str, set[str]]:
    """The private names hf_geonorm's modules touch that are not their own: imported from transformers, methods
    its classes define over a transformers class's, and attributes read that hf_geonorm neither defines nor sets in
    an ``__init__`` (torch's nn.Module attributes left out); each with the modules that touch it."""
    defined, initialised, touched, overridden = set(), set(), {}, {}
    for path in PACKAGE.rglob("*.py"):
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformers":
                for alias in node.names:
                    if private(alias.name):
                        overridden.setdefault(alias.name, set()).add(where)
            elif isinstance(node, ast.ClassDef):
                defined.add(node.name)
                for method in node.body:
                    name = getattr(method, "name", "")
                    if private(name) and any(hasattr(cls, name) for cls in TRANSFORMERS_CLASSES):
                        overridden.setdefault(name, set()).add(where)
            elif isinstance(node, ast.FunctionDef):
                defined.add(node.name)
                if node.name == "__init__":
                    initialised |= {target.attr for sub in ast.walk(node) for target in assigned(sub)
                                    if isinstance(target, ast.Attribute)}  # fmt: skip
            elif isinstance(node, ast.Attribute) and private(node.attr):
                touched.setdefault(node.attr, set()).add(where)
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and private(node.args[1].value)
            ):
                touched.setdefault(node.args[1].value, set()).add(where)
    foreign = {name: modules for name, modules in touched.items()
               if name not in defined | initialised and not hasattr(torch.nn.Module, name)}  # fmt: skip
    return {name: foreign.get(name, set()) | overridden.get(name, set()) for name in {*foreign, *overridden}}


def test_the_package_touches_no_private_transformers_attribute_that_is_not_named():
    found = private_names()
    assert {"_save_checkpoint", "_CAN_RECORD_REGISTRY", "_weight_conversions"} <= set(found)  # the three kinds
    named = {internal.name for internal in internals.INTERNALS}
    unnamed = {name: sorted(modules) for name, modules in found.items() if name not in named}
    assert not unnamed, f"name these in hf_geonorm/training/run/transformers_internals.py: {unnamed}"
    sources = "\n".join(path.read_text(encoding="utf-8") for path in PACKAGE.rglob("*.py")
                        if path.name != "transformers_internals.py")  # fmt: skip
    unused = sorted(internal.name for internal in internals.INTERNALS if internal.name not in sources)
    assert not unused, f"named but not used (remove them): {unused}"


def test_the_check_finds_a_renamed_method_and_a_changed_signature(monkeypatch):
    monkeypatch.delattr(Trainer, "_get_output_dir")
    (gone,) = internals.problems(internals.OVERRIDDEN_BY_TRAINER)
    assert gone.startswith("transformers.Trainer._get_output_dir is gone")
    with pytest.raises(RuntimeError, match="_get_output_dir is gone"):
        internals.check_trainer_overrides()
    monkeypatch.setattr(Trainer, "_get_output_dir", lambda self, run: None, raising=False)
    monkeypatch.setattr(Trainer, "_save_checkpoint", lambda self, trial, model: None)
    assert internals.problems(internals.OVERRIDDEN_BY_TRAINER) == [
        "transformers.Trainer._get_output_dir takes (self, run), not (self, trial)",
        "transformers.Trainer._save_checkpoint takes (self, trial, model), not (self, model, trial)",
    ]
    read = internals.Internal("transformers.PreTrainedModel", "_gone", "nowhere", read_by="transformers.Trainer.train")
    assert internals.problems((read,)) == ["transformers.Trainer.train no longer reads _gone (nowhere)"]


def test_stock_decoder_layer_classes_define_only_init_and_forward():
    """``patch_base_model`` sets a stock layer's class to a GeoNorm decoder layer, which derives from
    ``GradientCheckpointingLayer``, not from the stock class: the layer keeps every module and attribute its
    ``__init__`` made and loses only the stock ``forward``. That holds while every stock decoder layer class
    defines ``__init__`` and ``forward`` alone, directly over ``GradientCheckpointingLayer``; a transformers version
    that adds a method or a base fails here (``check_stock_layer_class``, which the modelling code also runs on
    every layer it takes over under a release newer than the newest tested)."""
    found, unlike = set(), {}
    for case in CASES:
        for layer_class in {type(layer) for layer in layers_of(stock_model(case))}:
            found.add(layer_class.__qualname__)
            try:
                check_stock_layer_class(layer_class)
            except UnsupportedTransformers as refused:
                unlike[layer_class.__qualname__] = str(refused)
    assert len(found) > 50  # the cases' own classes, not one class seen 80 times
    assert not unlike, f"stock decoder layers with more than __init__ and forward: {unlike}"
