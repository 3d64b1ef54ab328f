"""Which files are pickles, told by what they hold rather than by their names: ``numpy.load(allow_pickle=True)``
unpickles a ``.npy`` array of Python objects and anything that is neither a ``.npy`` nor a zip, ``torch.load`` a
zip whose ``data.pkl`` is a pickle and a tar of its legacy format (whose members are pickles), ``pickle.load`` any
stream of pickle opcodes, and ``pandas.read_pickle`` or ``joblib.load`` a pickle compressed with gzip, bz2, xz,
lzma, zlib or zstd. ``push`` shares none of them.

Nothing here unpickles. A pickle stream is decoded opcode by opcode with ``pickletools`` (which decodes, never
executes), following the stack as the unpickler would, up to the first step that imports or calls something (a
pickle that can run code) or a ``STOP`` that ends a well-formed pickle; text and other binary data break off within
a few opcodes. A ``.npy`` header is parsed as numpy parses it (``ast.literal_eval``, then its dtype); the members of
a zip or a tar are checked one by one, each the same way, and a compressed stream is decompressed (told by its magic
bytes, at most ``MAX_DECOMPRESSED`` bytes of it, into a temporary file) and checked the same way. What cannot be
checked (nested too deep, decompressing to more, a zstd stream where neither Python 3.14's ``compression.zstd`` nor
the ``zstandard`` package is there) is taken for a pickle, with the reason.
"""

from __future__ import annotations

import ast
import bz2
import gzip
import lzma
import pickletools
import re
import struct
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# Names the pickle loaders are used on, whatever the file holds (torch.load, joblib.load, pickle.load); any other
# name (.bin, .npy, .npz, none) is judged by its content.
PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # what numpy.load and torch.load take for a zip (a first local header,
# or the end record of an empty archive)
NPY_OBJECTS = "a .npy array of Python objects"
NPY_UNREADABLE = "a .npy whose header cannot be read, so it may hold Python objects"
MAX_NPY_HEADER = 1 << 20  # numpy itself reads at most 10,000 bytes unless allow_pickle is given
MAX_ARGUMENT = 1 << 24  # an opcode argument this long is no text's: a pickle's bytes (not read into memory here)
MAX_OPCODES = 100_000  # that many opcodes that decode and fit on the stack: a pickle
MAX_DEPTH = 4  # archives and compressed streams inside one another
MAX_DECOMPRESSED = 1 << 31  # 2 GiB: a compressed stream decompressing to more is not checked (so refused)
SPOOLED_IN_MEMORY = 1 << 26  # a decompressed stream up to 64 MiB is held in memory, a longer one on disk
READ_CHUNK = 1 << 20
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame (a stream may also start with a skippable frame: 0x184D2A5?)
XZ_MAGIC = b"\xfd7zXZ\x00"
LZMA_ALONE_PROPERTIES = 0x5D  # the first byte of nearly every .lzma (lc=3, lp=0, pb=2: the encoders' default)
# Opcodes that hand the unpickler an extension code, which names something to import when it is registered
# (``copyreg.add_extension``; nothing registers any by default, and an unregistered one stops the unpickler).
EXTENSIONS = frozenset({"EXT1", "EXT2", "EXT4"})
STRINGS = frozenset({"str", "bytes_or_str"})  # what the unpickler turns into str (STACK_GLOBAL takes two)
_DOTTED_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")


class _TooLong(Exception):
    """An opcode argument longer than ``MAX_ARGUMENT`` that the stream holds: not read, and no text has one."""


