"""What a checkpoint records of the run that wrote it, and the check ``--resume`` makes against it.

Every checkpoint holds ``hf_geonorm_run.json``: the data's key (its content, ``corpus``), the tokenizer's hash, the
number of processes and every option that shapes what trains (``SHAPING``), with the GeoNorm settings the model was
built with and where its learning rate came from (``learning_rate_facts``: read by ``hf-geonorm info``). A resumed
run keeps the held-out rule its record names (``recorded_held_out_rule``: rule 1 where it names none), so that it
is evaluated on the text it was evaluated on before; and it must match the rest: another data, tokenizer or shaping
option would continue the optimizer state and the data order of one run on the inputs of another, so it is refused
in one line naming each change. The options that only say how
often to evaluate, save and log, or where to report (``FREE``) may change, and the change is logged. A longer
``--max-steps`` is allowed where the schedule allows it: where every step already trained had the learning rate the
longer run gives it (the checkpoint is within the warm-up, or ``--min-lr-ratio`` is 1, no decay).
The checkpoint's own training state is checked against its record before (``checkpoint_state``); a checkpoint an
earlier hf-geonorm wrote without a record has its saved learning-rate schedule checked against this run's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...modeling.settings import GeoNormSettings
from ..options import LEGACY_HELD_OUT_RULE, TrainOptions
from ..rate_rule import DefaultRate
from .checkpoint_state import Schedule, schedule_problem

RECORD_NAME = "hf_geonorm_run.json"
RECORD_FORMAT = 1
SHAPING = (
    "seq_len", "batch_size", "gradient_accumulation_steps", "lr", "warmup_steps", "min_lr_ratio", "weight_decay",
    "adam_beta2", "precision", "lora", "eval_blocks", "max_tokens", "streaming", "bridge_anneal", "bridge_order",
    "seed", "held_out_rule",
)  # fmt: skip
# what a record written before an option of SHAPING was recorded ran with, where that is not the option's default
BEFORE_RECORDED = {"held_out_rule": LEGACY_HELD_OUT_RULE}
FREE = (
    "eval_every", "save_every", "logging_steps", "report_to", "data_workers", "data_cache", "compile",
    "gradient_checkpointing",
)  # fmt: skip


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def run_record(
    options: TrainOptions,
    data: tuple[str, str],
    tokenizer_hash: str,
    settings: dict[str, Any],
    processes: int,
    learning_rate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of a run: ``data`` is the corpus's label and key; ``options`` as the run uses them (its learning
    rate chosen), and where that rate came from (``learning_rate``: ``hf-geonorm info`` says it of an unfinished
    run; not compared on resume: ``--lr`` is)."""
    return {
        "format": RECORD_FORMAT,
        "data": {"label": data[0], "key": data[1]},
        "tokenizer": tokenizer_hash,
        "processes": processes,
        "max_steps": options.max_steps,
        "options": {name: getattr(options, name) for name in SHAPING},
        "free": {name: getattr(options, name) for name in FREE},
        "settings": settings,
        "learning_rate": learning_rate,
    }


def learning_rate_facts(rate: DefaultRate) -> dict[str, Any]:
    """The run's peak rate and where it came from (``model.rate_choice``), as the record and ``metrics.json`` hold
    it."""
    return {"value": rate.lr, "source": rate.source, "why": rate.why}


def write_record(folder: Path, record: dict[str, Any]) -> None:
    (folder / RECORD_NAME).write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")


def read_record(checkpoint: Path) -> dict[str, Any] | None:
    """The record of ``checkpoint``; None when it has none (written before runs were recorded); ``ValueError``
    when it is damaged."""
    path = checkpoint / RECORD_NAME
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"--resume: {path} is damaged ({error}); remove {checkpoint.name} to resume from an earlier "
                         "checkpoint, or start anew with --force") from None  # fmt: skip
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise ValueError(f"--resume: {path} is not a record this hf-geonorm reads; start anew with --force")
    return record


