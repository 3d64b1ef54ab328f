"""The benchmark scripts: each one's imports resolve (none reads a helper that is gone), and none trains a model
by a loop of its own, so that the evidence is about the code users run (``run_training``, ``run_sweep``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
# times single training steps of its own (forward, backward, AdamW) for speed; trains no model to a result
STEP_TIMERS = {"overhead"}
OWN_TRAINING = (".backward(", "optimizer.step(", "clip_grad_norm_(")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_benchmark_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their neighbours by name
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)


def test_no_benchmark_trains_through_a_loop_of_its_own():
    assert {path.stem for path in SCRIPTS} >= STEP_TIMERS
    found = [f"{path.name}: {marker}" for path in SCRIPTS if path.stem not in STEP_TIMERS
             for marker in OWN_TRAINING if marker in path.read_text(encoding="utf-8")]  # fmt: skip
    assert not found, "train through hf_geonorm.training (run_training, run_sweep) instead:\n" + "\n".join(found)
