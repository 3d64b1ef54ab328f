"""Which folders ``--force`` may replace: empty ones, and hf-geonorm's own outputs holding nothing else.

Every folder that ``convert``, ``init``, ``train`` and ``sweep`` write carries ``.hf-geonorm-output.json``: the
command that wrote it and every path it wrote there, with each file's size (``record_paths``, ``mark_folder``). A
non-empty folder is an hf-geonorm output (``ownership_problem`` is None) when that marker is there and everything in
the folder is listed in it at its recorded size (a folder inside that carries its own marker, a sweep's run, is
checked against its own). A file added, grown or shrunk since, or a marker that does not parse, makes it someone
else's. A folder written before the marker existed is recognised by what it holds (``earlier_kind``): a GeoNorm
model (its card or a ``geonorm_*`` config), a run (checkpoints with run records, ``final/``, metrics) or a sweep (its
journal), with nothing else beside.

Never replaced, whatever they hold (``protected_reason``): ``/``, the user's home folder (``$HOME`` and the
account's), any folder that holds one of them, and a folder holding ``.git``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import stat
import uuid
from pathlib import Path
from typing import Any

LOCK_NAME = ".hf-geonorm.lock"  # an output folder's lock (hf_geonorm.files.output_lock): not content of the folder
MARKER_NAME = ".hf-geonorm-output.json"
MARKER_FORMAT = 1
_MARKER_BYTES = 64 << 20  # a marker lists paths: one larger than this is not one hf-geonorm wrote
# what an interrupted write of this package leaves next to its target (files.atomic, training.run.checkpoints): the
# next run removes it, so it is the tool's own, not the user's
_TEMPORARY = re.compile(r"\..+\.(partial|old)-\d+-[^/]+")
_SHOWN = 5


def is_own_name(name: str) -> bool:
    """Whether a folder entry named ``name`` is hf-geonorm's bookkeeping (lock, marker, a temporary folder)."""
    return name in (LOCK_NAME, MARKER_NAME) or _TEMPORARY.fullmatch(name) is not None


