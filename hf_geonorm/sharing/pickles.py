"""Which files are pickles, told by what they hold rather than by their names: ``numpy.load(allow_pickle=True)``
unpickles a ``.npy`` array of Python objects and anything that is neither a ``.npy`` nor a zip, ``torch.load`` a
zip whose ``data.pkl`` is a pickle, ``pickle.load`` any stream of pickle opcodes. ``push`` shares none of them.

Nothing here unpickles. A pickle stream is decoded opcode by opcode with ``pickletools`` (which decodes, never
executes), following the stack as the unpickler would, up to the first step that imports or calls something (a
pickle that can run code) or a ``STOP`` that ends a well-formed pickle; text and other binary data break off within
a few opcodes. A ``.npy`` header is parsed as numpy parses it (``ast.literal_eval``, then its dtype); a zip's members
are checked one by one, each the same way.
"""

from __future__ import annotations

import ast
import pickletools
import re
import struct
import zipfile
import zlib
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
MAX_ZIP_DEPTH = 4
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
    head = stream.read(len(NPY_MAGIC))
    stream.seek(0)
    if head.startswith(NPY_MAGIC):
        return _npy_reason(stream)
    if head[:4] in ZIP_MAGICS:
        return _zip_reason(stream, depth)
    return "" if unpickles(stream) else None


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
    if depth >= MAX_ZIP_DEPTH:
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
