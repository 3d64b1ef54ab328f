"""What a checkpoint's training state says, checked against its folder, against itself and against a run's record.

A resumed Trainer takes its step from ``trainer_state.json``, the peak and current learning rates from
``scheduler.pt`` (LambdaLR keeps the saved ``base_lrs``) and ``optimizer.pt`` (the saved groups' rate, betas and
weight decay drive the first step), and its random stream from ``rng_state.pth``; it checks none of them, and goes
on without ``rng_state.pth`` (or fp16's ``scaler.pt``) unsaid. An edited step skips steps; a scheduler of another
run trains at that run's rate. ``state_files`` lists what a whole checkpoint holds besides its model and optimizer
state; ``state_problem`` says what of it does not fit the checkpoint's step and its run's ``Schedule`` (the
checkpoint is then damaged: ``checkpoints.resume_checkpoint`` falls back past it); ``schedule_problem`` checks the
learning rates against a ``Schedule`` alone (this run's, for a checkpoint that holds no record).

``scheduler.pt`` and ``optimizer.pt`` are files the Trainer wrote and its resume loads; they are read here with
``torch.load(weights_only=True)``, which refuses anything but tensors and plain containers (``optimizer.pt``
memory-mapped: its moments are not read).
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import first_line
from ..data.prepare import world_size
from ..options import BETA1
from .optim import lr_factor

SCHEDULER = "scheduler.pt"
OPTIMIZER = "optimizer.pt"
WHY_NEEDED = {
    SCHEDULER: "the learning-rate schedule would restart its warm-up",
    "rng_state": "the resumed steps would draw other random numbers than the run would have",
    "scaler.pt": "fp16's loss scale would start anew, skipping steps until it is found again",
}


class StateProblem(Exception):
    """Why a state file of a checkpoint does not fit; the message names the file."""


@dataclass(frozen=True)
class Schedule:
    """What a run's record says of its optimizer: the peak rate (``--lr``), the warm-up, the steps the cosine is
    laid out over (``--max-steps``), its floor (``--min-lr-ratio``), AdamW's beta2 and the weight decay."""

    lr: float
    warmup: int
    total: int
    min_ratio: float
    beta2: float
    weight_decay: float

    @classmethod
    def of(cls, record: dict[str, Any]) -> Schedule:
        """The schedule of a run's ``record`` (``record.run_record``); ``ValueError`` naming what it lacks."""
        options = record.get("options")
        options = options if isinstance(options, dict) else {}
        values = {
            "lr": options.get("lr"), "warmup": options.get("warmup_steps"), "total": record.get("max_steps"),
            "min_ratio": options.get("min_lr_ratio"), "beta2": options.get("adam_beta2"),
            "weight_decay": options.get("weight_decay"),
        }  # fmt: skip
        lacking = [name for name, value in values.items() if not _is_number(value)]
        if lacking:
            raise ValueError(f"it lacks a number for {', '.join(lacking)}")
        return cls(**values)

    def rate(self, step: int) -> float:
        """The learning rate of 0-based step ``step`` (``optim.lr_factor``, as ``make_scheduler`` lays it out)."""
        return self.lr * lr_factor(step, self.warmup, self.total, self.min_ratio)

    def describe(self) -> str:
        return (f"--lr {self.lr:g}, --warmup-steps {self.warmup}, --min-lr-ratio {self.min_ratio:g}, "
                f"--max-steps {self.total}")  # fmt: skip


@dataclass(frozen=True)
class SavedSchedule:
    """``scheduler.pt`` and ``optimizer.pt`` as read: the scheduler's step (``last_epoch``), its peak and current
    rates by parameter group, and the optimizer's groups and the most steps it took for one parameter (None where
    the optimizer state is not ``optimizer.pt``: FSDP's files)."""

    step: int
    peaks: list[float]
    rates: list[float]
    groups: list[dict[str, Any]] | None
    optimizer_steps: int | None


def keeps_loss_scale() -> bool:
    """Whether this machine's Trainer keeps fp16's loss scale: accelerate keeps one on every device but the CPU, and
    a run trains on the CPU only where torch sees no accelerator (``trainer.checked_trainer``)."""
    return torch.accelerator.is_available()


