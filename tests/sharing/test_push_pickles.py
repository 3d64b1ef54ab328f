"""``hf-geonorm push`` refuses pickles by what a file holds, whatever its name: a pickle stream (with a protocol
header or without), a ``.npy`` array of Python objects (``numpy.load(allow_pickle=True)`` unpickles it), and a
zip archive (``.npz``, ``torch.save``'s format) with such a member. The files are made by numpy, pickle and torch
themselves; none is ever loaded. So are torch's legacy tar checkpoint format (its members are pickles) and a
pickle compressed as ``pandas.read_pickle`` and ``joblib.load`` read one (gzip, bz2, xz, lzma, zlib), also inside a
tar or cut short; a zstd stream is refused where this Python cannot decompress it to check. Files that only look
alike (a float ``.npy``, an ``.npz`` of numbers, a text, a safetensors file whose header size starts with the bytes
of a pickle header, compressed text, a tar of texts) are pushed."""

from __future__ import annotations

import bz2
import errno
import gzip
import io
import json
import lzma
import os
import pickle
import shutil
import struct
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from support.fake_hub import served
from support.helpers import fails, invoke
from support.tiny_models import tiny_model

RAN = Path("/tmp/hf-geonorm-pickle-ran")


class Payload:
    """Unpickling this runs a shell command: what a pickle from someone else can do."""

    def __reduce__(self):
        return (os.system, (f"touch {RAN}",))


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pickles")
    tiny_model("llama").save_pretrained(root / "stock")
    result = invoke("convert", root / "stock", root / "converted", "--license", "mit")
    assert result.exit_code == 0, result.output
    return root / "converted"


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with served(monkeypatch, tmp_path / "no-login" / "token") as server:
        yield server


def saved_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # np.save adds .npy to a name without it
        np.save(f, array, allow_pickle=True)


def object_npy(path: Path) -> None:
    saved_array(path, np.array([{"weights": [1.0]}, None], dtype=object))


def object_npz(path: Path) -> None:
    with open(path, "wb") as f:  # np.savez adds .npz to a name without it
        np.savez(f, numbers=np.arange(4.0), table=np.array([Payload()], dtype=object))


def structured_npy(path: Path) -> None:
    saved_array(path, np.array([(1, "x")], dtype=[("id", "<i4"), ("note", "O")]))


def torch_zip(path: Path) -> None:
    torch.save({"step": 1}, path)  # a zip whose members sit in a folder named after the file: weights/data.pkl


def zipped_pickle(path: Path) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("readme.txt", "numbers inside\n")
        archive.writestr("inner/state", pickle.dumps({"a": 1}, protocol=2))


def tar_of(path: Path, members: dict[str, bytes], mode: str = "w") -> None:
    with tarfile.open(path, mode) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def legacy_torch_tar(path: Path) -> None:
    """torch's legacy checkpoint format as ``torch.load`` reads it (``_legacy_load``: a tar of the members
    sys_info, pickle, tensors and storages, each a pickle), with only storages one here: the trial's case."""
    text = b"not a pickle\n"
    tar_of(path, {"sys_info": text, "pickle": text, "tensors": text, "storages": pickle.dumps(Payload())})


def compressed(compress: Callable[[bytes], bytes], cut: int = 0) -> Callable[[Path], None]:
    """A maker of a file holding the payload's pickle (less its last ``cut`` bytes: a pickle cut short still
    runs its payload when unpickled) compressed by ``compress``."""
    data = pickle.dumps(Payload())
    return lambda path: path.write_bytes(compress(data[: len(data) - cut]))


PICKLES: dict[str, tuple[Callable[[Path], None], str]] = {
    "model.npy": (object_npy, "model.npy (a .npy array of Python objects)"),
    "arrays.npz": (object_npz, "arrays.npz (its member table.npy: a .npy array of Python objects)"),
    "table.dat": (structured_npy, "table.dat (a .npy array of Python objects)"),
    "notes.txt": (lambda p: p.write_bytes(pickle.dumps(Payload())), "notes.txt"),
    "data.json": (lambda p: p.write_bytes(pickle.dumps({"a": [1, 2]}, protocol=0)), "data.json"),
    "legacy": (lambda p: p.write_bytes(pickle.dumps(Payload(), protocol=1)), "legacy"),
    "weights.data": (torch_zip, "weights.data (its member weights/data.pkl: a pickle)"),
    "bundle.zip": (zipped_pickle, "bundle.zip (its member inner/state: a pickle)"),
    "old_checkpoint.tar": (legacy_torch_tar, "old_checkpoint.tar (its member storages: a pickle)"),
    "data.pkl.gz": (compressed(gzip.compress), "data.pkl.gz (gzip-compressed: a pickle)"),
    "clf.joblib.gz": (compressed(gzip.compress, cut=1), "clf.joblib.gz (gzip-compressed: a pickle)"),
    "cut.gz": (compressed(lambda data: gzip.compress(data)[:-12]), "cut.gz (gzip-compressed: a pickle)"),
    "frame.bz2": (compressed(bz2.compress), "frame.bz2 (bz2-compressed: a pickle)"),
    "frame.xz": (compressed(lzma.compress), "frame.xz (xz-compressed: a pickle)"),
    "frame.lzma": (compressed(lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE)),
                   "frame.lzma (lzma-compressed: a pickle)"),  # fmt: skip
    "model.z": (compressed(zlib.compress), "model.z (zlib-compressed: a pickle)"),
    "old.tar.gz": (lambda p: tar_of(p, {"inner/storages": pickle.dumps(Payload())}, "w:gz"),
                   "old.tar.gz (gzip-compressed: its member inner/storages: a pickle)"),  # fmt: skip
    "twice.gz": (lambda p: p.write_bytes(gzip.compress(bz2.compress(pickle.dumps(Payload())))),
                 "twice.gz (gzip-compressed: bz2-compressed: a pickle)"),  # fmt: skip
}


