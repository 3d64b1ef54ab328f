"""What transformers' Trainer (and the trainers built on it, TRL's SFTTrainer among them) leaves in a folder that says
how a model was trained, for the card of a folder hf-geonorm did not train and for ``info`` on a run that has not
finished: ``trainer_state.json`` (the steps, and the losses and learning rates it logged) is read; ``training_args.bin``
(every argument: optimizer, schedule, batch, data, seed) is a pickle, which hf-geonorm never loads, and the card says
that it was not read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._plumbing.text_files import json_or_problem

TRAINER_STATE = "trainer_state.json"
TRAINING_ARGS = "training_args.bin"
TRAINED_ELSEWHERE = (
    "Trained with another tool (transformers' Trainer, or one built on it such as TRL's SFTTrainer), as the files it "
    "left in the folder record it"
)
NOT_RECORDED = (
    "How this model was trained is unknown: hf-geonorm did not train it, and its folder holds none of the files "
    f"transformers' Trainer leaves ({TRAINER_STATE}, {TRAINING_ARGS})"
)
ARGUMENTS_NOT_READ = (
    f"{TRAINING_ARGS} (the arguments it was given: optimizer, schedule, batch, data, seed): a pickle, which "
    "hf-geonorm never loads (unpickling can run any code)"
)


def checkpoint_step(folder: Path) -> int | None:
    """N of a ``checkpoint-N`` folder; None for any other name."""
    prefix, _, number = folder.name.partition("-")
    return int(number) if prefix == "checkpoint" and number.isdigit() else None


def newest_state(folder: Path) -> Path | None:
    """The ``trainer_state.json`` that records the most of the training that made ``folder``: its own (written by
    ``trainer.save_state()``), else that of its newest ``checkpoint-N``."""
    if (folder / TRAINER_STATE).is_file():
        return folder / TRAINER_STATE
    numbered = [(step, path) for path in folder.glob("checkpoint-*")
                if (step := checkpoint_step(path)) is not None and (path / TRAINER_STATE).is_file()]  # fmt: skip
    return max(numbered)[1] / TRAINER_STATE if numbered else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def logged(history: list[Any], key: str) -> list[tuple[Any, float]]:
    """The ``(step, value)`` pairs of ``key`` in a Trainer ``log_history``, in the order logged."""
    return [(entry.get("step"), entry[key]) for entry in history if isinstance(entry, dict) and _number(entry.get(key))]


def state_facts(state: dict[str, Any]) -> dict[str, str]:
    """A ``trainer_state.json`` in the card's words: the steps (of how many), epochs, batch size per device, the
    first and last logged training loss, the last validation loss and the highest logged learning rate."""
    facts: dict[str, str] = {}
    step, total = state.get("global_step"), state.get("max_steps")
    if _number(step):
        facts["steps"] = f"{step:,}" + (f" of {total:,}" if _number(total) and total > 0 else "")
    if _number(state.get("epoch")):
        facts["epochs"] = f"{state['epoch']:.3g}"
    if _number(state.get("train_batch_size")):
        facts["batch size per device"] = f"{state['train_batch_size']:,}"
    history = state.get("log_history") if isinstance(state.get("log_history"), list) else []
    losses = logged(history, "loss")
    if losses:
        ends = [losses[0]] if len(losses) == 1 else [losses[0], losses[-1]]
        facts["training loss"] = ", ".join(f"{value:.4g} at step {at}" for at, value in ends) + " (logged)"
    evaluations = logged(history, "eval_loss")
    if evaluations:
        facts["validation loss"] = f"{evaluations[-1][1]:.4g} at step {evaluations[-1][0]}"
    rates = logged(history, "learning_rate")
    if rates:
        facts["peak learning rate"] = f"{max(value for _, value in rates):.3g} (the highest logged)"
    return facts


def trainer_training(folder: Path) -> tuple[dict[str, str] | None, str]:
    """The card's ``training`` and ``trained_with`` for a folder another tool trained: what its
    ``trainer_state.json`` (or its newest checkpoint's) records, and what was not read; ``(None, NOT_RECORDED)``
    where the folder holds none of Trainer's files."""
    state_path = newest_state(folder)
    arguments = (folder / TRAINING_ARGS).is_file() or (state_path is not None and
                                                       (state_path.parent / TRAINING_ARGS).is_file())  # fmt: skip
    if state_path is None and not arguments:
        return None, NOT_RECORDED
    facts: dict[str, str] = {}
    if state_path is None:
        facts["steps and losses"] = f"unknown: no {TRAINER_STATE} in the folder or its checkpoint-N folders"
    else:
        where = state_path.relative_to(folder).as_posix()
        state, problem = json_or_problem(state_path)
        if problem is None and not isinstance(state, dict):
            problem = f"{state_path} holds a JSON {type(state).__name__}, not a Trainer state"
        if problem is not None:  # named as the folder holds it: the card is no place for this machine's paths
            facts["steps and losses"] = f"unknown: {problem.replace(str(state_path), where)}"
        else:
            facts["recorded in"] = where
            facts.update(state_facts(state))
    if arguments:
        facts["not read"] = ARGUMENTS_NOT_READ
    return facts, TRAINED_ELSEWHERE
