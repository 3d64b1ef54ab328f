"""What a run leaves in its output folder, also when it is stopped:

- one run at a time: the run holds ``.hf-geonorm.lock`` in it (``hf_geonorm._plumbing.output_lock``) from before it
  looks at the folder until it ends; a second run into the folder fails at once, naming the first;
- checkpoints and ``final/`` appear whole or not at all (written in hidden temporary folders, then moved into
  place); ``metrics.json`` and ``loss_curve.png`` are replaced in one step;
- an error, Ctrl-C or SIGTERM removes the temporary folders; in an output folder the run created, what the run
  wrote is removed too (and the folder, when that leaves it empty) unless a checkpoint of the run is there to
  resume from; files others put there stay;
- a non-finite training or validation loss stops the run with an error naming the step, before that step's
  checkpoint; nothing is published as final, and ``metrics.json`` is always strict JSON;
- SIGKILL leaves a hidden temporary folder carrying the proof that the run made it, which the next run in the same
  output folder removes (``atomic.remove_leftovers``: never a folder only named like one);
- the folder's marker (``hf_geonorm._plumbing.ownership``) lists what the run wrote there with each file's proof, as it
  publishes it; the checkpoints rotated away leave it, and TensorBoard's event files (``--report-to tensorboard``)
  are recorded when the run ends (``RunOutputs.finish``);
- ``--force`` starts anew only in an empty folder or an hf-geonorm output holding nothing else: what that output
  wrote is removed when training starts (a folder holding anything else is refused before anything moves);
- a resumed run starts from the newest whole checkpoint, skipping damaged ones with a warning; a checkpoint whose
  tensors do not match the model (missing, unexpected, other shapes) is an error; a finished run is left as it is;
- what the run shows while it runs (``RunProgress``) and its last line: its checkpoints removed (a finished run
  keeps final/ only) or, with ``--keep-checkpoints``, kept beside ``final/``, with their size.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import TrainerState, TrainingArguments
from transformers.trainer_callback import ProgressCallback
from transformers.utils import logging as hf_logging

from ..._plumbing.atomic import atomic_directory, check_output_name, remove_leftovers, remove_tree
from ..._plumbing.output_lock import output_lock
from ..._plumbing.ownership import (
    check_replaceable,
    is_bookkeeping,
    only_bookkeeping_left,
    record_paths,
    temporary_folder,
)
from ..._plumbing.signals import terminate_raises
from ...errors import first_line
from ...modeling.settings import GeoNormSettings
from ...sharing.hub import save_shareable
from ...sharing.model_card import CardInfo, inherited_card_info
from ...sharing.model_facts import bridge_words
from ..options import TrainOptions
from ..rate_rule import RATE_GIVEN, DefaultRate
from .checkpoints import CHECKPOINT, disk_full_named, kept_checkpoints, resume_checkpoint


def strict_json(value: Any) -> str:
    """``value`` as strict JSON (what every JSON parser reads): NaN and infinities, which ``json.dumps`` would
    write as the bare words NaN and Infinity, become null."""

    def finite(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return None
        if isinstance(item, dict):
            return {key: finite(v) for key, v in item.items()}
        if isinstance(item, (list, tuple)):
            return [finite(v) for v in item]
        return item

    return json.dumps(finite(value), indent=2, default=str, allow_nan=False)


def replace_file(path: Path, write: Any) -> None:
    """``write(tmp)`` to a file in a temporary folder next to ``path`` (``ownership.temporary_folder``: a kill
    leaves it for the next run to remove), then move it over ``path`` in one step."""
    folder = temporary_folder(path.parent, path.name)
    tmp = folder / path.name
    try:
        with disk_full_named(tmp, path):
            write(tmp)
        os.replace(tmp, path)
    finally:
        remove_tree(folder)


def plot_losses(history: list[dict[str, Any]], path: Path, title: str | None = None) -> None:
    """Draw the training and validation losses of a Trainer ``log_history`` to the PNG file ``path``."""
    from matplotlib.figure import Figure

    train = [(h["step"], h["loss"]) for h in history if "loss" in h]
    evals = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    if train:
        ax.plot([s for s, _ in train], [v for _, v in train], label="train loss")
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], marker="o", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    metadata = {"Title": title} if title else {}  # in the file too (a PNG text chunk), for what reads it
    replace_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, metadata=metadata))


def check_output_path(
    output: Path, force: bool = False, given: str = "", reads: dict[str, str | None] | None = None
) -> None:
    """``ValueError`` when ``--output`` cannot be a folder: a dangling symbolic link or a file; with ``force``
    (``--force``, which removes the earlier run's files) also one that is or holds the current folder, or holds what
    the run reads (``reads``: the ``--model``, ``--tokenizer`` and ``--data`` it was ``given`` with)."""
    if output.is_symlink() and not output.exists():
        raise ValueError(
            f"--output {output} is a dangling symbolic link (to {os.readlink(output)}, which does not exist); create "
            "the folder it points to, remove the link, or give another --output"
        )
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is a file; give a folder")
    if not force:
        return
    check_output_name(given, force=False, option="--output")
    real = output.resolve()
    for name, value in (reads or {}).items():
        if value and os.path.lexists(Path(value).expanduser()):
            read = Path(value).expanduser().resolve()
            if read == real or real in read.parents:
                raise ValueError(
                    f"--output {given} holds the --{name} {value} the run reads, and --force removes the "
                    "earlier run's files there: give another --output"
                )


def prepare_output(output: Path, resume: bool, force: bool, max_steps: int, main: bool) -> tuple[Path | None, int]:
    """Clean up after killed runs, check the output folder, and find the checkpoint to resume from (and its step)
    with ``resume`` (``--resume``), up to ``max_steps``; a folder that holds another run needs ``resume`` or
    ``force``. The main process holds the folder's lock (``output_lock``) by then."""
    check_output_path(output)
    if main and output.is_dir():
        for line in remove_leftovers(output):
            warnings.warn(line, stacklevel=3)
    if resume:
        finished = finished_metrics(output, None)
        if finished is not None and not any(CHECKPOINT.fullmatch(entry.name) for entry in output.iterdir()):
            if finished["steps"] != max_steps:  # its checkpoints were removed at its end: nothing to resume
                raise ValueError(
                    f"--resume: the run in {output} finished at step {finished['steps']} and removed its checkpoints "
                    f"(--keep-checkpoints keeps them); train on from its model in a new run: --model {output / 'final'}"
                )
            return None, max_steps
        checkpoint, step = resume_checkpoint(output, warn=main)
        if step > max_steps:
            raise ValueError(
                f"--resume: {checkpoint.name} is at step {step} already, beyond --max-steps {max_steps}: "
                f"nothing to train; give a --max-steps above {step}"
            )
        return checkpoint, step
    content = [e for e in output.iterdir() if not is_bookkeeping(e)] if output.is_dir() else []
    if content and not force:
        raise ValueError(f"--output {output} is not empty; pass --resume to continue it or --force to start anew")
    if content:
        check_replaceable(output, output, "--output")
    return None, 0


def finished_metrics(output: Path, step: int | None) -> dict[str, Any] | None:
    """The metrics of the run in ``output`` when it finished at ``step`` (None: at any step; its final model and
    metrics.json are written), else None: a run killed while writing them is completed by ``--resume`` instead."""
    try:
        metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    whole = isinstance(metrics, dict) and isinstance(metrics.get("steps"), int)
    return metrics if whole and step in (None, metrics["steps"]) and (output / "final/config.json").is_file() else None


def clear_earlier_run(output: Path, log: Any) -> None:
    """``--force``: remove what the earlier output in ``output`` wrote before this run trains, so that a run killed
    later never leaves it beside its own as if it were its results; checked again first (``check_replaceable``:
    an hf-geonorm output holding nothing else, every file's hash included), since the data was prepared meanwhile.
    Each entry is first moved into a temporary folder of this run in one step (a SIGKILL leaves that folder, with the
    proof that lets the next run remove it), then removed; the folder's marker then starts anew."""
    if not output.is_dir():
        return
    check_replaceable(output, output, "--output", contents=True)
    removed = sorted(path.name for path in output.iterdir() if not is_bookkeeping(path))
    if removed:
        earlier = temporary_folder(output, "earlier-output")
        for name in removed:
            os.rename(output / name, earlier / name)
        remove_tree(earlier)
    record_paths(output, "train", fresh=True)
    if removed:
        log(f"--force: removed the earlier output's {', '.join(removed)} in {output}")


@contextlib.contextmanager
def run_output(output: Path, main: bool, log: Any) -> Iterator[RunOutputs]:
    """The output folder of a run, held for it: locked by the ``main`` process (``output_lock``; the other processes
    are the same run) and, when the run fails, left as ``output_removed_on_failure`` says. Yields the list that the
    run adds what it publishes to."""
    with output_removed_on_failure(output, main, log) as published:
        with output_lock(output, "train") if main else contextlib.nullcontext():
            yield published


class RunOutputs(list):
    """What a run publishes in its output folder, in order; each path is recorded in the folder's marker as it is
    added (by the ``main`` process, which writes there), and the entries gone since (rotated checkpoints) leave it.
    TensorBoard keeps appending to its event files while the run goes: ``finish`` closes its writers and records
    the files of the folders they wrote in (``watch_tensorboard``) when the run ends, however it ends."""

    def __init__(self, output: Path, main: bool) -> None:
        super().__init__()
        self.output, self.main = output, main
        self.tensorboard: list[Any] = []  # transformers' TensorBoardCallback of the run's Trainer, if any

    def append(self, path: Path) -> None:
        super().append(path)
        if self.main and path.parent == self.output:
            record_paths(self.output, "train", path)

    def watch_tensorboard(self, trainer: Any) -> None:
        """Take note of ``trainer``'s TensorBoard callback (``--report-to tensorboard``), whose files ``finish``
        records."""
        from transformers.integrations import TensorBoardCallback

        self.tensorboard = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, TensorBoardCallback)]

    def finish(self) -> None:
        """Close TensorBoard's writers and record every file of the folders they wrote in under the output (each
        run's ``runs/DATE_HOST``), and drop from the marker what is gone (the checkpoints removed at the end)."""
        if not self.main or not self.output.is_dir():
            return
        logs = []
        for callback in self.tensorboard:
            if callback.tb_writer is not None:
                callback.tb_writer.close()
                callback.tb_writer = None
            folder = Path(callback.logging_dir).absolute() if callback.logging_dir else None
            if folder is not None and folder.is_relative_to(self.output) and folder.is_dir():
                logs += [Path(root, name) for root, _, files in os.walk(folder) for name in files]
        record_paths(self.output, "train", *logs)


