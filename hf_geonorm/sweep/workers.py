"""The worker processes of a sweep that trains several runs at once (``sweep --workers N``, ``--devices``): one
process per worker, started once, so that importing torch and transformers is paid once per worker and not per run
(and not at all by a worker forked from this process: ``start_method``);
each trains the runs it is handed one after the other, as ``grid._train`` trains a serial sweep's, on its own
accelerator (``CUDA_VISIBLE_DEVICES``: the run sees that one device alone) or, without one, on its own share of the
CPU cores (``torch.set_num_threads``). Before each run a worker measures the sweep's identity again (the
fingerprints of the data, the tokenizer and the model) and trains nothing where it is not the journal header's.

A worker reports its run's step as it trains (read from the progress bar and the step lines ``run_training``
writes), its journal entry when the run ends, or the first line of what stopped it. A worker that dies (killed, out
of memory) is reported as such: its run left no entry, so it trains again.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from .._plumbing.children import environment_set
from .._plumbing.declarations import OptionError
from ..errors import first_line
from ..training.options import TrainOptions
from .protocol import Task

STEP = re.compile(r"(?:^|\r|\n)\s*(?:step )?(\d+)/(\d+)(?: \[|:)")  # the bar's "3/300 [" or a line's "step 3/300:"


@dataclass(frozen=True)
class Slot:
    """Where a worker trains: an accelerator's index (None: the CPU) and its share of the CPU cores."""

    number: int
    device: str | None
    threads: int

    @property
    def where(self) -> str:
        return f"cuda:{self.device}" if self.device is not None else f"CPU, {self.threads} thread(s)"


def visible_accelerators() -> list[str]:
    import torch

    return [str(index) for index in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def start_method(slot: Slot) -> str:
    """How a worker's process starts: ``fork`` for a worker on the CPU with one thread, on Linux, which starts at once
    with this process's torch and transformers already imported (torch's DataLoader forks its workers so); ``spawn``
    otherwise, which imports them again (seconds). A forked child cannot initialise CUDA, and its OpenMP threads hang
    once this process has used OpenMP's own (measured: a forked child's two-thread matmul after the parent's never
    returned), while one thread needs none."""
    return "fork" if slot.device is None and slot.threads == 1 and sys.platform.startswith("linux") else "spawn"


def worker_slots(workers: int | None, devices: str | None) -> list[Slot]:
    """The workers ``--workers`` and ``--devices`` ask for: one per device named (``auto``: every visible
    accelerator; none visible: the CPU), or ``--workers`` of them spread over the devices in turn; each gets an
    equal share of the cores this process may use (at most ``OMP_NUM_THREADS`` threads where that is set)."""
    visible = visible_accelerators()
    if devices is None or devices == "auto":
        named = visible
    else:
        named = [part.strip() for part in devices.split(",")]
        unknown = [name for name in named if name not in visible]
        if unknown:
            seen = f"the visible ones are {', '.join(visible)}" if visible else "none is visible (no CUDA device)"
            raise OptionError(f"--devices names {', '.join(unknown)}, not a visible accelerator: {seen}; give their "
                              "indexes, or auto")  # fmt: skip
    count = workers or max(1, len(named))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // count)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # the user's own limit, as torch reads it
        threads = max(1, min(threads, int(os.environ["OMP_NUM_THREADS"])))
    return [Slot(number + 1, named[number % len(named)] if named else None, threads) for number in range(count)]


@dataclass
class Worker:
    """A worker process, the pipe to it, and the task it trains (None: free)."""

    slot: Slot
    process: Any
    pipe: Connection
    task: Task | None = None
    started: float = 0.0
    step: tuple[int, int] | None = None
    ended: bool = False


@dataclass
class Event:
    """What a worker reported: its run's entry (``entry``), or why it stopped (``error``, ``stop``: a signal)."""

    worker: Worker
    task: Task
    entry: dict[str, Any] | None = None
    seconds: float = 0.0
    error: str | None = None
    stop: bool = False
    refused: bool = False  # the sweep's identity, measured before the run, was not the header's: it did not train


@dataclass
class Pool:
    """The worker processes of this machine."""

    slots: list[Slot]
    train: TrainOptions
    folder: Path
    header: dict[str, Any]  # the journal's: the sweep's identity, which each worker checks before each run
    workers: list[Worker] = field(default_factory=list)

    def __enter__(self) -> Pool:
        given = os.environ.get("CUDA_VISIBLE_DEVICES")
        for slot in self.slots:
            method = start_method(slot)
            context = multiprocessing.get_context(method)
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(slot, self.train, self.folder, self.header, child),
                                      daemon=True, name=f"hf-geonorm sweep worker {slot.number}")  # fmt: skip
            # the worker sees its device alone from its start (torch may count devices as it is imported); a forked
            # one tokenizes on one thread, without the tokenizers library's warning about a fork
            environment = {"CUDA_VISIBLE_DEVICES": device_id(slot.device, given)}
            if method == "fork":
                environment["TOKENIZERS_PARALLELISM"] = os.environ.get("TOKENIZERS_PARALLELISM", "false")
            with environment_set(environment):
                process.start()
            child.close()
            self.workers.append(Worker(slot, process, parent))
        return self

    def __exit__(self, *_: Any) -> None:
        """Stop every worker: a run still training is stopped (SIGTERM: its checkpoints are removed) and trains
        again from its start when the sweep runs again."""
        for worker in self.workers:
            if worker.process.is_alive():
                if worker.task is None:
                    _send(worker, None)
                else:
                    os.kill(worker.process.pid, signal.SIGTERM)
        for worker in self.workers:
            worker.process.join(timeout=60)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()

    def free(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.task is None and not worker.ended]

    def busy(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.task is not None]

    def start(self, worker: Worker, task: Task) -> None:
        worker.task, worker.started, worker.step = task, time.monotonic(), None
        _send(worker, task)

    def wait(self, timeout: float) -> list[Event]:
        """The runs that ended within ``timeout`` seconds (their workers are free again); the steps of the others."""
        events = []
        for pipe in wait([worker.pipe for worker in self.busy()], timeout):
            worker = next(worker for worker in self.workers if worker.pipe is pipe)
            try:
                kind, *payload = pipe.recv()
            except (EOFError, OSError):
                worker.process.join(timeout=10)
                code = worker.process.exitcode
                why = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                kind, payload = "error", [f"worker {worker.slot.number} ({worker.slot.where}) died ({why})"]
                worker.ended = True
            if kind == "step":
                worker.step = tuple(payload)
                continue
            task, worker.task = worker.task, None
            assert task is not None
            if kind == "done":
                events.append(Event(worker, task, entry=payload[0], seconds=payload[1]))
            else:
                events.append(Event(worker, task, error=payload[0], stop=kind == "stop", refused=kind == "refused"))
                worker.ended = True
        return events




