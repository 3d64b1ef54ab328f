"""Torch's CPU threads against the cores other processes keep busy. Torch starts one intra-op thread per core; where
another process holds some of those cores, the threads wait on each other at every operation: the README's first
command took 18:39 on a two-core machine whose other core trained, and 1:54 there with ``OMP_NUM_THREADS=1``
(``benchmarks/results/first_command.md``). A CPU run measures, between its start and its first step, how busy the
other processes kept its cores (Linux's ``/proc/stat``, less its own CPU time), and says so where its threads do
not fit; it changes nothing itself (the user's choice: ``OMP_NUM_THREADS``)."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

PROC_STAT = Path("/proc/stat")
NOTE_START = "note: other processes kept"  # how the note begins: a sweep shows its runs' first one on its console
SHORTEST_SECONDS = 0.5  # a shorter span tells nothing: the kernel counts in hundredths of a second


def core_jiffies(cores: frozenset[int], stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """Busy and total clock ticks of ``cores`` since boot (``/proc/stat``'s ``cpuN`` lines: user, nice, system,
    idle, iowait, irq, softirq, steal); None where the file or a core's line is missing."""
    try:
        lines = stat.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    busy = total = found = 0
    for line in lines:
        name, *values = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            ticks = [int(value) for value in values[:8]]
            busy += sum(ticks) - ticks[3] - ticks[4]
            total += sum(ticks)
            found += 1
    return (busy, total) if found == len(cores) and total else None


def usable_cores() -> frozenset[int]:
    """The cores this process may run on (all of them where the system does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def own_cpu_seconds() -> float:
    """This process's CPU time, its threads and its finished children (a tokenizing pool) included."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@dataclass
class CoreUse:
    """The cores this process may run on, and their use since ``start``: ``others_busy`` measures it."""

    cores: frozenset[int] = field(default_factory=lambda: usable_cores())
    wall: float = field(default_factory=time.monotonic)
    own: float = field(default_factory=own_cpu_seconds)
    jiffies: tuple[int, int] | None = None

    @classmethod
    def start(cls) -> CoreUse:
        use = cls()
        use.jiffies = core_jiffies(use.cores)
        return use

    def others_busy(self) -> float | None:
        """How many of the cores the machine's other processes kept busy since the start, on average; None where it
        cannot be measured (no ``/proc/stat``, or too short a span)."""
        now = core_jiffies(self.cores)
        span = time.monotonic() - self.wall
        if self.jiffies is None or now is None or span < SHORTEST_SECONDS or now[1] <= self.jiffies[1]:
            return None
        busy_cores = (now[0] - self.jiffies[0]) / (now[1] - self.jiffies[1]) * len(self.cores)
        own_cores = (own_cpu_seconds() - self.own) / span
        return max(0.0, busy_cores - own_cores)


def contention_note(threads: int, cores: int, others_busy: float | None) -> str | None:
    """A line for the log where torch's ``threads`` exceed the cores left free by half a core or more; None where
    they fit, where one thread runs, or where nothing was measured."""
    if others_busy is None or threads <= 1:
        return None
    free = cores - others_busy
    if threads < free + 0.5:
        return None
    fits = max(1, math.floor(free + 0.5))
    return (f"{NOTE_START} {others_busy:.1f} of the {cores} cores busy while this run started, and torch "
            f"runs {threads} threads on them: threads that wait for a busy core slow every step (hf-geonorm's first "
            f"example took 10 times as long on two cores with one busy); set OMP_NUM_THREADS={fits} before the "
            "command to run at the pace of the free cores")  # fmt: skip
