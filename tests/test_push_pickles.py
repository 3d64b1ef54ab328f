"""``hf-geonorm push`` refuses pickles by what a file holds, whatever its name: a pickle stream (with a protocol
header or without), a ``.npy`` array of Python objects (``numpy.load(allow_pickle=True)`` unpickles it), and a
zip archive (``.npz``, ``torch.save``'s format) with such a member. The files are made by numpy, pickle and torch
themselves; none is ever loaded. Files that only look alike (a float ``.npy``, an ``.npz`` of numbers, a text, a
safetensors file whose header size starts with the bytes of a pickle header) are pushed."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_hub import served
from helpers import fails, invoke
from safetensors.numpy import save_file
from tiny_models import tiny_model

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


PICKLES: dict[str, tuple[Callable[[Path], None], str]] = {
    "model.npy": (object_npy, "model.npy (a .npy array of Python objects)"),
    "arrays.npz": (object_npz, "arrays.npz (its member table.npy: a .npy array of Python objects)"),
    "table.dat": (structured_npy, "table.dat (a .npy array of Python objects)"),
    "notes.txt": (lambda p: p.write_bytes(pickle.dumps(Payload())), "notes.txt"),
    "data.json": (lambda p: p.write_bytes(pickle.dumps({"a": [1, 2]}, protocol=0)), "data.json"),
    "legacy": (lambda p: p.write_bytes(pickle.dumps(Payload(), protocol=1)), "legacy"),
    "weights.data": (torch_zip, "weights.data (its member weights/data.pkl: a pickle)"),
    "bundle.zip": (zipped_pickle, "bundle.zip (its member inner/state: a pickle)"),
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
    assert (folder / "extra.safetensors").read_bytes()[:2] == b"\x80\x03"
    result = invoke("push", folder, "me/numbers")
    assert result.exit_code == 0, result.output
    pushed = hub.files("me/numbers")
    for name in ("stats.npy", "numbers.npz", "citation.txt", "eval.json", "extra.safetensors"):
        assert pushed[name] == (folder / name).read_bytes(), name
