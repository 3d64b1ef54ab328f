"""Scan the installed transformers for decoder-only layouts GeoNorm can patch.

For every causal-LM model type (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) the scan finds, from the source files
alone (no model module is imported, so the whole scan takes a few seconds):

- the base model the causal LM wraps (``self.model = XModel(config)``) and the attribute holding its decoder
  layers (``self.layers = nn.ModuleList([XDecoderLayer(...) ...])``);
- the decoder layer's ``forward``, normalised: its AST with the docstring, type annotations and decorators
  removed and the model's class prefix (``Mistral`` in ``MistralDecoderLayer``) replaced by ``Llama``;
- how the base model calls its layers (how many positional arguments) and its final norm's attribute.

A type is *LLaMA-identical* when its normalised forward equals ``LlamaDecoderLayer.forward``'s, its layers live
in ``<base>.layers``, the base model calls each layer with ``hidden_states`` as the only positional argument and
its final norm is ``<base>.norm`` and the base model it wraps is the type's own base model (not a multimodal
wrapper's text model): then ``hf_geonorm``'s LLaMA layout patches it unchanged.
``llama_identical_types()`` returns those types; tests/modeling/test_layouts.py checks that
``hf_geonorm.layouts.LLAMA_LAYOUT_TYPES`` contains every one, so the test fails when transformers moves.

Run ``python benchmarks/scan_layouts.py`` for the report (``--json`` for machine-readable output).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

LAYER_SUFFIXES = ("DecoderLayer", "Layer", "Block")
CLASS_RE = re.compile(r"^class (\w+)\(", re.MULTILINE)


@dataclass
class LayerInfo:
    """What the scan found for one causal-LM model type (fields are None where it could not tell)."""

    model_type: str
    causal_class: str
    base_class: str | None = None
    base_attr: str | None = None
    layers_attr: str | None = None
    layer_class: str | None = None
    layer_file: str | None = None
    call_positional: int | None = None
    final_norm: str | None = None
    llama_forward: bool = False
    llama_identical: bool = False
    supported: bool = False
    note: str = ""


def _models_dir() -> Path:
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        raise RuntimeError("transformers is not installed")
    return Path(spec.origin).parent / "models"


@functools.cache
def _class_index() -> dict[str, list[Path]]:
    """Class name -> the modeling files that define it (several for copies of a name)."""
    index: dict[str, list[Path]] = {}
    for path in sorted(_models_dir().rglob("modeling_*.py")):
        for name in CLASS_RE.findall(path.read_text(encoding="utf-8")):
            index.setdefault(name, []).append(path)
    return index


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _find_class(name: str, prefer: Path | None = None) -> tuple[Path, ast.ClassDef] | None:
    paths = _class_index().get(name, [])
    if prefer is not None and prefer in paths:
        paths = [prefer]
    for path in paths:
        for node in _parse(path).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return path, node
    return None


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _find_method(path: Path, node: ast.ClassDef, method: str, depth: int = 0) -> tuple[Path, ast.FunctionDef] | None:
    """A method of a class, looked up through its bases defined in transformers' modeling files."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == method:
            return path, item
    if depth > 8:
        return None
    for base in _base_names(node):
        found = _find_class(base, path) or _find_class(base)
        if found is not None:
            result = _find_method(*found, method, depth + 1)
            if result is not None:
                return result
    return None


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


def _self_assignments(init: ast.FunctionDef) -> list[tuple[str, ast.AST]]:
    """(attribute, value) for every ``self.attr = value`` in ``__init__``."""
    found = []
    for node in ast.walk(init):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                ):
                    found.append((target.attr, node.value))
    return found


def _module_list_class(value: ast.AST) -> str | None:
    """The layer class of ``nn.ModuleList([Layer(...) for ...])`` (or of a list literal of calls)."""
    if _call_name(value) != "ModuleList" or not value.args:
        return None
    arg = value.args[0]
    if isinstance(arg, ast.ListComp):
        return _call_name(arg.elt)
    if isinstance(arg, ast.List) and arg.elts:
        return _call_name(arg.elts[0])
    return None


def _layer_calls(forward: ast.FunctionDef, layers_attr: str) -> list[ast.Call]:
    """Calls of the loop variable of ``for ... in self.<layers_attr>...`` inside the base model's forward."""
    calls = []
    for loop in ast.walk(forward):
        if not isinstance(loop, ast.For):
            continue
        source = ast.unparse(loop.iter)
        if f"self.{layers_attr}" not in source:
            continue
        names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        for node in ast.walk(loop):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                calls.append(node)
    return calls


