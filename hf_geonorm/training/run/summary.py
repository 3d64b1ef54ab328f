"""What ``hf-geonorm info`` says of the output folder of a run (``describe_run``): its model, steps, tokens, peak
learning rate with where it came from, and losses; from ``metrics.json`` once the run finished, else from its newest
checkpoint (its ``trainer_state.json``, and the record of its run, which holds the rate's source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..._plumbing.text_files import json_or_problem
from ...sharing.trainer_records import TRAINER_STATE, logged
from .checkpoints import checkpoints
from .record import RECORD_NAME

NOT_RECORDED_RATE = "not recorded (a run of an hf-geonorm that did not record the rate's source)"


def _read(path: Path) -> dict[str, Any] | None:
    value, problem = json_or_problem(path)
    return value if problem is None and isinstance(value, dict) else None


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` is the output folder of a run (``hf-geonorm train``, or Trainer's): no model of its own, but
    ``metrics.json``, ``final/`` or ``checkpoint-N`` folders."""
    if (path / "config.json").exists():
        return False
    return (path / "metrics.json").is_file() or (path / "final" / "config.json").is_file() or any(
        (folder / TRAINER_STATE).is_file() for _, folder in checkpoints(path))  # fmt: skip


def describe_run(path: Path) -> dict[str, Any]:
    """The summary of the run whose output folder is ``path``: its model (``final/``, else the newest checkpoint),
    steps, tokens, peak learning rate with its source, and losses; from ``metrics.json`` where the run finished,
    else from the newest checkpoint's ``trainer_state.json`` and the record of its run."""
    found = checkpoints(path)
    out: dict[str, Any] = {"path": str(path), "kind": "run", "checkpoints": [folder.name for _, folder in found]}
    metrics = _read(path / "metrics.json")
    if metrics is not None and (path / "final" / "config.json").is_file():
        return {**out, **_finished(path, metrics)}
    out.update(finished=False, model=str(found[0][1]) if found else None)
    state = _read(found[0][1] / TRAINER_STATE) if found else None
    record = _read(found[0][1] / RECORD_NAME) if found else None
    history = state.get("log_history") if state and isinstance(state.get("log_history"), list) else []
    out.update(steps=state.get("global_step") if state else None, max_steps=state.get("max_steps") if state else None)
    if record is not None:
        options = record.get("options", {})
        out["tokens_per_step"] = (options.get("batch_size", 0) * options.get("gradient_accumulation_steps", 1)
                                  * record.get("processes", 1) * options.get("seq_len", 0))  # fmt: skip
        out["tokens"] = out["tokens_per_step"] * out["steps"] if isinstance(out["steps"], int) else None
        out["learning_rate"] = record.get("learning_rate") or {"value": options.get("lr"), "source": None,
                                                               "why": NOT_RECORDED_RATE}  # fmt: skip
    evaluations, losses = logged(history, "eval_loss"), logged(history, "loss")
    out["validation_loss"] = evaluations[-1][1] if evaluations else None
    out["validation_step"] = evaluations[-1][0] if evaluations else None
    out["training_loss"] = losses[-1][1] if losses else None
    return out


def _finished(path: Path, metrics: dict[str, Any]) -> dict[str, Any]:
    """The summary of a finished run, from its ``metrics.json``."""
    options = metrics.get("options", {})
    steps, per_step = metrics.get("steps"), metrics.get("tokens_per_step")
    losses = logged(metrics.get("log_history") or [], "loss")
    rate = metrics.get("learning_rate") or {"value": options.get("lr"), "source": None, "why": NOT_RECORDED_RATE}
    return {
        "finished": True,
        "model": str(path / "final"),
        "model_type": metrics.get("model_type"),
        "parameters": metrics.get("parameters"),
        "data": metrics.get("data"),
        "steps": steps,
        "max_steps": options.get("max_steps", steps),
        "tokens_per_step": per_step,
        "tokens": steps * per_step if isinstance(steps, int) and isinstance(per_step, int) else None,
        "learning_rate": rate,
        "validation_loss": metrics.get("final_eval_loss"),
        "test_loss": metrics.get("final_test_loss"),
        "training_loss": losses[-1][1] if losses else None,
        "metrics": str(path / "metrics.json"),
        "loss_curve": str(path / "loss_curve.png") if (path / "loss_curve.png").is_file() else None,
    }