@contextlib.contextmanager
def output_removed_on_failure(output: Path, main: bool, log: Any) -> Iterator[RunOutputs]:
    """On an error, Ctrl-C or SIGTERM in an output folder this run created: remove what the run put there (the
    paths the block adds to the yielded list) and the folders it created when they are empty, unless a
    checkpoint of the run is left to resume from; what stays is recorded in the folder's marker
    (``RunOutputs.finish``). Whatever else is there (put by another process) stays."""
    created = [] if os.path.lexists(output) else [output, *(p for p in output.parents if not p.exists())]
    published = RunOutputs(output, main)
    with terminate_raises():
        try:
            yield published
        except BaseException:
            if main and created and not any(p.exists() for p in published if CHECKPOINT.fullmatch(p.name)):
                for path in published:
                    remove_tree(path)
                only_bookkeeping_left(output)
                for folder in created:  # deepest first; only when empty
                    with contextlib.suppress(OSError):
                        folder.rmdir()
            elif main:
                if published:  # a run refused before it wrote anything leaves the folder as it was, marker too
                    with contextlib.suppress(OSError):  # the run's own error is the one to report
                        published.finish()
                if created:
                    log(f"the run stopped; its checkpoints are in {output}: continue with --resume")
            raise


def last_evaluation(state: TrainerState) -> dict[str, float] | None:
    """The evaluation Trainer ran at the last step (when it is an evaluation step), as ``evaluate`` returns it:
    reused for the final metrics rather than run a second time on the same weights."""
    for entry in reversed(state.log_history):
        if "eval_loss" in entry:
            return entry if entry.get("step") == state.global_step else None
    return None


