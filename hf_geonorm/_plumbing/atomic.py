"""All-or-nothing output folders: build in a hidden temporary folder next to the target, move it into place
when complete.

What is guaranteed (Linux, where ``renameat2`` moves without replacing and swaps in one step):

- the block raises, Ctrl-C or SIGTERM: the temporary folder is removed and the target is as it was;
- SIGKILL (or a crash of the machine): the temporary folder ``.NAME.partial-PID-XXXX`` stays behind; the next
  ``atomic_directory`` for the same target removes it when it carries the proof that a process of this host made
  it (``ownership.temporary_owner``) and that process no longer runs; a folder of that name without the proof is
  left alone;
- without ``force`` the final move never removes anything: a target that appeared while the block ran is left
  alone and ``FileExistsError`` is raised (an empty folder that was there at the start is replaced, as asked);
- with ``force`` the new folder and the target swap in one step, so the target is always either the old or the
  new folder, whole; the old one is then removed, read-only folders included (a symbolic link is replaced by
  the new folder; the folder it pointed to is left untouched).

Refused whatever ``force`` says (``check_output_name``): an empty name, the current folder and any folder that
holds it; and replacing a folder while a run holds the lock of a folder inside it (``check_no_run_inside``).

Elsewhere the same holds except that the final moves are two steps (a target appearing in between can be an
empty folder that gets replaced; with ``force`` a SIGKILL between the steps leaves the old folder as
``.NAME.old-PID-XXXX``, with the proof, which the next run removes: nothing outside the target is ever moved into
it).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import os
import shutil
import socket
import stat
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .ownership import (
    LOCK_NAME,
    MARKER_NAME,
    TEMPORARY_NAME,
    check_replaceable,
    mark_folder,
    mark_temporary,
    ownership_problem,
    protected_reason,
    temporary_folder,
    temporary_owner,
)
from .signals import raise_if_signalled, signals_held, signals_stop_the_job

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2(source: Path, target: Path, flags: int) -> bool:
    """``renameat2(source, target, flags)``: True when done, False when the system or the filesystem lacks it."""
    function = getattr(_libc(), "renameat2", None)
    if function is None:
        return False
    if function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), ctypes.c_uint(flags)) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(target))


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _make_writable(path: Path) -> None:
    """Give the owner write access to ``path`` and every folder under it (so their entries can be removed)."""
    os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) | stat.S_IRWXU)
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            folder = os.path.join(root, name)
            if not os.path.islink(folder):
                os.chmod(folder, stat.S_IMODE(os.lstat(folder).st_mode) | stat.S_IRWXU)


def remove_tree(path: Path) -> None:
    """Remove the folder ``path`` (read-only parts included), or only the link when ``path`` is a symbolic link."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except PermissionError:
        _make_writable(path)
        shutil.rmtree(path)


# The longest output name the temporary names spell out whole; a longer one is cut and given a hash of the whole
# name, so that ``.NAME.partial-PID-XXXXXXXX`` stays within the 255 bytes a file name may have.
_NAME_BYTES = 100


def _temporary_stem(output: Path) -> str:
    """The output's name as the temporary folders next to it spell it (shortened for a long name)."""
    name = output.name
    if len(os.fsencode(name)) <= _NAME_BYTES:
        return name
    digest = hashlib.sha1(os.fsencode(name)).hexdigest()[:12]
    return f"{os.fsdecode(os.fsencode(name)[:_NAME_BYTES - 13]).rstrip(chr(0xFFFD))}~{digest}"


def remove_leftovers(folder: Path, target: str | None = None) -> list[str]:
    """Remove the temporary folders in ``folder`` (for ``target`` only, the name they spell, where given) that
    hf-geonorm processes of this host made and that no longer run; return what was done. Only a folder carrying
    that proof counts (``ownership.temporary_owner``): one merely named like it is left alone."""
    done = []
    with contextlib.suppress(OSError):
        for entry in sorted(folder.iterdir()):
            owner = temporary_owner(entry)
            if owner is None or (target is not None and owner["temporary_for"] != target):
                continue
            pid = owner["pid"]
            if owner["host"] != socket.gethostname() or pid == os.getpid() or _pid_alive(pid):
                continue
            remove_tree(entry)
            done.append(f"removed {entry.name}, left in {folder} by an interrupted run of hf-geonorm (process {pid})")
    return done


def remove_stale_partials(output_dir: str | os.PathLike) -> list[str]:
    """Clean up after runs that were killed (SIGKILL) while writing ``output_dir``: the temporary folders they made
    next to it (``remove_leftovers``); return what was done. Nothing is ever moved into ``output_dir``."""
    output = Path(output_dir).absolute()
    return remove_leftovers(output.parent, _temporary_stem(output))


class OutputInUse(ValueError):
    """Another run holds the output folder (the message names it)."""


def holder_text(holder: dict[str, Any] | None) -> str:
    """How messages name the run that holds a lock (``hf_geonorm._plumbing.output_lock``)."""
    if not holder:
        return "another hf-geonorm run (starting)"
    return (
        f"hf-geonorm {holder.get('command', '?')} (process {holder.get('pid', '?')} on host {holder.get('host', '?')}, "
        f"since {holder.get('started', '?')})"
    )


