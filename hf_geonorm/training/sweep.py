"""``hf-geonorm sweep``: is GeoNorm better than Pre-Norm on this data, and at which learning rate?

A grid of norm styles (and geo_alpha values for geo) x learning rates x seeds, each run as ``hf-geonorm train``
runs it (``run_training``: the same data pipeline, Trainer, optimizer and model recipe), one after the other. Each
finished run is appended to ``DIR/runs.jsonl`` at once, so a sweep stopped part way is resumed by running the same
command again: only the missing runs train. The journal's first line holds the options every run shares; a sweep
with other options is refused rather than mixed in (the grid itself may grow: more rates, seeds or styles).

Every arm is chosen the same way: its best rate is the one with the lowest mean validation loss over its seeds,
and the arms are compared at their own best rates on the test split (documents held out apart from validation's),
as mean and spread over seeds (``report``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from ..errors import NonFiniteError, first_line
from ..files.output_lock import output_lock
from .checkpoints import checkpoints
from .options import SweepOptions, TrainOptions
from .sweep_report import rate_text, write_report
from .trainer import run_training

JOURNAL = "runs.jsonl"
JOURNAL_FORMAT = 1
# options that do not change what a run computes: left out of the journal's key
NOT_IN_KEY = ("output", "resume", "force", "lr", "seed", "logging_steps", "report_to", "data_cache", "data_workers")


@dataclass(frozen=True)
class Run:
    """One cell of the grid."""

    style: str
    alpha: float | None  # geo_alpha of a geo run when --alphas sweeps it (None: the settings' own)
    lr: float
    seed: int

    @property
    def name(self) -> str:
        alpha = "" if self.alpha is None else f"-alpha{self.alpha:g}"
        return f"{self.style}{alpha}-lr{rate_text(self.lr)}-seed{self.seed}"

    @property
    def label(self) -> str:
        alpha = "" if self.alpha is None else f" alpha {self.alpha:g}"
        return f"{self.style}{alpha} lr {rate_text(self.lr)} seed {self.seed}"

    def settings(self, base: dict[str, Any]) -> dict[str, Any]:
        settings = {**base, "norm_style": self.style}
        if self.alpha is not None:
            settings["geo_alpha"] = self.alpha
        return settings

    def key(self) -> tuple:
        return (self.style, self.alpha, self.lr, self.seed)


def plan(sweep: SweepOptions) -> list[Run]:
    """The runs of the grid, in the order they train: style by style, rate by rate, then seed."""
    runs = []
    for style in sweep.styles:
        alphas = sweep.alphas if style == "geo" and sweep.alphas is not None else (None,)
        for alpha in alphas:
            for lr in sweep.rates():
                runs.extend(Run(style, alpha, lr, seed) for seed in sweep.seeds)
    return runs


def journal_key(train: TrainOptions) -> dict[str, Any]:
    """What every run of a sweep shares: the train options that shape a run (not where it writes, nor the rate
    and seed the grid sets)."""
    return {name: value for name, value in asdict(train).items() if name not in NOT_IN_KEY}


def read_journal(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The header and the finished runs of a journal (none when it does not exist); a line cut short by a stop
    while it was written is dropped (its run trains again)."""
    if not path.is_file():
        return None, []
    lines = path.read_text(encoding="utf-8").splitlines()
    header, runs = None, []
    for number, line in enumerate(lines):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines) - 1:
                break
            raise ValueError(f"{path}, line {number + 1}: not JSON; the journal is damaged (move it away)") from None
        if number == 0:
            header = entry
        else:
            runs.append(entry)
    if header is None or header.get("format") != JOURNAL_FORMAT or "train_options" not in header:
        raise ValueError(f"{path} is not a journal of hf-geonorm sweep (no header line); give another --output")
    return header, runs


def option_defaults() -> dict[str, Any]:
    """The default of every train option, as a journal holds it: an option that a journal's header lacks was added
    to hf-geonorm after the journal was started, and its runs ran with what its default does."""
    defaults = {f.name: f.default for f in fields(TrainOptions) if f.default is not MISSING}
    defaults |= {f.name: f.default_factory() for f in fields(TrainOptions) if f.default_factory is not MISSING}
    return json.loads(json.dumps({name: value for name, value in defaults.items() if name not in NOT_IN_KEY}))


def _differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    names = sorted(set(before) | set(now))
    return [f"{name} {before.get(name)!r} there, {now.get(name)!r} now" for name in names
            if before.get(name) != now.get(name)]  # fmt: skip