def shared_data(name: str, fingerprint: str) -> str:
    """The data as the model card states it: its name (no folder of the machine it trained on) and the fingerprint
    of its content, by which another copy of it is known to be the same."""
    return f"{name} (content fingerprint {fingerprint[:16]})"


def training_facts(
    options: TrainOptions, data: str, steps: int, peak: float, val_loss: float, test_loss: float, rate: DefaultRate
) -> dict:
    """What the model card says of the run, as Trainer's card lists its hyperparameters and results; ``peak``: the
    highest learning rate its ``steps`` had (``optim.peak_reached``), of the rate ``rate`` says the source of
    (``model.rate_choice``: ``--lr``, or the default's)."""
    per_step = options.batch_size * options.gradient_accumulation_steps * options.seq_len
    reached = float(f"{peak:.3g}")  # as the card says it
    return {
        "data": data,
        "steps": f"{steps:,}",
        "tokens per step": f"{per_step:,} (x processes)",
        "peak learning rate": f"{reached:g} reached of {options.lr:g} (AdamW, warm-up {options.warmup_steps} "
        f"steps, cosine to {options.min_lr_ratio:g} of it at step {options.max_steps})",
        "learning rate source": rate.why if rate.source == RATE_GIVEN else f"{rate.why} (no --lr given)",
        "weight decay": f"{options.weight_decay:g}",
        "seed": options.seed,
        "final validation loss": f"{val_loss:.4f} (perplexity {perplexity(val_loss):.2f})",
        "test loss": f"{test_loss:.4f} (held-out documents, not the validation ones)",
    }