def _entries(folder: Path) -> list[str]:
    return sorted(entry.name for entry in folder.iterdir() if not is_own_name(entry.name))


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of ``folder`` (None when it has none, or one that is not a regular file or does not parse)."""
    path = folder / MARKER_NAME
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MARKER_BYTES:
            return None
        marker = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if (
        not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT
        or not isinstance(marker.get("command"), str) or not isinstance(marker.get("paths"), dict)
    ):  # fmt: skip
        return None
    return marker


def _listing(folder: Path, relative: str, trees: tuple[str, ...] = ()) -> dict[str, Any]:
    """``relative`` (a path under ``folder``) and everything under it, as a marker lists them: a file by its size,
    a folder as "folder", a folder with its own marker (an output inside this one) as "output"; ``trees``: folders
    that another writer fills on the run's behalf (TensorBoard's event files), listed as "tree" and owned whole."""
    path = folder / relative
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {}
    if not stat.S_ISDIR(info.st_mode):
        return {relative: info.st_size}
    if relative in trees:
        return {relative: "tree"}
    if relative and read_marker(path) is not None:
        return {relative: "output"}
    listed: dict[str, Any] = {relative: "folder"} if relative else {}
    for name in sorted(os.listdir(path)):
        if not is_own_name(name):
            listed.update(_listing(folder, f"{relative}/{name}" if relative else name, trees))
    return listed


def _write_marker(folder: Path, marker: dict[str, Any]) -> None:
    """Write ``marker`` in one step, never through a link: a new hidden file, then renamed over the marker."""
    tmp = folder / f".{MARKER_NAME}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(marker, file, indent=1, sort_keys=True)
        os.replace(tmp, folder / MARKER_NAME)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def mark_folder(folder: Path, command: str) -> None:
    """Mark ``folder`` as written whole by ``command``: every path now in it."""
    _write_marker(folder, {"format": MARKER_FORMAT, "command": command, "paths": _listing(folder, "")})


def record_paths(
    folder: Path, command: str, *paths: Path, trees: tuple[Path, ...] = (), fresh: bool = False
) -> None:
    """Add ``paths`` (inside ``folder``, with everything under them) to the marker of ``folder``, which ``command``
    writes over time (``train``, ``sweep``); ``trees`` among them are owned whole (``_listing``); ``fresh``: start
    a new marker (a run starting anew there)."""
    marker = None if fresh else read_marker(folder)
    listed = dict(marker["paths"]) if marker is not None and marker["command"] == command else {}
    for path in paths:
        relative = path.relative_to(folder).as_posix()
        listed = {key: value for key, value in listed.items() if key != relative and not key.startswith(relative + "/")}
        for parent in Path(relative).parents[:-1]:  # the folders it was written in (``logs/`` of ``logs/a.log``)
            listed[parent.as_posix()] = "folder"
        listed.update(_listing(folder, relative, tuple(tree.relative_to(folder).as_posix() for tree in trees)))
    _write_marker(folder, {"format": MARKER_FORMAT, "command": command, "paths": listed})


def _unlisted(folder: Path, listed: dict[str, Any], relative: str = "") -> list[str]:
    """The paths under ``folder / relative`` that ``listed`` does not account for (a listed file of another size
    counts as not listed: it changed since it was written)."""
    found = []
    for name in sorted(os.listdir(folder / relative if relative else folder)):
        if is_own_name(name):
            continue
        child = f"{relative}/{name}" if relative else name
        path = folder / child
        info = os.lstat(path)
        kind = listed.get(child)
        if stat.S_ISDIR(info.st_mode):
            if kind == "tree":
                continue
            if kind == "output" and ownership_problem(path) is None:
                continue
            if kind == "folder":
                found += _unlisted(folder, listed, child)
                continue
        elif kind == info.st_size and not isinstance(kind, bool):
            continue
        found.append(child + ("/" if stat.S_ISDIR(info.st_mode) else ""))
    return found


# ---- folders written before the marker existed ----

_MODEL_FILE = re.compile(
    r"config\.json|generation_config\.json|.+\.safetensors|.+\.safetensors\.index\.json|tokenizer.*\.(json|model)"
    r"|special_tokens_map\.json|vocab\.(json|txt)|merges\.txt|added_tokens\.json|chat_template\.jinja|README\.md"
    r"|geonorm_card\.json|geonorm_method\.md|[A-Za-z_][A-Za-z0-9_]*\.py|adapter_config\.json"
)
_CHECKPOINT_FILE = re.compile(
    rf"{_MODEL_FILE.pattern}|trainer_state\.json|training_args\.bin|optimizer\.pt|scheduler\.pt|scaler\.pt"
    r"|rng_state(_\d+)?\.pth|hf_geonorm_run\.json"
)
_RUN_FILE = re.compile(r"metrics\.json|loss_curve\.png")


def _files_only(folder: Path, pattern: re.Pattern[str]) -> bool:
    return all(pattern.fullmatch(name) and (folder / name).is_file() and not (folder / name).is_symlink()
               for name in _entries(folder))  # fmt: skip


def _is_model(folder: Path) -> bool:
    """A GeoNorm model folder (``convert``, ``init``, ``final/``): its card or a ``geonorm_*`` config, and nothing
    but the files a saved model holds."""
    if not folder.is_dir() or folder.is_symlink() or not _files_only(folder, _MODEL_FILE):
        return False
    if (folder / "geonorm_card.json").is_file():
        return True
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and str(config.get("model_type", "")).startswith("geonorm_")


def _is_checkpoint(folder: Path) -> bool:
    return (
        re.fullmatch(r"checkpoint-\d+", folder.name) is not None and folder.is_dir() and not folder.is_symlink()
        and (folder / "hf_geonorm_run.json").is_file() and _files_only(folder, _CHECKPOINT_FILE)
    )  # fmt: skip


def _is_run(folder: Path) -> bool:
    """A ``train`` output: checkpoints with their run records, ``final/``, metrics, plot, TensorBoard's ``runs/``."""
    names = _entries(folder)
    checks = {"final": _is_model, "runs": lambda path: path.is_dir() and not path.is_symlink()}
    found = False
    for name in names:
        path = folder / name
        if name.startswith("checkpoint-"):
            if not _is_checkpoint(path):
                return False
            found = True
        elif name in checks:
            if not checks[name](path):
                return False
            found = found or name == "final"
        elif not (_RUN_FILE.fullmatch(name) and path.is_file() and not path.is_symlink()):
            return False
    return found


