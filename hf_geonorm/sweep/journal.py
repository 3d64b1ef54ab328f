"""The journal of ``hf-geonorm sweep``, ``DIR/runs.jsonl``: a header line (the sweep's identity: the train options
every run shares, their GeoNorm settings and the fingerprints of the data, the tokenizer and the model; the sweep
options it began with; a digest, ``record.sweep_header``), then one line per finished run, each with its own
identity, appended and synced as each run ends. A sweep resumes from it, so it is checked before it is trusted:

- a last line cut short by a stop (no newline, not JSON) is dropped and the file repaired, and its run trains again;
- a UTF-8 byte order mark before the header (a journal an editor saved as "UTF-8 with BOM") is read past;
- the header must be whole and unedited (its digest), and every other line a whole run of this sweep
  (``record.check_record``): JSON, the fields of a run with finite values, named as its own run, and its options,
  settings and fingerprints those of the header, field by field; no run twice. Anything else is refused with its
  line number and the field, so that a damaged, edited or foreign line never mixes into a report;
- the data, the tokenizer and the model are keyed by their content, not by the spelling of their paths.

A journal of format 1 (an earlier hf-geonorm: its lines record neither their options nor the model's content) is
read with the checks its lines allow (``summary``, the study's tables); ``sweep`` appends to none (``grid``).
"""

from __future__ import annotations

import codecs
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._plumbing.text_files import open_no_follow
from ..modeling.settings import GeoNormSettings
from ..training.options import TrainOptions
from .record import (
    FORMAT,
    KEYED_BY_CONTENT,
    cell_problem,
    header_problem,
    journal_key,
    record_problem,
    result_problem,
    stored_options,
)

JOURNAL = "runs.jsonl"
LEGACY_FORMAT = 1  # read, never appended to
DATA_KEY = ("fingerprint", "tokenizer")  # a format-1 header's data_key: the data's and the tokenizer's fingerprints
BOM = codecs.BOM_UTF8  # what an editor saving "UTF-8 with BOM" puts before the header: read past
WHY_NO_LINK = "the sweep appends each finished run to its journal itself"


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

    @property
    def legacy(self) -> bool:
        """Whether the journal is of format 1, whose lines do not carry their identity."""
        return self.header is not None and self.header.get("format") == LEGACY_FORMAT


def header_options(header: dict[str, Any]) -> dict[str, Any]:
    """The train options of a header, as they are compared (``record.stored_options``)."""
    return stored_options(header["train_options"])


def read_journal(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The header and the finished runs of a journal (none when it does not exist), every line checked; a last line
    cut short by a stop is left out (``open`` in ``sweep`` repairs the file)."""
    journal = load_journal(path)
    return journal.header, journal.entries


def refuse_link(path: Path) -> None:
    """A journal that is a symbolic link would take this sweep's runs into the file it points to (another sweep's
    journal): ``JournalError`` naming the link, as a run's log or a lock file that is one."""
    if path.is_symlink():
        raise JournalError(
            f"{path} is a symbolic link (to {os.readlink(path)}): {WHY_NO_LINK}, never through a link, which would "
            "write into the file it points to; remove the link and run the command again"
        )


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
    if isinstance(header, dict) and header.get("format") == LEGACY_FORMAT and isinstance(header.get("train_options"),
                                                                                        dict):  # fmt: skip
        key = header.get("data_key")
        if key is not None and not (isinstance(key, dict) and all(isinstance(key.get(n), str) for n in DATA_KEY)):
            raise _damaged(path, number, "its data_key is not the data's and the tokenizer's fingerprints")
        return header
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise JournalError(
            f"{path}, line {number}: not the header of an hf-geonorm sweep journal (format {FORMAT}); give another "
            "--output"
        )
    problem = header_problem(header)
    if problem is not None:
        raise _damaged(path, number, problem)
    return header


def _checked_entry(path: Path, number: int, entry: Any, journal: Journal, seen: dict[tuple, int]) -> dict[str, Any]:
    """``entry`` if it is a finished run of this journal's sweep; else the error naming its line and field."""
    header = journal.header or {}
    problem = _legacy_problem(entry, journal) if journal.legacy else record_problem(entry, header)
    if problem is not None:
        raise _damaged(path, number, problem)
    key = entry_key(entry)
    if key in seen:
        raise _damaged(path, number, f"run {entry['run']} again (first on line {seen[key]})")
    seen[key] = number
    return entry


def _legacy_problem(entry: Any, journal: Journal) -> str | None:
    """What a line of a format-1 journal can be checked for: a whole run of the header's steps with the settings
    the header gave, on the data its runs recorded."""
    if not isinstance(entry, dict):
        return "not a run (a JSON object)"
    missing = [name for name in ("run", "style", "alpha", "lr", "seed", "val_loss", "test_loss", "settings", "steps",
                                 "tokens") if name not in entry]  # fmt: skip
    if missing:
        return f"a run without {', '.join(missing)}"
    options = header_options(journal.header or {"train_options": {}})
    problem = cell_problem(entry) or result_problem(entry, options["max_steps"])
    if problem is not None:
        return problem
    settings = entry["settings"]
    if not isinstance(settings, dict):
        return f"settings: expected a JSON object, found {settings!r}"
    expected = {**options["settings"], "norm_style": entry["style"]}  # only the settings the header gave are known
    if entry["alpha"] is not None:
        expected["geo_alpha"] = entry["alpha"]
    for name, value in expected.items():
        if settings.get(name) != value:
            return f"settings.{name}: expected {value!r}, found {settings.get(name)!r}"
    return _legacy_data_problem(entry, journal)