class _Bounded:
    """The stream ``pickletools.genops`` reads: reads and lines of at most ``MAX_ARGUMENT`` bytes. A longer read
    is ``_TooLong`` where the stream holds that many bytes, and ``ValueError`` (a pickle cut short: the unpickler
    stops there) where it does not."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream

    def read(self, size: int = -1) -> bytes:
        if 0 <= size <= MAX_ARGUMENT:
            return self.stream.read(size)
        here = self.stream.tell()
        remaining = self.stream.seek(0, 2) - here
        self.stream.seek(here)
        if size < 0 or size > remaining:
            raise ValueError(f"an argument of {size} bytes where {remaining} remain")
        raise _TooLong

    def readline(self, size: int = -1) -> bytes:
        line = self.stream.readline(MAX_ARGUMENT)
        if len(line) == MAX_ARGUMENT and not line.endswith(b"\n"):
            raise _TooLong
        return line


def pickle_reason(file: Path) -> str | None:
    """Why ``file`` is a pickle: "" for a pickle stream (or a name pickle loaders are used on), a few words for a
    ``.npy`` of Python objects or a zip that holds a pickle; None when no loader would unpickle it."""
    if file.suffix.lower() in PICKLE_SUFFIXES:
        return ""
    try:
        with open(file, "rb") as stream:
            return _stream_reason(stream, depth=0)
    except OSError:
        return None  # a file that cannot be read is not uploaded either: the push names it


def _stream_reason(stream: IO[bytes], depth: int) -> str | None:
    head = stream.read(16)
    stream.seek(0)
    if head.startswith(NPY_MAGIC):
        return _npy_reason(stream)
    if head[:4] in ZIP_MAGICS:
        return _zip_reason(stream, depth)
    if unpickles(stream):
        return ""
    stream.seek(0)
    compression = _compression(head)
    if compression is not None:
        return _compressed_reason(stream, depth, *compression)
    if _is_tar(stream):
        return _tar_reason(stream, depth)
    return None


def _zstd_reader() -> Callable[[IO[bytes]], IO[bytes]] | None:
    """A reader of zstd streams: Python 3.14's ``compression.zstd``, else the ``zstandard`` package; None when
    neither is there."""
    try:
        from compression import zstd  # type: ignore[import-not-found]

        return zstd.ZstdFile
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        return None
    return lambda stream: zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)


class _ZlibFile:
    """A raw zlib stream (what ``joblib.dump(compress="zlib")`` writes) read as a file, a bounded chunk at a time."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.decompressor = zlib.decompressobj()

    def read1(self, size: int) -> bytes:
        while not self.decompressor.eof:
            data = self.decompressor.unconsumed_tail or self.stream.read(READ_CHUNK)
            if not data:
                return b""  # cut short: what decompressed is all there is
            out = self.decompressor.decompress(data, size)
            if out:
                return out
        return b""

    def __enter__(self) -> _ZlibFile:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _compression(head: bytes) -> tuple[str, Callable[[IO[bytes]], IO[bytes]] | None] | None:
    """The compression a stream starting with ``head`` is in, by its magic bytes, and a reader of it (None where
    this Python has none); None for a stream in none of them."""
    if head.startswith(b"\x1f\x8b"):
        return "gzip", lambda stream: gzip.GzipFile(fileobj=stream)
    if head.startswith(b"BZh") and head[3:4].isdigit():
        return "bz2", bz2.BZ2File
    if head.startswith(XZ_MAGIC):
        return "xz", lzma.LZMAFile
    if len(head) >= 13 and head[0] == LZMA_ALONE_PROPERTIES:
        return "lzma", lambda stream: lzma.LZMAFile(stream, format=lzma.FORMAT_ALONE)
    if head.startswith(ZSTD_MAGIC) or (len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18"):
        return "zstd", _zstd_reader()
    if len(head) >= 2 and head[0] == 0x78 and int.from_bytes(head[:2], "big") % 31 == 0:
        return "zlib", _ZlibFile
    return None


def _compressed_reason(
    stream: IO[bytes], depth: int, compression: str, reader: Callable[[IO[bytes]], IO[bytes]] | None
) -> str | None:
    """Why the ``compression`` stream holds a pickle (or may: one that cannot be decompressed here, or is too
    long or nested too deep to check); None when what it decompresses to is no pickle. A damaged stream is
    checked as far as it decompresses: a loader reads that far too (so it is read a chunk at a time,
    ``read1``, which returns what decompressed before an error)."""
    if reader is None:
        return (f"a {compression} stream, which this Python cannot decompress to check (that needs Python 3.14 or "
                "the zstandard package), so it may hold a pickle")  # fmt: skip
    if depth >= MAX_DEPTH:
        return f"a {compression} stream nested too deep to check"
    with tempfile.SpooledTemporaryFile(max_size=SPOOLED_IN_MEMORY) as out, reader(stream) as decompressed:
        while chunk := _read_as_far_as_it_goes(decompressed):
            if out.tell() + len(chunk) > MAX_DECOMPRESSED:
                return (f"a {compression} stream of more than {MAX_DECOMPRESSED:,} bytes decompressed, too long "
                        "to check, so it may hold a pickle")  # fmt: skip
            try:
                out.write(chunk)
            except OSError as error:  # a full disk: not a stream that ends, so not checked whole
                return (f"a {compression} stream that could not be decompressed to check ({error.strerror or error}), "
                        "so it may hold a pickle")  # fmt: skip
        if out.tell() == 0:
            return None
        out.seek(0)
        reason = _stream_reason(out, depth + 1)  # type: ignore[arg-type]
    return None if reason is None else f"{compression}-compressed: {reason or 'a pickle'}"


def _read_as_far_as_it_goes(decompressed: Any) -> bytes:
    """The next chunk of a decompressed stream; b"" at its end, or where it is damaged (each library raises its own
    error): what decompressed before is what a loader reads too."""
    try:
        return decompressed.read1(READ_CHUNK)
    except Exception:  # noqa: BLE001 - a damaged stream ends here
        return b""


def _is_tar(stream: IO[bytes]) -> bool:
    """Whether ``stream`` opens as a tar archive (torch's legacy checkpoint format is one)."""
    try:
        with tarfile.open(fileobj=stream, mode="r:"):
            return True
    except (tarfile.TarError, OSError, ValueError, EOFError):
        return False
    finally:
        stream.seek(0)


def _tar_reason(stream: IO[bytes], depth: int) -> str | None:
    """The first member of the tar ``stream`` that is a pickle, with why; None when no member is one."""
    if depth >= MAX_DEPTH:
        return "a tar nested too deep to check"
    try:
        with tarfile.open(fileobj=stream, mode="r:") as archive:
            for member in archive:
                inner = archive.extractfile(member) if member.isfile() else None
                if inner is None:
                    continue
                with inner:
                    reason = _stream_reason(inner, depth + 1)
                if reason is not None:
                    return f"its member {member.name}: {reason or 'a pickle'}"
    except (tarfile.TarError, OSError, EOFError):
        return None
    return None


def _npy_reason(stream: IO[bytes]) -> str | None:
    """``NPY_OBJECTS`` when the dtype of the .npy ``stream`` holds objects (numpy stores those as a pickle),
    ``NPY_UNREADABLE`` when its header does not parse; None for arrays of numbers."""
    from numpy.lib.format import descr_to_dtype

    start = stream.read(len(NPY_MAGIC) + 2)
    major = start[-2] if len(start) == len(NPY_MAGIC) + 2 else 0
    if major not in (1, 2, 3):
        return None  # numpy reads format versions 1 to 3 only
    size_format = "<H" if major == 1 else "<I"
    size_bytes = stream.read(struct.calcsize(size_format))
    if len(size_bytes) < struct.calcsize(size_format):
        return None
    (size,) = struct.unpack(size_format, size_bytes)
    if size > MAX_NPY_HEADER:
        return NPY_UNREADABLE
    try:
        header = ast.literal_eval(stream.read(size).decode("utf-8" if major == 3 else "latin-1"))
        dtype = descr_to_dtype(header["descr"])
    except Exception:  # noqa: BLE001 - whatever fails to parse is not known to be numbers
        return NPY_UNREADABLE
    return NPY_OBJECTS if dtype.hasobject else None


def _zip_reason(stream: IO[bytes], depth: int) -> str | None:
    """The first member of the zip ``stream`` that is a pickle, with why; None when no member is one (or the
    archive does not open: then no loader opens it either)."""
    if depth >= MAX_DEPTH:
        return "a zip nested too deep to check"
    try:
        with zipfile.ZipFile(stream) as archive:
            for member in archive.infolist():
                if member.is_dir():
                    continue
                with archive.open(member) as inner:
                    reason = _stream_reason(inner, depth + 1)
                if reason is not None:
                    return f"its member {member.filename}: {reason or 'a pickle'}"
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError):
        return None
    return None


