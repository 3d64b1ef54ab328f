"""A sweep's identity and its records, whatever stores them (``journal``: the lines of ``DIR/runs.jsonl``).

- The identity of a sweep (``sweep_header``): the train options that shape every run (``journal_key``: not where a
  run writes, nor the rate and seed the grid sets), the full GeoNorm settings every run shares but its style and
  alpha, and the content fingerprints of the data, the tokenizer and the ``--model`` folder (``sweep_identity``,
  ``model_fingerprint``: of its config and weight files, as the data's is of its files); beside it
  the sweep options as first given (the plan a rerun without them resumes) and a digest of it all, so that an edited
  header is known (``check_header``).
- A record (one finished run): its cell (style, alpha, rate, seed, the name they make, its role in the protocol), its
  results, and its own identity: the same options, settings and fingerprints. ``check_record`` compares it with the
  sweep's identity field by field and names the first field that differs, expected against found.

Paths are never compared: ``--data``, ``--tokenizer`` and ``--model`` are keyed by their content (``./m/`` and the
absolute path of the same folder are one model; another model under the same name is not)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any

from .._plumbing.checksums import file_sha256
from ..modeling.settings import NORM_STYLES, GeoNormSettings
from ..training.options import LEGACY_HELD_OUT_RULE, MAX_SEED, TrainOptions
from .options import OUTSIDE_SWEEP_KEY
from .table import run_name

FORMAT = 2  # 1: a header of the options alone, lines without their options or the model's fingerprint
NOT_IN_KEY = OUTSIDE_SWEEP_KEY  # left out of the journal's key
KEYED_BY_CONTENT = ("data", "tokenizer", "model")  # options naming files: their fingerprints are compared, not paths
FINGERPRINTS = ("data", "tokenizer", "model")  # the model's is None for a model built from --arch
CELL = ("run", "style", "alpha", "lr", "seed", "val_loss", "test_loss")
IDENTITY = ("train_options", "settings", "fingerprints")
RECORD = (*CELL, "role", "settings", "steps", "tokens", "train_options", "fingerprints", "data")
ROLES = ("grid", "extension", "confirmation")
SPLITS = ("validation", "test")  # a run's evaluated_blocks
CONFIG_FILES = ("config.json", "model.safetensors.index.json")  # beside the weights (*.safetensors)
# what the runs of a journal that predates an option ran with, where that is not the option's default: the held-out
# rule before it was recorded
BEFORE_RECORDED = {"held_out_rule": LEGACY_HELD_OUT_RULE}
# Train options removed since journals named them, no-ops when they went (save_final_only: a finished run removes its
# checkpoints anyway): a stored run that names one is read as one that does not, so that its sweep resumes
RETIRED_OPTIONS = ("save_final_only",)


class RecordError(ValueError):
    """A stored run or header that is not one of this sweep: the message names where and the field."""


def journal_key(train: TrainOptions) -> dict[str, Any]:
    """What every run of a sweep shares: the train options that shape a run (not where it writes, nor the rate
    and seed the grid sets), as the header holds them (JSON: tuples as lists). A file's option is keyed by its
    content (its fingerprint), so a path of this machine is kept by its last name only (``short_path``): a committed
    journal names no folder of the machine it ran on."""
    key = {name: value for name, value in asdict(train).items() if name not in NOT_IN_KEY}
    return json.loads(json.dumps({name: short_path(value) if name in KEYED_BY_CONTENT else value
                                  for name, value in key.items()}))  # fmt: skip


def short_path(value: Any) -> Any:
    """An absolute path (or one from ``~``) by its last name; a relative path, a dataset's name or None as given."""
    if isinstance(value, str) and os.path.isabs(os.path.expanduser(value)):
        return Path(value).name or value
    return value


