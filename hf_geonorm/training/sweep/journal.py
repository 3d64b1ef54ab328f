"""The journal of ``hf-geonorm sweep``, ``DIR/runs.jsonl``: a header line (the train options every run shares, and
since this format the data's and the tokenizer's fingerprints), then one line per finished run, appended and
synced as each run ends. A sweep resumes from it, so it is checked before it is trusted:

- a last line cut short by a stop (no newline, not JSON) is dropped and the file repaired, and its run trains again;
- a UTF-8 byte order mark before the header (a journal an editor saved as "UTF-8 with BOM") is read past;
- every other line must be a whole run of this sweep: JSON, the fields of a run with finite values, named as its
  own run, with the header's steps, settings and data, and no run twice; anything else is refused with its line
  number, so that a damaged or edited journal never mixes into a report;
- the data is keyed by its content: the fingerprints of the data and of the tokenizer, not the spelling of the
  path (a header written before they were recorded falls back to the runs' recorded data facts, then to the path).
"""

from __future__ import annotations

import codecs
import json
import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ...modeling.settings import NORM_STYLES
from ..options import MAX_SEED, TrainOptions
from .options import outside_sweep_key
from .table import run_name

JOURNAL = "runs.jsonl"
JOURNAL_FORMAT = 1
NOT_IN_KEY = outside_sweep_key()  # left out of the journal's key, as TrainOptions declares
# options naming files whose content the header's data fingerprints key: their spelling may change
KEYED_BY_CONTENT = ("data", "tokenizer")
RUN_FIELDS = ("run", "style", "alpha", "lr", "seed", "val_loss", "test_loss")
SPLITS = ("validation", "test")  # a run's evaluated_blocks
DATA_KEY = ("fingerprint", "tokenizer")  # the header's data_key: the data's and the tokenizer's fingerprints
BOM = codecs.BOM_UTF8  # what an editor saving "UTF-8 with BOM" puts before the header: read past


class JournalError(ValueError):
    """A journal that cannot be trusted: the message names the file, the line and the way out."""


@dataclass
class Journal:
    """A journal as read from disk: its header and finished runs, and what a stop left to repair."""

    path: Path
    header: dict[str, Any] | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)
    whole_bytes: int = 0  # the length of the part made of whole, checked lines
    cut_line: int | None = None  # the number of a last line cut short by a stop (dropped)
    needs_newline: bool = False  # the last line is whole but its newline was not written


def journal_key(train: TrainOptions) -> dict[str, Any]:
    """What every run of a sweep shares: the train options that shape a run (not where it writes, nor the rate
    and seed the grid sets), as the header holds them (JSON: tuples as lists)."""
    return json.loads(json.dumps({name: value for name, value in asdict(train).items() if name not in NOT_IN_KEY}))


def option_defaults() -> dict[str, Any]:
    """The default of every train option, as a journal holds it: an option that a journal's header lacks was added
    to hf-geonorm after the journal was started, and its runs ran with what its default does."""
    defaults = {f.name: f.default for f in fields(TrainOptions) if f.default is not MISSING}
    defaults |= {f.name: f.default_factory() for f in fields(TrainOptions) if f.default_factory is not MISSING}
    return json.loads(json.dumps({name: value for name, value in defaults.items() if name not in NOT_IN_KEY}))


def header_options(header: dict[str, Any]) -> dict[str, Any]:
    """The train options of a header, the options it predates at their defaults."""
    return {**option_defaults(), **header["train_options"]}


