"""The shape of the package: its modules on floors, none importing one on a floor above its own; what may sit at the
top of ``hf_geonorm/``; the training modules in the order the data flows (documents, tokenizer, blocks, trainer), none
importing one after it; following the calls of ``run_training`` enters each at most twice; and following ``train``'s
options from the command to the run visits at most MAX_FILES_VISITED files with at most MAX_CLIMBS climbs back up."""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from test_repository import PACKAGE, ROOT, absolute, imported_names

# The floors of hf_geonorm and its command line, lowest first: a module may import modules of its own floor and of
# those below, never one above (the import cycles are tests/repository/test_repository.py's). A name is a module or a folder of
# them; each module is on the floor of the longest name that holds it, so a new top-level module of hf_geonorm is on
# the top floor until it is placed. Within the training floor, FLOW below orders the modules further.
FLOORS = (
    {"hf_geonorm.modeling"},  # the code a saved folder carries as its remote code: imports none of the rest
    {"hf_geonorm.checkpoints.patching", "hf_geonorm.errors", "hf_geonorm.checkpoints.loading_sizes", "hf_geonorm.checkpoints.loading_info",
     "hf_geonorm._plumbing", "hf_geonorm._plumbing.declarations", "hf_geonorm.conversion.options", "hf_geonorm.analysis.defaults"},
    # the core every job uses: patching, the errors, what loading checks, files written safely, the options'
    # declarations and the defaults they name (standard library only)
    {"hf_geonorm.checkpoints.loading"},  # a model from a folder, a Hub id or a GGUF file
    {"hf_geonorm.analysis", "hf_geonorm.sharing"},  # what a loaded model is measured and shared by
    {"hf_geonorm.conversion.convert", "hf_geonorm.conversion.inspection", "hf_geonorm.training"},  # the jobs
    {"hf_geonorm", "hf_geonorm_cli"},  # the faces: the package's names and the command line
)  # fmt: skip
CLI = Path(importlib.util.find_spec("hf_geonorm_cli").origin).parent  # its folder, whatever the folder is named


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` (package name -> its folder) it imports: statements anywhere in the file,
    and ``import_module`` string literals."""
    paths = {}
    for package, folder in packages.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            paths[".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    graph = {}
    for module, path in paths.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets = set()
        for level, name in imported_names(path):
            base = package[: len(package) - level + 1] if level else []
            target = ".".join([*base, name] if name else base)
            if target in paths and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def floor_of(module: str, floors: tuple[set[str], ...]) -> int:
    """The floor of the longest name in ``floors`` that is ``module`` or a package holding it."""
    holders = [(len(name), number) for number, names in enumerate(floors) for name in names
               if module == name or module.startswith(name + ".")]  # fmt: skip
    assert holders, f"{module} is on no floor: place it in FLOORS"
    return max(holders)[1]


def upward_imports(graph: dict[str, set[str]], floors: tuple[set[str], ...]) -> list[str]:
    """Each import of a module on a higher floor than the importer's, as "a (floor n) imports b (floor m)"."""
    found = []
    for module, targets in sorted(graph.items()):
        low = floor_of(module, floors)
        found += [f"{module} (floor {low}) imports {target} (floor {floor_of(target, floors)})"
                  for target in sorted(targets) if floor_of(target, floors) > low]  # fmt: skip
    return found


def test_no_module_imports_one_on_a_floor_above_its_own():
    graph = import_graph({"hf_geonorm": PACKAGE, "hf_geonorm_cli": CLI})
    # edges the check reads: a module-level import, a function-level one within a floor, and the command line's
    assert "hf_geonorm.checkpoints.patching" in graph["hf_geonorm.checkpoints.loading"]
    assert "hf_geonorm.training.run.summary" in graph["hf_geonorm.conversion.inspection"]
    assert any(target.startswith("hf_geonorm.") for module, targets in graph.items()
               if module.startswith("hf_geonorm_cli.") for target in targets)  # fmt: skip
    stale = sorted(name for names in FLOORS for name in names
                   if not any(module == name or module.startswith(name + ".") for module in graph))  # fmt: skip
    assert not stale, f"names in FLOORS that hold no module: {stale}"
    upward = upward_imports(graph, FLOORS)
    assert not upward, "imports that run up a floor (move the code down, or the module up):\n" + "\n".join(upward)


def test_the_floor_check_finds_an_upward_import_wherever_it_is(tmp_path):
    """The check on a package of three floors whose lowest module imports the top one inside a function, while the
    middle imports the lowest and its own floor's other module: only the first is upward."""
    package = tmp_path / "house"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "base.py").write_text("def f():\n    from ..top import g\n")
    (package / "middle.py").write_text("from .low.base import f\nfrom . import beside\n")
    (package / "beside.py").write_text("")
    (package / "top.py").write_text("import house.middle\n\ndef g():\n    pass\n")
    floors = ({"house.low"}, {"house.middle", "house.beside"}, {"house"})
    graph = import_graph({"house": package})
    assert graph["house.middle"] == {"house.low.base", "house.beside"} and graph["house.top"] == {"house.middle"}
    assert floor_of("house.top", floors) == 2 and floor_of("house.low.base", floors) == 0
    assert upward_imports(graph, floors) == ["house.low.base (floor 0) imports house.top (floor 2)"]


# The top of the package: the patching, loading (with the sizes it checks before it builds) and conversion core,
# the errors every layer raises, and ``inspection`` (``hf-geonorm info`` and ``architectures``); every other job has
# its folder.
TOP_LEVEL = {"__init__", "patching", "loading", "loading_info", "loading_sizes", "conversion", "conversion_options",
             "declarations", "errors", "inspection"}
TRAINING = PACKAGE / "training"
# The training modules (by their path under training/), each after every module it imports: Liger-Kernel's patches
# for the GeoNorm types, the model sizes, the declaration and the rate rule, the transformers internals named, then the
# data as it flows (documents, a folder's files, tokenizer, token batches, blocks, made ready for Trainer), the run's
# record and its checkpoints, the model and what trains it, the run's outputs, the run and what `info` reads of it, and
# the sweep over runs (and what `info` reads of it).
FLOW = (
    "liger", "presets", "options", "rate_rule", "run.transformers_internals", "data.cache_checks", "data.documents",
    "data.folders", "data.corpus", "data.tokenizer", "data.token_batches", "data.duplicates", "data.split",
    "data.pipeline", "data.prepare",
    "run.optim", "run.checkpoint_state", "run.record", "run.checkpoints", "run.model", "run.bridge", "run.outputs",
    "run.trainer", "run.summary",
    "sweep.options", "sweep.table", "sweep.welch", "sweep.evidence", "sweep.reference", "sweep.soundness",
    "sweep.report", "sweep.record", "sweep.journal",
    "sweep.identity", "sweep.estimate", "sweep.protocol", "sweep.grid", "sweep.engine_options", "sweep.workers",
    "sweep.storage", "sweep.engine", "sweep.summary",
)  # fmt: skip
MAX_ENTRIES = 2
# Following train's options (``options_walk``), measured on the layout before ``_run`` was split into steps:
# 22 files, 6 climbs back up; one more since the options' declaration machinery has a module of its own
# (``declarations``), shared by every command.
MAX_FILES_VISITED = 16
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


def calls_in_order(function: ast.FunctionDef) -> list[ast.Call]:
    """The calls of ``function``'s body in the order they run: a call's arguments before the call itself (a lambda's
    and a nested function's calls where they are written)."""
    found: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            for child in [*node.args, *node.keywords, node.func]:
                visit(child)
            found.append(node)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in function.body:
        visit(statement)
    return found


def options_walk(code: Code, start: tuple[str, str], options: tuple[str, str]) -> list[tuple[str, str]]:
    """The files a reader enters following the options from ``start`` (module, function), as (from, to) modules in
    the order the calls run (depth first, each function followed once).

    The walk reads ``start`` and every function handed the options: one with a parameter annotated with the options
    class ``options`` (module, class), and the methods of that class (reached by calling it or a method of a
    parameter of that type). Every call such a function makes to a function or class of ``code`` is an entry into its
    module (when another); the walk follows it only where the callee is handed the options too. A function handed
    explicit values is where the options end: a reader opens its file to see what it does with them, and follows no
    further."""
    walked: list[tuple[str, str]] = []
    followed: set[tuple[str, str]] = set()

    def handed_options(function: ast.FunctionDef) -> set[str]:
        arguments = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
        return {arg.arg for arg in arguments if arg.annotation is not None
                and options[1] in ast.unparse(arg.annotation)}  # fmt: skip

    def read(target: tuple[str, str]) -> list[tuple[ast.FunctionDef, set[str]]]:
        """The functions of ``target`` the walk reads, each with its parameters that hold the options."""
        node = code.defined[target[0]][target[1]]
        if isinstance(node, ast.FunctionDef):
            return [(node, handed_options(node))] if target == start or handed_options(node) else []
        methods = [item for item in node.body if isinstance(item, ast.FunctionDef)]
        if target == options:  # the options' own methods: ``self`` is the options
            return [(method, {method.args.args[0].arg}) for method in methods if method.args.args]
        return [(method, handed_options(method)) for method in methods if handed_options(method)]

    def callee(module: str, func: ast.expr, parameters: set[str]) -> tuple[str, str] | None:
        if isinstance(func, ast.Name):
            return code.definition(module, func.id)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id in parameters:
                return options  # a method of the options
            found = code.definition(module, func.value.id)
            if found is not None and not found[1]:  # a module imported whole: its function
                return code.definition(found[0], func.attr) if func.attr in code.defined[found[0]] else None
            return found  # a class's own method (Class.method): the class
        return None

    def follow(target: tuple[str, str]) -> None:
        followed.add(target)
        module = target[0]
        for function, parameters in read(target):
            for call in calls_in_order(function):
                entered = callee(module, call.func, parameters)
                if entered is None or not entered[1]:
                    continue
                if entered[0] != module:
                    walked.append((module, entered[0]))
                if entered not in followed and read(entered):
                    follow(entered)

    follow(start)
    return walked


def files_and_climbs(start: str, walked: list[tuple[str, str]]) -> tuple[list[str], list[tuple[str, str]]]:
    """The files visited, in the order first entered (``start`` first), and the climbs back up: each (from, to) pair
    of modules where the walk enters a file it first entered before the file it comes from, counted once."""
    visited = [start]
    for _, entered in walked:
        if entered not in visited:
            visited.append(entered)
    climbs = [(caller, entered) for caller, entered in walked if visited.index(entered) < visited.index(caller)]
    return visited, list(dict.fromkeys(climbs))


def test_following_trains_options_from_the_command_to_the_run_visits_few_files_and_climbs_back_little():
    """A run read in one sitting: from ``hf-geonorm train`` (``hf_geonorm_cli/train.py``), the options go to the
    run, and the run's steps take what they need of them.

    How it is measured: ``options_walk`` over the modules of ``hf_geonorm`` and ``hf_geonorm_cli``, from
    the command's function: it reads the command and every function handed the options object (a parameter
    annotated ``TrainOptions``, and ``TrainOptions``'s own methods), in the order the calls run, and enters the file
    of every function or class such a function calls; a callee handed explicit values is visited (a reader opens it
    to see what it does with them) but not followed. What is not this repository's code (transformers, torch, the
    standard library) is not counted. The modelling package counts like any other: it is never handed the options,
    so a call into it is one visit and the walk goes no further. A file visited is one the walk enters at least
    once; a climb back up is a pair (from, to) where the walk enters a file it first visited before the one it
    comes from (back to a file already read), each pair counted once, however many calls it makes."""
    code = read_code({"hf_geonorm": PACKAGE, "hf_geonorm_cli": ROOT / "hf_geonorm_cli"})
    walked = options_walk(code, ("hf_geonorm_cli.train", "train"), ("hf_geonorm.training.options", "TrainOptions"))
    visited, climbs = files_and_climbs("hf_geonorm_cli.train", walked)
    assert {"hf_geonorm.training.options", "hf_geonorm.training.run.trainer"} <= set(visited)  # it reaches the run
    assert len(visited) <= MAX_FILES_VISITED, f"{len(visited)} files visited: {visited}"
    assert len(climbs) <= MAX_CLIMBS, f"{len(climbs)} climbs back up: {climbs}"


def test_the_options_walk_follows_the_options_and_counts_what_it_visits(tmp_path):
    """The walk on a command whose options reach ``run``, which hands them to ``low`` (which climbs back to the
    options' file) and explicit values to ``side`` (visited, not followed: ``deep`` is never entered)."""
    package = tmp_path / "package"
    package.mkdir()
    (package / "options.py").write_text(
        "from .check import check\n\nclass Options:\n    def validate(self):\n        check()\n\n"
        "def helper():\n    pass\n"
    )
    (package / "check.py").write_text("def check():\n    pass\n")
    (package / "deep.py").write_text("def d():\n    pass\n")
    (package / "side.py").write_text("from .deep import d\n\ndef s(size: int):\n    d()\n")
    (package / "low.py").write_text(
        "from .options import Options, helper\n\ndef l(options: Options):\n    helper()\n    options.validate()\n"
    )
    (package / "run.py").write_text(
        "from .low import l\nfrom .options import Options\nfrom .side import s\n\n"
        "def run(options: Options):\n    l(options)\n    s(options.size)\n\n"
        "def main():\n    run(Options())\n"
    )
    code = read_code({"package": package})
    walked = options_walk(code, ("package.run", "main"), ("package.options", "Options"))
    assert walked == [
        ("package.run", "package.options"), ("package.options", "package.check"), ("package.run", "package.low"),
        ("package.low", "package.options"), ("package.low", "package.options"), ("package.run", "package.side"),
    ]  # fmt: skip
    visited, climbs = files_and_climbs("package.run", walked)
    assert visited == ["package.run", "package.options", "package.check", "package.low", "package.side"]
    assert climbs == [("package.low", "package.options")]


def test_the_modelling_code_passes_its_values_explicitly():
    """No value of a forward travels through a module's ``__dict__`` behind nn.Module's back: the attention weights
    are returned, the first tokens are an argument of the residual update and, from the base model's inputs, a
    named attribute its layers share (``decoder_layers.FirstTokens``)."""
    found = [
        f"{path.name}:{number}"
        for path in sorted((PACKAGE / "modeling").glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "__dict__" in line
    ]
    assert not found, f"side channels through __dict__: {found}"