def _send(worker: Worker, task: Task | None) -> None:
    try:
        worker.pipe.send(task)
    except (BrokenPipeError, OSError):
        pass  # the worker is gone: its end is read from the pipe


class _ProgressStream:
    """A worker's stdout and stderr: the progress bar and the step lines become step reports to the sweep (several
    bars on one terminal would garble it); other text (a warning) goes on to the terminal."""

    def __init__(self, pipe: Connection, passed: Any) -> None:
        self.pipe, self.passed, self.last = pipe, passed, None

    def write(self, text: str) -> int:
        if "evaluating" in text:
            return len(text)
        matches = STEP.findall(text)
        if matches:
            step = tuple(map(int, matches[-1]))
            if step != self.last:
                self.last = step
                self.pipe.send(("step", *step))
        elif text.strip() and "\r" not in text:
            self.passed.write(text)
        return len(text)

    def flush(self) -> None:
        self.passed.flush()

    def isatty(self) -> bool:
        return False


def device_id(device: str | None, given: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a worker on ``device`` (an index among the devices this process sees, which
    ``given``, the variable as the user set it, may already narrow); empty for a worker on the CPU."""
    if device is None:
        return ""
    listed = [part.strip() for part in given.split(",")] if given else []
    return listed[int(device)] if int(device) < len(listed) else device


def checked_run(task: Task, train: TrainOptions, folder: Path, header: dict[str, Any], worker: int) -> dict[str, Any]:
    """Train ``task``'s run as ``grid._train`` does, the sweep's identity measured again first and compared with the
    ``header``'s (``record.check_same_sweep``: ``RecordError`` naming the field, and nothing trained, where the data,
    the tokenizer or the model changed since the sweep began); its record carries that identity, as a serial
    sweep's line does."""
    from .grid import _train
    from .identity import measured_identity
    from .record import check_same_sweep

    identity, _ = measured_identity(train)
    check_same_sweep(header, identity, where=f"before {task.run.label} on worker {worker}")
    entry = {**_train(task.run, train, folder), "role": task.role, "fingerprints": identity["fingerprints"]}
    if entry["val_loss"] is None:  # diverged: the settings its model was built with
        entry["settings"] = task.run.settings(identity["settings"])
    return entry


def _stop_with_the_sweep() -> None:
    """On Linux, SIGTERM this worker when the sweep's process ends, even by SIGKILL (where no handler of the sweep
    runs to stop it): its run stops as the sweep's own SIGTERM would stop it, instead of training on for nobody while
    it holds the folder's lock. Elsewhere a worker ends at its next run (the pipe is closed)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    set_parent_death_signal = 1  # PR_SET_PDEATHSIG, linux/prctl.h
    ctypes.CDLL(None, use_errno=True).prctl(set_parent_death_signal, signal.SIGTERM)
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:  # the sweep ended before the signal was asked for
        os.kill(os.getpid(), signal.SIGTERM)


def _serve(slot: Slot, train: TrainOptions, folder: Path, header: dict[str, Any], pipe: Connection) -> None:
    """A worker process: train each run handed over (``checked_run``) until told to stop (None)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the sweep, which stops its workers

    def terminated(signum: int, _: Any) -> None:
        from .._plumbing.signals import Terminated

        raise Terminated(signum)

    signal.signal(signal.SIGTERM, terminated)
    _stop_with_the_sweep()
    import torch

    from .._plumbing.output_lock import share_parents_lock
    from .record import RecordError

    share_parents_lock(folder)
    torch.set_num_threads(slot.threads)
    sys.stdout = sys.stderr = _ProgressStream(pipe, sys.__stderr__)  # type: ignore[assignment]
    while (task := pipe.recv()) is not None:
        started = time.monotonic()
        try:
            entry = checked_run(task, train, folder, header, slot.number)
        except BaseException as error:  # noqa: BLE001 - reported to the sweep, which stops
            from .._plumbing.signals import Terminated

            kind = "refused" if isinstance(error, RecordError) else "error"
            pipe.send(("stop" if isinstance(error, (KeyboardInterrupt, Terminated)) else kind,
                       first_line(error, limit=600)))  # fmt: skip
            return
        pipe.send(("done", entry, time.monotonic() - started))