def _legacy_data_problem(entry: dict[str, Any], journal: Journal) -> str | None:
    facts = entry.get("data")
    if facts is None:
        return None
    if not (isinstance(facts, dict) and all(isinstance(facts.get(name), str) for name in DATA_KEY)):
        return "its data facts lack the data's and the tokenizer's fingerprints"
    reference = data_reference(journal)
    changed = [name for name in DATA_KEY if reference is not None and facts[name] != reference[name]]
    if changed:
        return f"a run on other data (its {' and '.join(changed)} fingerprint differs from the sweep's)"
    return None


def data_reference(journal: Journal) -> dict[str, str] | None:
    """The data's and the tokenizer's fingerprints the journal's runs trained on: the header's, else (a format-1
    header written before they were recorded) the first run's that recorded them; None when nothing recorded them."""
    header = journal.header
    if header is not None and isinstance(header.get("fingerprints"), dict):
        return {"fingerprint": header["fingerprints"]["data"], "tokenizer": header["fingerprints"]["tokenizer"]}
    if header is not None and header.get("data_key") is not None:
        return {name: header["data_key"][name] for name in DATA_KEY}
    for entry in journal.entries:
        if isinstance(entry.get("data"), dict):
            return {name: entry["data"][name] for name in DATA_KEY}
    return None


def entry_key(entry: dict[str, Any]) -> tuple:
    """The cell of the grid a journal line holds (as ``protocol.Run.key``): its warm-up share where the sweep tunes
    it."""
    return (entry["style"], entry["alpha"], entry["lr"], entry["seed"], entry.get("warmup_share"))


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
    """Refuse a sweep whose shaping options differ from the header's (the paths of the data, the tokenizer and the
    model aside: their content is compared, ``check_identity``)."""
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
    """Refuse data or a tokenizer whose content (``data_key``: ``fingerprint``, ``tokenizer``) differs from what the
    journal's runs trained on; where nothing recorded that content (a format-1 journal of an earlier hf-geonorm),
    the paths as spelled then."""
    reference = data_reference(journal)
    if reference is None:
        if journal.header is None:
            return
        before, now = header_options(journal.header), journal_key(train)
        changed = [f"--{name} {before.get(name)!r} there, {now.get(name)!r} now" for name in ("data", "tokenizer")
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


def check_identity(journal: Journal, train: TrainOptions, identity: dict[str, Any]) -> None:
    """Refuse a sweep whose identity as measured now (``identity.sweep_identity``: before each run) differs from
    the header's: its options, the content of its data, tokenizer and model, the settings its runs share."""
    check_options(journal, train)
    marks = identity["fingerprints"]
    check_data(journal, train, {"fingerprint": marks["data"], "tokenizer": marks["tokenizer"]})
    header = journal.header
    if header is None or journal.legacy:
        return
    there, now = header["fingerprints"]["model"], marks["model"]
    if there != now:
        raise JournalError(
            f"{journal.path} holds runs of another model: the model fingerprint (of its config and weight files) "
            f"differs ({_short(there)} there, {_short(now)} now), so the --model folder was changed or names another "
            "model; a sweep compares runs of the same model: give that model, or another --output"
        )
    defaults = GeoNormSettings().to_dict()  # a setting added since the sweep began: its runs ran its default
    before, now = {**defaults, **header["settings"]}, {**defaults, **identity["settings"]}
    changed = [f"{name} {before.get(name)!r} there, {now.get(name)!r} now" for name in sorted(set(before) | set(now))
               if name != "norm_style" and before.get(name) != now.get(name)]  # fmt: skip
    if changed:
        raise JournalError(
            f"{journal.path} holds runs with other GeoNorm settings ({'; '.join(changed)}): the --model folder's "
            "stored settings or the library's defaults changed; a sweep compares runs that differ only in style, "
            "alpha, rate and seed: give another --output"
        )


def _short(fingerprint: str | None) -> str:
    return "none (--arch)" if fingerprint is None else fingerprint[:12]


def begin_journal(path: Path, header: dict[str, Any]) -> None:
    """A new journal: its header (``record.sweep_header``), never written through a link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, WHY_NO_LINK), "wb"):
        pass
    append(path, header)


def append(path: Path, entry: dict[str, Any]) -> None:
    """One line more in the journal, on disk before the next run starts; never through a link."""
    with open(open_no_follow(path, os.O_WRONLY | os.O_APPEND, WHY_NO_LINK), "w", encoding="utf-8") as f:
        f.write(json.dumps(entry, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
