"""What ``hf-geonorm info`` says of a sweep's output folder, read as the sweep reads it: the journal through
``journal.read_journal`` (every line checked), each arm's choice through ``table.best_rates``; then the arms
compared at their own best rates on test (the margin between the lowest two), and where the report is."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from ..errors import require_extra
from .evidence import caveats
from .journal import JOURNAL, read_journal
from .reference import read_held_out
from .soundness import cliff_notes, not_learning
from .table import arm_name, cells, chosen_cells, rate_text
from .welch import welch_test

REPORT = "sweep.md"


def is_sweep_folder(path: Path) -> bool:
    return (path / JOURNAL).is_file() and not (path / "config.json").exists()


def _mean(values: list[float | None]) -> float | None:
    """The mean of the finite values (a diverged run has none); None when no run trained."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(finite) if finite else None


def describe_sweep(path: Path) -> dict[str, Any]:
    """The summary of the sweep whose output folder is ``path``, in short what its report says (``report``): the
    caveats its report starts with, each arm's chosen cell (warm-up and rate, chosen on validation) with its seeds
    and its mean validation and test loss there, the rates and warm-ups it ran, and each other arm's margin over the
    arm lowest on test ± its standard error with Welch's p; rates written as the report writes them.
    ``journal.JournalError`` (a ``ValueError`` naming the line) for a journal the sweep itself would refuse;
    ``MissingExtraError`` without the train extra (Welch's test is scipy's)."""
    require_extra("train", f"hf-geonorm info of the sweep folder {path}")
    header, runs = read_journal(path / JOURNAL)
    table, chosen = cells(runs), chosen_cells(runs)
    seeds = {choice.row: len(table[choice.row][choice.lr].seeds) for choice in chosen.values()}
    reference = read_held_out(path, header)
    cliffs, idle = cliff_notes(table, chosen, reference), not_learning(table, chosen, reference)
    arms = []
    for arm, choice in chosen.items():
        own = [run for run in runs if arm_name(run) == arm]
        cell = table[choice.row][choice.lr]
        arms.append({
            "arm": arm,
            "best_rate": choice.lr,
            "best_rate_text": rate_text(choice.lr),
            "warmup_share": choice.share,
            "rates": sorted({run["lr"] for run in own}),
            "warmup_shares": sorted({run.get("warmup_share") for run in own if run.get("warmup_share") is not None}),
            "runs": len(own),
            "diverged": sum(run["val_loss"] is None for run in own),
            "seeds_at_best": len(cell.seeds),
            "validation_loss": _mean(cell.val),
            "test_loss": _mean(cell.test),
            "test_loss_of_each_seed": dict(zip(cell.seeds, cell.test, strict=True)),
            "flags": [text for text in (cliffs.get(choice.row),
                                        "not yet learning from context" if choice.row in idle else None) if text],
        })  # fmt: skip
    ranked = sorted((arm for arm in arms if arm["test_loss"] is not None), key=lambda arm: arm["test_loss"])
    choice = None
    if ranked:
        lowest = ranked[0]
        margins = []
        for other in ranked[1:]:
            test = welch_test(_finite(other), _finite(lowest))
            margins.append({"arm": other["arm"], "margin": other["test_loss"] - lowest["test_loss"],
                            "standard_error": None if test is None else test.standard_error,
                            "p": None if test is None else test.p,
                            "df": None if test is None else test.df})  # fmt: skip
        runner_up = margins[0] if margins else None
        choice = {"arm": lowest["arm"], "runner_up": runner_up and runner_up["arm"],
                  "margin": runner_up and runner_up["margin"], "margins": margins}  # fmt: skip
    report = path / REPORT
    return {
        "path": str(path),
        "kind": "sweep",
        "journal": str(path / JOURNAL),
        "runs": len(runs),
        "unigram_test": None if reference is None else reference["unigram_test"],
        "caveats": caveats(runs, {c.row: c.share for c in chosen.values()}, seeds,
                           header.get("sweep_options") if header else None) if runs else [],  # fmt: skip
        "arms": arms,
        "choice": choice,
        "report": str(report) if report.is_file() else None,
    }


def _finite(arm: dict[str, Any]) -> list[float]:
    return [v for v in arm["test_loss_of_each_seed"].values() if v is not None and math.isfinite(v)]
