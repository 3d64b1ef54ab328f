"""The study's protocol: its cells (``Run``), its arms, the decisions it takes from the finished runs (an arm's best
rate, ``--extend``'s rates beyond an edge, the rate ``--confirm-seeds`` runs at), and, for a sweep that trains
several runs at once (``engine``), the runs it needs now that no finished run holds (``walk``).

A serial sweep (``grid``) walks the protocol one run after the other: per arm, the grid on ``--seeds``, then each
``--extend`` step once every run of the rates so far is in, then ``--confirm-seeds`` at the best rate once the
extensions are decided. ``walk`` takes the same steps with the same decisions (``extension_step``,
``confirmation_rate``) from whatever runs are in, stopping an arm at the first step whose inputs are missing; so the
runs it names, trained in any order, are the runs the serial sweep trains, and when none is left the runs are the
serial sweep's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .journal import entry_key
from .options import SweepOptions
from .table import alpha_text, arm_name, best_rates, rate_text, run_name

SINGLE_RATE_STEP = 2.0  # the step an extension takes beyond a grid of one rate


@dataclass(frozen=True)
class Run:
    """One cell of the grid."""

    style: str
    alpha: float | None  # geo_alpha of a geo run when --alphas sweeps it (None: the settings' own)
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return run_name(self.style, self.alpha, self.lr, self.seed)

    @property
    def label(self) -> str:
        alpha = "" if self.alpha is None else f" alpha {alpha_text(self.alpha)}"
        return f"{self.style}{alpha} lr {rate_text(self.lr)} seed {self.seed}"

    @property
    def arm(self) -> str:
        return arm_name({"style": self.style, "alpha": self.alpha})

    def settings(self, base: dict[str, Any]) -> dict[str, Any]:
        settings = {**base, "norm_style": self.style}
        if self.alpha is not None:
            settings["geo_alpha"] = self.alpha
        return settings

    def key(self) -> tuple:
        return (self.style, self.alpha, self.lr, self.seed)


def arms(sweep: SweepOptions) -> list[tuple[str, float | None]]:
    """The arms of the grid, in the order they train: each style, geo once per ``--alphas`` value."""
    found = []
    for style in sweep.styles:
        alphas = sweep.alphas if style == "geo" and sweep.alphas is not None else (None,)
        found.extend((style, alpha) for alpha in alphas)
    return found


def choice(entries: list[dict[str, Any]], style: str, alpha: float | None, rates: list[float],
           seeds: tuple[int, ...]) -> float | None:  # fmt: skip
    """The arm's best rate among ``rates`` on ``seeds`` (``best_rates``), None before any of them ran."""
    runs = [e for e in entries
            if (e["style"], e["alpha"]) == (style, alpha) and e["lr"] in rates and e["seed"] in seeds]  # fmt: skip
    return best_rates(runs).get(arm_name({"style": style, "alpha": alpha})) if runs else None


def beyond_edge(rates: list[float], best: float) -> tuple[list[float], list[str]]:
    """The rates one grid step beyond ``best`` when it is at an edge of ``rates`` (both sides of a single rate),
    none when it lies inside; and why a step adds no rate: it leaves the positive floating-point numbers, or rounds
    to a rate of the grid."""
    ordered = sorted(rates)
    if len(ordered) == 1:
        steps = [("below", "/", SINGLE_RATE_STEP), ("above", "x", SINGLE_RATE_STEP)]
    elif best == ordered[0]:
        steps = [("below", "/", ordered[1] / ordered[0])]
    elif best == ordered[-1]:
        steps = [("above", "x", ordered[-1] / ordered[-2])]
    else:
        return [], []
    beyond, why_not = [], []
    for side, sign, factor in steps:
        rate = float(f"{best / factor if sign == '/' else best * factor:.12g}")  # 3e-3 x 3 is 9e-3, not 9.000..2e-3
        step = f"the next rate {side}, {rate_text(best)} {sign} {factor:.15g},"
        if rate == 0 or rate == math.inf:
            why_not.append(f"{step} {'underflows to 0' if rate == 0 else 'overflows'}")
        elif rate in ordered:
            why_not.append(f"{step} rounds to {rate_text(rate)}, a rate of the grid")
        else:
            beyond.append(rate)
    return beyond, why_not


