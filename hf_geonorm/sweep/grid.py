"""``hf-geonorm sweep``: is GeoNorm better than Pre-Norm on this data, and at which learning rate?

A grid of norm styles (and geo_alpha values for geo) x learning rates x seeds, each run as ``hf-geonorm train``
runs it (``run_training``: the same data pipeline, Trainer, optimizer and model recipe), one after the other. Each
finished run is appended to ``DIR/runs.jsonl`` at once (``journal``), so a sweep stopped part way is resumed
by running the same command again: only the missing runs train. The journal's first line holds the sweep's identity
(the options every run shares, their settings, the fingerprints of the data, the tokenizer and the model: ``record``)
and the sweep options it began with, which a rerun that leaves them out takes; every line carries its run's identity.
A sweep with other options, data or model is refused rather than mixed in (the grid itself may grow: more rates,
seeds or styles), and the fingerprints are measured again before every run (``identity``).

The study's protocol, per arm: the grid on ``--seeds`` (the choice), then ``--extend``: while the arm's best rate is
at an edge of its grid, the next rate a grid step beyond it (N times at most), then ``--confirm-seeds`` at the best
rate only. Every step is decided from the journal, so a resumed sweep takes the same steps. Each arm's best rate is
the one with the lowest mean validation loss over the seeds every rate ran, and the arms are compared at their own
best rates on the test split (``report``).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Collection
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from .._plumbing.atomic import LOCK_NAME
from .._plumbing.declarations import OptionError
from .._plumbing.output_lock import output_lock
from .._plumbing.ownership import only_bookkeeping_left, read_marker, record_paths
from .._plumbing.signals import raise_if_signalled
from .._plumbing.text_files import new_text_file
from ..errors import NonFiniteError, first_line
from ..training.data.prepare import check_output_apart
from ..training.options import LEGACY_HELD_OUT_RULE, TrainOptions
from ..training.rate_rule import SWEEP_RATE
from ..training.run.checkpoints import checkpoints
from ..training.run.cpu_threads import NOTE_START
from ..training.run.model import default_rate, planned_config
from ..training.run.trainer import run_training
from .estimate import TimeEstimate
from .identity import checked_identity, checked_line, reference_for_finished
from .journal import (
    JOURNAL,
    Journal,
    JournalError,
    append,
    check_options,
    header_options,
    journal_key,
    load_journal,
    read_journal,
    refuse_link,
    repair,
)
from .options import DEFAULT_GRID_STEPS, STARTING_RATES, UNMEASURED_GRID_STEPS, WARMUP_LADDER, SweepOptions
from .protocol import Run, Task, most_left, plan_text, walk
from .reference import HELD_OUT
from .report import write_report
from .table import rate_text

__all__ = ["JOURNAL", "JournalError", "Run", "journal_key", "open_journal", "read_journal", "run_sweep"]


def style_grids(sweep: SweepOptions, train: TrainOptions, log: Any,
                header: dict[str, Any] | None = None) -> dict[str, tuple[float, ...]]:  # fmt: skip
    """Each style's starting rates: ``--lrs`` or ``--lr-range`` for every style, else each style's own ladder around
    its default rate (``train``'s for this model: ``default_rate``), 1/2 to 2 times it, or 1/4 to 4 where no cell
    measured it, logged with where it comes from; a style the journal's ``header`` began (``starting_rates``) keeps
    its rates, so that a resumed sweep walks from where it began even if the default rates changed since."""
    if sweep.lrs is not None or sweep.lr_range is not None:
        return dict.fromkeys(sweep.styles, sweep.rates())
    begun = (header or {}).get("sweep_options", {}).get(STARTING_RATES) or {}
    config, grids = planned_config(train), {}
    for style in sweep.styles:
        if style in begun:
            grids[style] = tuple(begun[style])
            log(f"{style}: starting rates {', '.join(map(rate_text, grids[style]))}, as the sweep began")
            continue
        centre = default_rate(train.model, config, style)
        grids[style] = sweep.rates(centre.lr, UNMEASURED_GRID_STEPS if centre.needs_sweep else DEFAULT_GRID_STEPS)
        log(f"{style}: starting rates {', '.join(map(rate_text, grids[style]))}, around {rate_text(centre.lr)}, the "
            f"default for {centre.why}; --lrs or --lr-range sets others")  # fmt: skip
    return grids


def begun_plan(sweep: SweepOptions, grids: dict[str, tuple[float, ...]]) -> dict[str, Any]:
    """The plan a new journal's header records: the sweep options, and each style's starting rates."""
    return {**sweep.plan(), STARTING_RATES: {style: list(rates) for style, rates in grids.items()}}


def open_journal(folder: Path, train: TrainOptions) -> tuple[Path, list[dict[str, Any]]]:
    """The journal of ``folder`` and its finished runs, every line checked and the options compared with its
    header's (the data's content is compared before a run trains: ``run_sweep``)."""
    journal = load_journal(folder / JOURNAL)
    check_options(journal, train)
    return journal.path, journal.entries


def run_sweep(sweep: SweepOptions, train: TrainOptions, log: Any = print,
              given: Collection[str] | None = None, runner: Any = None) -> list[dict[str, Any]]:  # fmt: skip
    """Train every run of the sweep that ``DIR/runs.jsonl`` does not hold yet, appending each as it ends: the grid,
    its extensions and the confirmation runs; write ``sweep.md`` and ``sweep.png`` (``report``) after each;
    return the journal's runs. ``given``: the sweep options the command line gave; each other one is the journal's
    (the plan the sweep began with), so that a rerun with fewer options finishes the same sweep (None: all given).
    A Ctrl-C or SIGTERM that Python swallowed stops it before the next run, where the caller records them
    (``signals.signals_stop_the_job``: the command line). ``runner``: what trains the runs in the locked folder
    (``engine.ParallelSweep``, bound to its options), one after the other here by default."""
    sweep.validate()
    if train.lr is not None:
        raise OptionError("the sweep sets the learning rate of each run (--lrs or --lr-range); drop --lr")
    for setting, option, single in (("norm_style", "--styles", "--norm-style"), ("geo_alpha", "--alphas", "--alpha")):
        if setting in train.settings and (setting == "norm_style" or sweep.alphas is not None):
            raise OptionError(f"the sweep sets {setting} of each run: give {option}, not {single}")
    train = replace(train, lr=1e-3).validate()  # the rate each run sets: checked with a stand-in
    folder = Path(sweep.output).absolute()  # as given: a quoted ~ is a folder ~
    check_output_apart(train.data, folder, sweep.output)  # before the sweep writes anything
    with output_lock(folder, "sweep"):  # one sweep per folder, and no other run in its logs/ or runs/
        refuse_link(folder / JOURNAL)
        journal = load_journal(folder / JOURNAL)
        refuse_foreign_folder(folder, journal)
        if journal.legacy:
            raise JournalError(
                f"{journal.path} is the journal of an earlier hf-geonorm (format 1), whose lines record neither the "
                "options that shaped each run nor the content of its model, so they cannot be checked against this "
                "sweep: `hf-geonorm info` and the report read it; give another --output to sweep again"
            )
        repair(journal, log)
        train = begun_held_out_rule(journal, train, log)
        check_options(journal, replace(train, lr=None))
        if journal.header is not None and given is not None:
            sweep, taken = sweep.as_begun(journal.header["sweep_options"], given)
            sweep.validate()
            if taken:
                log(f"the sweep resumes as it began ({journal.path}, line 1): {', '.join(taken)}")
        sweep = fixed_warmup(sweep, train, given).resolved()
        return (runner or _Sweep)(sweep, train, folder, journal, log).run()


def begun_held_out_rule(journal: Journal, train: TrainOptions, log: Any) -> TrainOptions:
    """``train`` with the held-out rule of the journal's header (``LEGACY_HELD_OUT_RULE`` where the header, written
    before the rule was recorded, names none), so that a resumed sweep's runs are judged on the text its first runs
    were; a new sweep's as given."""
    if journal.header is None:
        return train
    rule = header_options(journal.header)["held_out_rule"]
    if rule != train.held_out_rule:
        earlier = ", an earlier hf-geonorm's: files in path order, none longer than the evaluation"
        log(f"the sweep resumes with the held-out files it began with ({journal.path}, line 1): held-out rule {rule}"
            f"{earlier if rule == LEGACY_HELD_OUT_RULE else ''} (not {train.held_out_rule})")  # fmt: skip
    return replace(train, held_out_rule=rule)


