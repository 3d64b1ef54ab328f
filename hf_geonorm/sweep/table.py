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


def share_text(share: float) -> str:
    """A warm-up share of the run as a percentage (30%, 0%, 12.5%)."""
    return f"{round(share * 100, 10):g}%"


def run_name(style: str, alpha: float | None, lr: float, seed: int, share: float | None = None) -> str:
    """A run's folder name under ``runs/``, one per cell of the grid: ``geo-alpha0.5-lr8e-3-seed0``, with its
    warm-up share where the sweep tunes it: ``geo-warmup0.3-lr8e-3-seed0``."""
    alpha_part = "" if alpha is None else f"-alpha{alpha_text(alpha)}"
    share_part = "" if share is None else f"-warmup{alpha_text(share)}"
    return f"{style}{alpha_part}{share_part}-lr{rate_text(lr)}-seed{seed}"


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
    """The arm of a run: its norm style, with its geo_alpha where the sweep varies it."""
    return entry["style"] + ("" if entry["alpha"] is None else f" alpha {alpha_text(entry['alpha'])}")


def row_name(entry: dict[str, Any]) -> str:
    """The row of the grid a run is in: its arm, and its warm-up share where the sweep tunes it (``pre warm-up
    30%``); an arm's rows are compared at their best rates (``chosen_cells``)."""
    share = entry.get("warmup_share")
    return arm_name(entry) + ("" if share is None else f" warm-up {share_text(share)}")


def cells(runs: list[dict[str, Any]]) -> dict[str, dict[float, Cell]]:
    """The runs grouped by row (an arm at one warm-up), then by rate (rates in increasing order), in the order rows
    first appear."""
    table: dict[str, dict[float, Cell]] = {}
    for entry in runs:
        cell = table.setdefault(row_name(entry), {}).setdefault(entry["lr"], Cell([], [], []))
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
    """Each row's best rate (a row: an arm at one warm-up, ``row_name``): the lowest mean validation loss (the lower
    rate on a tie) over the seeds that every rate of the row has run, so that a rate run with more seeds (the best,
    seeded once chosen) is compared on the same seeds as the others; over all its seeds where no seed is common. A
    diverged run counts as infinite loss. Test losses play no part in it."""
    best = {}
    for arm, rates in cells(runs).items():
        common = common_seeds(rates)
        best[arm] = min(rates, key=lambda lr, rates=rates, common=common: (choice_loss(rates[lr], common), lr))
    return best


@dataclass(frozen=True)
class Chosen:
    """An arm's chosen cell: its row (the arm at one warm-up), the warm-up share (None: not tuned) and the rate."""

    row: str
    share: float | None
    lr: float


def chosen_cells(runs: list[dict[str, Any]]) -> dict[str, Chosen]:
    """Each arm's chosen cell: the best rate of each of its rows (``best_rates``), and of those the lowest mean
    validation loss over the seeds that every cell of the arm ran (the lower share, then the lower rate, on a tie).
    With the warm-up not tuned an arm has one row: its best rate."""
    table, best = cells(runs), best_rates(runs)
    rows: dict[str, dict[str, float | None]] = {}
    for entry in runs:
        rows.setdefault(arm_name(entry), {})[row_name(entry)] = entry.get("warmup_share")
    chosen = {}
    for arm, shares in rows.items():
        common = set.intersection(*(set(cell.seeds) for row in shares for cell in table[row].values()))

        def order(row: str, shares: dict[str, float | None] = shares, common: set[int] = common) -> tuple:
            share = shares[row]
            return (choice_loss(table[row][best[row]], common), -1.0 if share is None else share, best[row])

        row = min(shares, key=order)
        chosen[arm] = Chosen(row, shares[row], best[row])
    return chosen


def at_edge(runs: list[dict[str, Any]]) -> dict[str, str]:
    """The rows whose best rate is the lowest or the highest of their grid: the best may lie beyond it."""
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
