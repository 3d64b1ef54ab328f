"""`hf-geonorm sweep`'s time estimate: from the runs' parts (setup, steps at each style's pace, evaluations), the
data prepared before the first run, the first run's one-off costs left out once a later run is measured, and
logged after every run. A clock of the test's own times the runs, so nothing here depends on the machine's speed."""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path
from types import SimpleNamespace

from hf_geonorm.sweep import grid as sweep_module

from support.helpers import invoke

STDLIB = Path(sysconfig.get_paths()["stdlib"])
STEPS = 3
TINY = ["--seq-len", "32", "--batch-size", "4", "--vocab-size", "300", "--max-steps", str(STEPS), "--eval-every",
        "3", "--warmup-steps", "0", "--eval-blocks", "8", "--extend", "0", "--confirm-seeds", "none"]  # fmt: skip
# seconds of each run, in the order they train: (setup, seconds a step, evaluations); setup is everything else the
# sweep waits for (building the model, saving it, the report); the first run's holds one-off costs
RUNS = {"pre-lr2e-3-seed0": (20.0, 1.0, 1.0), "pre-lr8e-3-seed0": (2.0, 1.0, 1.0),
        "geo-lr2e-3-seed0": (4.0, 4.0, 3.0), "geo-lr8e-3-seed0": (2.0, 4.0, 1.0)}  # fmt: skip


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def test_the_estimate_counts_each_part_and_is_updated_after_every_run(tmp_path, monkeypatch):
    corpus = tmp_path / "text.txt"
    corpus.write_text((STDLIB / "textwrap.py").read_text())
    clock = [1000.0]
    monkeypatch.setattr(sweep_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    trained: list[str] = []

    def timed_run(run, train, folder, thread_note=None):
        if not trained:  # the data is tokenized and cached before the first run, apart from its time
            assert list((tmp_path / "cache").glob("blocks-*/meta.json")), "no data prepared before the first run"
        trained.append(run.name)
        setup, pace, evaluation = RUNS[run.name]
        clock[0] += setup + STEPS * pace + evaluation
        header = json.loads((folder / "runs.jsonl").read_text().splitlines()[0])  # the sweep's identity
        marks = header["fingerprints"]
        return {"run": run.name, "style": run.style, "alpha": None, "lr": run.lr, "seed": run.seed,
                "settings": run.settings(header["settings"]), "train_options": header["train_options"],
                "data": {"fingerprint": marks["data"], "tokenizer": marks["tokenizer"]}, "steps": STEPS,
                "tokens": STEPS * 4 * 32, "val_loss": 5.0,
                "test_loss": 5.0, "train_seconds": STEPS * pace + evaluation, "training_seconds": STEPS * pace,
                "evaluation_seconds": evaluation, "warmup_steps": 0,
                "evaluated_blocks": {"validation": 8, "test": 8}}  # fmt: skip

    monkeypatch.setattr(sweep_module, "_train", timed_run)
    result = invoke("sweep", "--output", tmp_path / "sweep", "--styles", "pre,geo", "--lrs", "2e-3,8e-3", "--seeds",
                    "0", "--data", corpus, "--data-cache", tmp_path / "cache", *TINY)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert trained == list(RUNS)
    first, second, third, _ = RUNS.values()

    def run_seconds(setup: float, pace: float, evaluation: float) -> float:
        return setup + STEPS * pace + evaluation

    # after the first: all that is known is that run (its one-off costs in it), for every style
    after_first = 3 * run_seconds(*first)
    # after the second: the first run left out; geo not measured yet, at pre's pace
    after_second = 2 * run_seconds(*second)
    # after the third: setup and evaluations over the runs after the first, each style at its own pace
    after_third = run_seconds(median([second[0], third[0]]), third[1], median([second[2], third[2]]))
    lines = result.output.splitlines()
    assert all(re.match(r"\d\d:\d\d:\d\d ", line) for line in lines if "time estimate" in line)  # timestamped
    estimates = [line[9:] for line in lines if line[9:].startswith("time estimate:")]
    assert len(estimates) == 3, result.output
    for line, seconds, left in zip(estimates, (after_first, after_second, after_third), (3, 2, 1), strict=True):
        assert line.startswith(f"time estimate: about {seconds:.0f} s for the {left} run(s) left"), (line, seconds)
    assert "data prepared in" in result.output
