"""Trainer checkpoints that are whole or absent, and the checkpoint a resumed run starts from.

transformers' Trainer writes ``checkpoint-N`` in place: a kill during the save leaves a folder with a config and
no weights, which a resumed run then takes as the latest. ``AtomicCheckpointTrainer`` has every process write
into one hidden folder ``.checkpoint-N.partial-PID-staging`` next to it and moves the complete checkpoint into
place when all of them are done. ``resume_checkpoint`` checks the checkpoints newest first and falls back past
damaged ones (a file missing or unreadable, or a training state that does not fit the checkpoint's step or the record
of its run: ``checkpoint_state``), saying why; the one chosen is loaded strictly (``load_checkpoint_weights``), where
the Trainer would keep the values of ``--model`` for tensors it does not find. The staging folder and a replaced
checkpoint carry the proof of a temporary folder (``hf_geonorm._plumbing.ownership``), which ``atomic.remove_leftovers``
needs to remove them after a kill; only the checkpoints the output's marker proves are the run's are rotated away
or removed at the end, never a folder that is merely named ``checkpoint-N``.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..._plumbing.atomic import remove_tree
from ..._plumbing.full_device import is_full_device
from ..._plumbing.ownership import MARKER_NAME, changed_file, mark_temporary, proven_entries, temporary_folder
from ..._plumbing.text_files import json_or_problem
from ...checkpoints.loading import NO_REMOTE_CODE, read_config_json
from ...checkpoints.loading_info import tensor_names
from ...checkpoints.safetensors_files import safetensors_header, weight_files
from ...errors import SettingsError, first_line
from ...modeling.settings import GeoNormSettings
from .checkpoint_state import Schedule, missing_file_problem, state_files, state_problem
from .record import RECORD_FORMAT, RECORD_NAME, write_record

CHECKPOINT = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")


class NoSpaceError(OSError):
    """The device filled up while a file of the run was being written; the message names the file as it was to
    appear (not the hidden temporary name it was written under)."""

    def __init__(self, target: Path) -> None:
        super().__init__(errno.ENOSPC, f"no space left on device while writing {target}", str(target))

    def __str__(self) -> str:
        return self.strerror


TORCH_WRITE_FAILED = ("unexpected pos", "PytorchStreamWriter failed writing")  # torch.save on a full device


@contextlib.contextmanager
def disk_full_named(written: Path, target: Path) -> Iterator[None]:
    """Turn a full device while writing into ``written`` (a hidden temporary path) into ``NoSpaceError`` naming
    the same file under ``target``: what the user sees, never the temporary name or torch's internals."""
    try:
        yield
    except OSError as error:
        if error.errno != errno.ENOSPC or isinstance(error, NoSpaceError):
            raise
        file = Path(error.filename) if error.filename else None
        inside = file is not None and file.is_relative_to(written)
        raise NoSpaceError(target / file.relative_to(written) if inside else target) from None
    except RuntimeError as error:
        if not any(text in str(error) for text in TORCH_WRITE_FAILED) and not is_full_device(error):
            raise
        raise NoSpaceError(target) from None
    except Exception as error:  # safetensors' writer: a SafetensorError with the system's words
        if not is_full_device(error):
            raise
        raise NoSpaceError(target) from None


