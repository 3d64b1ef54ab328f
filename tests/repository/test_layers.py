"""The layers of the package, as pyproject.toml's import-linter contracts declare them: each package imports only the
packages on the layers below its own, the library's top holds only the packages the contract names (besides its
public API and its errors), and the library never imports the command line. import-linter follows every import,
also those inside functions. The import cycles and what the modelling code may import are
tests/repository/test_repository.py's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(sys.argv[1], no_cache=True))"


def lint_imports(config: Path, cwd: Path, path: Path | None = None) -> subprocess.CompletedProcess:
    """``lint-imports`` on the contracts of ``config``, in a child (``path`` first on its module path)."""
    env = {**os.environ, "PYTHONPATH": str(path)} if path else dict(os.environ)
    return subprocess.run([sys.executable, "-c", LINT, str(config)], cwd=cwd, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)  # fmt: skip


def test_the_package_keeps_its_layers():
    try:
        import importlinter  # noqa: F401
    except ImportError:
        raise AssertionError("import-linter checks the layers: pip install -e '.[dev]'") from None
    config = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    contracts = len(re.findall(r"^\[\[tool\.importlinter\.contracts\]\]$", config, re.MULTILINE))
    assert contracts == 2 and re.search(r"^exhaustive = true$", config, re.MULTILINE)  # every package is placed
    done = lint_imports(ROOT / "pyproject.toml", ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"Contracts: {contracts} kept, 0 broken." in done.stdout


def test_the_contract_finds_an_upward_import_and_a_loose_module(tmp_path):
    """The contract's form on a package of three layers whose lowest module imports the top one inside a function,
    and whose top holds a module the layers do not name: both are reported, and nothing else."""
    package = tmp_path / "house"
    (package / "low").mkdir(parents=True)
    (package / "top").mkdir()
    for init in (package / "__init__.py", package / "low" / "__init__.py", package / "top" / "__init__.py"):
        init.write_text("")
    (package / "low" / "base.py").write_text("def f():\n    from ..top.run import g\n")
    (package / "middle.py").write_text("from .low.base import f\n")
    (package / "top" / "run.py").write_text("from ..middle import f\n\ndef g():\n    pass\n")
    (package / "loose.py").write_text("")
    config = tmp_path / "layers.toml"
    config.write_text(textwrap.dedent("""
        [tool.importlinter]
        root_packages = ["house"]

        [[tool.importlinter.contracts]]
        name = "house"
        type = "layers"
        containers = ["house"]
        exhaustive = true
        layers = ["top", "middle", "low"]
    """))
    done = lint_imports(config, tmp_path, path=tmp_path)
    assert done.returncode == 1, done.stdout
    assert "house.low.base -> house.top.run" in done.stdout
    assert "house.loose" in done.stdout
    assert "house.middle -> house.low" not in done.stdout  # a downward import is fine
