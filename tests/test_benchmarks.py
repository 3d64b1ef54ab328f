"""The evidence benchmarks (benchmarks/ablation.py, knobs.py, stability.py, convert_uptrain.py) run end to end
at a minuscule ``--smoke`` scale and write their table, raw numbers and figure, so the scripts cannot rot; so does
benchmarks/data_pipeline.py, at 1 MB."""

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


def test_data_pipeline_marks_every_target_and_resumes_from_its_journal(tmp_path, monkeypatch):
    """benchmarks/data_pipeline.py at 1 MB: every measurement, every target with its figure; the tokens it reports
    are the tokenizer's count of the documented documents; a second run measures nothing again."""
    from test_data_pipeline import reference_documents
    from tokenizers import Tokenizer

    bench = load("data_pipeline")
    args = ["--sizes", "1", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    bench.main(args)
    payload = json.loads((tmp_path / "out" / "data_pipeline.json").read_text())
    table = (tmp_path / "out" / "data_pipeline.md").read_text()
    runs = payload["measurements"]
    assert sorted(runs) == sorted(f"{shape}-1-{job}" for shape in bench.SHAPES for job in bench.JOBS)
    assert len(payload["targets"]) == 2 * 5 and all(f"| {t['target']} | {t['corpus']} |" in table
                                                    for t in payload["targets"])  # fmt: skip
    for target in payload["targets"]:
        if target["target"].startswith("throughput"):
            one, raw = runs[f"{target['shape']}-1-given-1"], runs[f"{target['shape']}-1-raw"]
            assert target["value"] == (one["tokens"] / one["seconds"]) / (raw["tokens"] / raw["seconds"])
            assert target["met"] == (target["value"] >= 0.85)
        elif target["target"].startswith("2 processes"):
            assert target["met"] is None  # not a target below 100 MB
    tokenizer = Tokenizer.from_file(str(tmp_path / "work" / "tokenizer.json"))
    docs = reference_documents((tmp_path / "work" / "file-1MB.txt").read_text(encoding="utf-8"))
    counted = sum(len(tokenizer.encode(doc, add_special_tokens=False).ids) + 1 for doc in docs)
    assert runs["file-1-given-1"]["tokens"] == runs["file-1-given-2"]["tokens"] == counted

    def measured_again(*args, **kwargs):
        raise AssertionError("a journaled measurement ran again")

    monkeypatch.setattr(bench, "measure", measured_again)
    bench.main(args)
    assert json.loads((tmp_path / "out" / "data_pipeline.json").read_text())["measurements"] == runs
