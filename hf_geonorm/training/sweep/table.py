"""The runs of a sweep as a table: their names, the cells of each arm (a norm style, with its geo_alpha when the sweep
varies it) at each rate, and each arm's best rate. The report (``report``, ``evidence``), the grid (``grid``) and the
journal (``journal``) all read runs through these."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any


def rate_text(lr: float) -> str:
    """A learning rate as people write it, one digit before the point (4e-3, 1.6e-2; 16e-3 is written 1.6e-2),
    with the fewest digits that read back as exactly this rate: two rates never share a text (1.0000001e-3 is not
    1e-3), so run names built from it cannot collide."""
    for digits in range(17):
        mantissa, exponent = f"{lr:.{digits}e}".split("e")
        if float(f"{mantissa}e{exponent}") == lr:
            break
    return f"{mantissa}e{int(exponent)}"


def alpha_text(alpha: float) -> str:
    """A geo_alpha as people write it (0.5, 1), with the fewest digits that read back as exactly this value."""
    for digits in range(1, 18):
        text = f"{alpha:.{digits}g}"
        if float(text) == alpha:
            return text
    return repr(alpha)


def run_name(style: str, alpha: float | None, lr: float, seed: int) -> str:
    """A run's folder name under ``runs/``, one per cell of the grid: ``geo-alpha0.5-lr8e-3-seed0``."""
    alpha_part = "" if alpha is None else f"-alpha{alpha_text(alpha)}"
    return f"{style}{alpha_part}-lr{rate_text(lr)}-seed{seed}"


@dataclass
class Cell:
    """The runs of one arm at one rate."""

    val: list[float | None]  # one per seed; None: diverged
    test: list[float | None]
    seeds: list[int]

    def val_on(self, common: set[int]) -> list[float | None]:
        """The validation losses of the seeds in ``common`` (all of them where ``common`` is empty)."""
        return [v for v, seed in zip(self.val, self.seeds, strict=True) if not common or seed in common]


def arm_name(entry: dict[str, Any]) -> str:
    return entry["style"] + ("" if entry["alpha"] is None else f" alpha {alpha_text(entry['alpha'])}")


def cells(runs: list[dict[str, Any]]) -> dict[str, dict[float, Cell]]:
    """The runs grouped by arm, then by rate (rates in increasing order), in the order arms first appear."""
    table: dict[str, dict[float, Cell]] = {}
    for entry in runs:
        cell = table.setdefault(arm_name(entry), {}).setdefault(entry["lr"], Cell([], [], []))
        cell.val.append(entry["val_loss"])
        cell.test.append(entry["test_loss"])
        cell.seeds.append(entry["seed"])
    return {arm: dict(sorted(rates.items())) for arm, rates in table.items()}


def common_seeds(rates: dict[float, Cell]) -> set[int]:
    """The seeds every rate of an arm ran: the arm's rates are compared on them."""
    return set.intersection(*(set(cell.seeds) for cell in rates.values()))


def choice_loss(cell: Cell, common: set[int]) -> float:
    """The loss a rate is chosen by: its mean validation loss on ``common`` (infinite where a run diverged)."""
    kept = cell.val_on(common)
    return math.inf if None in kept else statistics.fmean(kept)


def best_rates(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each arm's best rate: the lowest mean validation loss (the lower rate on a tie) over the seeds that every
    rate of the arm has run, so that a rate run with more seeds (the best, seeded once chosen) is compared on the
    same seeds as the others; over all its seeds where no seed is common. A diverged run counts as infinite loss.
    Test losses play no part in it."""
    best = {}
    for arm, rates in cells(runs).items():
        common = common_seeds(rates)
        best[arm] = min(rates, key=lambda lr, rates=rates, common=common: (choice_loss(rates[lr], common), lr))
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


def trained(rates: dict[float, Cell]) -> bool:
    """Whether any run of an arm trained to the end (not every one diverged)."""
    return any(v is not None for cell in rates.values() for v in cell.val)