class _Normalise(ast.NodeTransformer):
    """Drop docstrings, annotations and decorators; everything else stays token for token."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.decorator_list = []
        node.returns = None
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                body = body[1:] or [ast.Pass()]
        node.body = body
        self.generic_visit(node)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.annotation = None
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return None
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)


def _prefix(layer_class: str) -> str:
    for suffix in LAYER_SUFFIXES:
        if layer_class.endswith(suffix):
            return layer_class[: -len(suffix)]
    return layer_class


def normalised_forward(layer_class: str, prefer: Path | None = None) -> str | None:
    """The normalised ``forward`` of a layer class (model prefix replaced by ``Llama``), or None."""
    found = _find_class(layer_class, prefer)
    if found is None:
        return None
    method = _find_method(*found, "forward")
    if method is None:
        return None
    tree = _Normalise().visit(ast.parse(ast.unparse(method[1])))
    text = ast.dump(tree, annotate_fields=False, include_attributes=False)
    prefix = _prefix(layer_class)
    return text.replace(prefix, "Llama") if prefix else text


def _supported_types() -> set[str]:
    try:
        from hf_geonorm.modeling.modeling_geonorm import FAMILIES
    except ImportError:
        return set()
    return set(FAMILIES)


def scan_type(
    model_type: str, causal_class: str, llama_forward: str | None, base_model_class: str | None = None
) -> LayerInfo:
    """What one causal-LM type's source shows; ``base_model_class`` is the type's ``MODEL_MAPPING_NAMES`` entry,
    which GeoNorm swaps for its own base class (it must be the class the causal LM wraps)."""
    info = LayerInfo(model_type, causal_class)
    found = _find_class(causal_class)
    if found is None:
        info.note = "causal-LM class not found in a modeling file"
        return info
    path, node = found
    init = _find_method(path, node, "__init__")
    if init is None:
        info.note = "no __init__"
        return info
    for attr, value in _self_assignments(init[1]):
        name = _call_name(value)
        if name and name.endswith(("Model", "TextModel", "Transformer", "Decoder")) and _find_class(name):
            info.base_attr, info.base_class = attr, name
            break
    if info.base_class is None:
        info.note = "no inner base model in the causal LM's __init__"
        return info
    base = _find_class(info.base_class, init[0]) or _find_class(info.base_class)
    base_init = _find_method(*base, "__init__")
    if base_init is None:
        info.note = "base model has no __init__"
        return info
    norms = []
    for attr, value in _self_assignments(base_init[1]):
        layer_class = _module_list_class(value)
        if layer_class is not None and info.layer_class is None:
            info.layers_attr, info.layer_class = attr, layer_class
        name = _call_name(value)
        if name and "norm" in name.lower():
            norms.append(attr)
    if info.layer_class is None:
        info.note = "no nn.ModuleList of layers in the base model"
        return info
    base_forward = _find_method(*base, "forward")
    if base_forward is not None:
        calls = _layer_calls(base_forward[1], info.layers_attr)
        if calls:
            info.call_positional = max(len(c.args) for c in calls)
        source = ast.unparse(base_forward[1])
        used = [n for n in norms if f"self.{n}(" in source]
        info.final_norm = used[-1] if used else None
    layer = _find_class(info.layer_class, base[0]) or _find_class(info.layer_class)
    if layer is None:
        info.note = f"layer class {info.layer_class} not found"
        return info
    info.layer_file = str(layer[0].relative_to(_models_dir()))
    forward = normalised_forward(info.layer_class, layer[0])
    info.llama_forward = forward is not None and forward == llama_forward
    info.llama_identical = (
        info.llama_forward
        and info.layers_attr == "layers"
        and info.call_positional == 1
        and info.final_norm == "norm"
        and info.base_class == base_model_class
    )
    if info.llama_forward and info.base_class != base_model_class:
        info.note = f"wraps {info.base_class}, but the type's base model is {base_model_class} (multimodal)"
    return info


def scan() -> list[LayerInfo]:
    """One ``LayerInfo`` per causal-LM model type of the installed transformers, sorted by type."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    llama = _find_class("LlamaDecoderLayer")
    llama_forward = normalised_forward("LlamaDecoderLayer", llama[0] if llama else None)
    supported = _supported_types()
    results = []
    for model_type, causal_class in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        try:
            info = scan_type(model_type, causal_class, llama_forward, MODEL_MAPPING_NAMES.get(model_type))
        except (SyntaxError, OSError, AttributeError, TypeError) as err:  # a file the scan cannot read
            info = LayerInfo(model_type, causal_class, note=f"scan failed: {err!r}")
        info.supported = model_type in supported
        results.append(info)
    return results


@functools.lru_cache(maxsize=1)
def _llama_identical() -> tuple[str, ...]:
    return tuple(info.model_type for info in scan() if info.llama_identical)


def llama_identical_types() -> list[str]:
    """The causal-LM model types whose decoder layer and its use are LLaMA's, token for token (sorted)."""
    return list(_llama_identical())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object per model type")
    parser.add_argument("--all", action="store_true", help="also list types that are neither identical nor supported")
    args = parser.parse_args(argv)
    results = scan()
    if args.json:
        print(json.dumps([asdict(info) for info in results], indent=1))
        return 0
    identical = [i for i in results if i.llama_identical]
    print(
        f"{len(results)} causal-LM model types; {len(identical)} LLaMA-identical; "
        f"{sum(i.supported for i in results)} supported by hf_geonorm"
    )
    print()
    print(f"{'model_type':28} {'LLaMA':6} {'geonorm':8} {'layers':22} layer class / note")
    for info in results:
        if not (args.all or info.llama_identical or info.supported or info.llama_forward):
            continue
        where = f"{info.base_attr}.{info.layers_attr}" if info.layers_attr else "-"
        flag = "same" if info.llama_identical else ("fwd" if info.llama_forward else "")
        detail = info.layer_class or info.note
        if info.layer_class and info.note:
            detail += f" ({info.note})"
        if info.layer_class and (info.call_positional not in (None, 1) or info.final_norm not in (None, "norm")):
            detail += f" (positional args {info.call_positional}, final norm {info.final_norm})"
        print(f"{info.model_type:28} {flag:6} {'yes' if info.supported else '':8} {where:22} {detail}")
    missing = [i.model_type for i in identical if not i.supported]
    if missing:
        print(f"\nLLaMA-identical but not supported: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
