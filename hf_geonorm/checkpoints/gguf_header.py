"""The header of a GGUF file (llama.cpp's format), read once and quickly: its metadata and its tensors' names,
shapes and types, never their data.

``gguf.GGUFReader`` builds every field of the file, a NumPy view per string of the tokenizer's vocabulary and merges
(about 100,000 on SmolLM2: seconds per read); this reads the same layout with ``struct`` and keeps the lengths of
long arrays only. Standard library only (the tensor types' names come from the ``gguf`` package when asked for).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
GGUF_PACKAGE_NEEDED = "reading .gguf files needs the gguf package (pip install gguf, or hf-geonorm[gguf])"
ARRAY_KEPT = 64  # an array of at most this many items is kept (languages, tags); of a longer one, its length
SUPPORTED_VERSIONS = (2, 3)  # the versions the gguf package's reader (which transformers uses) reads


@dataclass
class GGUFTensorInfo:
    """A tensor as the header describes it: ``shape`` in the file's order (the row width first)."""

    name: str
    shape: tuple[int, ...]
    type_id: int

    @property
    def n_elements(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass
class GGUFHeader:
    """The metadata (``fields``: numbers, strings and arrays of up to ``ARRAY_KEPT`` items, as
    ``GGUFReader``'s ``contents()`` gives them), the length of every array (``array_lengths``) and the tensors."""

    fields: dict[str, Any] = field(default_factory=dict)
    array_lengths: dict[str, int] = field(default_factory=dict)
    tensors: list[GGUFTensorInfo] = field(default_factory=list)
    path: str = ""  # the file it was read from, for messages

    def tensor_types(self) -> list[str]:
        """Each tensor's type by its ggml name (``Q4_1``, ``F32``), from the ``gguf`` package (``ValueError``
        saying how to install it where it is missing, and naming the file and the tensor for a type number the
        package does not know)."""
        try:
            from gguf import GGMLQuantizationType
        except ImportError:
            raise ValueError(GGUF_PACKAGE_NEEDED) from None
        known = {member.value: member.name for member in GGMLQuantizationType}
        for tensor in self.tensors:
            if tensor.type_id not in known:
                raise ValueError(
                    f"{self.path}: tensor {tensor.name} has GGML type number {tensor.type_id}, which is not a type the "
                    "gguf package knows: the file is damaged, or newer than the gguf package (pip install -U gguf)"
                )
        return [known[t.type_id] for t in self.tensors]


class _Cursor:
    """Reads the header's values one after the other, in the file's byte order."""

    def __init__(self, data: Any, order: str) -> None:
        self.data, self.order, self.at = data, order, 0

    def read(self, code: str) -> Any:
        fmt = self.order + code
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self, what: str = "") -> str:
        """A string; ``what`` names one that must be UTF-8 (a key, a tensor name: readers fail on any other),
        otherwise bytes that are not UTF-8 are replaced."""
        length = self.read("Q")
        if self.at + length > len(self.data):
            raise ValueError("a string runs past the end of the file")
        raw = bytes(self.data[self.at : self.at + length])
        try:
            text = raw.decode("utf-8", errors="strict" if what else "replace")
        except UnicodeDecodeError as error:
            raise ValueError(f"{what} at byte {self.at} is not UTF-8 text ({error.reason} at its byte "
                             f"{error.start}): {raw[:60]!r}") from None  # fmt: skip
        self.at += length
        return text

    def value(self, kind: int) -> Any:
        if kind == STRING:
            return self.string()
        if kind in SCALARS:
            return self.read(SCALARS[kind])
        raise ValueError(f"unknown metadata value type {kind}")

    def array(self) -> tuple[list[Any] | None, int]:
        """An array's items (None past ``ARRAY_KEPT``, skipped) and its length."""
        kind, length = self.read("I"), self.read("Q")
        if length <= ARRAY_KEPT:
            return [self.value(kind) for _ in range(length)], length
        if kind == STRING:
            for _ in range(length):
                length_of_text = self.read("Q")
                self.at += length_of_text
        elif kind in SCALARS:
            self.at += length * struct.calcsize(self.order + SCALARS[kind])
        else:
            raise ValueError(f"an array of value type {kind} is not one GGUF metadata holds")
        if self.at > len(self.data):
            raise ValueError("an array runs past the end of the file")
        return None, length


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """The header of the GGUF file ``path``; ``ValueError`` naming the file when it is not one (no magic, a value
    past its end, an unknown type)."""
    path = Path(path)
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            header = _parse(data)
            header.path = str(path)
            return header
    except (OSError, ValueError, struct.error, OverflowError) as error:
        raise ValueError(f"cannot read {path} as a GGUF checkpoint: {error}") from None


def _parse(data: Any) -> GGUFHeader:
    if bytes(data[:4]) != MAGIC:
        raise ValueError("it does not start with GGUF's magic number")
    (version,) = struct.unpack_from("<I", data, 4)
    cursor = _Cursor(data, "<" if version & 0xFFFF else ">")  # a big-endian file reads as a version above 65535
    cursor.at = 4
    version = cursor.read("I")
    if version not in SUPPORTED_VERSIONS:
        read = " and ".join(map(str, SUPPORTED_VERSIONS))
        raise ValueError(f"it is GGUF version {version}, and versions {read} are read (those llama.cpp writes)")
    tensor_count, field_count = cursor.read("Q"), cursor.read("Q")
    header = GGUFHeader()
    for _ in range(field_count):
        key, kind = cursor.string("a metadata key"), cursor.read("I")
        if kind == ARRAY:
            items, header.array_lengths[key] = cursor.array()
            if items is not None:
                header.fields[key] = items
        else:
            header.fields[key] = cursor.value(kind)
    for _ in range(tensor_count):
        name, dims = cursor.string("a tensor name"), cursor.read("I")
        shape = tuple(cursor.read("Q") for _ in range(dims))
        type_id = cursor.read("I")
        cursor.read("Q")  # the data's offset: not read here
        header.tensors.append(GGUFTensorInfo(name, shape, type_id))
    return header
