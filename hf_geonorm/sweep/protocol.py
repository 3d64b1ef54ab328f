"""The sweep's protocol, the same rule for every arm: its cells (``Run``: a rate at a warm-up share, on a seed),
its arms, and the decisions it takes from the finished runs (``walk``).

Per arm: the starting grid (the arm's rates at each ``--warmup-start`` share, on ``--seeds``); then, while the best
cell (``table.chosen_cells``, on validation) sits at an edge, a step: the next rate beyond it at its share where it
is the lowest or highest rate of that share (``--extend`` steps at most per arm), and the next share of
``--warmup-shares`` where its share is the lowest or highest the arm ran, at three rates around the best cell's
(the rates re-centred on the best share); then ``--confirm-seeds`` at the chosen cell. Each step is decided once
every run of the steps before is in, so the runs the protocol takes do not depend on the order runs end in.

A serial sweep (``grid``) trains the first run ``walk`` names, again and again; a parallel one (``engine``) hands
every run it names to a free worker: the runs, trained in any order, are the serial sweep's, and when none is left
the runs are the serial sweep's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .journal import entry_key
from .options import SweepOptions
from .table import alpha_text, arm_name, chosen_cells, rate_text, run_name, share_text

SINGLE_RATE_STEP = 2.0  # the step an extension takes beyond a grid of one rate
SHARE_RATES = 3  # the rates of a share the walk adds: half, once and twice the best cell's rate


@dataclass(frozen=True)
class Run:
    """One cell of the grid."""

    style: str
    alpha: float | None  # geo_alpha of a geo run when --alphas sweeps it (None: the settings' own)
    lr: float
    seed: int
    warmup_share: float | None = None  # the warm-up as a share of the run when the sweep tunes it

    @property
    def name(self) -> str:
        return run_name(self.style, self.alpha, self.lr, self.seed, self.warmup_share)

    @property
    def label(self) -> str:
        alpha = "" if self.alpha is None else f" alpha {alpha_text(self.alpha)}"
        share = "" if self.warmup_share is None else f" warm-up {share_text(self.warmup_share)}"
        return f"{self.style}{alpha}{share} lr {rate_text(self.lr)} seed {self.seed}"

    @property
    def arm(self) -> str:
        return arm_name({"style": self.style, "alpha": self.alpha})

    def warmup_steps(self, max_steps: int) -> int | None:
        """The run's warm-up steps: its share of ``max_steps``, rounded (None: the train options' warm-up)."""
        return None if self.warmup_share is None else round(self.warmup_share * max_steps)

    def settings(self, base: dict[str, Any]) -> dict[str, Any]:
        settings = {**base, "norm_style": self.style}
        if self.alpha is not None:
            settings["geo_alpha"] = self.alpha
        return settings

    def key(self) -> tuple:
        return (self.style, self.alpha, self.lr, self.seed, self.warmup_share)


def arms(sweep: SweepOptions) -> list[tuple[str, float | None]]:
    """The arms of the grid, in the order they train: each style, geo once per ``--alphas`` value."""
    found = []
    for style in sweep.styles:
        alphas = sweep.alphas if style == "geo" and sweep.alphas is not None else (None,)
        found.extend((style, alpha) for alpha in alphas)
    return found


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
    possible: int = 0  # the runs the steps and confirmations not yet decided may add, at most

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
    """The protocol over ``entries`` (the finished runs): the starting grid of every arm, and each arm's steps and
    confirmation runs as far as its results decide them."""
    done = {entry_key(entry) for entry in entries}
    found = Walk()
    for style, alpha in arms(sweep):
        walk_arm(found, sweep, list(grids[style]), entries, done, style, alpha)
    return found


def walk_arm(found: Walk, sweep: SweepOptions, rates: list[float], entries: list[dict[str, Any]], done: set[tuple],
             style: str, alpha: float | None) -> None:  # fmt: skip
    """One arm's part of ``walk``: its starting grid, its steps while its best cell is at an edge, its
    confirmation runs."""
    arm = arm_name({"style": style, "alpha": alpha})
    rows = {share: list(rates) for share in sweep.start_shares()}  # share -> its rates, in the order reached

    def runs(share: float | None, lrs: list[float]) -> list[Run]:
        return [Run(style, alpha, lr, seed, share) for lr in lrs for seed in sweep.seeds]

    stage, rate_steps = 0, 0

    def undecided() -> int:
        """The runs this arm's steps and confirmation may still add, at most."""
        shares_left = 0 if sweep.warmup_shares is None else len(set(sweep.warmup_shares) - set(rows))
        return (len(sweep.seeds) * ((sweep.extend - rate_steps) + SHARE_RATES * shares_left)
                + len(sweep.confirm_seeds or ()))  # fmt: skip

    if found.add([run for share, lrs in rows.items() for run in runs(share, lrs)], "grid", done):
        found.possible += undecided()
        return
    while True:
        stage += 1
        best = best_cell(entries, sweep.seeds, style, alpha, rows)
        if best is None:
            found.notes.append(f"{arm}: every run diverged (no rate trained): the grid is not extended and no seed "
                               "confirmed; give lower --lrs")  # fmt: skip
            return
        share, lr = best
        added: list[Run] = []
        where = "" if share is None else f" at warm-up {share_text(share)}"
        if rate_steps < sweep.extend:
            beyond, why_not = beyond_edge(rows[share], lr)
            edge = f"{arm}: best rate {rate_text(lr)}{where} is at the edge of its grid"
            if why_not:
                found.notes.append(f"{edge}, but {'; '.join(why_not)}: "
                                   + ("no rate added" if not beyond else "not on that side"))  # fmt: skip
            if beyond:
                found.notes.append(f"{edge}; extending to {', '.join(map(rate_text, beyond))}")
                rows[share] += beyond
                added += runs(share, beyond)
                rate_steps += 1
        following = next_share(sweep, list(rows), share)
        if following is not None:
            around = [float(f"{lr * 2.0**step:.12g}") for step in range(-(SHARE_RATES // 2), SHARE_RATES // 2 + 1)]
            found.notes.append(f"{arm}: best cell at warm-up {share_text(share)}, the edge of the shares run; "
                               f"adding warm-up {share_text(following)} at {', '.join(map(rate_text, around))}")
            rows[following] = around
            added += runs(following, around)
        if not added:
            break
        if found.add(added, "extension", done, stage):
            found.possible += undecided()
            return
    if sweep.confirm_seeds:
        confirm = [Run(style, alpha, lr, seed, share) for seed in sweep.confirm_seeds]
        found.add(confirm, "confirmation", done, stage + 1)


def best_cell(entries: list[dict[str, Any]], seeds: tuple[int, ...], style: str, alpha: float | None,
              rows: dict[float | None, list[float]]) -> tuple[float | None, float] | None:  # fmt: skip
    """The arm's best cell (share, rate) among ``rows`` on ``seeds`` (``table.chosen_cells``); None where every run
    diverged."""
    cells = {(share, lr) for share, lrs in rows.items() for lr in lrs}
    own = [entry for entry in entries if (entry["style"], entry["alpha"]) == (style, alpha)
           and (entry.get("warmup_share"), entry["lr"]) in cells and entry["seed"] in seeds]  # fmt: skip
    if not any(entry["val_loss"] is not None for entry in own):
        return None
    chosen = chosen_cells(own)[arm_name({"style": style, "alpha": alpha})]
    return chosen.share, chosen.lr


def next_share(sweep: SweepOptions, shares: list[float | None], best: float | None) -> float | None:
    """The share of ``--warmup-shares`` one step beyond ``best`` where it is the lowest or highest share the arm
    ran and the ladder goes on; None otherwise (and where the warm-up is not tuned)."""
    if best is None or sweep.warmup_shares is None:
        return None
    ladder = sorted(sweep.warmup_shares)
    step = ladder.index(best)
    if best == min(shares) and step > 0:
        return ladder[step - 1]
    if best == max(shares) and step < len(ladder) - 1:
        return ladder[step + 1]
    return None


def serial_order(entries: list[dict[str, Any]], reached: list[tuple]) -> list[dict[str, Any]]:
    """``entries`` in the order a serial sweep appends them: the protocol's runs in the order it reaches them, then
    any others (runs of an earlier, other grid) as the journal holds them. The report reads its arms in the order
    they first appear, so a report written from runs that ended in another order is the serial sweep's."""
    position = {key: index for index, key in enumerate(reached)}
    indexed = [(position.get(entry_key(entry), len(position) + index), entry) for index, entry in enumerate(entries)]
    return [entry for _, entry in sorted(indexed, key=lambda pair: pair[0])]


def most_left(sweep: SweepOptions, grids: dict[str, tuple[float, ...]], entries: list[dict[str, Any]]) -> int:
    """The runs left to train at most: those the protocol needs now and those its undecided steps and
    confirmations may add."""
    found = walk(sweep, grids, entries)
    return len(found.due) + found.possible


def plan_text(sweep: SweepOptions, grids: dict[str, tuple[float, ...]], entries: list[dict[str, Any]]) -> str:
    """The plan the sweep logs before its first run: the rule, the runs it needs now, and how many it may take in
    all with the steps and the confirmation runs the results may add."""
    found = walk(sweep, grids, entries)
    shares = sweep.start_shares()
    seeds = len(sweep.seeds)
    if sweep.warmup_shares is None:
        warmup = "the warm-up not tuned (fixed by the train options)"
        share_steps = ""
    else:
        warmup = (f"at warm-up {', '.join(share_text(s) for s in shares if s is not None)} of the run, then the next "
                  f"share of {', '.join(map(share_text, sorted(sweep.warmup_shares)))} while the best cell is at "
                  f"the lowest or highest share run, at {SHARE_RATES} rates around its rate")  # fmt: skip
        share_steps = f", up to {len(set(sweep.warmup_shares) - set(shares))} more share(s) x {SHARE_RATES} rates"
    confirm = (f"then seeds {', '.join(map(str, sweep.confirm_seeds))} at the chosen cell" if sweep.confirm_seeds
               else "no confirmation seeds")  # fmt: skip
    per_arm = [f"{style}{'' if alpha is None else f' alpha {alpha_text(alpha)}'}: {len(grids[style])} rates "
               f"({', '.join(map(rate_text, grids[style]))})" for style, alpha in arms(sweep)]  # fmt: skip
    return (f"the sweep tunes each arm on one rule: {'; '.join(per_arm)}, {warmup}; up to {sweep.extend} rate(s) "
            f"beyond an edge{share_steps}, on {seeds} seed(s) each; chosen on validation; {confirm}. To train: "
            f"{len(found.due)} run(s) now, at most {len(found.due) + found.possible} with the steps and "
            "confirmation runs the results may add (time estimate after the first run)")
