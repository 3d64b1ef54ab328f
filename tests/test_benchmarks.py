"""The evidence benchmarks (benchmarks/ablation.py, knobs.py, stability.py, convert_uptrain.py) run end to end
at a minuscule ``--smoke`` scale and write their table, raw numbers and figure, so the scripts cannot rot."""

from __future__ import annotations

import importlib.util
import json
import sys
import sysconfig
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = ("ablation", "knobs", "stability", "convert_uptrain", "scaling")
sys.path.insert(0, str(BENCHMARKS))

import corpus_data  # noqa: E402 - benchmarks/corpus_data.py, the corpora of the scripts


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prose(tmp_path_factory) -> Path:
    """A small English prose file (so the test needs no apt-get): the stdlib's own docstring-heavy module."""
    path = tmp_path_factory.mktemp("prose") / "prose.txt"
    path.write_text(Path(sysconfig.get_paths()["stdlib"], "this.py").read_text() * 3
                    + Path(sysconfig.get_paths()["stdlib"], "textwrap.py").read_text())  # fmt: skip
    return path


@pytest.fixture(scope="module")
def corpus_cache(tmp_path_factory) -> Path:
    """One token cache for all the scripts: each corpus is tokenized once (by the first script that reads it)."""
    return tmp_path_factory.mktemp("corpus_cache")


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_runs_at_smoke_scale_and_writes_its_results(name, tmp_path, prose, corpus_cache, monkeypatch):
    monkeypatch.setattr(corpus_data, "CACHE", corpus_cache)
    out = tmp_path / "out"
    load(name).main(["--smoke", "--out", str(out), "--prose", str(prose)])
    table = (out / f"{name}_smoke.md").read_text()
    assert table.startswith("# ") and "|---|" in table
    raw = json.loads((out / f"{name}_smoke.json").read_text())
    assert raw["environment"]["torch"]
    assert (out / f"{name}_smoke.png").stat().st_size > 5000
    if name == "scaling":  # --report rebuilds the same tables, final comparison included, from the journal alone
        load(name).main(["--smoke", "--report", "--out", str(out), "--prose", str(prose)])
        rebuilt = (out / f"{name}_smoke.md").read_text()
        assert "## Final comparison" in table
        assert rebuilt.split("\n", 3)[3] == table.split("\n", 3)[3]  # all but the title and the timing line