def state_files(processes: int | None, precision: str | None) -> list[str]:
    """The files a whole checkpoint holds besides its model, ``trainer_state.json`` and its optimizer state, for a
    run of ``processes`` (None: unrecorded, as many as this run's) in ``precision`` (None: unrecorded): the
    schedule, each process's random state, and fp16's loss scale where the Trainer ``keeps_loss_scale``."""
    processes = world_size() if processes is None else processes
    rng = ["rng_state.pth"] if processes <= 1 else [f"rng_state_{index}.pth" for index in range(processes)]
    scaler = ["scaler.pt"] if precision == "fp16" and keeps_loss_scale() else []
    return [SCHEDULER, *rng, *scaler]


def missing_file_problem(file: Path) -> str:
    why = next(text for name, text in WHY_NEEDED.items() if file.name.startswith(name))
    return f"{file} is missing ({why})"


def state_problem(folder: Path, step: int, trainer_state: dict[str, Any], schedule: Schedule | None) -> str | None:
    """Why the training state of the checkpoint ``folder`` of ``step`` does not fit it or the ``schedule`` its record
    gives (None: it holds no record), or None when it fits."""
    try:
        _check_trainer_state(folder, step, trainer_state, schedule)
        saved = read_saved_schedule(folder)
        _check_steps(folder, step, saved)
        if schedule is not None:
            _check_schedule(folder, saved, schedule, "its record's")
        _check_agreement(folder, saved)
    except StateProblem as problem:
        return str(problem)
    return None


def schedule_problem(folder: Path, schedule: Schedule) -> str | None:
    """Why the learning rates and optimizer settings saved in ``folder`` are not those of this run's ``schedule``,
    or None."""
    try:
        _check_schedule(folder, read_saved_schedule(folder), schedule, "this run's")
    except StateProblem as problem:
        return str(problem)
    return None


def read_saved_schedule(folder: Path) -> SavedSchedule:
    """``scheduler.pt`` and ``optimizer.pt`` of ``folder``; ``StateProblem`` when one cannot be read or is not
    what the Trainer writes."""
    file = folder / SCHEDULER
    held = _load_tensors_only(file)
    peaks, rates, step = (held.get(key) for key in ("base_lrs", "_last_lr", "last_epoch"))
    if not (_are_numbers(peaks) and _are_numbers(rates) and len(peaks) == len(rates) and _is_int(step)):
        raise StateProblem(f"{file} is not the state of a learning-rate schedule (base_lrs, _last_lr, last_epoch)")
    file = folder / OPTIMIZER
    if not file.exists():  # FSDP's optimizer.bin or optimizer_0/: laid out otherwise, loaded by accelerate
        return SavedSchedule(step, peaks, rates, None, None)
    held = _load_tensors_only(file)
    groups, state = held.get("param_groups"), held.get("state")
    if not (isinstance(groups, list) and isinstance(state, dict) and all(isinstance(g, dict) for g in groups)
            and all(_is_number(g.get("lr")) and _is_number(g.get("initial_lr")) for g in groups)):  # fmt: skip
        raise StateProblem(f"{file} is not the state of an optimizer with a schedule (param_groups, state)")
    steps = [_number(entry.get("step")) for entry in state.values() if isinstance(entry, dict)]
    steps = [found for found in steps if _is_number(found)]  # AdamW's per parameter; another optimizer's: none
    return SavedSchedule(step, peaks, rates, groups, round(max(steps)) if steps else None)


def _check_trainer_state(folder: Path, step: int, trainer_state: dict[str, Any], schedule: Schedule | None) -> None:
    file = folder / "trainer_state.json"
    said = trainer_state["global_step"]
    if said != step:
        raise StateProblem(f"{file} says global_step {said}, but the folder is {folder.name}")
    if schedule is not None and trainer_state.get("max_steps") != schedule.total:
        raise StateProblem(f"{file} says max_steps {trainer_state.get('max_steps')}, its record's --max-steps "
                           f"{schedule.total}")  # fmt: skip
    history = trainer_state.get("log_history")
    logged = [entry.get("step") for entry in history if isinstance(entry, dict)] if isinstance(history, list) else []
    beyond = [entry for entry in logged if _is_number(entry) and entry > step]
    if beyond:
        raise StateProblem(f"{file} logs step {max(beyond)}, beyond its global_step {step}")