def fixed_warmup(sweep: SweepOptions, train: TrainOptions, given: Collection[str] | None) -> SweepOptions:
    """The sweep with the warm-up walk off where ``--warmup-steps`` fixes the warm-up; refused where
    ``--warmup-shares`` was also given (``given``; None: every option, so a ladder other than the default)."""
    if train.warmup_steps is None or sweep.warmup_shares is None:
        return sweep
    named = "warmup_shares" in given if given is not None else sweep.warmup_shares != WARMUP_LADDER
    if named:
        raise OptionError("--warmup-steps fixes the warm-up of every run and --warmup-shares tunes it: give one (the "
                          "default tunes it: --warmup-shares alone)")  # fmt: skip
    return replace(sweep, warmup_shares=None)


def refuse_foreign_folder(folder: Path, journal: Journal) -> None:
    """A sweep writes ``sweep.md``, ``sweep.png``, ``runs/`` and ``logs/`` into its folder: refuse a non-empty one
    that holds no journal, whose files of those names would be replaced. A journal is one with a sweep's header: an
    empty ``runs.jsonl`` makes no folder a sweep's."""
    if journal.header is not None:
        return
    held = sorted(entry.name for entry in folder.iterdir() if entry.name != LOCK_NAME)
    if held:
        shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
        raise OptionError(
            f"--output {folder} is not empty ({shown}) and holds no sweep journal ({JOURNAL}): a sweep would write "
            "sweep.md, sweep.png, runs/ and logs/ over files of those names; give an empty or new folder"
        )


