"""The data cache is verified, not trusted as it lies:

- its keys hash the data's content (``content_key``: each file's size and SHA-256, read in 1 MiB chunks, a small
  cost next to tokenizing it), not its path and modification time, which an edit can keep;
- an entry's ``meta.json`` records the size and SHA-256 of each of its Arrow files (``file_checks``), checked
  every time the entry is read (``entry_problem``); an entry that fails (a file changed, cut short or missing, a
  missing or broken ``meta.json``) is moved aside and rebuilt, with one warning that names it (``discard``);
- a storage error while the cache is written (a full device, a read-only or forbidden folder, a file where a
  folder should be) is one line naming the path and the fix (``storage_errors``); what was being written is
  removed (the entry and the tokenizer are written under temporary names and moved into place whole).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..._plumbing.atomic import remove_tree
from ..._plumbing.checksums import file_sha256
from ..._plumbing.ownership import temporary_folder
from ..._plumbing.text_files import json_or_problem
from ..options import DATA_CACHE_ENV

WHERE = f"--data-cache (or ${DATA_CACHE_ENV})"


def file_checks(folder: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """What ``meta.json`` records of the entry's files, to verify them when read."""
    return {name: {"bytes": (folder / name).stat().st_size, "sha256": file_sha256(folder / name)} for name in names}


def entry_problem(folder: Path) -> str | None:
    """Why the cache entry ``folder`` cannot be trusted (naming the file), or None when it verifies."""
    meta_path = folder / "meta.json"
    meta, problem = json_or_problem(meta_path)
    if problem:
        return problem
    files = meta.get("files") if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{meta_path} records no checksums"
    for name, check in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{path} is missing"
        if not isinstance(check, dict) or size != check.get("bytes"):
            return f"{path} holds {size} bytes, not the {check.get('bytes') if isinstance(check, dict) else '?'} built"
        if file_sha256(path) != check.get("sha256"):
            return f"{path} changed since it was built (its checksum differs)"
    return None


def discard(folder: Path) -> None:
    """Move the entry aside in one step into a temporary folder of this process (a run reading it keeps its open
    files; a kill leaves that folder with the proof that lets the next run remove it), then remove it."""
    if not os.path.lexists(folder):
        return
    aside = temporary_folder(folder.parent, folder.name)
    with contextlib.suppress(FileNotFoundError):
        os.rename(folder, aside / folder.name)
    remove_tree(aside)


def check_cache_folder(cache: Path) -> None:
    """``ValueError`` when the cache path is a file, or lies under one."""
    for path in (cache, *cache.parents):
        if path.exists():
            if not path.is_dir():
                what = "is a file" if path == cache else f"lies under the file {path}"
                raise ValueError(f"the data cache {cache} {what}, not a folder; give a folder with {WHERE}")
            return


_ERRNO_TEXT = re.compile(r"\[?[Ee]rrno (\d+)\]?|\(os error (\d+)\)")


def _storage_errno(error: BaseException, cache: Path) -> int | None:
    """The system error number of ``error`` or of what caused it (datasets, pyarrow and tokenizers wrap it, some
    only in their messages), when it concerns the cache (not, say, a data file that cannot be read)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        name = getattr(error, "filename", None)
        if name and not Path(name).absolute().is_relative_to(cache.absolute()):
            return None
        if isinstance(error, OSError) and error.errno:
            return error.errno
        match = _ERRNO_TEXT.search(str(error))
        if match:
            return int(match.group(1) or match.group(2))
        error = error.__cause__ or error.__context__
    return None


FIXES = {
    errno.ENOSPC: "no space left on its device; free space there, or give another folder with " + WHERE,
    errno.EDQUOT: "the disk quota is used up; free space there, or give another folder with " + WHERE,
    errno.EROFS: "it is on a read-only file system; give a writable folder with " + WHERE,
    errno.EACCES: "permission denied; give a folder you can write to with " + WHERE,
    errno.EPERM: "permission denied; give a folder you can write to with " + WHERE,
    errno.ENOTDIR: "a part of its path is a file, not a folder; give a folder with " + WHERE,
}


@contextlib.contextmanager
def storage_errors(cache: Path) -> Iterator[None]:
    """A storage error of the cache in the block as one ``ValueError`` line naming the cache and the fix (nothing
    of the entry is left: it is built under a temporary name); other errors pass."""
    try:
        yield
    except Exception as error:
        code = _storage_errno(error, cache)
        if code not in FIXES:
            raise
        raise ValueError(f"cannot write the data cache {cache}: {FIXES[code]}") from None