def recorded_held_out_rule(checkpoint: Path) -> int:
    """The held-out rule of the run that wrote ``checkpoint`` (``BEFORE_RECORDED``'s for a record, or a
    checkpoint without one, from before it was recorded)."""
    record = read_record(checkpoint) or {"options": {}}
    return record["options"].get("held_out_rule", BEFORE_RECORDED["held_out_rule"])


def _schedule_kept(before: dict[str, Any], step: int) -> bool:
    """Whether the first ``step`` steps had the learning rates a longer run gives them (``optim.lr_factor``: the
    warm-up does not depend on the length; the cosine after it does, unless it does not decay)."""
    return step <= before["options"]["warmup_steps"] or before["options"]["min_lr_ratio"] == 1


def _trained_otherwise(checkpoint: Path, changes: list[str]) -> ValueError:
    return ValueError(
        f"--resume: {checkpoint} was trained otherwise: {'; '.join(changes)}; resume with what it was trained "
        f"with, or start a new run from its weights (--model {checkpoint}, another --output) or anew (--force)"
    )


def check_same_run(checkpoint: Path, now: dict[str, Any], step: int, log: Any) -> None:
    """``ValueError`` naming every change from the run recorded in ``checkpoint`` (at ``step``) that ``now`` would
    make to what trains; the changes that cannot corrupt it are logged."""
    before = read_record(checkpoint)
    now = json.loads(json.dumps(now, default=str))  # as it reads back: tuples as lists
    if before is None:  # only its learning-rate schedule can be checked: against this run's
        problem = schedule_problem(checkpoint, Schedule.of(now))
        if problem:
            raise _trained_otherwise(checkpoint, [problem])
        log(f"--resume: {checkpoint.name} holds no record of its run (an earlier hf-geonorm wrote it): its data, "
            "tokenizer and options cannot be checked against this run's, only its learning-rate schedule")  # fmt: skip
        return
    changes = []
    if before["data"]["key"] != now["data"]["key"]:
        same_label = before["data"]["label"] == now["data"]["label"]
        changes.append(f"the data ({before['data']['label']} then, {now['data']['label']} now"
                       + (": its content changed)" if same_label else ")"))  # fmt: skip
    if before["tokenizer"] != now["tokenizer"]:
        changes.append("the tokenizer (another vocabulary or rules than the checkpoint's)")
    if before["processes"] != now["processes"]:
        changes.append(f"the processes ({before['processes']} then, {now['processes']} now: another global batch)")
    for name in SHAPING:
        then = before["options"].get(name, BEFORE_RECORDED.get(name))
        if then != now["options"][name]:
            changes.append(f"{_option(name)} {then} then, {now['options'][name]} now")
    defaults = GeoNormSettings().to_dict()  # a setting the record lacks was added since: the run had its default
    for name in sorted(set(before["settings"]) | set(now["settings"])):
        then = before["settings"].get(name, defaults.get(name))
        if then != now["settings"].get(name):
            changes.append(f"{name} {then!r} then, {now['settings'].get(name)!r} now")
    old, new = before["max_steps"], now["max_steps"]
    if new != old and not (new > old and _schedule_kept(before, step)):
        changes.append(
            f"--max-steps {old} then, {new} now (the learning rates of the {step} steps done followed a cosine laid "
            f"out for {old} steps: a longer run keeps them only within the --warmup-steps or with --min-lr-ratio 1)"
        )
    if changes:
        raise _trained_otherwise(checkpoint, changes)
    free = [f"{_option(name)} {before['free'].get(name)} then, {now['free'][name]} now"
            for name in FREE if before["free"].get(name) != now["free"][name]]  # fmt: skip
    if new != old:
        free.append(f"--max-steps {old} then, {new} now (the steps done are within the warm-up or the rate does not "
                    "decay: their schedule is the same)")  # fmt: skip
    if free:
        log(f"--resume: continuing {checkpoint.name} with {'; '.join(free)} (what trained so far is the same)")
