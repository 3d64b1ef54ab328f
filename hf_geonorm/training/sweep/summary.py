"""What ``hf-geonorm info`` says of a sweep's output folder, read as the sweep reads it: the journal through
``journal.read_journal`` (every line checked), each arm's choice through ``table.best_rates``; then the arms
compared at their own best rates on test (the margin between the lowest two), and where the report is."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from .journal import JOURNAL, read_journal
from .table import arm_name, best_rates

REPORT = "sweep.md"


def is_sweep_folder(path: Path) -> bool:
    return (path / JOURNAL).is_file() and not (path / "config.json").exists()


def _mean(values: list[float | None]) -> float | None:
    """The mean of the finite values (a diverged run has none); None when no run trained."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else None


def describe_sweep(path: Path) -> dict[str, Any]:
    """The summary of the sweep whose output folder is ``path``: its finished runs, each arm's rates and best rate
    (chosen on validation) with its mean validation and test loss there, the arm lowest on test at its own best
    rate and its margin over the next, and the report's path (None before the first run ended).
    ``journal.JournalError`` (a ``ValueError`` naming the line) for a journal the sweep itself would refuse."""
    _, runs = read_journal(path / JOURNAL)
    arms = []
    for arm, best in best_rates(runs).items():
        own = [run for run in runs if arm_name(run) == arm]
        at_best = [run for run in own if run["lr"] == best]
        arms.append({
            "arm": arm,
            "best_rate": best,
            "rates": sorted({run["lr"] for run in own}),
            "runs": len(own),
            "diverged": sum(run["val_loss"] is None for run in own),
            "seeds_at_best": len(at_best),
            "validation_loss": _mean([run["val_loss"] for run in at_best]),
            "test_loss": _mean([run["test_loss"] for run in at_best]),
        })  # fmt: skip
    ranked = sorted((arm for arm in arms if arm["test_loss"] is not None), key=lambda arm: arm["test_loss"])
    choice = None
    if ranked:
        runner_up = ranked[1] if len(ranked) > 1 else None
        choice = {"arm": ranked[0]["arm"], "runner_up": runner_up and runner_up["arm"],
                  "margin": runner_up and runner_up["test_loss"] - ranked[0]["test_loss"]}  # fmt: skip
    report = path / REPORT
    return {
        "path": str(path),
        "kind": "sweep",
        "journal": str(path / JOURNAL),
        "runs": len(runs),
        "arms": arms,
        "choice": choice,
        "report": str(report) if report.is_file() else None,
    }