def curve_title(config: Any, parameters: int, lr: float, bridge_anneal: int | None, data: str) -> str:
    """The loss curve's title: the model, what it computed (its style; a ``geo`` model at bridge 0 computes exact
    Pre-Norm, and says so; ``bridge_anneal``: its bridge moved to 1 over that many steps), the rate and the data."""
    settings = GeoNormSettings.from_object(config)
    size = f"{config.model_type} {parameters / 1e6:.2f}M"
    if bridge_anneal:
        return f"{size}, lr {lr:g}\ngeo, its bridge annealed to 1 over {bridge_anneal} steps\n{data}"
    words = bridge_words(settings)
    if words is not None:
        return f"{size}, lr {lr:g}\ngeo {words}\n{data}"
    return f"{size}, {settings.norm_style}, lr {lr:g}\n{data}"


def machine_load() -> dict[str, Any]:
    """How busy the machine was as the run ended (tokens/s compares between runs only where the load did not
    differ): its CPUs and the 1-minute load average, this run included."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpus": os.cpu_count(), "load_average_1m": load, "note": "tokens_per_second is comparable only "
            "between runs on the same machine at the same load"}


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < math.log(sys.float_info.max) else math.inf


class RunProgress(ProgressCallback):
    """Trainer's progress bar (steps done, total, time left), with the logs written as readable lines instead of
    Python dicts: ``step 10/300: loss 5.1234, lr 1.20e-03, grad norm 0.81``. Each evaluation has its own bar (named
    ``evaluating``, on the training bar's line and cleared when it ends: a long one at step 0 would otherwise look
    like a hung run); transformers' own bars (writing each checkpoint's shards) stay off while training, so a log
    read from a file holds lines, not cursor movements."""

    hf_bars_were_on: bool | None = None

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: Any, **kwargs: Any) -> None:
        self.hf_bars_were_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        super().on_train_begin(args, state, control, **kwargs)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: Any, **kwargs: Any) -> None:
        super().on_train_end(args, state, control, **kwargs)
        self.restore_bars()

    def restore_bars(self) -> None:
        """transformers' bars as they were before training (also after a run that failed part way)."""
        if self.hf_bars_were_on:
            hf_logging.enable_progress_bar()
        self.hf_bars_were_on = None

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: Any, **kwargs: Any) -> None:
        from tqdm.auto import tqdm

        loader = kwargs.get("eval_dataloader")
        if state.is_world_process_zero and self.prediction_bar is None and loader is not None:
            # on the training bar's line (position 0), cleared when done: a nested bar's cursor-up escapes would
            # garble a log read from a file
            self.prediction_bar = tqdm(total=len(loader), desc="evaluating", unit="batch", leave=False, position=0,
                                       dynamic_ncols=True)  # fmt: skip
        if self.prediction_bar is not None:
            self.prediction_bar.update(1)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: Any, logs: Any = None, **_: Any) -> None:
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        step = f"step {state.global_step}/{state.max_steps}"
        if "eval_loss" in logs:
            loss = logs["eval_loss"]
            perplexity = f" (perplexity {math.exp(loss):.2f})" if loss < 700 else ""
            self.training_bar.write(f"{step}: validation loss {loss:.4f}{perplexity}")
        elif "loss" in logs:
            parts = [f"loss {logs['loss']:.4f}"]
            if "learning_rate" in logs:
                parts.append(f"lr {logs['learning_rate']:.2e}")
            if "grad_norm" in logs:
                parts.append(f"grad norm {logs['grad_norm']:.3g}")
            self.training_bar.write(f"{step}: {', '.join(parts)}")