def option_defaults() -> dict[str, Any]:
    """The default of every train option, as a journal holds it: an option that a journal's header lacks was added
    to hf-geonorm after the journal was started, and its runs ran with what its default does, or with what
    ``BEFORE_RECORDED`` says they ran with (the held-out rule: rule 1)."""
    defaults = {f.name: f.default for f in fields(TrainOptions) if f.default is not MISSING}
    defaults |= {f.name: f.default_factory() for f in fields(TrainOptions) if f.default_factory is not MISSING}
    defaults |= BEFORE_RECORDED
    return json.loads(json.dumps({name: value for name, value in defaults.items() if name not in NOT_IN_KEY}))


def stored_options(options: dict[str, Any]) -> dict[str, Any]:
    """The train options a header or a record holds, as they are compared: those added since at their defaults
    (``option_defaults``), those removed since (``RETIRED_OPTIONS``) left out."""
    return {**option_defaults(), **{name: value for name, value in options.items() if name not in RETIRED_OPTIONS}}


def model_files(folder: Path) -> list[Path]:
    """The files of a model folder that make the model: its config and its safetensors weights (the tokenizer has
    its own fingerprint; hf-geonorm reads no other weights)."""
    return sorted(path for path in folder.iterdir()
                  if path.is_file() and (path.name in CONFIG_FILES or path.name.endswith(".safetensors")))  # fmt: skip


def model_fingerprint(model: str | None) -> str | None:
    """The SHA-256 of the ``--model`` folder's config and weight files (their names, sizes and content hashes), as
    the data's fingerprint is of its files; None for a model built from ``--arch``."""
    if model is None:
        return None
    parts = [(path.name, path.stat().st_size, file_sha256(path)) for path in model_files(Path(model).expanduser())]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def shared_settings(train: TrainOptions) -> dict[str, Any]:
    """The full GeoNorm settings every run of the sweep builds its model with, but its style and alpha: the
    ``--model`` folder's stored ones (else the library's defaults) updated with those given."""
    if train.model is None:
        return GeoNormSettings(**train.settings).to_dict()
    from ..checkpoints.loading import open_source, resolve_settings

    return resolve_settings(train.settings, open_source(Path(train.model).expanduser()))


def sweep_identity(train: TrainOptions, data: str, tokenizer: str) -> dict[str, Any]:
    """The identity of the sweep of ``train``'s runs (``record``): its options, the settings its runs share, and the
    fingerprints of its data and tokenizer (``data``, ``tokenizer``: those of the data's source, which the sweep
    resolves as a run does) and of its model (measured here)."""
    return {
        "train_options": journal_key(train),
        "settings": shared_settings(train),
        "fingerprints": {"data": data, "tokenizer": tokenizer, "model": model_fingerprint(train.model)},
    }


def digest(header: dict[str, Any]) -> str:
    """The SHA-256 of a header's content (all but its digest), as canonical JSON."""
    content = {name: value for name, value in header.items() if name != "digest"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, allow_nan=False).encode()).hexdigest()


def sweep_header(identity: dict[str, Any], sweep_options: dict[str, Any]) -> dict[str, Any]:
    """The header of a new sweep: its ``identity`` (``train_options``, ``settings``, ``fingerprints``), the sweep
    options it began with, and their digest."""
    header = {"format": FORMAT, **{name: identity[name] for name in IDENTITY}, "sweep_options": sweep_options}
    return header | {"digest": digest(header)}


def header_problem(header: Any) -> str | None:
    """Why ``header`` is not a whole, unedited header of this format; None when it is."""
    if not isinstance(header, dict) or not all(isinstance(header.get(n), dict) for n in (*IDENTITY, "sweep_options")):
        return f"not the header of an hf-geonorm sweep journal (format {FORMAT})"
    marks = header["fingerprints"]
    if not (all(isinstance(marks.get(n), str) for n in ("data", "tokenizer")) and "model" in marks
            and (marks["model"] is None or isinstance(marks["model"], str))):  # fmt: skip
        return f"fingerprints: expected those of the data, the tokenizer and the model, found {marks!r}"
    if header.get("digest") != digest(header):
        return ("the header was edited (its digest does not match its content): a sweep's first line is written "
                "once, when the sweep begins")  # fmt: skip
    return None


