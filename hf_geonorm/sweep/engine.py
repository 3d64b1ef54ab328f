"""A sweep that trains several runs at once (``sweep --workers N``, ``--devices``, ``--storage``): the study's protocol
(``protocol.walk``) over a board of runs, this machine's journal (``LocalBoard``) or a study shared by many machines
(``storage.StudyBoard``), each run trained by a worker process (``workers``) as soon as one is free and the protocol
needs it: the grids first, an extension or a confirmation once the results it depends on are in.

The runs, the choice and the numbers are a serial sweep's: the same protocol decides them from the same results,
and each run trains as ``grid._train`` trains it, seeded alike. Runs end in another order than one after the other,
so the journal is written again in the serial sweep's order when the sweep ends (``serial_order``) and the report is
written from that order: it is the serial sweep's.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._plumbing.ownership import record_paths
from .._plumbing.signals import raise_if_signalled
from ..errors import require_extra
from ..training.options import TrainOptions
from .engine_options import EngineOptions
from .estimate import TimeEstimate, duration
from .grid import begun_plan, style_grids
from .identity import measured_identity, reference_for_finished
from .journal import Journal, JournalError, append, begin_journal, check_identity, load_journal
from .options import SweepOptions
from .protocol import Task, Walk, plan_text, serial_order, walk
from .record import RecordError, check_record, sweep_header
from .reference import HELD_OUT, write_held_out
from .report import write_report
from .workers import Pool, Worker, worker_slots

PROGRESS_SECONDS = 30.0  # how often the workers' progress is logged while runs train
POLL_SECONDS = 2.0  # how often a machine with nothing to take looks again (the runs others train may decide more)


class LocalBoard:
    """The runs of a sweep on this machine alone: its journal, and the runs its workers train."""

    def __init__(self, journal: Journal, sweep: SweepOptions, grids: dict[str, tuple[float, ...]]) -> None:
        self.journal, self.sweep, self.grids = journal, sweep, grids
        self.running: set[tuple] = set()

    def entries(self) -> list[dict[str, Any]]:
        return self.journal.entries

    def walk(self) -> Walk:
        return walk(self.sweep, self.grids, self.journal.entries)

    def take(self) -> Task | None:
        return self.walk().next_due(self.running)

    def started(self, task: Task) -> None:
        self.running.add(task.run.key())

    def finish(self, task: Task, entry: dict[str, Any]) -> bool:
        append(self.journal.path, entry)
        self.journal.entries.append(entry)
        self.running.discard(task.run.key())
        return True

    def release(self, task: Task) -> None:
        self.running.discard(task.run.key())

    def beat(self) -> None:
        """A journal on this machine needs no heartbeat."""


class ParallelSweep:
    """One call of ``run_sweep`` on worker processes (``grid.run_sweep``'s ``runner``): the same folder, lock and
    journal checks as a serial sweep's."""

    def __init__(self, engine: EngineOptions, sweep: SweepOptions, train: TrainOptions, folder: Path,
                 journal: Journal, log: Any) -> None:  # fmt: skip
        self.engine, self.sweep, self.train, self.folder, self.journal, self.log = (engine, sweep, train, folder,
                                                                                   journal, log)  # fmt: skip
        self.kept = len(journal.entries)  # the runs a serial sweep would also find there first
        self.grids = style_grids(sweep, train, log, journal.header)
        self.estimate = TimeEstimate(train.max_steps)
        self.said: set[str] = set()
        self.started = self.trained = 0
        self.board: Any = None

    def run(self) -> list[dict[str, Any]]:
        self.board = self.open_board()
        if self.engine.storage is not None or not self.board.walk().finished:  # a study's runs: read once joined
            self.check_identity()
        else:
            reference_for_finished(self.journal, self.train, begun_plan(self.sweep, self.grids), self.log)
        slots = worker_slots(self.engine.workers, self.engine.devices)
        pending = self.board.walk()
        if not pending.finished:
            self.log(plan_text(self.sweep, self.grids, self.board.entries()))
            self.log(f"to train: {len(pending.due)} run(s) the protocol needs now, on {len(slots)} worker(s): "
                     + "; ".join(f"worker {slot.number} on {slot.where}" for slot in slots))  # fmt: skip
            with Pool(slots, self.train, self.folder, self.journal.header) as pool:
                try:
                    self.loop(pool)
                finally:
                    for worker in pool.busy():
                        self.board.release(worker.task)
        final = self.board.walk()
        self.say(final)
        entries = self.ordered(final.reached)
        if not self.trained:
            self.log(f"all {len(final.reached)} runs of the sweep are in {self.where()}")
        self.write_journal(entries)
        write_report(self.folder, entries, log=self.log, header=self.journal.header)
        record_paths(self.folder, "sweep", *(path for path in (self.journal.path, self.folder / "sweep.md",
                                                               self.folder / "sweep.png", self.folder / HELD_OUT)
                                               if path.exists()))  # fmt: skip
        return entries

    def open_board(self) -> Any:
        if self.engine.storage is None:
            return LocalBoard(self.journal, self.sweep, self.grids)
        from .storage import StudyBoard

        return StudyBoard(self.engine.storage, self.engine.study, self.engine.takeover_after, self.sweep, self.grids,
                          self.log)  # fmt: skip

    def where(self) -> str:
        return self.board.where if self.engine.storage is not None else str(self.journal.path)

    def check_identity(self) -> None:
        """Before a run trains: the sweep's identity measured here (``identity``), compared with the study's header
        (``--storage``: recorded there by the first machine) and the journal's, or recorded where there is none yet;
        then the data cached. Each worker measures it again before each of its runs (``workers``)."""
        identity, prepare = measured_identity(self.train)
        header = None
        if self.engine.storage is not None:  # before this folder's journal is started: a refusal leaves it as it was
            grid = {**self.sweep.plan(), "grids": {style: list(rates) for style, rates in self.grids.items()}}
            header = self.board.join(sweep_header(identity, self.sweep.plan()), json.loads(json.dumps(grid)),
                                     identity)  # fmt: skip
        if self.journal.header is None:
            begin_journal(self.journal.path, header or sweep_header(identity, begun_plan(self.sweep, self.grids)))
            self.journal = load_journal(self.journal.path)
            if isinstance(self.board, LocalBoard):
                self.board.journal = self.journal
        else:
            check_identity(self.journal, replace(self.train, lr=None), identity)
        write_held_out(self.folder, prepare(self.log), self.log)
        if self.engine.storage is not None:
            self.refuse_runs_the_study_lacks()

    def refuse_runs_the_study_lacks(self) -> None:
        """This folder's journal mirrors the study's runs: one that holds others (a sweep run here alone) would lose
        them when it is written again."""
        shared = {entry["run"] for entry in self.board.entries()}
        own = [entry["run"] for entry in self.journal.entries if entry["run"] not in shared]
        if own:
            raise JournalError(f"{self.journal.path} holds {len(own)} run(s) that {self.board.where} lacks ("
                               f"{', '.join(own[:3])}{', ...' if len(own) > 3 else ''}): this folder's journal is "
                               "written from the study; give another --output")  # fmt: skip

    def loop(self, pool: Pool) -> None:
        """Hand each free worker the next run the protocol needs, until no run is left or training."""
        shown, looked = time.monotonic(), 0.0
        while True:
            raise_if_signalled()
            if time.monotonic() - looked >= POLL_SECONDS:  # a step report alone changes nothing to take
                for worker in pool.free():
                    task = self.board.take()
                    if task is None:
                        break
                    self.start(pool, worker, task)
                looked = time.monotonic()
            if not pool.busy():
                if self.board.walk().finished or self.engine.storage is None:
                    return
                time.sleep(POLL_SECONDS)  # the others' runs decide what comes next
            for event in pool.wait(timeout=POLL_SECONDS if self.engine.storage else PROGRESS_SECONDS):
                if event.entry is None:
                    self.board.release(event.task)
                    if event.refused:
                        raise JournalError(f"{event.error}: the data, the tokenizer or the model changed since the "
                                           f"sweep began; the finished runs are in {self.where()}: run the sweep "
                                           "again on the files it began with, or give another --output")  # fmt: skip
                    stopped = "was stopped" if event.stop else f"failed: {event.error}"
                    raise JournalError(f"{event.task.run.label} on worker {event.worker.slot.number} {stopped}; the "
                                       f"finished runs are in {self.where()}: the same command again trains the runs "
                                       "that are missing")  # fmt: skip
                self.ended(event.task, event.entry, event.seconds, event.worker.slot.number)
                self.time_left(pool)
                looked = 0.0
            self.board.beat()
            if time.monotonic() - shown >= PROGRESS_SECONDS:
                self.progress(pool)
                shown = time.monotonic()

    def start(self, pool: Pool, worker: Worker, task: Task) -> None:
        if isinstance(self.board, LocalBoard):
            self.board.started(task)
        self.started += 1
        self.log(f"run {self.started}: {task.run.label} ({task.role}) on worker {worker.slot.number}")
        pool.start(worker, task)

    def ended(self, task: Task, entry: dict[str, Any], seconds: float, worker: int) -> None:
        """A run a worker finished: counted once its record is one of this sweep (``record.check_record``: its
        identity, measured by the worker before it trained, and the data its run read)."""
        try:
            check_record(entry, self.journal.header or {}, where=f"run {task.run.label} from worker {worker}")
        except RecordError as error:
            self.board.release(task)
            raise JournalError(f"{error}: not recorded in {self.where()}, so the data, the tokenizer or the model "
                               "changed while it trained; run the sweep again on the files it began with, or give "
                               "another --output") from None  # fmt: skip
        if not self.board.finish(task, entry):
            return
        self.trained += 1
        record_paths(self.folder, "sweep", *(path for path in (self.folder / "logs" / f"{task.run.name}.log",
                                                               self.folder / "runs" / task.run.name) if path.exists()))
        result = "diverged" if entry["val_loss"] is None else (
            f"validation loss {entry['val_loss']:.4f}, test loss {entry['test_loss']:.4f}")  # fmt: skip
        self.log(f"run {task.run.label}: {result} ({seconds:.0f} s)")
        self.estimate.add(seconds, entry)
        self.say(self.board.walk())

    def say(self, found: Walk) -> None:
        """The protocol's decisions, each once, as the serial sweep logs them."""
        for note in found.notes:
            if note not in self.said:
                self.said.add(note)
                self.log(note)

    def progress(self, pool: Pool) -> None:
        """A line per worker (its run and step) and the time the sweep has left."""
        for worker in pool.workers:
            step = f", step {worker.step[0]}/{worker.step[1]}" if worker.step else ", starting"
            doing = f"{worker.task.run.label}{step}" if worker.task else "free (waiting for a run the protocol needs)"
            self.log(f"worker {worker.slot.number} ({worker.slot.where}): {doing}")
        self.time_left(pool)

    def time_left(self, pool: Pool) -> None:
        """The time the runs known to be left should take on the workers: those waiting at a whole run's time
        (``TimeEstimate``, measured on the runs so far), those training at the part of it their steps have left."""
        busy = pool.busy()
        queued = [task for task in self.board.walk().due if task.run.key() not in {w.task.run.key() for w in busy}]
        if not self.estimate.measured or not (queued or busy):
            return
        seconds = sum(self.estimate.run_seconds(task.run.style) for task in queued)
        for worker in busy:
            done = worker.step[0] / worker.step[1] if worker.step else 0.0
            seconds += (1 - done) * self.estimate.run_seconds(worker.task.run.style)
        found = self.board.walk()
        upper = seconds + found.possible * statistics.fmean(self.estimate.run_seconds(s) for s in self.sweep.styles)
        self.log(f"time estimate: about {duration(seconds / len(pool.workers))} for the {len(queued) + len(busy)} "
                 f"run(s) known to be left on {len(pool.workers)} worker(s), at most about "
                 f"{duration(upper / len(pool.workers))} with the {found.possible} run(s) the steps and confirmations "
                 "not yet decided may add")  # fmt: skip

    def ordered(self, reached: list[tuple]) -> list[dict[str, Any]]:
        """The runs in the serial sweep's order: those the journal held before, then the others as the protocol
        reaches them (``serial_order``)."""
        entries = self.board.entries()
        if self.engine.storage is not None:
            return serial_order(entries, reached)
        return entries[: self.kept] + serial_order(entries[self.kept :], reached)

    def write_journal(self, entries: list[dict[str, Any]]) -> None:
        """This folder's journal, in the serial sweep's order (with ``--storage``: the study's runs), written in one
        step."""
        from ..training.run.outputs import replace_file

        if self.journal.header is None or entries == self.journal.entries:
            return
        lines = [json.dumps(line, allow_nan=False) + "\n" for line in [self.journal.header, *entries]]
        replace_file(self.journal.path, lambda tmp: tmp.write_text("".join(lines), encoding="utf-8"))
        self.journal = load_journal(self.journal.path)


def sweep_on(engine: EngineOptions, sweep: SweepOptions, train: TrainOptions, log: Any = print,
             given: Any = None) -> list[dict[str, Any]]:  # fmt: skip
    """``grid.run_sweep``, its runs trained as ``engine`` says: one after the other in this process unless it asks for
    workers, devices or a storage (``given``: the sweep options the command line gave, as ``run_sweep`` takes)."""
    from functools import partial

    from .grid import run_sweep

    require_extra("train", "hf-geonorm sweep")
    engine.validate()
    return run_sweep(sweep, train, log, given=given, runner=partial(ParallelSweep, engine) if engine.parallel else None)