def extension_step(entries: list[dict[str, Any]], seeds: tuple[int, ...], style: str, alpha: float | None,
                   rates: list[float]) -> tuple[list[float], list[str]]:  # fmt: skip
    """The rates ``--extend`` adds to the arm's grid now (``beyond_edge``), and the lines that say which or why
    none: an arm whose every run diverged has no best rate to extend from (the lowest would pass for one)."""
    arm = arm_name({"style": style, "alpha": alpha})
    best = choice(entries, style, alpha, rates, seeds)
    if best is None:
        return [], []
    if not any(e["val_loss"] is not None for e in entries if (e["style"], e["alpha"]) == (style, alpha)
               and e["lr"] in rates and e["seed"] in seeds):  # fmt: skip
        return [], [f"{arm}: every run diverged (no rate trained): the grid is not extended; give lower --lrs"]
    beyond, why_not = beyond_edge(rates, best)
    edge, notes = f"{arm}: best rate {rate_text(best)} is at the edge of its grid", []
    if why_not:
        notes.append(f"{edge}, but {'; '.join(why_not)}: " + ("no rate added" if not beyond else "not on that side"))
    if beyond:
        notes.append(f"{edge}; extending to {', '.join(map(rate_text, beyond))}")
    return beyond, notes


def confirmation_rate(entries: list[dict[str, Any]], seeds: tuple[int, ...], style: str, alpha: float | None,
                      rates: list[float]) -> tuple[float | None, str]:  # fmt: skip
    """The rate ``--confirm-seeds`` runs at: the arm's best, chosen on ``seeds``; None, and the line that says so,
    where every rate diverged."""
    best = choice(entries, style, alpha, rates, seeds)
    trained = [e for e in entries if (e["style"], e["alpha"], e["lr"]) == (style, alpha, best)
               and e["seed"] in seeds and e["val_loss"] is not None]  # fmt: skip
    if best is None or not trained:
        arm = arm_name({"style": style, "alpha": alpha})
        return None, f"{arm}: no rate trained (every run diverged): no confirmation runs"
    return best, ""


@dataclass(frozen=True)
class Task:
    """A run the protocol needs, its role in it (``grid``, ``extension``, ``confirmation``) and its stage: 0 for the
    grid, N for the N-th extension, one more for the confirmation runs."""

    run: Run
    role: str
    stage: int = 0


@dataclass
class Walk:
    """The protocol walked over the finished runs: the runs it needs and no finished run holds (in the order a serial
    sweep trains them), every run it reached in that order, and the decisions it took (as the serial sweep logs
    them)."""

    due: list[Task] = field(default_factory=list)
    reached: list[tuple] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return not self.due

    def next_due(self, taken: set[tuple]) -> Task | None:
        """The run to start next among the due ones not ``taken`` (being trained): the earliest stage first (a grid's
        run may decide more runs after it, a confirmation run decides none: started first, the runs that wait on
        results start sooner), then in the serial sweep's order."""
        free = [task for task in self.due if task.run.key() not in taken]
        return min(free, key=lambda task: task.stage) if free else None

    def add(self, runs: list[Run], role: str, done: set[tuple], stage: int = 0) -> bool:
        """Reach ``runs``; whether any is missing (then the arm's next step waits on it)."""
        missing = [Task(run, role, stage) for run in runs if run.key() not in done]
        self.reached += [run.key() for run in runs]
        self.due += missing
        return bool(missing)


def walk(sweep: SweepOptions, grids: dict[str, tuple[float, ...]], entries: list[dict[str, Any]]) -> Walk:
    """The protocol over ``entries`` (the finished runs): the grid of every arm, and each arm's extensions and
    confirmation runs as far as its results decide them."""
    done = {entry_key(entry) for entry in entries}
    found = Walk()
    for style, alpha in arms(sweep):
        rates = list(grids[style])
        if found.add([Run(style, alpha, lr, seed) for lr in rates for seed in sweep.seeds], "grid", done):
            continue
        waiting = False
        for stage in range(1, sweep.extend + 1):
            beyond, notes = extension_step(entries, sweep.seeds, style, alpha, rates)
            found.notes += notes
            if not beyond:
                break
            rates.extend(beyond)
            waiting = found.add([Run(style, alpha, lr, seed) for lr in beyond for seed in sweep.seeds], "extension",
                                done, stage)  # fmt: skip
            if waiting:
                break
        if waiting or not sweep.confirm_seeds:
            continue
        best, note = confirmation_rate(entries, sweep.seeds, style, alpha, rates)
        if best is None:
            found.notes.append(note)
            continue
        found.add([Run(style, alpha, best, seed) for seed in sweep.confirm_seeds], "confirmation", done,
                  sweep.extend + 1)  # fmt: skip
    return found


def serial_order(entries: list[dict[str, Any]], reached: list[tuple]) -> list[dict[str, Any]]:
    """``entries`` in the order a serial sweep appends them: the protocol's runs in the order it reaches them, then
    any others (runs of an earlier, other grid) as the journal holds them. The report reads its arms in the order
    they first appear, so a report written from runs that ended in another order is the serial sweep's."""
    position = {key: index for index, key in enumerate(reached)}
    indexed = [(position.get(entry_key(entry), len(position) + index), entry) for index, entry in enumerate(entries)]
    return [entry for _, entry in sorted(indexed, key=lambda pair: pair[0])]
