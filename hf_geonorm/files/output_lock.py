"""One run per output folder: ``train``, ``sweep``, ``convert`` and ``init`` hold ``OUTPUT/.hf-geonorm.lock`` while
they write there, so that a second one into the same folder fails at once, naming the first, rather than both
writing into it and both reporting success.

The lock is an ``flock`` on that file, which records the holder (command, process id, host, start time). The
kernel releases it when the holder ends however it ends, so a lock file left by a killed run is taken over, with a
warning that names the run it was. A lock file written on another host is not taken over (this machine cannot tell
whether that run still runs): the message says to remove it once that run has ended. POSIX only (``fcntl``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from .atomic import LOCK_NAME, OutputInUse, holder_text, read_holder


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a holder that ended removes it, after which a new
    lock file is the one to lock)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _acquire(path: Path, command: str, option: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(fd)
            os.close(fd)
            raise OutputInUse(
                f"{path.parent} is in use by {holder_text(holder)}: one run writes into a folder at a time; wait "
                f"for it to end, or give another {option}"
            ) from None
        if _same_file(fd, path):
            break
        os.close(fd)
    previous, host = read_holder(fd), socket.gethostname()
    if previous and previous.get("host") != host:
        os.close(fd)
        raise OutputInUse(
            f"{path.parent} is locked by {holder_text(previous)}, which this machine cannot check; if that run has "
            f"ended, remove {path} and start again, or give another {option}"
        )
    if previous:
        warnings.warn(
            f"took over the lock {path} of {holder_text(previous)}, which no longer runs (it was stopped before it "
            "could remove it)",
            stacklevel=4,
        )
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    record = json.dumps({"command": command, "pid": os.getpid(), "host": host, "started": started})
    os.ftruncate(fd, 0)
    os.pwrite(fd, record.encode("utf-8"), 0)
    return fd


def _release(fd: int, path: Path) -> None:
    """Remove the lock file (unless the folder holding it was replaced), then unlock it."""
    try:
        if _same_file(fd, path):
            path.unlink()
    finally:
        os.close(fd)


@contextlib.contextmanager
def output_lock(folder: str | os.PathLike, command: str, option: str = "--output") -> Iterator[None]:
    """Hold ``folder``'s lock for the block (``OutputInUse`` naming the holder when another run has it). The
    folder is created to hold it; the folders created are removed again when the block leaves them empty."""
    folder = Path(folder).absolute()
    if os.path.lexists(folder) and not folder.is_dir():
        raise ValueError(f"{folder} is a file or a broken link, not a folder; give another {option}")
    created = []
    for path in (folder, *folder.parents):  # deepest first
        if path.exists():
            break
        created.append(path)
    path = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _acquire(path, command, option)
    except OSError as error:
        _remove_empty(created)
        raise ValueError(
            f"cannot lock {folder} ({path}: {error.strerror or error}); give an {option} you can write to"
        ) from None
    except BaseException:
        _remove_empty(created)
        raise
    try:
        yield
    finally:
        _release(fd, path)
        _remove_empty(created)


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
