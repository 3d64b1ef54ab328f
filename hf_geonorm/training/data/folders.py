"""The files of a ``--data`` folder (``folder_files``): found by a walk that follows links to folders, and each file
that is not read named with why, in warnings (``warn_skipped``).

A link to a folder is followed once: every folder is read once, under the first path the walk reaches it by (the
folder's own path before any link to it), and a link to a folder read already, or to a folder that holds the link or
the data folder (a loop), is skipped, naming the link. Links inside hidden folders and hidden links are not followed
(what they lead to is hidden too). A file that is not a regular file (a FIFO, a device, a socket, also behind a
link) is skipped, never opened: a FIFO would block, ``/dev/zero`` never end; so is a link that leads nowhere.
"""

from __future__ import annotations

import heapq
import os
import stat
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SKIPPED_NAMED = 10  # a folder's skipped files named in a warning each (the others counted)


@dataclass
class FolderFiles:
    """What a walk of a data folder found, each list in path order: the regular files that are not hidden
    (``files``), the hidden ones with a suffix that is read (``hidden``), and every other file or link not read, with
    why (``skipped``)."""

    files: list[Path] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def folder_files(root: Path, suffixes: tuple[str, ...], why_not_read: Callable[[Path], str]) -> FolderFiles:
    """The files under ``root``, its links to folders followed once (the module's rule). A file whose suffix is not
    in ``suffixes`` is skipped for ``why_not_read(path)``; a file that is not a regular one for what it is.
    ``ValueError`` naming a folder that cannot be listed."""
    walk = _Walk(root)
    walk.tree(root)
    while walk.links:
        walk.follow(heapq.heappop(walk.links))
    found = FolderFiles(skipped=walk.skipped)
    for path in sorted(walk.files):
        if _hidden(path, root):
            if path.suffix.lower() in suffixes:
                found.hidden.append(path)
        elif (why := irregular(path)) is not None:
            found.skipped.append((path, why))
        elif path.suffix.lower() not in suffixes:
            found.skipped.append((path, why_not_read(path)))
        else:
            found.files.append(path)
    found.skipped.sort(key=lambda skip: skip[0])
    return found


class _Walk:
    """The state of one walk: the folders read (by their real path, with the path each is read under), the files
    found, the links to folders still to follow (in path order), and what was skipped."""

    def __init__(self, root: Path) -> None:
        self.root, self.real_root = root, Path(os.path.realpath(root))
        self.read_as: dict[Path, Path] = {}
        self.files: list[Path] = []
        self.links: list[Path] = []
        self.skipped: list[tuple[Path, str]] = []

    def tree(self, top: Path) -> None:
        """The files under ``top`` and its links to folders (kept for later), without following any link."""
        pending = [top]
        while pending:
            folder = pending.pop()
            hidden = _hidden(folder, self.root)
            if not hidden:
                real = Path(os.path.realpath(folder))
                if real in self.read_as:  # a folder inside a linked one, read already by another path
                    self.skipped.append((folder, f"the folder {real}, read already (as {self.read_as[real]})"))
                    continue
                self.read_as[real] = folder
            for entry in _entries(folder):
                path = Path(entry.path)
                if not _is_folder(entry):
                    self.files.append(path)
                elif not entry.is_symlink():
                    pending.append(path)
                elif not hidden and not _hidden(path, self.root):
                    heapq.heappush(self.links, path)

    def follow(self, link: Path) -> None:
        """Walk the folder ``link`` leads to, unless it holds the link or the data folder, or is read already."""
        real = Path(os.path.realpath(link))
        holder = Path(os.path.realpath(link.parent))
        if real in (holder, self.real_root) or real in holder.parents or real in self.real_root.parents:
            self.skipped.append((link, f"a link to {real}, a folder that holds it (a loop): it is not followed"))
        elif real in self.read_as:
            self.skipped.append((link, f"a link to {real}, a folder read already (as {self.read_as[real]})"))
        else:
            self.tree(link)


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as listing:
            return sorted(listing, key=lambda entry: entry.name)
    except OSError as error:
        raise ValueError(f"cannot list the folder {folder} of the data: {error.strerror or error}; make it readable "
                         "(chmod u+rx) or move it out of the data") from None  # fmt: skip


def _is_folder(entry: os.DirEntry) -> bool:
    """Whether ``entry`` is a folder or a link to one (a link that cannot be followed is not: a file, named later)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _hidden(path: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def irregular(path: Path) -> str | None:
    """Why ``path`` is not read as a regular file (what it is, or where its link leads), or None; it is never opened."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"a link to {os.path.realpath(path)}, which does not exist"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if stat.S_ISREG(mode):
        return None
    target = f" ({os.path.realpath(path)})" if path.is_symlink() else ""
    return f"{special_kind(mode)}{target}, not a regular file: it is never read"


def special_kind(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) that is neither a regular file nor a folder is."""
    for check, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):  # fmt: skip
        if check(mode):
            return name
    return "not a regular file"


def warn_skipped(folder: Path, skipped: list[tuple[Path, str]]) -> None:
    """A warning for each of the first ``SKIPPED_NAMED`` files of ``folder`` that are not read, with why (a line
    each: the command line shows the first line of a warning), and one that counts the others."""
    for path, why in skipped[:SKIPPED_NAMED]:
        warnings.warn(f"skipped {path}: {why}", stacklevel=4)
    if len(skipped) > SKIPPED_NAMED:
        warnings.warn(f"skipped {len(skipped) - SKIPPED_NAMED} more file(s) under {folder} that are not read (other "
                      "extensions, compressed or binary files, links to folders read already, files that are not "
                      "regular)", stacklevel=4)  # fmt: skip
