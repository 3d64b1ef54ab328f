"""One run per output folder: ``train``, ``sweep``, ``convert`` and ``init`` hold ``OUTPUT/.hf-geonorm.lock`` while
they write there, so that a second one into the same folder fails at once, naming the first, rather than both
writing into it and both reporting success.

The lock is an ``flock`` on that file, which records the holder (command, process id, host, start time). The
kernel releases it when the holder ends however it ends, so a lock file left by a killed run is taken over, with a
warning that names the run it was. A lock file written on another host is not taken over (this machine cannot tell
whether that run still runs): the message says to remove it once that run has ended. POSIX only (``fcntl``).

A lock covers the folder's whole tree: a folder inside one a live run holds is refused (a sweep holds its folder, so
its ``logs/``, ``runs/`` and every run folder in it are held), and so is a folder that holds one; a folder inside
one that this process holds is its own (the sweep's run in ``runs/NAME``). An output that is a symbolic link is
locked in the folder it points to, and unlocked there. The lock file is opened without following a symbolic link:
one there (which would have the record written over the file it points to) is refused, as is a file with other
names (hard links).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from .atomic import LOCK_NAME, OutputInUse, holder_text, lock_holder, read_holder
from .text_files import open_no_follow

_HELD_HERE: set[tuple[int, int]] = set()  # (device, inode) of the lock files this process holds


def _identity(result: os.stat_result) -> tuple[int, int]:
    return result.st_dev, result.st_ino


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a holder that ended removes it, after which a new
    lock file is the one to lock)."""
    try:
        return _identity(os.lstat(path)) == _identity(os.fstat(fd))
    except FileNotFoundError:
        return False


def _open_lock_file(path: Path) -> int:
    """``path`` opened for reading and writing (created when missing), never through a symbolic link, and only
    when it is a regular file of one name: the lock record is written into it."""
    why = "the lock record is written into hf-geonorm's own lock file"
    fd = open_no_follow(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, why)
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink > 1:
        os.close(fd)
        what = "has other names (hard links)" if stat.S_ISREG(found.st_mode) else "is not a regular file"
        raise ValueError(
            f"{path} {what}, so it is not hf-geonorm's lock file: the lock record would be written over it; remove "
            "it and start again"
        )
    return fd


def _acquire(path: Path, command: str, option: str, given: Path) -> int:
    """The open lock file ``path``, locked and holding this run's record (``given``: the folder as messages name
    it)."""
    while True:
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(fd)
            os.close(fd)
            raise OutputInUse(
                f"{given} is in use by {holder_text(holder)}: one run writes into a folder at a time; wait "
                f"for it to end, or give another {option}"
            ) from None
        if _same_file(fd, path):
            break
        os.close(fd)
    previous, host = read_holder(fd), socket.gethostname()
    if previous and previous.get("host") != host:
        os.close(fd)
        raise OutputInUse(
            f"{given} is locked by {holder_text(previous)}, which this machine cannot check; if that run has "
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
    _HELD_HERE.add(_identity(os.fstat(fd)))
    return fd


def _release(fd: int, path: Path) -> None:
    """Remove the lock file (unless the folder holding it was replaced), then unlock it."""
    try:
        if _same_file(fd, path):
            path.unlink()
    finally:
        _HELD_HERE.discard(_identity(os.fstat(fd)))
        os.close(fd)


def _refuse_runs_around(given: Path, folder: Path, option: str) -> None:
    """``OutputInUse`` when a live run of another process holds a folder that holds ``folder`` (``given`` as the
    user spelled it, ``folder`` where a link leads), or a live run holds a folder inside it."""
    around = dict.fromkeys([*Path(os.path.abspath(given)).parents, *folder.parents])
    for holding in around:
        lock = holding / LOCK_NAME
        try:
            if _identity(os.lstat(lock)) in _HELD_HERE:
                continue
        except OSError:
            continue
        holder = lock_holder(lock)
        if holder is not None:
            raise OutputInUse(
                f"{given} is inside {holding}, which is in use by {holder}: one run writes into a folder at a "
                f"time; wait for it to end, or give another {option}"
            )
    own = folder / LOCK_NAME
    for root, _, files in os.walk(folder):
        lock = Path(root, LOCK_NAME)
        if LOCK_NAME in files and lock != own and (holder := lock_holder(lock)) is not None:
            raise OutputInUse(
                f"{given} holds {root}, in use by {holder}: one run writes into a folder at a time; wait for it to "
                f"end, or give another {option}"
            )


def check_not_in_use(folder: str | os.PathLike, option: str = "--output") -> None:
    """``OutputInUse`` when a live run of another process holds ``folder``, a folder around it or one inside it:
    what a command checks first, before it judges what the folder holds (the lock it takes later checks again)."""
    given = Path(folder).absolute()
    real = given.resolve()
    lock = real / LOCK_NAME
    try:
        mine = _identity(os.lstat(lock)) in _HELD_HERE
    except OSError:
        mine = True  # no lock file there
    holder = None if mine else lock_holder(lock)
    if holder is not None:
        raise OutputInUse(
            f"{given} is in use by {holder}: one run writes into a folder at a time; wait for it to end, or give "
            f"another {option}"
        )
    _refuse_runs_around(given, real, option)



def share_parents_lock(folder: Path) -> None:
    """In a worker process of the run holding ``folder``'s lock (a sweep's workers): write inside that folder as its
    holder does, the lock counted as held here too."""
    _HELD_HERE.add(_identity(os.lstat(folder / LOCK_NAME)))
@contextlib.contextmanager
def output_lock(folder: str | os.PathLike, command: str, option: str = "--output") -> Iterator[None]:
    """Hold ``folder``'s lock for the block (``OutputInUse`` naming the holder when another run has it, or a folder
    around it or inside it). The folder is created to hold it; the folders created are removed again when the
    block leaves them empty. A symbolic link is locked in the folder it points to."""
    given = Path(folder).absolute()
    if os.path.lexists(given) and not given.is_dir():
        raise ValueError(f"{given} is a file or a broken link, not a folder; give another {option}")
    folder = given.resolve()
    created = []
    for path in (folder, *folder.parents):  # deepest first
        if path.exists():
            break
        created.append(path)
    path = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _acquire(path, command, option, given)
    except OSError as error:
        _remove_empty(created)
        raise ValueError(
            f"cannot lock {folder} ({path}: {error.strerror or error}); give an {option} you can write to"
        ) from None
    except BaseException:
        _remove_empty(created)
        raise
    try:
        _refuse_runs_around(given, folder, option)
        yield
    finally:
        _release(fd, path)
        _remove_empty(created)


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()