def read_journal(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The header and the finished runs of a journal (none when it does not exist), every line checked; a last line
    cut short by a stop is left out (``open`` in ``sweep`` repairs the file)."""
    journal = load_journal(path)
    return journal.header, journal.entries


def load_journal(path: Path) -> Journal:
    """Read and check ``path`` line by line (``JournalError`` naming the first bad line)."""
    journal = Journal(path)
    if not os.path.lexists(path):
        return journal
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not a file"
        raise JournalError(f"{path} is {what}, not a sweep journal: move it away, or give another --output")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise JournalError(f"cannot read {path}: {error.strerror or error}") from None
    lines = data.split(b"\n")
    ended = lines[-1] == b""  # the file ends with a newline: every line is whole
    if ended:
        lines.pop()
    offset, seen = 0, {}
    for number, raw in enumerate(lines, 1):
        last_unended = number == len(lines) and not ended
        text = raw[len(BOM) :] if number == 1 and raw.startswith(BOM) else raw  # saved as "UTF-8 with BOM"
        try:
            entry = json.loads(text.decode("utf-8")) if text.strip() else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            if last_unended:  # written in part when the sweep was stopped: its run trains again
                journal.cut_line = number
                break
            if text.startswith(BOM):  # files joined end to end, the second saved with a mark
                raise _damaged(path, number, "it starts with a UTF-8 byte order mark (EF BB BF), which only the "
                                             "file's start may hold") from None  # fmt: skip
            raise _damaged(path, number, "not a line of JSON") from None
        if entry is not None:
            if journal.header is None:
                journal.header = _checked_header(path, number, entry)
            else:
                journal.entries.append(_checked_entry(path, number, entry, journal, seen))
        offset += len(raw) + 1
        journal.needs_newline = last_unended
    journal.whole_bytes = min(offset, len(data))
    return journal


def _damaged(path: Path, number: int, problem: str) -> JournalError:
    return JournalError(
        f"{path}, line {number}: {problem}; the journal holds one line per finished run of this sweep: remove that "
        "line (its run trains again), or give another --output"
    )


def _checked_header(path: Path, number: int, header: Any) -> dict[str, Any]:
    if (
        not isinstance(header, dict) or header.get("format") != JOURNAL_FORMAT
        or not isinstance(header.get("train_options"), dict)
    ):  # fmt: skip
        raise JournalError(
            f"{path}, line {number}: not the header of an hf-geonorm sweep journal (format {JOURNAL_FORMAT}); give "
            "another --output"
        )
    key = header.get("data_key")
    if key is not None and not (isinstance(key, dict) and all(isinstance(key.get(n), str) for n in DATA_KEY)):
        raise _damaged(path, number, "its data_key is not the data's and the tokenizer's fingerprints")
    return header


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _checked_entry(path: Path, number: int, entry: Any, journal: Journal, seen: dict[tuple, int]) -> dict[str, Any]:
    """``entry`` if it is a finished run of this journal's sweep; else the error naming its line."""
    if not isinstance(entry, dict):
        raise _damaged(path, number, "not a run (a JSON object)")
    missing = [name for name in RUN_FIELDS if name not in entry]
    if missing:
        raise _damaged(path, number, f"a run without {', '.join(missing)}")
    style, alpha, lr, seed = entry["style"], entry["alpha"], entry["lr"], entry["seed"]
    if style not in NORM_STYLES:
        raise _damaged(path, number, f"style {style!r} is none of {', '.join(NORM_STYLES)}")
    if not (_is_number(lr) and lr > 0):
        raise _damaged(path, number, f"lr {lr!r} is not a positive finite number")
    if alpha is not None and not (_is_number(alpha) and alpha >= 0):
        raise _damaged(path, number, f"alpha {alpha!r} is not a finite number >= 0")
    if not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED):
        raise _damaged(path, number, f"seed {seed!r} is not a whole number from 0 to {MAX_SEED}")
    losses = [entry["val_loss"], entry["test_loss"]]
    if any(loss is not None and not _is_number(loss) for loss in losses) or (losses.count(None) == 1):
        raise _damaged(path, number, f"val_loss {losses[0]!r}, test_loss {losses[1]!r}: not two finite losses, nor "
                                     "a diverged run's two nulls")  # fmt: skip
    expected = run_name(style, alpha, lr, seed)
    if entry["run"] != expected:
        raise _damaged(path, number, f"run {entry['run']!r} is not the name of its own run ({expected})")
    options = header_options(journal.header or {"train_options": {}})
    _check_settings(path, number, entry, options)
    steps = entry.get("steps")
    if losses[0] is not None and steps != options["max_steps"]:
        raise _damaged(path, number, f"a run of {steps} steps in a sweep of --max-steps {options['max_steps']}")
    _check_data_facts(path, number, entry, journal)
    _check_recorded(path, number, entry)
    key = entry_key(entry)
    if key in seen:
        raise _damaged(path, number, f"run {expected} again (first on line {seen[key]})")
    seen[key] = number
    return entry


def _check_settings(path: Path, number: int, entry: dict[str, Any], options: dict[str, Any]) -> None:
    settings = entry.get("settings")
    if settings is None:
        return
    if not isinstance(settings, dict):
        raise _damaged(path, number, "its settings are not a JSON object")
    expected = {**options["settings"], "norm_style": entry["style"]}
    if entry["alpha"] is not None:
        expected["geo_alpha"] = entry["alpha"]
    changed = [f"{name} {settings.get(name)!r} (the sweep's: {value!r})" for name, value in expected.items()
               if settings.get(name) != value]  # fmt: skip
    if changed:
        raise _damaged(path, number, f"a run with other settings: {', '.join(changed)}")


