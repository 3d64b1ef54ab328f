"""The report of a sweep (``sweep.md``, ``sweep.png``), from its journal's runs: the loss at every rate per arm
with the spread over seeds, each arm's best rate chosen on validation, and the arms compared at their own best
rates on test. An arm is a norm style (with its geo_alpha when the sweep varies it)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPREAD = "sample standard deviation over seeds (n-1)"


def rate_text(lr: float) -> str:
    """A learning rate as people write it: 4e-3, 1.6e-2."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


@dataclass
class Cell:
    """The runs of one arm at one rate."""

    val: list[float | None]  # one per seed; None: diverged
    test: list[float | None]
    seeds: list[int]


def arm_name(entry: dict[str, Any]) -> str:
    return entry["style"] + ("" if entry["alpha"] is None else f" alpha {entry['alpha']:g}")


def cells(runs: list[dict[str, Any]]) -> dict[str, dict[float, Cell]]:
    """The runs grouped by arm, then by rate (rates in increasing order), in the order arms first appear."""
    table: dict[str, dict[float, Cell]] = {}
    for entry in runs:
        cell = table.setdefault(arm_name(entry), {}).setdefault(entry["lr"], Cell([], [], []))
        cell.val.append(entry["val_loss"])
        cell.test.append(entry["test_loss"])
        cell.seeds.append(entry["seed"])
    return {arm: dict(sorted(rates.items())) for arm, rates in table.items()}


def best_rates(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each arm's best rate: the lowest mean validation loss (the lower rate on a tie) over the seeds that every
    rate of the arm has run, so that a rate run with more seeds (the best, seeded once chosen) is compared on the
    same seeds as the others; over all its seeds where no seed is common. A diverged run counts as infinite loss.
    Test losses play no part in it."""
    best = {}
    for arm, rates in cells(runs).items():
        common = set.intersection(*(set(cell.seeds) for cell in rates.values()))

        def loss(lr: float, rates: dict[float, Cell] = rates, common: set[int] = common) -> tuple[float, float]:
            cell = rates[lr]
            kept = [v for v, seed in zip(cell.val, cell.seeds, strict=True) if not common or seed in common]
            return (math.inf if None in kept else statistics.fmean(kept), lr)

        best[arm] = min(rates, key=loss)
    return best


def at_edge(runs: list[dict[str, Any]]) -> dict[str, str]:
    """The arms whose best rate is the lowest or the highest of their grid: the best may lie beyond it."""
    edges = {}
    for arm, lr in best_rates(runs).items():
        rates = list(cells(runs)[arm])
        if len(rates) > 1 and lr == rates[0]:
            edges[arm] = "lowest"
        elif len(rates) > 1 and lr == rates[-1]:
            edges[arm] = "highest"
        elif len(rates) == 1:
            edges[arm] = "only"
    return edges


def mean_spread(values: list[float | None]) -> tuple[float, float | None, int]:
    """Mean, sample standard deviation (None for one value) and count of the finite values."""
    finite = [v for v in values if v is not None]
    if not finite:
        return math.inf, None, 0
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else None, len(finite)


def _loss_text(values: list[float | None]) -> str:
    mean, spread, n = mean_spread(values)
    if n == 0:
        return "diverged"
    text = f"{mean:.4f}" + ("" if spread is None else f" ± {spread:.4f}")
    lost = len(values) - n
    return text + (f" (n={n})" if n > 1 or lost else "") + (f", {lost} diverged" if lost else "")


def report_text(runs: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """The markdown report and its warnings (best rates at the edge of the grid)."""
    table, best, edges = cells(runs), best_rates(runs), at_edge(runs)
    rates = sorted({lr for arm in table.values() for lr in arm})
    lines = [
        "# Sweep",
        "",
        f"{len(runs)} runs. Validation loss (mean ± {SPREAD}; n: seeds) at each peak learning rate; "
        "**bold**: the arm's best rate, chosen on validation (on the seeds all its rates ran).",
        "",
        "| arm | " + " | ".join(rate_text(lr) for lr in rates) + " |",
        "|---|" + "---|" * len(rates),
    ]
    for arm, arm_rates in table.items():
        row = []
        for lr in rates:
            text = _loss_text(arm_rates[lr].val) if lr in arm_rates else "–"
            row.append(f"**{text}**" if lr == best[arm] else text)
        lines.append(f"| {arm} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## The arms at their own best rates, on test",
        "",
        f"Test loss: documents held out apart from validation's, never used for the choice. Mean ± {SPREAD}.",
        "",
        "| arm | best rate | seeds | validation loss | test loss |",
        "|---|---|---|---|---|",
    ]
    ranked = sorted(best, key=lambda arm: mean_spread(table[arm][best[arm]].test)[0])
    for arm in ranked:
        cell = table[arm][best[arm]]
        lines.append(f"| {arm} | {rate_text(best[arm])} | {len(cell.seeds)} | {_loss_text(cell.val)} | "
                     f"{_loss_text(cell.test)} |")  # fmt: skip
    if len(ranked) > 1:
        first, second = (mean_spread(table[arm][best[arm]].test) for arm in ranked[:2])
        spreads = [s for s in (first[1], second[1]) if s is not None]
        versus = f"; the larger seed spread is {max(spreads):.4f}" if spreads else " (one seed each: no spread)"
        lines += ["", f"{ranked[0]} is lowest on test, by {second[0] - first[0]:.4f} below {ranked[1]}{versus}."]
    warnings = [
        f"the best rate of {arm} ({rate_text(best[arm])}) is the {where} rate of its grid: the best may lie "
        "beyond it; extend the grid (--lrs) and run the sweep again" if where != "only" else
        f"{arm} has one rate only: nothing was chosen"
        for arm, where in edges.items()
    ]  # fmt: skip
    if warnings:
        lines += ["", "## Warnings", "", *[f"- {warning}" for warning in warnings]]
    lines += ["", "![loss against learning rate](sweep.png)", ""]
    return "\n".join(lines), warnings


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Validation loss against learning rate (log scale) per arm, the seed spread as error bars, the best marked."""
    from matplotlib.figure import Figure

    from .outputs import replace_file

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    best = best_rates(runs)
    for arm, rates in cells(runs).items():
        points = [(lr, *mean_spread(cell.val)[:2]) for lr, cell in rates.items() if mean_spread(cell.val)[2]]
        if not points:
            continue
        xs, ys, spreads = zip(*points, strict=True)
        line = ax.errorbar(xs, ys, yerr=[s or 0.0 for s in spreads], marker="o", capsize=3, label=arm)
        if best[arm] in xs:
            index = xs.index(best[arm])
            ax.plot([xs[index]], [ys[index]], marker="*", markersize=14, color=line[0].get_color())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("validation loss (mean over seeds)")
    ax.set_title("sweep: loss against learning rate (star: best, chosen on validation)", fontsize=9)
    ax.legend()
    fig.tight_layout()
    replace_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def write_report(folder: Path, runs: list[dict[str, Any]], log: Any = print) -> None:
    """``sweep.md`` and ``sweep.png`` in ``folder``; ``log`` gets the warnings and where the report is."""
    from .outputs import replace_file

    if not runs:
        return
    text, warnings = report_text(runs)
    replace_file(folder / "sweep.md", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    plot(runs, folder / "sweep.png")
    for warning in warnings:
        log(f"warning: {warning}")
    log(f"report in {folder / 'sweep.md'} and {folder / 'sweep.png'}")
