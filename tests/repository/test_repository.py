"""Properties of the repository as a whole: its documents link only to files it has, nothing points at the
specification's old home outside the repository, the README's settings table states the library's defaults, the
package's modules import without cycles (their layers: tests/repository/test_layers.py), the modelling code imports
nothing outside it and passes its values explicitly, and the test suite's summary says why tests were skipped."""

from __future__ import annotations

import ast
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hf_geonorm"
SPEC = PACKAGE / "modeling" / "method.md"  # the method specification, shipped beside the code it specifies
# spelled in two parts, so that this file does not mention what it looks for
OLD_SPEC_NAMES = ("GEONORM" + ".md", ".." + "/shared")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def repository_files() -> list[Path]:
    """Tracked files and new files git does not ignore (a clean clone has exactly the tracked ones)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True, stdin=subprocess.DEVNULL,
        ).stdout.decode()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def documents() -> list[Path]:
    """The README, every page of docs/, the method specification and every Markdown file of benchmarks/results/
    and its history/."""
    results = sorted((ROOT / "benchmarks" / "results").glob("*.md")) + sorted(
        (ROOT / "benchmarks" / "results" / "history").glob("*.md"))  # fmt: skip
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), SPEC, *results]


def anchors(document: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation but - and _ dropped, spaces -."""
    headings = re.findall(r"^#+ (.+)$", document.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_the_method_specification_is_in_the_repository():
    assert SPEC.is_file()
    spec = SPEC.read_text(encoding="utf-8")
    for heading in (
        "The update",
        "Step sizes",
        "The block",
        "The family",
        "Pre-Norm as GeoNorm",
        "The bridge",
        "Choices the paper leaves open",
    ):  # the sections the code's docstrings cite by name
        assert f"\n## {heading}\n" in spec, heading


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_the_documents_resolves(document):
    text = document.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor in the same document
        name, _, anchor = target.partition("#")
        path = (document.parent / name).resolve()
        if not path.exists() or ROOT not in (path, *path.parents):
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(target)  # the file is there, the heading is not
    assert not broken, f"{document.name} links to files the repository does not have: {broken}"


def test_nothing_points_at_the_specification_outside_the_repository():
    found = []
    for path in repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: figures, weights
        found += [f"{path.relative_to(ROOT)}: {name}" for name in OLD_SPEC_NAMES if name in text]
    assert not found, "cite hf_geonorm/modeling/method.md instead:\n" + "\n".join(found)


MODELING = PACKAGE / "modeling"
# What the remote code may import besides its own package: it runs where only these are installed.
REMOTE_CODE_DEPENDENCIES = {"torch", "transformers", "triton"}


def module_name(path: Path) -> str:
    """``hf_geonorm/modeling/step.py`` -> ``hf_geonorm.modeling.step``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every import of ``path``, wherever it is (also inside functions and ``try``), as (level, dotted name):
    ``import a.b`` and ``importlib.import_module("a.b")`` give (0, "a.b"); ``from ..x import y`` gives
    (2, "x.y") and (2, "x"), since y may be a module or a name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found += [(node.level, f"{base}.{alias.name}".lstrip(".")) for alias in node.names]
            if base:
                found.append((node.level, base))
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((0, node.args[0].value))
    return found


def absolute(path: Path, level: int, name: str) -> str:
    """The dotted module name an import of ``path`` refers to (relative imports resolved from its package)."""
    if level == 0:
        return name
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, name] if name else base)


def package_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (statements anywhere, and ``import_module`` string literals)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    return {
        name: {target for level, imported in imported_names(path) if (target := absolute(path, level, imported))
               in modules and target != name}
        for name, path in modules.items()
    }  # fmt: skip


def first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done, on_path = set(), []

    def visit(module: str) -> list[str] | None:
        if module in on_path:
            return on_path[on_path.index(module) :] + [module]
        if module in done:
            return None
        on_path.append(module)
        for imported in sorted(graph[module]):
            if cycle := visit(imported):
                return cycle
        on_path.pop()
        done.add(module)
        return None

    return next((cycle for module in sorted(graph) if (cycle := visit(module))), None)


def test_the_package_modules_import_without_cycles():
    graph = package_graph()
    # the edges this test exists for: a function-level import and an import_module literal are edges too
    assert "hf_geonorm.modeling.triton_kernels" in graph["hf_geonorm.modeling.fused"]
    assert {"hf_geonorm.sharing.hub", "hf_geonorm.modeling.residual"} <= graph["hf_geonorm"]
    cycle = first_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_an_import_module_literal_closes_a_cycle(tmp_path, monkeypatch):
    """The detector on a package of three modules whose only way back is ``importlib.import_module("...")``."""
    package = tmp_path / "hf_geonorm"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .inner.b import f\n")
    (package / "inner" / "b.py").write_text("def f():\n    from ..c import g\n")
    (package / "c.py").write_text("import importlib\nh = importlib.import_module('hf_geonorm.a')\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert first_cycle(package_graph()) == ["hf_geonorm.a", "hf_geonorm.inner.b", "hf_geonorm.c", "hf_geonorm.a"]


def test_the_modelling_package_imports_nothing_outside_it():
    """The remote code is this package's files alone, copied flat beside a checkpoint: besides each other they may
    import the standard library, torch, transformers and triton; nothing else (hf_geonorm, peft, numpy...) exists
    where a folder is loaded as remote code."""
    inside = {module_name(path) for path in MODELING.glob("*.py")}
    outside = []
    for path in sorted(MODELING.glob("*.py")):
        for level, name in imported_names(path):
            target = absolute(path, level, name)
            top = target.split(".")[0]
            if level == 1 and (target in inside or target.rsplit(".", 1)[0] in inside):
                continue  # a sibling, or a name imported from one
            if level == 0 and (top in sys.stdlib_module_names or top in REMOTE_CODE_DEPENDENCIES):
                continue
            outside.append(f"{path.name}: {'.' * level}{name}")
    assert not outside, "imports outside the modelling package:\n" + "\n".join(outside)


def test_the_modelling_code_passes_its_values_explicitly():
    """No value of a forward travels through a module's ``__dict__`` behind nn.Module's back: the attention weights
    are returned, the first tokens are an argument of the residual update and, from the base model's inputs, a
    named attribute its layers share (``decoder_layers.FirstTokens``)."""
    found = [
        f"{path.name}:{number}"
        for path in sorted(MODELING.glob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "__dict__" in line
    ]
    assert not found, f"side channels through __dict__: {found}"


def test_the_readme_settings_table_states_the_library_defaults():
    """GeoNormSettings is the one place the defaults live; the README's table must say the same."""
    from hf_geonorm import GeoNormSettings

    stated = dict(re.findall(r"^\| `(\w+)` \| [^|]* \| `([^`]*)` \|", (ROOT / "README.md").read_text(), re.MULTILINE))
    defaults = GeoNormSettings()
    angle = defaults.geo_max_angle
    expected = {
        "norm_style": defaults.norm_style,
        "post_zero_positions": str(defaults.post_zero_positions),
        "geo_alpha": f"{defaults.geo_alpha:g}",
        "geo_decay": defaults.geo_decay,
        "geo_max_angle": "None" if angle is None else f"pi/{math.pi / angle:g}",
        "geo_clamp": defaults.geo_clamp,
        "geo_learnable_step": str(defaults.geo_learnable_step),
        "geo_radius": defaults.geo_radius,
        "geo_bridge": f"{defaults.geo_bridge:.1f}",
        "geo_frames": str(defaults.geo_frames),
        "geo_bridge_costs": str(defaults.geo_bridge_costs),
        "geo_first_token_prenorm": str(defaults.geo_first_token_prenorm),
    }
    assert {field: stated.get(field) for field in expected} == expected


def test_pytest_says_why_tests_were_skipped(tmp_path):
    """The hook of tests/conftest.py, read from its source (a test imports nothing from conftest), in a pytest run of
    its own over a test skipped for a reason."""
    source = (ROOT / "tests" / "conftest.py").read_text(encoding="utf-8")
    [hook] = [node for node in ast.parse(source).body
              if isinstance(node, ast.FunctionDef) and node.name == "pytest_terminal_summary"]  # fmt: skip
    hook = ast.get_source_segment(source, hook)
    (tmp_path / "conftest.py").write_text("from collections import Counter\nfrom typing import Any\n\nimport pytest\n\n"
                                          + hook)  # fmt: skip
    (tmp_path / "test_probe.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.skip(reason="needs a GPU")
        def test_gpu():
            pass

        def test_runs():
            pass
    """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert "skipped, by reason" in done.stdout and "1  needs a GPU" in done.stdout, done.stdout