class _Sweep:
    """One call of ``run_sweep``: the protocol (``protocol.walk``) over the journal (locked), its runs trained one
    after the other in the order the protocol reaches them."""

    def __init__(self, sweep: SweepOptions, train: TrainOptions, folder: Path, journal: Journal, log: Any) -> None:
        self.sweep, self.train, self.folder, self.journal, self.log = sweep, train, folder, journal, log
        self.grids = style_grids(sweep, train, log, journal.header)
        self.entries = journal.entries
        self.trained = 0
        self.said: set[str] = set()
        self.estimate = TimeEstimate(train.max_steps)
        self.identity: dict[str, Any] = {}  # the sweep's, as measured before the latest run (check_identity)

    def run(self) -> list[dict[str, Any]]:
        first = walk(self.sweep, self.grids, self.entries)
        if not first.finished:
            self.log(plan_text(self.sweep, self.grids, self.entries))
        else:
            reference_for_finished(self.journal, self.train, begun_plan(self.sweep, self.grids), self.log)
        while (task := self.next_task()) is not None:
            self.train_run(task)
        final = walk(self.sweep, self.grids, self.entries)
        if not self.trained:
            self.log(f"all {len(final.reached)} runs of the sweep are in {self.journal.path}")
        write_report(self.folder, self.entries, log=self.log, header=self.journal.header)
        self.record(self.journal.path, self.folder / "sweep.md", self.folder / "sweep.png", self.folder / HELD_OUT)
        return self.entries

    def next_task(self) -> Task | None:
        """The first run the protocol needs now (in the order it reaches them), its decisions logged once each."""
        raise_if_signalled()  # a Ctrl-C or SIGTERM that Python swallowed (in the last run, in the report)
        found = walk(self.sweep, self.grids, self.entries)
        for note in found.notes:
            if note not in self.said:
                self.said.add(note)
                self.log(note)
        return found.due[0] if found.due else None

    def train_run(self, task: Task) -> None:
        run = task.run
        self.check_identity()
        number = self.trained + 1
        most = most_left(self.sweep, self.grids, self.entries)
        self.log(f"run {number}/{self.trained + most}: {run.label} ({task.role})")
        started = time.monotonic()
        try:
            entry = {**_train(run, self.train, self.folder, thread_note=self.thread_note), "role": task.role}
            if entry["val_loss"] is None:  # diverged: the settings its model was built with
                entry["settings"] = run.settings(self.identity["settings"])
        finally:  # what the run wrote, also when it stopped part way
            self.record(self.folder / "logs" / f"{run.name}.log", self.folder / "runs" / run.name)
        entry = checked_line(self.journal, run.label, entry, self.identity)
        append(self.journal.path, entry)
        self.entries.append(entry)
        self.trained = number
        result = "diverged" if entry["val_loss"] is None else (
            f"validation loss {entry['val_loss']:.4f}, test loss {entry['test_loss']:.4f}"
        )  # fmt: skip
        self.log(f"run {number}: {run.label}: {result} ({time.monotonic() - started:.0f} s)")
        write_report(self.folder, self.entries, log=lambda _: None, header=self.journal.header)
        self.record(self.journal.path, self.folder / "sweep.md", self.folder / "sweep.png")
        self.estimate.add(time.monotonic() - started, entry)  # all the sweep waited for: the report included
        left = walk(self.sweep, self.grids, self.entries)
        line = self.estimate.line([t.run.style for t in left.due], most_left(self.sweep, self.grids, self.entries))
        if line is not None:
            self.log(line)

    def thread_note(self, line: str) -> None:
        """A run's note that torch's threads do not fit the cores left free, on the console once: every run of the
        sweep trains at that pace."""
        if NOTE_START not in self.said:
            self.said.add(NOTE_START)
            self.log(f"{line} (said once for the sweep; each run's log says it for that run)")

    def record(self, *paths: Path) -> None:
        """List ``paths`` (those that exist) in the folder's marker, as written by this sweep."""
        record_paths(self.folder, "sweep", *(path for path in paths if os.path.lexists(path)))

    def check_identity(self) -> None:
        """Before each run: the sweep's identity measured again and compared with the journal's (``identity``)."""
        self.journal, self.identity = checked_identity(self.journal, self.train, begun_plan(self.sweep, self.grids),
                                                       self.trained == 0, self.log)  # fmt: skip