def check_header(header: Any, where: str = "the header") -> None:
    """``RecordError`` unless ``header`` is a whole header that nobody edited (``header_problem``)."""
    problem = header_problem(header)
    if problem is not None:
        raise RecordError(f"{where}: {problem}")


def check_same_sweep(header: dict[str, Any], identity: dict[str, Any], where: str = "the header") -> None:
    """``RecordError`` ("the header: fingerprints.model: expected X, found Y") unless the stored sweep ``header``
    (checked whole: ``check_header``) is of the sweep whose ``identity`` (``sweep_identity``) is measured now:
    its options (paths aside), its shared settings and its fingerprints, field by field."""
    read = {"train_options": stored_options, "settings": lambda settings: {**GeoNormSettings().to_dict(), **settings},
            "fingerprints": dict}  # fmt: skip
    for part in IDENTITY:
        stored, now = read[part](header[part]), read[part](identity[part])
        for name in sorted(set(stored) | set(now)):
            skipped = part == "train_options" and name in KEYED_BY_CONTENT
            if not skipped and stored.get(name) != now.get(name):
                raise RecordError(f"{where}: {part}.{name}: expected {stored.get(name)!r}, found {now.get(name)!r}")


def check_record(record: Any, expected: dict[str, Any], where: str = "a record") -> None:
    """``RecordError`` ("line 7: seq_len: expected 32, found 16") unless ``record`` is a finished run of the sweep
    whose identity ``expected`` holds (a header, or ``identity``'s dict): ``record_problem``."""
    problem = record_problem(record, expected)
    if problem is not None:
        raise RecordError(f"{where}: {problem}")


def record_problem(record: Any, expected: dict[str, Any]) -> str | None:
    """Why ``record`` is not a finished run of the sweep ``expected`` identifies, as "field: expected X, found Y";
    None when it is one."""
    if not isinstance(record, dict):
        return "not a run (a JSON object)"
    missing = [name for name in RECORD if name not in record]
    if missing:
        return f"a run without {', '.join(missing)}"
    max_steps = stored_options(expected["train_options"])["max_steps"]
    problem = cell_problem(record) or result_problem(record, max_steps)
    if problem is not None:
        return problem
    if record["role"] not in ROLES:
        return f"role: expected one of {', '.join(ROLES)}, found {record['role']!r}"
    for name in ("train_options", "settings", "fingerprints"):
        if not isinstance(record[name], dict):
            return f"{name}: expected a JSON object, found {record[name]!r}"
    return identity_problem(record, expected)


def cell_problem(entry: dict[str, Any]) -> str | None:
    """Why the cell of ``entry`` (a dict holding ``CELL``) is not one: its style, rate, alpha and seed, its losses
    (finite and >= 0, or a diverged run's two nulls), and its name made of them."""
    style, alpha, lr, seed = entry["style"], entry["alpha"], entry["lr"], entry["seed"]
    if style not in NORM_STYLES:
        return f"style {style!r} is none of {', '.join(NORM_STYLES)}"
    if not (is_number(lr) and lr > 0):
        return f"lr {lr!r} is not a positive finite number"
    if alpha is not None and not (is_number(alpha) and alpha >= 0):
        return f"alpha {alpha!r} is not a finite number >= 0"
    if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED):
        return f"seed {seed!r} is not a whole number from 0 to {MAX_SEED}"
    share = entry.get("warmup_share")
    if share is not None and not (is_number(share) and 0 <= share < 1):
        return f"warmup_share {share!r} is not a share of the run from 0 to below 1"
    losses = {name: entry[name] for name in ("val_loss", "test_loss")}
    if list(losses.values()).count(None) == 1:
        return f"val_loss {losses['val_loss']!r}, test_loss {losses['test_loss']!r}: one loss null, not both"
    for name, loss in losses.items():
        if loss is not None and not (is_number(loss) and loss >= 0):
            return f"{name}: expected a finite loss >= 0, found {loss!r}"
    expected = run_name(style, alpha, lr, seed, share)
    if entry["run"] != expected:
        return f"run {entry['run']!r} is not the name of its own run ({expected})"
    return None


