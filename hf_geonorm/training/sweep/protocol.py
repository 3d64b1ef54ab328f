"""The study's protocol as a function of the finished runs, for a sweep that trains several runs at once
(``engine``): which runs it needs now that no finished run holds, and which wait on results not in yet.

A serial sweep (``grid``) walks the protocol one run after the other: per arm, the grid on ``--seeds``, then each
``--extend`` step once every run of the rates so far is in, then ``--confirm-seeds`` at the best rate once the
extensions are decided. ``walk`` takes the same steps with the same decisions (``extension_step``,
``confirmation_rate``) from whatever runs are in, stopping an arm at the first step whose inputs are missing; so the
runs it names, trained in any order, are the runs the serial sweep trains, and when none is left the runs are the
serial sweep's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .grid import Run, arms, confirmation_rate, extension_step
from .journal import entry_key
from .options import SweepOptions


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
