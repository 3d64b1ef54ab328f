"""Which folders ``--force`` may replace, and which temporary folders hf-geonorm may remove: only what it can prove
it wrote, never what merely looks like its output.

Every folder that ``convert``, ``init``, ``train`` and ``sweep`` write carries ``.hf-geonorm-output.json``, the
marker: the command that wrote it and every path it wrote there, each file with its proof, taken when it was
written: its stat (``file_proof``: size, modification and change times in nanoseconds, inode) and the SHA-256 of its
bytes (``file_entry``). A non-empty folder is an hf-geonorm output (``ownership_problem`` is None) only when the
marker is there and everything in the folder is listed in it with the same stat (a folder inside that carries its own
marker, ``final/`` or a sweep's run, is checked against its own). Anything else makes the whole folder the user's:
a file added, written again, or replaced since (a copy has other inodes; a write, even of the same size, sets the
change time, which no program can set back), a marker that does not parse, a nested ``.git``, and any folder without
a marker (a folder ``save_pretrained`` wrote, or one an earlier hf-geonorm wrote before the marker proved its files,
or listed them without a hash).

The stat is checked first, on every entry (cheap: a changed file is refused at once); the hash of every file about
to go is checked right before ``--force`` replaces a folder (``check_replaceable`` with ``contents``) and before a run
removes its own checkpoints (``changed_file``), to catch a same-length edit that left the stat as it was (file times
that advance only every few milliseconds on older kernels).

The marker lists what is on disk now and stays small: it is a header line and one line per update, appended
(``record_paths``); an update drops the listed paths that are gone (rotated checkpoints), and when the lines
outgrow twice what they list, the file is rewritten whole with that listing (``_MARKER_SLACK``).

A temporary folder (``temporary_folder``: ``.NAME.partial-PID-XXXXXXXX`` or ``.NAME.old-PID-XXXXXXXX``) holds
``.hf-geonorm-temporary.json``, the identity of the process that made it (its host and process number) and of the
folder itself (its inode): a leftover is removed only with that proof (``temporary_owner``), never by its name.

Never replaced, whatever they hold (``protected_reason``): ``/``, the user's home folder (``$HOME`` and the
account's), any folder that holds one of them, and a folder holding ``.git``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import re
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any

LOCK_NAME = ".hf-geonorm.lock"  # an output folder's lock (hf_geonorm._plumbing.output_lock): not content of the folder
MARKER_NAME = ".hf-geonorm-output.json"
TEMPORARY_NAME = ".hf-geonorm-temporary.json"  # in a temporary folder: who made it
MARKER_FORMAT = 2
_MARKER_BYTES = 64 << 20  # a marker lists what is on disk: one larger than this is not one hf-geonorm wrote
_MARKER_SLACK = 4096  # the appended lines may outgrow twice the listing by this much before a rewrite
_TEMPORARY = re.compile(r"\.(.+)\.(partial|old)-(\d+)-[^/]+")
_SHOWN = 5
_CHUNK = 8 << 20  # bytes hashed at a time: hashlib releases the GIL on chunks this size
FOLDER, OUTPUT = "folder", "output"  # how a marker lists a folder, and a folder with its own marker


def file_proof(info: os.stat_result) -> list[int]:
    """The stat half of a file's proof: size, modification and change times (ns), inode. A write of any
    size sets both times, a copy or a replacement has another inode, and the change time cannot be set back."""
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def _open_regular(path: Path) -> int | None:
    """A descriptor of the regular file ``path``, opened without following a link or blocking on a pipe; None for
    anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def _sha256(fd: int) -> str:
    digest = hashlib.sha256()
    while chunk := os.read(fd, _CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def file_entry(path: Path) -> list[int | str] | None:
    """How a marker lists the regular file ``path``: its stat proof, taken on the open file before its bytes are read
    (a write while they are hashed changes the change time, so the entry then proves nothing), and their SHA-256.
    None for anything but a regular file, which no marker lists."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        return [*file_proof(os.fstat(fd)), _sha256(fd)]
    finally:
        os.close(fd)


def _stat_matches(entry: Any, info: os.stat_result) -> bool:
    return isinstance(entry, list) and entry[:4] == file_proof(info)


# ---- temporary folders ----


def _read_small_json(path: Path, limit: int) -> Any:
    """The JSON in the regular file ``path`` of at most ``limit`` bytes (None otherwise), never through a link."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        return json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def mark_temporary(folder: Path, target: str, pid: int | None = None) -> None:
    """Put into ``folder`` the proof that process ``pid`` (this one by default) of this host made it as a temporary
    folder for ``target`` (the name its ``.NAME.partial-PID-...`` spells): ``temporary_owner`` reads it."""
    record = {"format": MARKER_FORMAT, "temporary_for": target, "pid": os.getpid() if pid is None else pid,
              "host": socket.gethostname(), "folder_inode": os.lstat(folder).st_ino}  # fmt: skip
    fd = os.open(folder / TEMPORARY_NAME, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump(record, file)


def temporary_folder(parent: Path, target: str, kind: str = "partial") -> Path:
    """A new hidden folder ``.TARGET.KIND-PID-XXXXXXXX`` in ``parent``, with the proof that this process made it."""
    path = Path(tempfile.mkdtemp(prefix=f".{target}.{kind}-{os.getpid()}-", dir=parent))
    try:
        mark_temporary(path, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        raise
    return path


def temporary_owner(path: Path) -> dict[str, Any] | None:
    """The record of the hf-geonorm process that made the temporary folder ``path`` (``mark_temporary``), when
    ``path`` carries the proof: its name spells that process and target, and the record names this very folder.
    None for anything else, whatever its name."""
    match = _TEMPORARY.fullmatch(path.name)
    if match is None:
        return None
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    record = _read_small_json(path / TEMPORARY_NAME, 4096)
    if (
        not isinstance(record, dict) or record.get("format") != MARKER_FORMAT
        or record.get("temporary_for") != match.group(1) or record.get("pid") != int(match.group(3))
        or record.get("folder_inode") != info.st_ino or not isinstance(record.get("host"), str)
    ):  # fmt: skip
        return None
    return {**record, "kind": match.group(2)}


def is_bookkeeping(path: Path) -> bool:
    """Whether the entry ``path`` is hf-geonorm's bookkeeping rather than content: the lock, the marker, the proof of
    a temporary folder, or a proven temporary folder (``temporary_owner``)."""
    return path.name in (LOCK_NAME, MARKER_NAME, TEMPORARY_NAME) or temporary_owner(path) is not None


def _entries(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if not is_bookkeeping(folder / name))


# ---- the marker ----


def _is_entry(value: Any) -> bool:
    """A folder, an output, or a file's stat proof and SHA-256 (a marker listing files without one does not parse:
    what it lists is the user's)."""
    return value in (FOLDER, OUTPUT) or (
        isinstance(value, list) and len(value) == 5 and all(type(item) is int for item in value[:4])
        and isinstance(value[4], str) and len(value[4]) == 64
    )


def _apply(paths: dict[str, Any], update: dict[str, Any]) -> bool:
    """Apply one marker line's update to ``paths`` in place (its ``drop``: paths removed with all under them, then
    its ``set``); False when the line is not an update."""
    drop, listed = update.get("drop", []), update.get("set", {})
    if not isinstance(drop, list) or not isinstance(listed, dict) or not all(isinstance(d, str) for d in drop):
        return False
    if not all(_is_entry(value) for value in listed.values()):
        return False
    for gone in drop:
        for key in [key for key in paths if key == gone or key.startswith(gone + "/")]:
            del paths[key]
    paths.update(listed)
    return True


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of ``folder``: its ``command`` and the ``paths`` it lists now (None when it has none, or one that
    is not a regular file or does not parse). A last line cut short (a write stopped) is left out; ``whole`` says
    whether the file ends with a whole line, ``size`` its bytes."""
    path = folder / MARKER_NAME
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MARKER_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    lines = data.split(b"\n")
    whole = lines[-1] == b""
    lines = lines[:-1]  # the empty rest after the last newline, or a line cut short
    try:
        header = json.loads(lines[0]) if lines else None
        updates = [json.loads(line) for line in lines[1:]]
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(header, dict) or header.get("format") != MARKER_FORMAT or not isinstance(header.get("command"),
                                                                                                str):  # fmt: skip
        return None
    paths: dict[str, Any] = {}
    if not all(isinstance(update, dict) and _apply(paths, update) for update in updates):
        return None
    return {"command": header["command"], "paths": paths, "whole": whole, "size": len(data)}


def _listing(folder: Path, relative: str) -> dict[str, Any]:
    """``relative`` (a path under ``folder``) and everything under it, as a marker lists them: a file by its proof
    (``file_entry``; anything but a regular file is left out, so the folder is not proven), a folder as ``FOLDER``, a
    folder with its own marker (an output inside this one) as ``OUTPUT``."""
    path = folder / relative
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {}
    if not stat.S_ISDIR(info.st_mode):
        entry = file_entry(path)
        return {} if entry is None else {relative: entry}
    if relative and read_marker(path) is not None:
        return {relative: OUTPUT}
    listed: dict[str, Any] = {relative: FOLDER} if relative else {}
    for name in _entries(path):
        listed.update(_listing(folder, f"{relative}/{name}" if relative else name))
    return listed


def _lines(*entries: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(entry, separators=(",", ":"), sort_keys=True).encode("utf-8") + b"\n"
                    for entry in entries)  # fmt: skip


def _write_marker(folder: Path, command: str, paths: dict[str, Any]) -> None:
    """Write the marker of ``folder`` whole, in one step and never through a link: into a temporary folder, then
    moved over the marker."""
    text = _lines({"format": MARKER_FORMAT, "command": command}, *([{"set": paths}] if paths else []))
    tmp = temporary_folder(folder, MARKER_NAME)
    try:
        (tmp / MARKER_NAME).write_bytes(text)
        os.replace(tmp / MARKER_NAME, folder / MARKER_NAME)
    finally:
        for name in (MARKER_NAME, TEMPORARY_NAME):
            with contextlib.suppress(FileNotFoundError):
                (tmp / name).unlink()
        os.rmdir(tmp)


def mark_folder(folder: Path, command: str) -> None:
    """Mark ``folder`` as written whole by ``command``: every path now in it, with its proof."""
    _write_marker(folder, command, _listing(folder, ""))


def record_paths(folder: Path, command: str, *paths: Path, fresh: bool = False) -> None:
    """Record ``paths`` (inside ``folder``, with everything under them, as they are now) in the marker of
    ``folder``, which ``command`` writes over time (``train``, ``sweep``), and drop the listed entries that are gone;
    ``fresh``: start a new marker (a run starting anew there). The update is appended as one line; the marker is
    rewritten whole only when it has none, is cut short, or its lines outgrow twice what they list."""
    marker = None if fresh else read_marker(folder)
    ours = marker is not None and marker["command"] == command
    listed = dict(marker["paths"]) if ours else {}
    update: dict[str, Any] = {"drop": sorted(key for key in listed if "/" not in key
                                             and not os.path.lexists(folder / key)), "set": {}}  # fmt: skip
    for path in paths:
        relative = path.relative_to(folder).as_posix()
        update["drop"].append(relative)
        for parent in Path(relative).parents[:-1]:  # the folders it was written in (``logs/`` of ``logs/a.log``)
            if listed.get(parent.as_posix()) != FOLDER:
                update["set"][parent.as_posix()] = FOLDER
        update["set"].update(_listing(folder, relative))
    _apply(listed, update)
    if not ours or not marker["whole"] or marker["size"] > 2 * len(_lines({"set": listed})) + _MARKER_SLACK:
        _write_marker(folder, command, listed)
    elif update["drop"] or update["set"]:
        fd = os.open(folder / MARKER_NAME, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        try:
            os.write(fd, _lines(update))
        finally:
            os.close(fd)


def _unlisted(folder: Path, listed: dict[str, Any], relative: str = "") -> list[str]:
    """The paths under ``folder / relative`` that ``listed`` does not account for (a listed file whose proof
    differs counts as not listed: it changed, or was replaced, since it was written)."""
    found = []
    for name in _entries(folder / relative if relative else folder):
        child = f"{relative}/{name}" if relative else name
        path = folder / child
        info = os.lstat(path)
        kind = listed.get(child)
        if stat.S_ISDIR(info.st_mode):
            if kind == OUTPUT and ownership_problem(path) is None:
                continue
            if kind == FOLDER:
                found += _unlisted(folder, listed, child)
                continue
        elif _stat_matches(kind, info):
            continue
        found.append(child + ("/" if stat.S_ISDIR(info.st_mode) else ""))
    return found


def proven_entries(folder: Path) -> list[str]:
    """The top-level entries of ``folder`` that its marker lists and proves, with everything under them (what
    hf-geonorm may remove of it: a run's own checkpoints, never a user's folder of the same name)."""
    marker = read_marker(folder)
    if marker is None:
        return []
    listed = marker["paths"]
    proven = []
    for name in _entries(folder):
        kind = listed.get(name)
        path = folder / name
        if kind == FOLDER and path.is_dir() and not path.is_symlink() and not _unlisted(folder, listed, name):
            proven.append(name)
        elif kind == OUTPUT and path.is_dir() and not path.is_symlink() and ownership_problem(path) is None:
            proven.append(name)
        elif _stat_matches(kind, os.lstat(path)):
            proven.append(name)
    return proven


def changed_file(folder: Path, relative: str = "") -> str | None:
    """The first file under ``folder / relative`` (all of ``folder`` by default; a proven entry, ``proven_entries``)
    whose bytes or stat differ from what the marker recorded, as a path under ``folder``, or None when every file
    listed there is as written (a listed file that is gone is nothing to replace). Hashes each of them: called just
    before they are replaced or removed, after the stat proof passed."""
    marker = read_marker(folder)
    if marker is None:  # proven only when it holds nothing (``ownership_problem``)
        return (relative or ".") if _entries(folder) else None
    for key, entry in sorted(marker["paths"].items()):
        if relative and key != relative and not key.startswith(relative + "/"):
            continue
        if entry == OUTPUT:
            inner = changed_file(folder / key)
            if inner is not None:
                return f"{key}/{inner}"
        elif isinstance(entry, list) and os.path.lexists(folder / key):
            fd = _open_regular(folder / key)
            if fd is None:
                return key
            try:
                if not _stat_matches(entry, os.fstat(fd)) or _sha256(fd) != entry[4]:
                    return key
            finally:
                os.close(fd)
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
    """None when ``folder`` may be replaced by an hf-geonorm output: it is missing or empty, or its marker lists
    and proves everything in it; otherwise what makes it the user's, with up to five of the entries concerned."""
    if folder.is_symlink() or not os.path.lexists(folder):
        return None  # nothing, or only a link, is replaced: the folder a link points to is left as it is
    if not folder.is_dir():
        return "is not a folder"
    names = _entries(folder)
    if not names:
        return None
    marker = read_marker(folder)
    if marker is None:
        return f"was not written by hf-geonorm (it holds {_shown(names)}; no {MARKER_NAME} of this version proves them)"
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


def check_replaceable(
    folder: Path, given: str | os.PathLike, option: str = "OUTPUT_DIR", contents: bool = False
) -> None:
    """``NotAnOutput`` unless ``folder`` (as the user ``given`` it) may be replaced: see ``ownership_problem`` and
    ``protected_reason``; ``contents``: also hash every file in it against the marker (``changed_file``), right
    before it is replaced (the stat check alone serves to fail fast)."""
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
    changed = changed_file(folder) if contents and os.path.isdir(folder) and not folder.is_symlink() else None
    if changed is not None:
        raise NotAnOutput(
            f"{option} {given} holds {changed}, which changed since hf-geonorm wrote it (its SHA-256 differs from "
            f"the one in {MARKER_NAME}): --force replaces only what hf-geonorm wrote; give another folder, or empty "
            "it yourself"
        )


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