def result_problem(entry: dict[str, Any], max_steps: int) -> str | None:
    """Why what ``entry`` recorded of its training is not a run's: every step of the sweep and the tokens they
    took, or a diverged run's nulls and its reason; whole numbers of warm-up steps and blocks, finite seconds."""
    if entry["val_loss"] is None:
        if not isinstance(entry.get("diverged"), str):
            return "a diverged run (val_loss and test_loss null) without its reason (diverged)"
        if entry["steps"] is not None or entry["tokens"] is not None:
            return f"a diverged run with steps {entry['steps']!r} and tokens {entry['tokens']!r}: expected nulls"
    elif entry["steps"] != max_steps:
        return f"steps: expected {max_steps}, found {entry['steps']!r}"
    elif not (is_count(entry["tokens"]) and entry["tokens"] > 0):
        return f"tokens: expected a whole number > 0, found {entry['tokens']!r}"
    warmup, blocks = entry.get("warmup_steps"), entry.get("evaluated_blocks")
    if warmup is not None and not is_count(warmup):
        return f"warmup_steps {warmup!r} is not a whole number >= 0"
    share = entry.get("warmup_share")
    if share is not None and warmup is not None and warmup != round(share * max_steps):
        return (f"warmup_steps: expected {round(share * max_steps)} (warm-up {share!r} of {max_steps} steps), found "
                f"{warmup}")
    if blocks is not None and not (isinstance(blocks, dict) and all(is_count(blocks.get(s)) for s in SPLITS)):
        return f"evaluated_blocks {blocks!r} is not a count of validation and test blocks"
    for name in ("training_seconds", "evaluation_seconds"):
        seconds = entry.get(name)
        if seconds is not None and not (is_number(seconds) and seconds >= 0):
            return f"{name} {seconds!r} is not a finite number of seconds >= 0"
    return None


def identity_problem(record: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """The first field of the record's identity that differs from ``expected``'s: its options (the paths of the
    data, the tokenizer and the model aside), its settings (its own style and alpha), the fingerprints it checked
    before it trained and those of the data its run read."""
    wanted, found = stored_options(expected["train_options"]), stored_options(record["train_options"])
    for name in sorted(set(wanted) | set(found)):
        if name not in KEYED_BY_CONTENT and wanted.get(name) != found.get(name):
            return f"{name}: expected {wanted.get(name)!r}, found {found.get(name)!r}"
    problem = settings_problem(record, expected["settings"], GeoNormSettings().to_dict())
    if problem is not None:
        return problem
    wanted, found = expected["fingerprints"], record["fingerprints"]
    for name in FINGERPRINTS:
        if found.get(name) != wanted[name]:
            return f"fingerprints.{name}: expected {wanted[name]!r}, found {found.get(name)!r}"
    facts = record["data"]
    if record["val_loss"] is not None or facts is not None:
        for name, fact in (("data", "fingerprint"), ("tokenizer", "tokenizer")):
            read = facts.get(fact) if isinstance(facts, dict) else None
            if read != expected["fingerprints"][name]:
                return f"data.{fact}: expected {expected['fingerprints'][name]!r}, found {read!r}"
    return None


def settings_problem(entry: dict[str, Any], shared: dict[str, Any], defaults: dict[str, Any]) -> str | None:
    """The first GeoNorm setting of ``entry`` that differs from ``shared`` (every run's, ``defaults`` for one a
    record predates) with its own style and alpha."""
    settings = entry["settings"]
    if not isinstance(settings, dict):
        return f"settings: expected a JSON object, found {settings!r}"
    wanted = {**defaults, **shared, "norm_style": entry["style"]}
    if entry["alpha"] is not None:
        wanted["geo_alpha"] = entry["alpha"]
    found = {**defaults, **settings}
    for name in sorted(set(wanted) | set(found)):
        if wanted.get(name) != found.get(name):
            return f"settings.{name}: expected {wanted.get(name)!r}, found {found.get(name)!r}"
    return None


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