def _is_sweep(folder: Path) -> bool:
    """A ``sweep`` output: its journal (with a header), report, plot, logs and runs."""
    journal = folder / "runs.jsonl"
    try:
        with open(journal, "rb") as file:
            header = json.loads(file.readline().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not isinstance(header, dict) or not isinstance(header.get("train_options"), dict):
        return False
    for name in _entries(folder):
        path = folder / name
        if path.is_symlink():
            return False
        if name == "logs":
            if not path.is_dir() or not all(n.endswith(".log") for n in _entries(path)):
                return False
        elif name == "runs":
            if not path.is_dir() or not all(ownership_problem(path / n) is None for n in _entries(path)):
                return False
        elif name not in ("runs.jsonl", "sweep.md", "sweep.png") or not path.is_file():
            return False
    return True


def earlier_kind(folder: Path) -> str | None:
    """What an output written before the marker existed is, judged by what it holds (None: not one)."""
    for kind, check in (("model", _is_model), ("run", _is_run), ("sweep", _is_sweep)):
        if check(folder):
            return kind
    return None


# ---- the rule ----


def _homes() -> list[Path]:
    homes = [Path.home()]
    with contextlib.suppress(KeyError, OSError):
        homes.append(Path(pwd.getpwuid(os.getuid()).pw_dir))
    resolved = []
    for home in homes:
        with contextlib.suppress(OSError, RuntimeError):
            resolved.append(home.resolve())
    return resolved


def protected_reason(folder: Path) -> str | None:
    """Why ``folder`` is never replaced, whatever it holds (None when it may be): ``/``, a home folder or one that
    holds it, a folder holding ``.git``."""
    real = folder.resolve()
    if real == Path(real.anchor):
        return "is the root folder"
    for home in _homes():
        if real == home:
            return "is your home folder"
        if real in home.parents:
            return f"holds your home folder {home}"
    if os.path.lexists(folder / ".git"):
        return "holds .git (a repository)"
    return None


def ownership_problem(folder: Path) -> str | None:
    """None when ``folder`` may be replaced by an hf-geonorm output: it is missing or empty, or hf-geonorm wrote it
    and it holds nothing else; otherwise what makes it someone else's, with up to five of the entries concerned."""
    if folder.is_symlink() or not os.path.lexists(folder):
        return None  # nothing, or only a link, is replaced: the folder a link points to is left as it is
    if not folder.is_dir():
        return "is not a folder"
    names = _entries(folder)
    if not names:
        return None
    marker = read_marker(folder)
    if marker is None:
        if earlier_kind(folder) is not None:
            return None
        return f"was not written by hf-geonorm (it holds {_shown(names)})"
    unlisted = _unlisted(folder, marker["paths"])
    if unlisted:
        return (
            f"holds what hf-geonorm's {marker['command']} did not write there, or changed since "
            f"({_shown(unlisted)})"
        )
    return None


def _shown(names: list[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


class NotAnOutput(ValueError):
    """``--force`` was asked to replace a folder that is not (only) an hf-geonorm output."""


def check_replaceable(folder: Path, given: str | os.PathLike, option: str = "OUTPUT_DIR") -> None:
    """``NotAnOutput`` unless ``folder`` (as the user ``given`` it) may be replaced: see ``ownership_problem`` and
    ``protected_reason``."""
    reason = protected_reason(folder)
    if reason is not None:
        raise NotAnOutput(f"{option} {given} {reason}, which hf-geonorm never replaces, not even with --force: give "
                          "another folder")  # fmt: skip
    problem = ownership_problem(folder)
    if problem is not None:
        raise NotAnOutput(
            f"{option} {given} {problem}: --force replaces only an empty folder or one that hf-geonorm wrote; give "
            "another folder, or empty it yourself"
        )


def adopt_earlier_output(folder: Path, command: str) -> None:
    """Give a folder that ``command`` wrote before the marker existed (``earlier_kind``) its marker, listing what it
    holds, before ``command`` adds to it (a resumed run, a resumed sweep); anything else is left unmarked."""
    if read_marker(folder) is None and earlier_kind(folder) is not None:
        mark_folder(folder, command)


def only_bookkeeping_left(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but hf-geonorm's lock, marker and temporary folders; then its marker is
    removed, so that an output left empty can be removed as an empty folder."""
    try:
        if _entries(folder):
            return False
        (folder / MARKER_NAME).unlink(missing_ok=True)
    except OSError:
        return False
    return True
