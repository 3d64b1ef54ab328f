"""The shape of the package: what may sit at the top of ``hf_geonorm/``, and the training modules in the order the
data flows (documents, tokenizer, blocks, trainer): none imports one after it, and following the options down the
calls of ``run_training`` enters each at most twice."""

from __future__ import annotations

import ast
from pathlib import Path

from test_repository import PACKAGE, absolute, imported_names

# The top of the package: the patching, loading and conversion core, the errors every layer raises, and
# ``inspection`` (``hf-geonorm info`` and ``architectures``); every other job has its folder.
TOP_LEVEL = {"__init__", "patching", "loading", "loading_info", "conversion", "errors", "inspection"}
TRAINING = PACKAGE / "training"
# The training modules, each after every module it imports: the model sizes, the declaration and the transformers
# internals named, then the data as it flows (documents, tokenizer, token batches, blocks, made ready for Trainer),
# the model and what trains it, the run's outputs, the run, and the sweep over runs.
FLOW = (
    "presets", "options", "transformers_internals", "cache_checks", "corpus", "tokenizer", "token_batches",
    "pipeline", "prepare", "run_record", "model", "optim", "bridge", "checkpoints", "outputs", "trainer",
    "sweep_report", "sweep_journal", "sweep",
)  # fmt: skip
MAX_ENTRIES = 2


def test_the_top_of_the_package_holds_only_the_core():
    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top <= TOP_LEVEL, f"give these a folder that names their job: {sorted(top - TOP_LEVEL)}"


def training_imports() -> dict[str, set[str]]:
    """Training module -> the training modules it imports (anywhere in the file)."""
    prefix = "hf_geonorm.training."
    found = {}
    for path in TRAINING.glob("*.py"):
        if path.stem == "__init__":
            continue
        targets = {absolute(path, level, name) for level, name in imported_names(path)}
        found[path.stem] = {t.removeprefix(prefix) for t in targets if t.removeprefix(prefix) in FLOW}
    return found


def test_no_training_module_imports_one_after_it_in_the_flow():
    imports = training_imports()
    assert set(imports) == set(FLOW), f"place every training module in FLOW: {sorted(set(imports) ^ set(FLOW))}"
    assert "corpus" in imports["pipeline"] and "tokenizer" in imports["prepare"]  # the edges this test reads
    upward = [f"{module} imports {target}" for module, targets in sorted(imports.items()) for target in sorted(targets)
              if FLOW.index(target) > FLOW.index(module)]  # fmt: skip
    assert not upward, "imports that run back up the flow:\n" + "\n".join(upward)


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
    """Module of ``folder`` -> the other modules of ``folder`` whose functions, reached from ``start`` (module,
    function) through the functions and classes they use, call into it (a class reached counts all its methods)."""
    trees = {path.stem: ast.parse(path.read_text(encoding="utf-8")) for path in folder.glob("*.py")}
    defined = {
        module: {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
        for module, tree in trees.items()
    }
    imported = {
        module: {alias.asname or alias.name: (node.module, alias.name) for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in trees
                 for alias in node.names}
        for module, tree in trees.items()
    }  # fmt: skip
    found: dict[str, set[str]] = {}
    seen, todo = set(), [start]
    while todo:
        module, name = todo.pop()
        if (module, name) in seen:
            continue
        seen.add((module, name))
        for used in names_used(defined[module][name]):
            if used.id in defined[module]:
                todo.append((module, used.id))
            elif used.id in imported[module]:
                target, real = imported[module][used.id]
                if real in defined[target]:  # a function or class: the call path enters the module
                    found.setdefault(target, set()).add(module)
                    todo.append((target, real))
    return found


def test_following_the_options_down_run_training_enters_each_training_module_at_most_twice():
    entered = entries(TRAINING, ("trainer", "run_training"))
    assert entered["corpus"] and entered["pipeline"] and entered["checkpoints"]  # the walk follows the calls down
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
