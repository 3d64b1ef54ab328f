"""How the study's tables state an arm and a margin (``sweep_study_tables.py``): an arm's test loss over its seeds
at the rate chosen for it, and the difference of two arms' means ± its standard error with Welch's two-sided p
(``hf_geonorm.sweep.welch``), never a difference in units of a seed spread; and the note on the split rule
the phases before i held out by."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hf_geonorm.sweep.grid import read_journal
from hf_geonorm.sweep.table import Cell, mean_spread
from hf_geonorm.sweep.welch import welch_test

SPLIT_LEAK = Path(__file__).parent / "results" / "split_leak.json"
MARGIN = (
    "± on a difference: its standard error, sqrt(var_a/n_a + var_b/n_b) with the sample variances over seeds; "
    "Welch's p: two-sided, from Welch's t and its degrees of freedom; 'single seed' where an arm ran one seed (no "
    "standard error, no test)."
)


def runs_of(folder: Path) -> list[dict[str, Any]]:
    return read_journal(folder / "runs.jsonl")[1] if (folder / "runs.jsonl").is_file() else []


def margin(arm: dict[str, Any], against: dict[str, Any]) -> dict[str, float] | None:
    """``arm``'s mean test loss minus ``against``'s, its standard error (sqrt(var_a/n_a + var_b/n_b), sample
    variances over seeds), Welch's t, degrees of freedom and two-sided p; None where an arm ran a single seed."""
    test = welch_test(arm["test_losses"], against["test_losses"])
    return None if test is None else asdict(test)


def arm_at(cell: Cell, lr: float) -> dict[str, Any]:
    """An arm at rate ``lr``: its test loss over the seeds run there (each, and their mean and sample spread)."""
    mean, spread, n = mean_spread(cell.test)
    return {"lr": lr, "test_mean": mean, "test_spread": spread, "seeds": n, "diverged": len(cell.test) - n,
            "test_losses": [v for v in cell.test if v is not None]}  # fmt: skip


def arm_test_loss(arm: dict[str, Any]) -> str:
    """An arm's test loss: mean ± spread (n=seeds)."""
    spread = "" if arm["test_spread"] is None else f" ± {arm['test_spread']:.3f}"
    return f"{arm['test_mean']:.3f}{spread} (n={arm['seeds']})"


def margin_cells(difference: float, welch: dict[str, float] | None) -> str:
    """A difference of test means ± its standard error, then Welch's two-sided p ("single seed" without one)."""
    if welch is None:
        return f"{difference:+.3f} | single seed"
    p = "< 0.001" if welch["p"] < 0.001 else f"{welch['p']:.3f}"
    return f"{difference:+.3f} ± {welch['standard_error']:.3f} | {p}"


def old_split_note(short: bool = False) -> str:
    """That phases a-h held out validation and test by the split rule before, and how much of the test text that
    leaked into training on the study corpus (``benchmarks/split_leak.py``'s measurement); ``short``: the leak
    alone, for a section below the page's first note."""
    rows = json.loads(SPLIT_LEAK.read_text(encoding="utf-8"))["rows"] if SPLIT_LEAK.is_file() else []
    old = next((row for row in rows if row["split"].startswith("old")), None)
    leak = "" if old is None else (
        f"on the study corpus {old['test']['leak']:.1%} of the test characters lay in pieces at least 80% covered "
        "by 100-character windows found verbatim in training text ([split_leak.md](../split_leak.md))")  # fmt: skip
    if short:
        return f"Validation and test held out by the split rule before (see the top of the page): {leak}."
    return (
        "Phases a-h held out validation and test by the split rule before: pieces of 1-8 KB, each from a file whose "
        f"other pieces trained, with no near-duplicate check{': ' + leak if leak else ''}. Their test losses are "
        "not of wholly unseen text (every arm of a phase was scored on the same blocks). `train` now holds out "
        'whole files (docs/training.md, "The data"); phase i uses that split.'
    )