def unpickles(stream: IO[bytes]) -> bool:
    """Whether ``pickle.load`` would take ``stream`` for a pickle: it reaches an opcode that imports (a module
    name, not text, for GLOBAL and INST; two strings for STACK_GLOBAL; an extension code), or a STOP that
    ends a well-formed pickle,
    or ``MAX_OPCODES`` opcodes that all decode and fit on the stack. Read by ``pickletools``, never unpickled."""
    stack: list[tuple[str, Any]] = []  # (the kind pickletools names, the value for strings)
    memo: dict[Any, tuple[str, Any]] = {}
    try:
        for count, (opcode, arg, _) in enumerate(pickletools.genops(_Bounded(stream))):
            if count >= MAX_OPCODES:
                return True
            name = opcode.name
            if name in ("GLOBAL", "INST"):
                return all(_DOTTED_NAME.match(part) for part in arg.split(" ")) and arg.count(" ") == 1
            if name in EXTENSIONS:
                return True  # an import by extension code: taken for a pickle, whatever this process registered
            popped = _pop(stack, opcode)
            if popped is None:
                return False  # the unpickler stops here: its stack holds too little
            if name == "STACK_GLOBAL":
                return all(kind in STRINGS for kind, _ in popped)
            if name == "STOP":
                return not stack
            if name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                if not stack and name != "MEMOIZE":
                    return False
                top = popped[-1] if name == "MEMOIZE" else stack[-1]
                memo[len(memo) if name == "MEMOIZE" else arg] = top
                stack.extend(popped)  # MEMOIZE leaves its item where it was
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    return False
                stack.append(memo[arg])
            elif name == "DUP":
                stack.extend(popped * 2)
            else:
                stack.extend((kind.name, arg if kind.name in STRINGS else None) for kind in opcode.stack_after)
    except _TooLong:
        return True
    except Exception:  # noqa: BLE001 - any byte that is no opcode, an argument cut short: not a pickle
        return False
    return False


def _pop(stack: list[tuple[str, Any]], opcode: Any) -> list[tuple[str, Any]] | None:
    """Take off ``stack`` what ``opcode`` consumes (to its mark and the items below it, for opcodes that read a
    mark); None when the stack does not hold it."""
    before = [kind.name for kind in opcode.stack_before]
    if "mark" in before or (opcode.name == "POP" and stack and stack[-1][0] == "mark"):
        marks = [i for i, (kind, _) in enumerate(stack) if kind == "mark"]
        if not marks:
            return None
        del stack[marks[-1] :]
        below = before.index("mark") if "mark" in before else 0
    else:
        below = len(before)
    if len(stack) < below:
        return None
    popped = stack[len(stack) - below :]
    del stack[len(stack) - below :]
    return popped
