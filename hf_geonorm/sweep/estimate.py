"""How long the rest of a sweep should take, from the runs it has trained: every run of a sweep has the same steps
and evaluations (the rate does not change the cost), so a run left is its setup (building the model, reading the
cached data, saving, the report), its steps at its style's pace, and its evaluations, each measured on the runs so
far. The data is prepared before the first run (``grid``), and the first run's one-off costs (imports, the first
steps' warm-up) are left out as soon as a later run is measured."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunTime:
    """One finished run of this sweep, in parts (seconds)."""

    style: str
    wall: float  # the whole run as the sweep waited for it
    steps: int
    training: float  # train() less its evaluations
    evaluation: float  # every evaluation of the run

    @property
    def setup(self) -> float:
        return max(0.0, self.wall - self.training - self.evaluation)

    @property
    def pace(self) -> float:
        return self.training / self.steps


class TimeEstimate:
    """The runs of this sweep measured so far, and the time of the runs left (each of ``steps`` steps)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.measured: list[RunTime] = []

    def add(self, wall: float, entry: dict[str, Any]) -> None:
        """A finished run, from its journal entry: one that diverged, or whose times were not recorded, says
        nothing of a whole run's time and is left out."""
        times = (entry.get("steps"), entry.get("training_seconds"), entry.get("evaluation_seconds"))
        if entry.get("val_loss") is not None and None not in times and times[0] > 0:
            self.measured.append(RunTime(entry["style"], wall, *times))

    def basis(self) -> list[RunTime]:
        """The runs after the first (the first carries one-off costs); the first alone until another is measured."""
        return self.measured[1:] or self.measured

    def run_seconds(self, style: str) -> float:
        """A run of ``style``: setup and evaluations as the runs so far (their median), steps at the style's pace
        (at the pace of all runs so far where none of the style has ended)."""
        basis = self.basis()
        own = [run.pace for run in basis if run.style == style] or [run.pace for run in basis]
        return (statistics.median(run.setup for run in basis) + self.steps * statistics.median(own)
                + statistics.median(run.evaluation for run in basis))  # fmt: skip

    def line(self, styles_left: list[str], most: int | None = None) -> str | None:
        """The log line: the time of the runs the protocol needs now (one style per run) and, given ``most`` (the
        runs left at most, with the steps and confirmations the results may add), the time of those at the mean
        pace of the styles left, and what it is made of; None before any run was measured or when none is left."""
        if not self.measured or not (styles_left or most):
            return None
        seconds = sum(self.run_seconds(style) for style in styles_left)
        if most is not None and most > len(styles_left):
            styles = list(dict.fromkeys(styles_left)) or [run.style for run in self.basis()]
            each = statistics.fmean(self.run_seconds(style) for style in styles)
            upper = seconds + (most - len(styles_left)) * each
            now = f"about {duration(seconds)} for the {len(styles_left)} run(s) needed now, " if styles_left else ""
            return (f"time estimate: {now}at most about {duration(upper)} for the {most} run(s) left at most with "
                    f"the steps and confirmation runs the results may add; runs of {self.steps} steps, measured on "
                    f"{self.basis_text()}")  # fmt: skip
        measured = {run.style for run in self.basis()}
        unmeasured = " (at the others' pace: none of its runs has ended)"
        each = ", ".join(f"{style} {self.run_seconds(style):.0f} s a run" + ("" if style in measured else unmeasured)
                         for style in dict.fromkeys(styles_left))  # fmt: skip
        return (f"time estimate: about {duration(seconds)} for the {len(styles_left)} run(s) left: {each}; setup, "
                f"{self.steps} steps at each style's pace and evaluations, measured on {self.basis_text()}")

    def basis_text(self) -> str:
        return (f"the {len(self.basis())} run(s) after the first, its one-off costs left out"
                if len(self.measured) > 1 else "the first run, its one-off costs included")  # fmt: skip


def duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