class AtomicCheckpointTrainer(Trainer):
    """A Trainer whose checkpoints appear whole or not at all.

    Every process saves into the same hidden staging folder (the Trainer's own ``_save_checkpoint``, pointed
    there through ``_get_output_dir``); once all have finished, the main process moves ``checkpoint-N`` into
    the output folder and rotates its own checkpoints by step (``save_total_limit``). ``published`` lists the
    checkpoints this run moved into place (a failed run that created the output folder keeps only those); each
    holds ``run_record`` (``record.RECORD_NAME``), which ``--resume`` checks, and the run's ``tokenizer``
    (saved here rather than given to the Trainer as ``processing_class``, which would write the tokenizer's padding
    id into the model's config: a padding row that never trains). A resumed run takes this run's evaluation, save
    and logging intervals (the Trainer would keep the checkpoint's and ignore the options). A whole model is resumed
    with ``load_checkpoint_weights``; a full device while saving is a ``NoSpaceError``; an optimizer, scheduler or
    random state file that holds more than tensors is refused (``tensors_only``).
    """

    def __init__(
        self,
        *args: Any,
        published: list[Path] | None = None,
        run_record: dict[str, Any] | None = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._staging: Path | None = None
        self._owner: int | None = None
        self.published = published if published is not None else []
        self.run_record = run_record
        self.run_tokenizer = tokenizer

    def _load_callback_state(self) -> None:  # right after a resumed checkpoint's trainer_state.json is read
        super()._load_callback_state()
        self.state.compute_steps(self.args, self.args.max_steps)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        with tensors_only(checkpoint):
            super()._load_rng_state(checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        with tensors_only(checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)

    def _load_scaler(self, checkpoint: str | None) -> None:
        with tensors_only(checkpoint):
            super()._load_scaler(checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        folder = Path(resume_from_checkpoint)
        if (folder / "config.json").is_file() and not self.is_fsdp_enabled:  # a whole model, not LoRA adapters
            load_checkpoint_weights(model if model is not None else self.model, folder)
        else:
            super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _get_output_dir(self, trial: Any) -> str:
        return str(self._staging) if self._staging is not None else super()._get_output_dir(trial)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        output = Path(self.args.output_dir)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self._staging = output / f".{name}.partial-{self._owner_pid()}-staging"
        try:
            if self.args.should_save:  # the proof that lets the next run remove it after a kill
                self._staging.mkdir(exist_ok=True)
                mark_temporary(self._staging, name, pid=self._owner_pid())
            with disk_full_named(self._staging / name, output / name):
                super()._save_checkpoint(model, trial)
                if self.args.should_save and self.run_record is not None:
                    write_record(self._staging / name, self.run_record)
                if self.args.should_save and self.run_tokenizer is not None:
                    self.run_tokenizer.save_pretrained(self._staging / name)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                publish(self._staging / name, output / name)
                self.published.append(output / name)
                rotate_own_checkpoints(output, self.args.save_total_limit)
        finally:
            staging, self._staging = self._staging, None
            if self.args.should_save:
                remove_tree(staging)

    def _owner_pid(self) -> int:
        """The main process's id, the same in every process (it names the staging folder)."""
        if self._owner is None:
            pid = [os.getpid()]
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.broadcast_object_list(pid, src=0)
            self._owner = pid[0]
        return self._owner


@contextlib.contextmanager
def tensors_only(checkpoint: str | None) -> Iterator[None]:
    """A file of ``checkpoint`` that torch's safe loading refuses (it pickles more than tensors, which could run
    code) as a ``ValueError`` naming the checkpoint, without torch's advice on how to load it anyway."""
    try:
        yield
    except pickle.UnpicklingError:
        name = Path(checkpoint).name if checkpoint else "the checkpoint"
        raise ValueError(
            f"--resume: {checkpoint} holds an optimizer, scheduler or random state file (optimizer.pt, scheduler.pt, "
            "rng_state.pth) with more than tensors in it, which hf-geonorm never loads (unpickling it could run "
            f"code); remove {name} to resume from an earlier checkpoint, or start anew with --force"
        ) from None


def publish(built: Path, target: Path) -> None:
    """Move the complete folder ``built`` to ``target``, replacing a ``target`` that is there (a checkpoint of
    the same step from an earlier run, or a damaged one): it is first moved into a temporary folder of this
    process, which a kill leaves for the next run to remove."""
    if not os.path.lexists(target):
        os.rename(built, target)
        return
    old = temporary_folder(target.parent, target.name, kind="old")
    os.rename(target, old / target.name)
    os.rename(built, target)
    remove_tree(old)


def rotate_own_checkpoints(output: Path, limit: int | None) -> None:
    """Remove the oldest of the run's checkpoints in ``output`` beyond the newest ``limit``: those the output's
    marker lists and proves (``ownership.proven_entries``), never a folder that is only named like one; each is
    hashed first (``remove_unchanged``)."""
    if not limit:
        return
    own = set(proven_entries(output))
    for _, path in [(step, path) for step, path in checkpoints(output) if path.name in own][limit:]:
        remove_unchanged(output, path)


def remove_unchanged(output: Path, path: Path) -> bool:
    """Remove the run's checkpoint ``path`` in ``output`` when every file in it still has the SHA-256 the marker
    recorded as it was written (``ownership.changed_file``); otherwise leave it, and say which file changed."""
    changed = changed_file(output, path.name)
    if changed is not None:
        warnings.warn(f"{output / changed} changed since hf-geonorm wrote it (it differs from what {MARKER_NAME} "
                      f"recorded): {path.name} is left in place; remove it yourself if it is not yours",
                      stacklevel=2)  # fmt: skip
        return False
    remove_tree(path)
    return True


def checkpoints(output: Path) -> list[tuple[int, Path]]:
    """The ``checkpoint-N`` folders of ``output``, newest (largest N) first."""
    found = []
    if output.is_dir():
        for entry in output.iterdir():
            match = CHECKPOINT.fullmatch(entry.name)
            if match and entry.is_dir():
                found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def checkpoint_problem(folder: Path, step: int) -> str | None:
    """Why the Trainer checkpoint ``folder`` of ``step`` cannot be resumed from (naming the file), or None when it is
    whole: every file it must hold is there and readable, and its training state fits its step and the record of its
    run (``checkpoint_state``)."""
    state_file = folder / "trainer_state.json"
    state, problem = json_or_problem(state_file)
    if problem:
        return problem
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        return f"{state_file} has no global_step"
    record, problem = _run_record(folder)
    if problem:
        return problem
    if (folder / "adapter_config.json").is_file():  # a LoRA run saves the adapters only
        files = [folder / "adapter_model.safetensors"]
    else:
        try:
            read_config_json(folder)
            files = weight_files(folder)
        except (ValueError, KeyError, TypeError) as error:
            return first_line(error)
        if not files:
            return f"{folder / 'model.safetensors'} is missing"
    for file in files:
        try:
            safetensors_header(file)
        except FileNotFoundError:
            return f"{file} is missing"
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"{file}: {first_line(error)}"
    if not any((folder / name).exists() for name in ("optimizer.pt", "optimizer.bin", "optimizer_0")):
        return f"{folder} has no optimizer state (optimizer.pt)"
    processes, precision = (record["processes"], record["options"].get("precision")) if record else (None, None)
    needed = state_files(processes, precision)
    for file in [folder / name for name in needed]:  # the Trainer would go on without each, unsaid
        if not file.exists():
            return missing_file_problem(file)
    for file in [folder / "optimizer.pt", *(folder / name for name in needed)]:
        if file.exists() and not zipfile.is_zipfile(file):
            return f"{file} is truncated or damaged"
    return state_problem(folder, step, state, Schedule.of(record) if record else None)


def _run_record(folder: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The record of the run that wrote the checkpoint ``folder`` (None where an earlier hf-geonorm wrote it
    without one), or why it cannot be read: the values checked against the checkpoint's state must be there."""
    path = folder / RECORD_NAME
    if not path.exists():
        return None, None
    record, problem = json_or_problem(path)
    if problem:
        return None, problem
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        return None, f"{path} is not a record this hf-geonorm reads"
    if not isinstance(record.get("processes"), int) or not isinstance(record.get("options"), dict):
        return None, f"{path} lacks the processes or the options of its run"
    try:
        Schedule.of(record)
    except ValueError as error:
        return None, f"{path}: {error}"
    return record, None


def resume_checkpoint(output: Path, warn: bool = True) -> tuple[Path, int]:
    """The newest whole checkpoint in ``output`` and its step. Damaged newer ones are skipped with a warning
    that names them; ``ValueError`` when there is none to resume from."""
    found = checkpoints(output)
    if not found:
        raise ValueError(f"--resume: no checkpoint-* folder in {output}; start without --resume")
    damaged = []
    for step, folder in found:
        problem = checkpoint_problem(folder, step)
        if problem is None:
            if damaged and warn:
                warnings.warn(f"{'; '.join(damaged)}: resuming from {folder.name} instead", stacklevel=2)
            return folder, step  # trainer_state.json's global_step: the same (checkpoint_state)
        damaged.append(f"{folder.name} is damaged ({problem})")
    raise ValueError(
        f"--resume: no whole checkpoint in {output}: {'; '.join(damaged)}; remove the damaged folders and start "
        "without --resume"
    )


def check_resumable(
    model: torch.nn.Module, checkpoint: Path, ignore: tuple[str, ...] = (), given: Collection[str] = ()
) -> None:
    """``ValueError`` naming the difference when the model built for a resumed run has other GeoNorm settings
    than ``checkpoint`` (the optimizer state would not match the parameters; ``SettingsError`` when it is one of
    the ``given`` settings). Its tensors are checked as they are loaded (``load_checkpoint_weights``)."""
    config_path = checkpoint / "config.json"
    if not config_path.is_file():  # adapters only (LoRA): the base model is rebuilt as before
        return
    saved = read_config_json(checkpoint)
    for name in sorted(set(GeoNormSettings.names()) - set(ignore)):
        ours = getattr(model.config, name, None)
        if name in saved and saved[name] != ours:
            error = SettingsError if name in given else ValueError
            raise error(
                f"{config_path} was trained with {name} {saved[name]!r}, this run asks for {ours!r}; resume with "
                f"the checkpoint's settings, or start a new run from its weights (--model {checkpoint})"
            )


def load_checkpoint_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Load the weights of ``checkpoint`` into ``model`` as strictly as ``--model`` is loaded: through
    transformers' own loading, which undoes the renamings it applies when saving (MoE experts are stored one by
    one), with any missing, unexpected or wrong-shape tensor a ``ValueError`` naming them. The Trainer's own
    resume loads the raw file leniently: such tensors (all the experts, after a renaming) would keep their values
    from ``--model``."""
    from transformers import AutoModelForCausalLM

    try:
        loaded, info = AutoModelForCausalLM.from_pretrained(
            checkpoint, config=copy.deepcopy(model.config), dtype=next(model.parameters()).dtype,
            use_safetensors=True, output_loading_info=True, ignore_mismatched_sizes=True, **NO_REMOTE_CODE,
        )  # fmt: skip
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        raise ValueError(f"--resume: cannot load {checkpoint}: {first_line(error)}") from None
    mismatched = [f"{key} {list(found)} for {list(expected)}" for key, found, expected in info["mismatched_keys"]]
    _refuse_mismatch(checkpoint, info["missing_keys"], info["unexpected_keys"], mismatched)
    model.load_state_dict(loaded.state_dict())


def check_resumable_adapters(model: torch.nn.Module, checkpoint: Path) -> None:
    """``ValueError`` naming them when the LoRA adapters of ``checkpoint`` miss tensors of the PEFT ``model``,
    hold others, or differ in shape (PEFT's ``load_adapter``, which the Trainer uses, accepts all of that)."""
    from peft import get_peft_model_state_dict

    file = checkpoint / "adapter_model.safetensors"
    if not file.is_file():
        return
    state = get_peft_model_state_dict(model)
    found = {key: entry["shape"] for key, entry in safetensors_header(file).items() if key != "__metadata__"}
    mismatched = [f"{key} {shape} for {list(state[key].shape)}" for key, shape in found.items()
                  if key in state and list(state[key].shape) != shape]  # fmt: skip
    _refuse_mismatch(checkpoint, set(state) - set(found), set(found) - set(state), mismatched)


def _refuse_mismatch(
    checkpoint: Path, missing: Collection[str], unexpected: Collection[str], other_shape: list[str]
) -> None:
    """``ValueError`` naming the tensors of ``checkpoint`` that do not fit the model of a resumed run, if any."""
    problems = [
        f"{len(keys)} tensor(s) {what} ({tensor_names(keys)})"
        for keys, what in ((missing, "missing"), (unexpected, "unexpected"), (other_shape, "of another shape"))
        if keys
    ]
    if problems:
        raise ValueError(
            f"{checkpoint}: {' and '.join(problems)} for the model of this run (a missing one would keep its value "
            "from --model); resume with the same --model (or --arch and --preset), or remove "
            f"{checkpoint.name} to resume from an earlier checkpoint"
        )


def kept_checkpoints(output: Path, remove: bool) -> str:
    """What the run leaves beside final/, in one line: its checkpoints, removed (``remove``: a finished run's, once
    final/ and metrics.json are written; final/ is the model, and their optimizer state serves only --resume) or
    kept, with their size. Only the checkpoints the output's marker proves are the run's count
    (``ownership.proven_entries``): a ``checkpoint-N`` folder of the user's is not hf-geonorm's to remove."""
    own = set(proven_entries(output))
    found = [path for _, path in checkpoints(output) if path.name in own]
    if not found:
        return "no checkpoints kept"
    sizes = {path: sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) for path in found}
    if remove:
        found = [path for path in found if remove_unchanged(output, path)]
        if not found:
            return "no checkpoints removed (they changed since the run wrote them)"
    size = sum(sizes[path] for path in found)
    names = ", ".join(path.name for path in found)
    if remove:
        return (f"removed {names} ({size / 1e9:.2f} GB, the optimizer state for --resume included; --keep-checkpoints "
                f"keeps them): {output} keeps final/ and the metrics")  # fmt: skip
    return f"{names} kept beside final/ (--keep-checkpoints): {size / 1e9:.2f} GB, the optimizer state included"