def _check_steps(folder: Path, step: int, saved: SavedSchedule) -> None:
    """The schedule at the checkpoint's step (before it with fp16's loss scale, which skips the steps it overflows
    with), and the optimizer at the schedule's with as many parameter groups."""
    scheduler, optimizer = folder / SCHEDULER, folder / OPTIMIZER
    if saved.step != step and not (saved.step < step and (folder / "scaler.pt").exists()):
        raise StateProblem(f"{scheduler} is at step {saved.step} (last_epoch), not {step}")
    if saved.optimizer_steps is not None and saved.optimizer_steps != saved.step:
        raise StateProblem(f"{optimizer} took {saved.optimizer_steps} steps, {scheduler} {saved.step}")
    if saved.groups is not None and len(saved.groups) != len(saved.peaks):
        raise StateProblem(f"{optimizer} holds {len(saved.groups)} parameter groups, {scheduler} "
                           f"{len(saved.peaks)}")  # fmt: skip


def _check_schedule(folder: Path, saved: SavedSchedule, schedule: Schedule, whose: str) -> None:
    """The saved peak and current rates, betas and weight decay against ``schedule`` (``whose``: whose it is),
    file by file, so that the one that does not fit is named."""
    scheduler, optimizer = folder / SCHEDULER, folder / OPTIMIZER
    expected = schedule.rate(saved.step)
    for peak in saved.peaks:
        if not _close(peak, schedule.lr):
            raise StateProblem(f"{scheduler} holds the peak learning rate {peak:g}, {whose} --lr {schedule.lr:g}")
    for rate in saved.rates:
        if not _close(rate, expected):
            raise StateProblem(f"{scheduler} holds the learning rate {rate:g} after step {saved.step}, where {whose} "
                               f"schedule ({schedule.describe()}) gives {expected:g}")  # fmt: skip
    for group in saved.groups or ():
        if not (_close(group["lr"], expected) and _close(group["initial_lr"], schedule.lr)):
            raise StateProblem(f"{optimizer} holds the learning rate {group['lr']:g} (peak {group['initial_lr']:g}) "
                               f"after step {saved.step}, where {whose} schedule ({schedule.describe()}) gives "
                               f"{expected:g}")  # fmt: skip
        betas = group.get("betas")
        if betas is not None and not (isinstance(betas, (list, tuple)) and len(betas) == 2
                                      and _close(betas[0], BETA1) and _close(betas[1], schedule.beta2)):  # fmt: skip
            raise StateProblem(f"{optimizer} holds AdamW's betas {betas}, {whose} ({BETA1}, --adam-beta2 "
                               f"{schedule.beta2:g})")  # fmt: skip
        decay = group.get("weight_decay", 0.0)
        if not (_close(decay, schedule.weight_decay) or decay == 0.0):  # the norms, biases and embeddings: none
            raise StateProblem(f"{optimizer} holds the weight decay {decay}, {whose} --weight-decay "
                               f"{schedule.weight_decay:g}")  # fmt: skip


def _check_agreement(folder: Path, saved: SavedSchedule) -> None:
    """The optimizer's rates those of the schedule (what a checkpoint without a record is checked by); as many
    groups (``_check_steps``)."""
    if saved.groups is None:
        return
    for group, peak, rate in zip(saved.groups, saved.peaks, saved.rates, strict=True):
        if not (_close(group["lr"], rate) and _close(group["initial_lr"], peak)):
            raise StateProblem(f"{folder / OPTIMIZER} holds the learning rate {group['lr']:g} (peak "
                               f"{group['initial_lr']:g}), {folder / SCHEDULER} {rate:g} (peak {peak:g})")  # fmt: skip


def _load_tensors_only(file: Path) -> dict[str, Any]:
    """What the torch file ``file`` holds, read as torch's safe loading allows (tensors and plain containers): the
    dictionary the Trainer saves its states as (empty for anything else, which the checks then find lacking)."""
    try:
        held = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:  # torch's message advises loading it anyway: not passed on
        raise StateProblem(f"{file} holds more than tensors, which hf-geonorm never loads (unpickling it could run "
                           "code)") from None  # fmt: skip
    except (OSError, RuntimeError, EOFError, ValueError) as error:
        raise StateProblem(f"{file} cannot be read ({first_line(error)})") from None
    return held if isinstance(held, dict) else {}


def _number(value: Any) -> Any:
    """A one-element tensor as its number; anything else as it is."""
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _are_numbers(values: Any) -> bool:
    return isinstance(values, list) and bool(values) and all(_is_number(value) for value in values)


def _close(value: Any, expected: float) -> bool:
    return _is_number(value) and math.isclose(value, expected, rel_tol=1e-6, abs_tol=1e-12)
