"""Properties of the repository as a whole: its documents link only to files it has, nothing points at the
specification's old home outside the repository, the README's settings table states the library's defaults, and
the package's modules import without cycles."""

from __future__ import annotations

import ast
import math
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hf_geonorm"
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
    """The README, every page of docs/ and every Markdown file of benchmarks/results/."""
    results = sorted((ROOT / "benchmarks" / "results").glob("*.md"))
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *results]


def anchors(document: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation but - and _ dropped, spaces -."""
    headings = re.findall(r"^#+ (.+)$", document.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_the_method_specification_is_in_the_repository():
    assert (ROOT / "docs" / "method.md").is_file()
    spec = (ROOT / "docs" / "method.md").read_text(encoding="utf-8")
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
    assert not found, "cite docs/method.md instead:\n" + "\n".join(found)


def relative_imports(path: Path) -> set[str]:
    """The package modules ``path`` imports, wherever the import statement is (also inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("hf_geonorm."):
            names = [node.module.split(".")[1]]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("hf_geonorm.")]
        else:
            continue
        found.update(name.split(".")[0] for name in names)
    return {name for name in found if (PACKAGE / f"{name}.py").is_file()}


def test_the_package_modules_import_without_cycles():
    graph = {path.stem: relative_imports(path) for path in PACKAGE.glob("*.py")}
    done, on_path = set(), []

    def visit(module: str) -> None:
        if module in on_path:
            cycle = on_path[on_path.index(module) :] + [module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        on_path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        on_path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_the_readme_settings_table_states_the_library_defaults():
    """GeoNormSettings is the one place the defaults live; the README's table must say the same."""
    from hf_geonorm import GeoNormSettings

    stated = dict(re.findall(r"^\| `(\w+)` \| [^|]* \| `([^`]*)` \|", (ROOT / "README.md").read_text(), re.MULTILINE))
    defaults = GeoNormSettings()
    angle = defaults.geo_max_angle
    expected = {
        "norm_style": defaults.norm_style,
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