def _train(run: Run, train: TrainOptions, folder: Path, thread_note: Any = None) -> dict[str, Any]:
    """Train one run into ``DIR/runs/NAME`` (its log in ``DIR/logs/NAME.log``); its journal entry. A run whose
    loss stops being finite is a result (the rate is too high), recorded with no losses. A run stopped part way
    leaves no checkpoint: the sweep resumes by whole runs. ``thread_note``: also given the log's line that torch's
    threads do not fit the free cores (``cpu_threads``), where there is one."""
    output = folder / "runs" / run.name
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    warmup = run.warmup_steps(train.max_steps)
    options = replace(
        train, output=str(output), lr=run.lr, lr_source=SWEEP_RATE, seed=run.seed,
        settings=run.settings(train.settings), force=True, resume=False,
        warmup_steps=train.warmup_steps if warmup is None else warmup,
    )  # fmt: skip
    entry: dict[str, Any] = {"run": run.name, "style": run.style, "alpha": run.alpha, "lr": run.lr, "seed": run.seed,
                             "train_options": journal_key(train)}  # fmt: skip
    if run.warmup_share is not None:
        entry["warmup_share"] = run.warmup_share
    with new_text_file(logs / f"{run.name}.log", "the sweep writes each run's log there itself") as log_file:
        try:
            metrics = run_training(options, log=partial(_run_log, log_file, thread_note))
        except NonFiniteError as error:
            print(first_line(error, limit=600), file=log_file)
            return {**entry, "settings": options.settings, "steps": None, "tokens": None, "val_loss": None,
                    "test_loss": None, "train_seconds": 0.0, "data": None,
                    "diverged": first_line(error, limit=600)}  # fmt: skip
        except BaseException:  # Ctrl-C, SIGTERM, an error: this run trains again from its start
            _remove_checkpoints(output)
            raise
    _remove_checkpoints(output)  # the final model stays
    return {
        **entry, "settings": metrics["settings"], "steps": metrics["steps"], "tokens": metrics["tokens"],
        "val_loss": _finite(metrics["final_eval_loss"]), "test_loss": _finite(metrics["final_test_loss"]),
        "train_seconds": metrics["train_seconds"], "model": f"runs/{run.name}/final", "data": metrics["data_facts"],
        "warmup_steps": metrics["options"]["warmup_steps"], "evaluated_blocks": metrics["evaluated_blocks"],
        "training_seconds": metrics["training_seconds"], "evaluation_seconds": metrics["evaluation_seconds"],
    }  # fmt: skip


def _run_log(log_file: Any, thread_note: Any, line: str) -> None:
    """A line of a run's log, written to its file; the note on torch's threads also given to ``thread_note``."""
    print(line, file=log_file, flush=True)
    if thread_note is not None and line.startswith(NOTE_START):
        thread_note(line)


def _remove_checkpoints(output: Path) -> None:
    """Remove the checkpoints of the run that trained into ``output`` (the folder ``--force`` gave it, locked while
    the sweep runs), and drop them from its marker."""
    for _, checkpoint in checkpoints(output):
        shutil.rmtree(checkpoint, ignore_errors=True)
    if output.is_dir() and only_bookkeeping_left(output):
        output.rmdir()
    elif output.is_dir() and read_marker(output) is not None:
        record_paths(output, "train")  # the checkpoints leave the run's marker


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