def read_holder(fd: int) -> dict[str, Any] | None:
    """The holder a lock file records (None while it is being written, or for a damaged one)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


class OutputExists(FileExistsError):
    """The output folder is taken. ``reason`` says how, without the remedy, which the command line words as
    ``--force`` and the library as ``force=True``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{reason} (choose another folder, or pass force=True to replace it)")


def _appeared(output: Path) -> OutputExists:
    return OutputExists(f"{output} appeared while the output was being written; it was left as it is and nothing was "
                        "written")  # fmt: skip


def _holds_content(folder: Path) -> bool:
    """Whether ``folder`` holds anything but hf-geonorm's bookkeeping (its lock, its output marker)."""
    return any(entry.name not in (LOCK_NAME, MARKER_NAME, TEMPORARY_NAME) for entry in folder.iterdir())


def _move_new(tmp: Path, output: Path, replace_empty: bool) -> None:
    """Move ``tmp`` to ``output`` without removing anything but the empty folder that was asked to be replaced
    (and the lock file in it, which the caller holds)."""
    if replace_empty:
        try:
            for name in (LOCK_NAME, MARKER_NAME, TEMPORARY_NAME):
                (output / name).unlink(missing_ok=True)
            output.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            raise _appeared(output) from None
    try:
        if _renameat2(tmp, output, _RENAME_NOREPLACE):
            return
        os.rename(tmp, output)  # POSIX: can replace an empty folder only, never files or a non-empty folder
    except (FileExistsError, IsADirectoryError, NotADirectoryError) as error:
        raise _appeared(output) from error
    except OSError as error:
        if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise _appeared(output) from None
        raise


