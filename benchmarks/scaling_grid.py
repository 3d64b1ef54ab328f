"""The grid of benchmarks/scaling.py and the rule it chooses by: the cells of each axis, the settings every run
spells out, and the decision over the finished runs (regrets, the chosen alpha and decay). The running
(``scaling.py``), the tables (``scaling_tables.py``) and the figure (``scaling_plots.py``) read it."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

ALPHAS = (0.125, 0.25, 0.5, 1.0, 2.0)
# Every GeoNorm setting spelled out: a run's identity must not depend on the library's defaults of the day.
FIXED = {"geo_max_angle": math.pi / 4, "geo_learnable_step": False, "geo_radius": "embedding", "geo_bridge": 1.0}
PRE = {"norm_style": "pre", "geo_alpha": 0.25, "geo_decay": "harmonic", **FIXED}
CHOICE_CORPORA = ("stdlib", "prose")
HELDOUT_CORPUS = "dict"
PHASES = ("budget", "depth", "final", "width")  # in the order they run
CHOICE_AXES = ("budget", "depth")  # the cells the rule is chosen on; width is a check run after the choice


def geo(alpha: float, decay: str = "harmonic") -> dict[str, Any]:
    return {"norm_style": "geo", "geo_alpha": alpha, "geo_decay": decay, **FIXED}

def alpha_label(alpha: float, decay: str = "harmonic") -> str:
    return f"geo {decay} alpha {alpha:g}"

@dataclass(frozen=True)
class Cell:
    """One point of the grid: depth, width and training steps (16 x 128 tokens a step)."""

    axis: str
    layers: int
    width: int
    steps: int

    @property
    def name(self) -> str:
        return f"L{self.layers} W{self.width} S{self.steps}"

def grid(smoke: bool) -> dict[str, list[Cell]]:
    """The cells of each axis, in the order they run (the middle point is run once, on the budget axis)."""
    if smoke:
        layers, width, budgets, depths, widths = 2, 16, (4, 8), (3,), (32,)
    else:
        layers, width, budgets, depths, widths = 12, 64, (64, 512, 192), (4, 32), (128, 256)
    middle = budgets[-1]
    return {
        "budget": [Cell("budget", layers, width, s) for s in budgets],
        "depth": [Cell("depth", d, width, middle) for d in depths],
        "width": [Cell("width", layers, w, middle) for w in widths],
    }

def lr_for(width: int) -> float:
    return 2e-3 * math.sqrt(128 / width)

def variant(result: dict[str, Any]) -> str:
    return result["spec"]["label"].split(" | ", 1)[1]

def cell_name(result: dict[str, Any]) -> str:
    return result["spec"]["label"].split(" | ", 1)[0]

def best_alpha(runs: list[dict[str, Any]]) -> float:
    """The harmonic alpha with the lowest final validation loss among ``runs`` (one cell, shape and corpus)."""
    harmonic = {r["spec"]["settings"]["geo_alpha"]: r["final_val_loss"] for r in runs
                if r["spec"]["settings"]["norm_style"] == "geo" and r["spec"]["settings"]["geo_decay"] == "harmonic"
                and math.isfinite(r["final_val_loss"])}  # fmt: skip
    return min(harmonic, key=harmonic.get) if harmonic else 1.0


# ---- the decision ----


def cell_tables(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """Final validation loss of every variant, by (cell, arch, corpus): the grid's runs (seed 0, choice
    corpora)."""
    tables: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in results:
        if r["spec"]["seed"] == 0 and r["spec"]["corpus"] != HELDOUT_CORPUS:
            tables.setdefault((cell_name(r), r["spec"]["arch"], r["spec"]["corpus"]), {})[variant(r)] = r[
                "final_val_loss"
            ]
    return tables

def choice_tables(tables: dict[tuple[str, str, str], dict[str, float]], smoke: bool) -> dict:
    """The tables of the cells the rule is chosen on (the budget and depth axes)."""
    names = {c.name for axis in CHOICE_AXES for c in grid(smoke)[axis]}
    return {key: table for key, table in tables.items() if key[0] in names}

def complete(table: dict[str, float]) -> bool:
    return "pre" in table and all(alpha_label(a) in table for a in ALPHAS)

def regrets(tables: dict[tuple[str, str, str], dict[str, float]]) -> dict[float, list[float]]:
    """Per alpha, its loss minus the best harmonic alpha's in each complete cell: what a user pays for a
    fixed alpha instead of the best one of the cell."""
    out: dict[float, list[float]] = {a: [] for a in ALPHAS}
    for table in tables.values():
        if not complete(table):
            continue
        best = min(table[alpha_label(a)] for a in ALPHAS)
        for a in ALPHAS:
            value = table[alpha_label(a)]
            out[a].append(value - best if math.isfinite(value) else math.inf)
    return out

def chosen_rule(tables: dict[tuple[str, str, str], dict[str, float]]) -> tuple[float, str]:
    """The single alpha (harmonic decay) with the lowest mean regret over every complete grid cell of the
    choice corpora; harmonic unless constant decay at the cell's best alpha beats harmonic there in most
    cells."""
    mean_regret = {a: statistics.fmean(v) for a, v in regrets(tables).items() if v}
    if not mean_regret:
        return 1.0, "harmonic"
    alpha = min(mean_regret, key=mean_regret.get)
    constant_wins = total = 0
    for table in tables.values():
        if not complete(table):
            continue
        best = min(ALPHAS, key=lambda a: table[alpha_label(a)])
        constant = table.get(alpha_label(best, "constant"))
        if constant is not None:
            total += 1
            constant_wins += constant < table[alpha_label(best)]
    return alpha, "constant" if total and constant_wins > total / 2 else "harmonic"
