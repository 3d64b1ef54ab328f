"""The shape of the package: what may sit at the top of ``hf_geonorm/``; the training modules in the order the data
flows (documents, tokenizer, blocks, trainer), none importing one after it; following the calls of ``run_training``
enters each at most twice; and following ``train``'s options from the command to the run visits at most
MAX_FILES_VISITED files with at most MAX_CLIMBS climbs back up."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from test_repository import PACKAGE, absolute, imported_names

# The top of the package: the patching, loading and conversion core, the errors every layer raises, and
# ``inspection`` (``hf-geonorm info`` and ``architectures``); every other job has its folder.
TOP_LEVEL = {"__init__", "patching", "loading", "loading_info", "conversion", "errors", "inspection"}
TRAINING = PACKAGE / "training"
# The training modules (by their path under training/), each after every module it imports: the model sizes, the
# declaration and the rate rule, the transformers internals named, then the data as it flows (documents, tokenizer,
# token batches, blocks, made ready for Trainer), the run's record, the model and what trains it, the run's outputs,
# the run, and the sweep over runs.
FLOW = (
    "presets", "options", "rate_rule", "run.transformers_internals", "data.cache_checks", "data.documents",
    "data.corpus", "data.tokenizer", "data.token_batches", "data.pipeline", "data.prepare", "run.record", "run.model",
    "run.optim", "run.bridge", "run.checkpoints", "run.outputs", "run.trainer", "sweep.options", "sweep.report",
    "sweep.journal", "sweep.grid",
)  # fmt: skip
MAX_ENTRIES = 2
# Following train's options (``options_walk``), measured on the layout before issue 39 split ``_run`` into steps:
# 22 files, 6 climbs back up.
MAX_FILES_VISITED = 15
MAX_CLIMBS = 5


def test_the_top_of_the_package_holds_only_the_core():
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL, f"give these a folder that names their job: {sorted(top - TOP_LEVEL)}"


def training_imports() -> dict[str, set[str]]:
    """Training module (``data.corpus``) -> the training modules it imports (anywhere in the file)."""
    prefix = "hf_geonorm.training."
    found = {}
    for path in TRAINING.rglob("*.py"):
        if path.stem == "__init__":
            continue
        name = ".".join(path.relative_to(TRAINING).with_suffix("").parts)
        targets = {absolute(path, level, imported).removeprefix(prefix) for level, imported in imported_names(path)}
        found[name] = targets & set(FLOW)
    return found


def test_no_training_module_imports_one_after_it_in_the_flow():
    imports = training_imports()
    assert set(imports) == set(FLOW), f"place every training module in FLOW: {sorted(set(imports) ^ set(FLOW))}"
    assert "data.corpus" in imports["data.pipeline"] and "data.tokenizer" in imports["data.prepare"]  # edges it reads
    upward = [f"{module} imports {target}" for module, targets in sorted(imports.items()) for target in sorted(targets)
              if FLOW.index(target) > FLOW.index(module)]  # fmt: skip
    assert not upward, "imports that run back up the flow:\n" + "\n".join(upward)


@dataclass
class Code:
    """The modules of some packages, by dotted name: each one's top-level functions and classes, and every name it
    imports (anywhere in the file) as (module, name)."""

    defined: dict[str, dict[str, ast.FunctionDef | ast.ClassDef]]
    imported: dict[str, dict[str, tuple[str, str]]]

    def definition(self, module: str, name: str) -> tuple[str, str] | None:
        """The function or class ``name`` means in ``module`` as (module, name), through imports and re-exports; a
        module imported whole as (module, ""); None for what the packages do not define."""
        for _ in range(len(self.defined)):
            if name in self.defined[module]:
                return module, name
            if name not in self.imported[module]:
                return None
            source, real = self.imported[module][name]
            if f"{source}.{real}" in self.defined:
                return f"{source}.{real}", ""
            if source not in self.defined:
                return None
            module, name = source, real
        return None


def read_code(packages: dict[str, Path]) -> Code:
    """The modules of ``packages`` (package name -> its folder, every subfolder included)."""
    paths = {}
    for package, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            paths[".".join((package, *parts))] = path
    defined, imported = {}, {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined[module] = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        imported[module] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, node.module] if node.module else base)
                imported[module] |= {alias.asname or alias.name: (source, alias.name) for alias in node.names}
            elif isinstance(node, ast.Import):
                imported[module] |= {alias.asname: tuple(alias.name.rsplit(".", 1)) for alias in node.names
                                     if alias.asname and "." in alias.name}  # fmt: skip
    return Code(defined, imported)


def names_used(node: ast.AST) -> list[ast.Name]:
    """The names ``node`` uses, leaving out annotations (a type is not a call)."""
    skip = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = sub.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg,
                        arguments.kwarg]:  # fmt: skip
                if arg is not None and arg.annotation is not None:
                    skip.add(id(arg.annotation))
            if sub.returns is not None:
                skip.add(id(sub.returns))
        elif isinstance(sub, ast.AnnAssign):
            skip.add(id(sub.annotation))
    found: list[ast.Name] = []

    def visit(sub: ast.AST) -> None:
        if id(sub) in skip:
            return
        if isinstance(sub, ast.Name):
            found.append(sub)
        for child in ast.iter_child_nodes(sub):
            visit(child)

    visit(node)
    return found


def entries(folder: Path, start: tuple[str, str]) -> dict[str, set[str]]:
    """Module of ``folder`` (its dotted path there: ``run.trainer``) -> the other modules of ``folder`` whose
    functions, reached from ``start`` (module, function) through the functions and classes they use, call into it
    (a class reached counts all its methods)."""
    code = read_code({"package": folder})
    found: dict[str, set[str]] = {}
    seen, todo = set(), [("package." + start[0], start[1])]
    while todo:
        module, name = todo.pop()
        if (module, name) in seen:
            continue
        seen.add((module, name))
        for used in names_used(code.defined[module][name]):
            target = code.definition(module, used.id)
            if target is None or not target[1]:
                continue
            if target[0] != module:  # a function or class of another module: the call path enters it
                found.setdefault(target[0].removeprefix("package."), set()).add(module.removeprefix("package."))
            todo.append(target)
    return found


def test_following_the_options_down_run_training_enters_each_training_module_at_most_twice():
    entered = entries(TRAINING, ("run.trainer", "run_training"))
    assert entered["data.corpus"] and entered["data.pipeline"] and entered["run.checkpoints"]  # the walk goes down
    too_often = {module: sorted(callers) for module, callers in entered.items() if len(callers) > MAX_ENTRIES}
    assert not too_often, f"entered from more than {MAX_ENTRIES} modules: {too_often}"


def test_the_entries_are_counted_along_the_calls_and_not_the_annotations(tmp_path):
    """The walker on a package whose run reaches ``low`` from three modules, one of them through a class's method
    only, while a fourth names it in an annotation alone."""
    (tmp_path / "low.py").write_text("def f():\n    pass\n\nclass Kind:\n    pass\n")
    (tmp_path / "mid.py").write_text("from .low import f\n\nclass Step:\n    def go(self):\n        f()\n")
    (tmp_path / "side.py").write_text("from .low import Kind\n\ndef g(kind: Kind) -> Kind:\n    return kind\n")
    (tmp_path / "other.py").write_text("from .low import f\n\ndef h():\n    f()\n")
    (tmp_path / "run.py").write_text(
        "from .low import f\nfrom .mid import Step\nfrom .other import h\nfrom .side import g\n\n"
        "def run():\n    f()\n    Step().go()\n    h()\n    g(None)\n"
    )
    found = entries(tmp_path, ("run", "run"))
    assert found == {"low": {"run", "mid", "other"}, "mid": {"run"}, "other": {"run"}, "side": {"run"}}


def test_the_modelling_code_passes_its_values_explicitly():
    """No value of a forward travels through a module's ``__dict__`` behind nn.Module's back: the attention weights
    are returned, the first tokens are an argument of the residual update and, from the base model's inputs, a
    named attribute its layers share (``blocks.FirstTokens``)."""
    found = [
        f"{path.name}:{number}"
        for path in sorted((PACKAGE / "modeling").glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "__dict__" in line
    ]
    assert not found, f"side channels through __dict__: {found}"