def open_journal(folder: Path, train: TrainOptions) -> tuple[Path, list[dict[str, Any]]]:
    """The journal of ``folder`` and its finished runs, after checking that it was written with the same options;
    a new one is started with its header."""
    path = folder / JOURNAL
    header, runs = read_journal(path)
    key = json.loads(json.dumps(journal_key(train)))  # as it reads back (tuples as lists)
    if header is not None:
        changed = _differences({**option_defaults(), **header["train_options"]}, key)
        if changed:
            raise ValueError(
                f"{path} holds runs made with other options ({'; '.join(changed)}): a sweep compares runs that "
                "differ only in style, alpha, rate and seed; give the options it was started with, or another "
                "--output"
            )
        return path, runs
    folder.mkdir(parents=True, exist_ok=True)
    _append(path, {"format": JOURNAL_FORMAT, "train_options": key})
    return path, []


def _append(path: Path, entry: dict[str, Any]) -> None:
    """One line more in the journal, on disk before the next run starts."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _entry_key(entry: dict[str, Any]) -> tuple:
    return (entry["style"], entry["alpha"], entry["lr"], entry["seed"])


def run_sweep(sweep: SweepOptions, train: TrainOptions, log: Any = print) -> list[dict[str, Any]]:
    """Train every run of the grid that ``DIR/runs.jsonl`` does not hold yet, appending each as it ends; write
    ``sweep.md`` and ``sweep.png`` (``report``) after each; return the journal's runs."""
    sweep.validate()
    if train.lr is not None:
        raise ValueError("the sweep sets the learning rate of each run (--lrs or --lr-range); drop --lr")
    for setting, option, single in (("norm_style", "--styles", "--norm-style"), ("geo_alpha", "--alphas", "--alpha")):
        if setting in train.settings and (setting == "norm_style" or sweep.alphas is not None):
            raise ValueError(f"the sweep sets {setting} of each run: give {option}, not {single}")
    train = replace(train, lr=1e-3).validate()  # the rate each run sets: checked with a stand-in
    folder = Path(sweep.output).expanduser().absolute()
    with output_lock(folder, "sweep"):  # one sweep per folder: two would train the same runs into the same places
        return _run_grid(sweep, train, folder, log)


def _run_grid(sweep: SweepOptions, train: TrainOptions, folder: Path, log: Any) -> list[dict[str, Any]]:
    path, finished = open_journal(folder, replace(train, lr=None))
    done = {_entry_key(entry) for entry in finished}
    runs = plan(sweep)
    for number, run in enumerate(runs, 1):
        if run.key() in done:
            continue
        log(f"run {number}/{len(runs)}: {run.label}")
        entry = _train(run, train, folder)
        _append(path, entry)
        finished.append(entry)
        done.add(run.key())
        result = "diverged" if entry["val_loss"] is None else (
            f"validation loss {entry['val_loss']:.4f}, test loss {entry['test_loss']:.4f}"
        )  # fmt: skip
        log(f"run {number}/{len(runs)}: {run.label}: {result} ({entry['train_seconds']:.0f} s)")
        write_report(folder, finished, log=lambda _: None)
    if not runs or all(run.key() in done for run in runs):
        log(f"all {len(runs)} runs of the grid are in {path}")
    write_report(folder, finished, log=log)
    return finished


def _train(run: Run, train: TrainOptions, folder: Path) -> dict[str, Any]:
    """Train one run into ``DIR/runs/NAME`` (its log in ``DIR/logs/NAME.log``); its journal entry. A run whose
    loss stops being finite is a result (the rate is too high), recorded with no losses."""
    output = folder / "runs" / run.name
    logs = folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    options = replace(
        train, output=str(output), lr=run.lr, seed=run.seed, settings=run.settings(train.settings), force=True,
        resume=False,
    )  # fmt: skip
    entry: dict[str, Any] = {"run": run.name, "style": run.style, "alpha": run.alpha, "lr": run.lr, "seed": run.seed}
    with open(logs / f"{run.name}.log", "w", encoding="utf-8") as log_file:
        try:
            metrics = run_training(options, log=lambda line: print(line, file=log_file, flush=True))
        except NonFiniteError as error:
            print(first_line(error, limit=600), file=log_file)
            return {**entry, "settings": options.settings, "steps": None, "tokens": None, "val_loss": None,
                    "test_loss": None, "train_seconds": 0.0, "diverged": first_line(error, limit=600)}  # fmt: skip
    for _, checkpoint in checkpoints(output):  # the final model stays; the sweep resumes by whole runs
        shutil.rmtree(checkpoint, ignore_errors=True)
    return {
        **entry, "settings": metrics["settings"], "steps": metrics["steps"], "tokens": metrics["tokens"],
        "val_loss": _finite(metrics["final_eval_loss"]), "test_loss": _finite(metrics["final_test_loss"]),
        "train_seconds": metrics["train_seconds"], "model": str(output / "final"), "data": metrics["data_facts"],
    }  # fmt: skip


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