def final_card(base_model: str | None, facts: dict[str, Any]) -> CardInfo:
    """The final model's card: what it inherits of the ``--model`` it was trained from (``base_model``) and the
    run's ``facts`` (``training_facts``)."""
    return replace(inherited_card_info(base_model) if base_model is not None else CardInfo(), training=facts)


def save_final_model(
    model: Any,
    tokenizer: Any,
    state_dict: dict[str, Any] | None,
    card: CardInfo,
    final_dir: Path,
    published: list[Path],
) -> None:
    """``final/``, whole or not at all: the model (with ``state_dict``, the full weights of a sharded one), its
    tokenizer, remote code and model ``card``."""
    with atomic_directory(final_dir, force=True, command="train") as tmp, disk_full_named(tmp, final_dir):
        weights = {"state_dict": state_dict} if state_dict else {}
        save_shareable(model, tmp, tokenizer=tokenizer, card_info=card, **weights)
    published.append(final_dir)


def publish_results(
    output: Path, metrics: dict[str, Any], title: str, remove_checkpoints: bool, published: RunOutputs, log: Any
) -> None:
    """``metrics.json`` and ``loss_curve.png`` (titled ``title``; a plot that fails is a warning: the run is done),
    the run's last lines, and its checkpoints removed (``remove_checkpoints``: no ``--keep-checkpoints``) or kept;
    then the marker records what the run leaves (``RunOutputs.finish``)."""
    text = strict_json(metrics)
    replace_file(output / "metrics.json", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    published.append(output / "metrics.json")
    curve = output / "loss_curve.png"
    try:
        plot_losses(metrics["log_history"], curve, title)
        published.append(curve)
    except Exception as error:  # noqa: BLE001 - the run is done; the plot is reported as not written
        warnings.warn(f"{curve} was not written: {type(error).__name__}: {first_line(error)}", stacklevel=4)
        curve = None
    resumed_step = metrics["resumed_from_step"]
    resumed = f" (steps {resumed_step + 1}-{metrics['steps']} in this run)" if resumed_step else ""
    log(
        f"final validation loss {metrics['final_eval_loss']:.4f} (perplexity {metrics['final_eval_perplexity']:.2f}), "
        f"test loss {metrics['final_test_loss']:.4f}; "
        f"{metrics['tokens_per_second']:.0f} tokens/s{resumed} (evaluations, {metrics['evaluation_seconds']:.0f} s, "
        f"left out); model in {output / 'final'}; metrics in "
        f"{output / 'metrics.json'}" + (f"; loss curve in {curve}" if curve else "")
    )
    log(kept_checkpoints(output, remove_checkpoints))
    published.finish()