def _check_recorded(path: Path, number: int, entry: dict[str, Any]) -> None:
    """What a run recorded of how it ran (absent from a journal of an earlier hf-geonorm), which the report states
    and the time estimate reads: whole numbers of steps and blocks, finite seconds."""
    warmup, blocks = entry.get("warmup_steps"), entry.get("evaluated_blocks")
    if warmup is not None and not _is_count(warmup):
        raise _damaged(path, number, f"warmup_steps {warmup!r} is not a whole number >= 0")
    if blocks is not None and not (isinstance(blocks, dict) and all(_is_count(blocks.get(s)) for s in SPLITS)):
        raise _damaged(path, number, f"evaluated_blocks {blocks!r} is not a count of validation and test blocks")
    for name in ("training_seconds", "evaluation_seconds"):
        seconds = entry.get(name)
        if seconds is not None and not (_is_number(seconds) and seconds >= 0):
            raise _damaged(path, number, f"{name} {seconds!r} is not a finite number of seconds >= 0")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_data_facts(path: Path, number: int, entry: dict[str, Any], journal: Journal) -> None:
    facts = entry.get("data")
    if facts is None:
        return
    if not (isinstance(facts, dict) and all(isinstance(facts.get(name), str) for name in DATA_KEY)):
        raise _damaged(path, number, "its data facts lack the data's and the tokenizer's fingerprints")
    reference = data_reference(journal)
    changed = [name for name in DATA_KEY if reference is not None and facts[name] != reference[name]]
    if changed:
        raise _damaged(path, number, f"a run on other data (its {' and '.join(changed)} fingerprint differs from "
                                     "the sweep's)")  # fmt: skip


def data_reference(journal: Journal) -> dict[str, str] | None:
    """The data's and the tokenizer's fingerprints the journal's runs trained on: the header's, else (a header
    written before they were recorded) the first run's that recorded them; None when nothing recorded them."""
    if journal.header is not None and journal.header.get("data_key") is not None:
        return {name: journal.header["data_key"][name] for name in DATA_KEY}
    for entry in journal.entries:
        if isinstance(entry.get("data"), dict):
            return {name: entry["data"][name] for name in DATA_KEY}
    return None


def entry_key(entry: dict[str, Any]) -> tuple:
    """The cell of the grid a journal line holds."""
    return (entry["style"], entry["alpha"], entry["lr"], entry["seed"])


def repair(journal: Journal, log: Any) -> None:
    """Drop a last line cut short by a stop (or end a whole one with its newline), so that the next line appended
    starts a line of its own."""
    if journal.cut_line is not None:
        os.truncate(journal.path, journal.whole_bytes)
        log(f"warning: {journal.path}, line {journal.cut_line} was cut short when the sweep was stopped: dropped "
            "(its run trains again)")  # fmt: skip
    elif journal.needs_newline:
        with open(journal.path, "a", encoding="utf-8") as f:
            f.write("\n")


def check_options(journal: Journal, train: TrainOptions) -> None:
    """Refuse a sweep whose shaping options differ from the header's (the paths of the data and the tokenizer
    aside: their content is compared, ``check_data``)."""
    if journal.header is None:
        return
    before = {n: v for n, v in header_options(journal.header).items() if n not in KEYED_BY_CONTENT}
    now = {n: v for n, v in journal_key(train).items() if n not in KEYED_BY_CONTENT}
    changed = [f"{name} {before.get(name)!r} there, {now.get(name)!r} now" for name in sorted(set(before) | set(now))
               if before.get(name) != now.get(name)]  # fmt: skip
    if changed:
        raise JournalError(
            f"{journal.path} holds runs made with other options ({'; '.join(changed)}): a sweep compares runs that "
            "differ only in style, alpha, rate and seed; give the options it was started with, or another --output"
        )


def check_data(journal: Journal, train: TrainOptions, data_key: dict[str, str]) -> None:
    """Refuse data or a tokenizer whose content differs from what the journal's runs trained on; where nothing
    recorded that content (a journal of an earlier hf-geonorm), the paths as spelled then."""
    reference = data_reference(journal)
    if reference is None:
        if journal.header is None:
            return
        before, now = header_options(journal.header), journal_key(train)
        changed = [f"--{name} {before.get(name)!r} there, {now.get(name)!r} now" for name in KEYED_BY_CONTENT
                   if before.get(name) != now.get(name)]  # fmt: skip
        if changed:
            raise JournalError(
                f"{journal.path} holds runs on other data ({'; '.join(changed)}; this journal predates the data's "
                "fingerprints, so the paths are compared): give the data it was started with, or another --output"
            )
        return
    changed = [name for name in DATA_KEY if reference[name] != data_key[name]]
    if changed:
        raise JournalError(
            f"{journal.path} holds runs on other data: the {' and '.join(changed)} fingerprint differs "
            f"({', '.join(f'{reference[n][:12]} there, {data_key[n][:12]} now' for n in changed)}), so the file was "
            "changed or --data names other data; a sweep compares runs on the same data: give that data, or another "
            "--output"
        )


def start_journal(path: Path, train: TrainOptions, data_key: dict[str, str]) -> None:
    """A new journal: its header, with the fingerprints of the data and the tokenizer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    append(path, {"format": JOURNAL_FORMAT, "train_options": journal_key(train), "data_key": data_key})


def append(path: Path, entry: dict[str, Any]) -> None:
    """One line more in the journal, on disk before the next run starts."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