@pytest.mark.parametrize("name", list(PICKLES))
def test_pickles_are_refused_by_content_whatever_their_name(hub, converted, tmp_path, name):
    make, expected = PICKLES[name]
    folder = tmp_path / "folder"
    shutil.copytree(converted, folder)
    make(folder / name)
    message = fails("push", folder, "me/pickled")
    assert message.startswith("Error: not pushed: ") and f"{expected}: pickle file(s)" in message, message
    assert hub.requests == [] and hub.repos == {}
    assert not RAN.exists()


def test_a_zstd_stream_this_python_cannot_decompress_is_refused_as_unchecked(hub, converted, tmp_path, monkeypatch):
    """Python before 3.14 has no zstd in its standard library; without the zstandard package a zstd stream cannot
    be checked, so it is refused, saying why. Its magic bytes, then a frame (what the zstd tool writes for a
    pickle of a few bytes: one raw block)."""
    import builtins

    real_import = builtins.__import__

    def without_zstd(name, *args, **kwargs):
        if name in ("zstandard", "compression") or name.startswith("compression."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_zstd)
    data = pickle.dumps(Payload())
    frame = b"\x28\xb5\x2f\xfd" + bytes([0x20, len(data)]) + struct.pack("<I", (len(data) << 3) | 1)[:3] + data
    folder = tmp_path / "folder"
    shutil.copytree(converted, folder)
    (folder / "frame.zst").write_bytes(frame)
    message = fails("push", folder, "me/zstd")
    assert "frame.zst (a zstd stream, which this Python cannot decompress to check" in message, message
    assert hub.requests == [] and hub.repos == {}


class FullDisk:
    """A temporary file on a full device: every write fails."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self) -> FullDisk:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def tell(self) -> int:
        return 0

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_compressed_stream_that_cannot_be_checked_whole_is_refused_saying_why(hub, converted, tmp_path, monkeypatch):
    """Decompressed at most MAX_DECOMPRESSED bytes (2 GiB; 1 kB here): a longer stream, even of text, is refused as
    too long to check, and so is one a full disk keeps from being decompressed: never taken for checked."""
    from hf_geonorm.sharing import pickles

    folder = tmp_path / "folder"
    shutil.copytree(converted, folder)
    (folder / "notes.txt.gz").write_bytes(gzip.compress(b"text, compressed\n" * 100))
    monkeypatch.setattr(pickles, "MAX_DECOMPRESSED", 1024)
    message = fails("push", folder, "me/long")
    assert "notes.txt.gz (a gzip stream of more than 1,024 bytes decompressed, too long to check" in message, message
    monkeypatch.setattr(pickles, "MAX_DECOMPRESSED", 1 << 31)
    monkeypatch.setattr(pickles.tempfile, "SpooledTemporaryFile", FullDisk)
    message = fails("push", folder, "me/full")
    assert "notes.txt.gz (a gzip stream that could not be decompressed to check (No space left on device)" in message
    assert hub.requests == [] and hub.repos == {}


def padded_safetensors(path: Path, header_size: int) -> None:
    """A safetensors file whose header is padded with spaces to ``header_size`` bytes (the format allows it)."""
    save_file({"x": np.arange(4, dtype=np.float32)}, path)
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + size].rstrip(b" ")
    path.write_bytes(struct.pack("<Q", header_size) + header.ljust(header_size, b" ") + data[8 + size :])


def test_files_that_only_look_like_pickles_are_pushed(hub, converted, tmp_path):
    folder = tmp_path / "folder"
    shutil.copytree(converted, folder)
    np.save(folder / "stats.npy", np.linspace(0, 1, 5))
    with open(folder / "numbers.npz", "wb") as f:
        np.savez_compressed(f, a=np.arange(3), b=np.ones((2, 2), dtype=np.float16))
    (folder / "citation.txt").write_text("cite as:\nSmith et al.\n")  # 'c' is a pickle opcode (GLOBAL)
    (folder / "eval.json").write_text(json.dumps({"loss": 1.5}))
    padded_safetensors(folder / "extra.safetensors", 0x0380)  # starts 0x80 0x03, as a protocol-3 pickle does
    (folder / "notes.txt.gz").write_bytes(gzip.compress(b"text, compressed\n" * 100))
    tar_of(folder / "texts.tar", {"a.txt": b"first text\n", "b.json": b'{"x": 1}'})
    (folder / "bracket.txt").write_text("]" + "a line that starts like an .lzma file\n" * 3)
    assert (folder / "extra.safetensors").read_bytes()[:2] == b"\x80\x03"
    result = invoke("push", folder, "me/numbers")
    assert result.exit_code == 0, result.output
    pushed = hub.files("me/numbers")
    for name in ("stats.npy", "numbers.npz", "citation.txt", "eval.json", "extra.safetensors", "notes.txt.gz",
                 "texts.tar", "bracket.txt"):  # fmt: skip
        assert pushed[name] == (folder / name).read_bytes(), name