def _swap_in(tmp: Path, output: Path) -> None:
    """Replace ``output`` by ``tmp`` and remove the old contents (a warning names them when that fails). The old
    folder first gets the proof of a temporary folder of this process, so that a SIGKILL before it is removed leaves
    a leftover the next run removes (``remove_leftovers``); where it cannot (a read-only folder), such a leftover
    stays until removed by hand."""
    proven = False
    if output.is_dir() and not output.is_symlink():  # a link is replaced as a link: nothing is written in it
        with contextlib.suppress(OSError):
            mark_temporary(output, _temporary_stem(output))
            proven = True
    try:
        if _renameat2(tmp, output, _RENAME_EXCHANGE):
            old = tmp  # the swap put the old contents there
        else:
            old = output.with_name(f".{_temporary_stem(output)}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            os.rename(output, old)
            try:
                os.rename(tmp, output)
            except BaseException:
                os.rename(old, output)
                raise
    except BaseException:
        if proven:
            (output / TEMPORARY_NAME).unlink(missing_ok=True)
        raise
    try:
        remove_tree(old)
    except OSError as error:
        warnings.warn(
            f"{output} was replaced, but its previous contents could not be removed from {old}: "
            f"{error.strerror or error}; remove that folder by hand",
            stacklevel=4,
        )


def check_output_name(output_dir: str | os.PathLike, force: bool, option: str = "OUTPUT_DIR") -> Path:
    """The absolute path of ``output_dir``, taken as given (a ``~`` the shell did not expand names a folder ``~``,
    as for every program the shell starts); ``ValueError`` when it is empty (an unset shell variable would otherwise
    name the current folder), when it is the current folder or one that holds it (replacing it, ``force``, would
    delete the folder the command runs in, and writing into it would mix the output with whatever is there), or when
    it is a folder never replaced (``ownership.protected_reason``: ``/``, the home folder, a repository)."""
    if not os.fspath(output_dir).strip():
        raise ValueError(f"the {option} given is empty (an unset shell variable?); give the folder to write")
    output = Path(output_dir).absolute()
    # with force a link is replaced, not the folder it points to; without, the empty folder behind a link is
    plain = Path(os.path.abspath(output))  # ".." spelled out
    replaced = plain.parent.resolve() / plain.name if force else output.resolve()
    protected = protected_reason(replaced) if os.path.isdir(replaced) else None
    if protected is not None:
        raise ValueError(f"{option} {output_dir} {protected}, which hf-geonorm never writes over (not even with "
                         "--force): give a new folder")  # fmt: skip
    try:
        here = Path.cwd().resolve()
    except OSError:  # the current folder was removed: nothing to protect
        return output
    if replaced == here or replaced in here.parents:
        what = "is the current folder" if replaced == here else f"holds the current folder {here}"
        raise ValueError(
            f"{option} {output_dir} {what}, which hf-geonorm never writes over (not even with --force): give a new "
            "folder"
        )
    return output


def check_target(output_dir: str | os.PathLike, force: bool = False, option: str = "OUTPUT_DIR") -> Path:
    """The absolute path of ``output_dir``; ``ValueError`` for a name ``check_output_name`` refuses, ``FileExistsError``
    for a file or (without ``force``) a non-empty folder, ``ownership.NotAnOutput`` (with ``force``) for one that is
    not an earlier output holding nothing else. ``atomic_directory`` checks this first (callers may, to fail fast)."""
    output = check_output_name(output_dir, force, option)
    if os.path.lexists(output) and not output.is_dir():
        raise FileExistsError(f"{output_dir} exists and is not a folder")
    if output.is_dir() and _holds_content(output):
        problem = ownership_problem(output)
        if not force and problem is None:  # an earlier output: --force would replace it
            raise OutputExists(f"{output_dir} exists and is not empty")
        if not force:
            raise FileExistsError(f"{output_dir} exists and is not empty: it {problem}; give another folder, or "
                                  "empty it yourself")  # fmt: skip
        check_replaceable(output, output_dir, option)
    return output


def lock_holder(path: Path) -> str | None:
    """How messages name the live run that holds the lock file ``path`` (``holder_text``); None when no run does:
    no such file, a symbolic link (never a lock: ``output_lock`` refuses one), or a lock whose holder ended."""
    import fcntl  # POSIX only, as the lock

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return holder_text(read_holder(fd))
    finally:
        os.close(fd)
    return None


def _refuse_if_held(path: Path, replaced: Path) -> None:
    """``OutputInUse`` when a live run holds the lock file ``path``, which lies inside the folder ``replaced`` that
    is about to be replaced (a lock file its holder no longer holds is not counted)."""
    holder = lock_holder(path)
    if holder is not None:
        raise OutputInUse(
            f"{replaced} holds {path.parent}, in use by {holder}: replacing {replaced} would remove that run's "
            "output; wait for it to end, or give another folder"
        )


def check_no_run_inside(folder: Path) -> None:
    """``output_lock.OutputInUse`` when a run holds the lock of ``folder`` or of any folder under it: replacing
    ``folder`` would swap out that run's output (a sweep's run in ``sweep/runs/NAME`` when ``sweep/runs`` is
    replaced). The lock of ``folder`` itself, which the caller holds, is not counted."""
    own = folder / LOCK_NAME
    for root, _, files in os.walk(folder):
        if LOCK_NAME in files and Path(root, LOCK_NAME) != own:
            _refuse_if_held(Path(root, LOCK_NAME), folder)


def _missing_ancestors(path: Path) -> list[Path]:
    missing = []
    for parent in path.parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_directory(
    output_dir: str | os.PathLike, force: bool = False, command: str | None = None
) -> Iterator[Path]:
    """Yield a fresh temporary folder next to ``output_dir``; when the block succeeds it becomes ``output_dir``,
    when it fails, is interrupted (Ctrl-C) or terminated (SIGTERM, raised as ``signals.Terminated``) it is removed and
    ``output_dir`` is left as it was.

    An existing non-empty ``output_dir`` (or one that appears while the block runs) raises ``FileExistsError``
    unless ``force``; a file there always does. Without ``force`` a symbolic link to an empty folder is written
    through: the new folder takes the place of the empty one the link points to (with ``force`` the link itself
    is replaced, and the folder it points to is left as it was). With ``force`` only a folder that hf-geonorm
    wrote is replaced (``check_target``), checked again just before the swap. ``command``: the command whose output
    this is, recorded in the folder's marker (``ownership.mark_folder``). Temporary folders that killed runs left
    next to ``output_dir`` are cleaned up first (a ``UserWarning`` says what was removed). See the module docstring
    for what holds on SIGKILL and on other systems.
    """
    output = Path(output_dir).absolute()
    if not force and output.is_symlink() and output.is_dir():  # a link to a folder: write into that folder
        output = output.resolve()
    for message in remove_stale_partials(output):
        warnings.warn(message, stacklevel=3)
    check_target(output_dir, force)
    existed_empty = output.is_dir() and not output.is_symlink() and not _holds_content(output)
    replaces = force and output.is_dir() and not output.is_symlink() and not existed_empty
    if replaces:
        check_no_run_inside(output)
    created = _missing_ancestors(output)
    with signals_stop_the_job():
        tmp = None
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            tmp = temporary_folder(output.parent, _temporary_stem(output))
            os.chmod(tmp, 0o777 & ~_umask())
            yield tmp
            raise_if_signalled()  # a Ctrl-C or SIGTERM that Python swallowed while the block wrote: nothing moves
            if command is not None:
                mark_folder(tmp, command)
            if replaces:  # every file's bytes, before the swap: outside signals_held, a Ctrl-C may stop a long hash
                check_replaceable(output, output_dir, contents=True)
            with signals_held():
                if force and os.path.lexists(output) and not existed_empty:
                    if replaces:  # again: a run may have started, a user's file appeared, a file changed, meanwhile
                        check_no_run_inside(output)
                        check_replaceable(output, output_dir)
                    _swap_in(tmp, output)
                else:
                    _move_new(tmp, output, replace_empty=existed_empty)
                (output / TEMPORARY_NAME).unlink(missing_ok=True)  # the proof went with tmp: it is the output now
        except BaseException:
            with signals_held():
                if tmp is not None:
                    remove_tree(tmp)
                for parent in created:  # deepest first
                    with contextlib.suppress(OSError):
                        parent.rmdir()
            raise
