"""Reading a text file as UTF-8, for perplexity (``hf_geonorm.analysis.evaluation``) and training data
(``hf_geonorm.training.data.documents``): a binary file is refused (a compressed or UTF-16 one with the command that
makes it UTF-8 text), bytes that are not UTF-8 are replaced with a warning."""

from __future__ import annotations

import codecs
import errno
import json
import os
import re
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from ..errors import first_line

SPECIAL_FILES = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
)  # fmt: skip


def check_regular_file(path: str | os.PathLike) -> None:
    """``ValueError`` unless ``path`` is a regular file (links followed): a device such as /dev/zero never ends, and
    reading a FIFO waits for a writer, so neither is read as text or data."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for check, name in SPECIAL_FILES if check(mode)), "not a regular file")
    raise ValueError(f"{path} is {kind}, not a file: give a UTF-8 text file")


def read_text(path: str | os.PathLike, max_chars: int | None = None) -> str:
    """The UTF-8 text of ``path`` (its first ``max_chars`` characters).

    A file that is not a regular one (``check_regular_file``), a binary file (one with NUL bytes) or an empty one is
    a ``ValueError``; bytes that are not UTF-8 are replaced by U+FFFD with a warning that names the file and counts
    them.
    """
    path = Path(path)
    check_regular_file(path)
    limit = -1 if max_chars is None else max_chars * 4 + 4  # a UTF-8 character is at most 4 bytes
    try:
        with open(path, "rb") as f:
            # a limit beyond the file reads it whole (read(n) would first allocate n bytes)
            data = f.read(limit if 0 <= limit < os.fstat(f.fileno()).st_size else -1)
            complete = not f.read(1)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    why = not_text(data[:BINARY_PROBE]) or (BINARY if b"\0" in data else None)
    if why is not None:
        raise ValueError(f"{path} {why}")
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    text = decoder.decode(data, final=complete)
    bad = sum(1 for c in text if "\udc80" <= c <= "\udcff")
    if bad:
        text = "".join("\ufffd" if "\udc80" <= c <= "\udcff" else c for c in text)
        warnings.warn(
            f"{path} is not valid UTF-8: {bad} byte(s) were replaced by U+FFFD; convert it to UTF-8 first "
            "(e.g. iconv -f latin1 -t utf-8)",
            stacklevel=2,
        )
    if not text.strip():
        raise ValueError(f"{path} contains no text")
    return text if max_chars is None else text[:max_chars]


BINARY_PROBE = 65536  # a file whose first 64 KB hold a NUL byte is binary
# Compressed files by their first bytes (whatever their name): the format and the command that decompresses it.
COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip"), (b"\xfd7zXZ\x00", "xz", "unxz"), (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
              (b"BZh", "bzip2", "bunzip2"))  # fmt: skip
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
BINARY = "is a binary file (it holds NUL bytes), not text: give a UTF-8 text file"


def not_text(head: bytes) -> str | None:
    """Why a file starting with ``head`` (its first ``BINARY_PROBE`` bytes) is not UTF-8 text, as the end of a
    sentence that names it, with the way to make it text where there is one; None when it may be text. A NUL byte
    makes a file binary; compressed files are known by their magic bytes, UTF-16 by its byte-order mark or by NULs
    at every other byte (ASCII text in UTF-16)."""
    for magic, name, command in COMPRESSED:
        if head.startswith(magic) and (name != "bzip2" or head[4:10] == b"1AY&SY"):
            return f"is {name}-compressed, not text: decompress it first ({command} FILE) and give the text"
    odd_nuls, even_nuls = head[1::2].count(0), head[0::2].count(0)
    if head.startswith(UTF16_BOMS) or (len(head) >= 8 and (odd_nuls == 0) != (even_nuls == 0)
                                       and max(odd_nuls, even_nuls) >= len(head) // 3):  # fmt: skip
        return "is UTF-16 text, not UTF-8: re-encode it first (iconv -f utf-16 -t utf-8 FILE > FILE.txt)"
    return BINARY if b"\0" in head else None


_ESCAPED = re.compile("[\udc80-\udcff]")  # the bytes surrogateescape kept: not UTF-8


def text_chunks(path: str | os.PathLike, chunk_bytes: int = 1 << 20) -> Iterator[str]:
    """The UTF-8 text of ``path`` in pieces of about ``chunk_bytes``: a corpus file is never held whole in memory.

    As ``read_text``: a binary file (a NUL byte in its first 64 KB) is a ``ValueError`` raised before any text is
    yielded; bytes that are not UTF-8 become U+FFFD with one warning, at the end, that names the file and counts
    them. An empty file yields nothing (the caller says whether that is an error)."""
    path = Path(path)
    check_regular_file(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, also when the generator is dropped
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    with f:
        decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        data = f.read(max(chunk_bytes, BINARY_PROBE))
        why = not_text(data[:BINARY_PROBE])
        if why is not None:
            raise ValueError(f"{path} {why}")
        bad = 0
        while data:
            following = f.read(chunk_bytes)
            text = decoder.decode(data, final=not following)
            text, replaced = _ESCAPED.subn("\ufffd", text)
            bad += replaced
            if text:
                yield text
            data = following
    if bad:
        warnings.warn(
            f"{path} is not valid UTF-8: {bad} byte(s) were replaced by U+FFFD; convert it to UTF-8 first "
            "(e.g. iconv -f latin1 -t utf-8)",
            stacklevel=2,
        )


def json_or_problem(path: Path) -> tuple[Any, str | None]:
    """``(the parsed JSON file, None)``, or ``(None, why it cannot be read)`` naming the file: the start of checking
    a record a run left behind (a cache entry's ``meta.json``, a checkpoint's ``trainer_state.json``)."""
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except FileNotFoundError:
        return None, f"{path} is missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"{path} is not valid JSON ({first_line(error)})"


def open_no_follow(path: Path, flags: int, why: str) -> int:
    """``os.open(path, flags)`` (mode 0o644 where it creates), never through a symbolic link, which would overwrite
    the file it points to: ``ValueError`` naming the link, with ``why`` the file is written here."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP and path.is_symlink():
            raise ValueError(
                f"{path} is a symbolic link (to {os.readlink(path)}): {why}, never through a link, which would "
                "overwrite the file it points to; remove the link and run the command again"
            ) from None
        raise


def new_text_file(path: Path, why: str) -> TextIO:
    """``path`` opened for writing anew, never through a symbolic link (``open_no_follow``)."""
    return open(open_no_follow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, why), "w", encoding="utf-8")
