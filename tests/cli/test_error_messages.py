"""Files hf-geonorm cannot use are refused in one line that names the file and the cause, through the command line
(the sixth hostile trial's unclear messages): a safetensors header nested too deep to read (push says so before
anything is sent, not "push ... failed"), a tensor dtype safetensors does not have (info and convert refuse it),
a GGUF file with a tensor name that is not UTF-8, a tensor type number the gguf package does not know, or a
version the reader does not read (info refuses what convert refuses), and a config.json with a width that is not
a number, a number of layers that is not whole, or an activation function transformers does not have."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from support.fake_hub import served
from support.helpers import fails, invoke
from support.tiny_gguf import write_tiny_gguf
from support.tiny_models import tiny_model


@pytest.fixture(scope="module")
def stock_gpt2(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stock") / "gpt2"
    tiny_model("gpt2").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def converted(stock_gpt2, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("converted") / "geo"
    result = invoke("convert", stock_gpt2, out, "--license", "mit")
    assert result.exit_code == 0, result.output
    return out


def safetensors_with(path: Path, header: bytes, data: bytes = b"") -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def test_a_safetensors_header_nested_too_deep_is_named_before_anything_is_sent(converted, tmp_path, monkeypatch):
    folder = tmp_path / "deep"
    shutil.copytree(converted, folder)
    safetensors_with(folder / "model.safetensors", b"[" * 100_000 + b"]" * 100_000)
    with served(monkeypatch, tmp_path / "no-login" / "token") as hub:
        message = fails("push", folder, "me/deep")
        assert hub.requests == []
    assert message.startswith("Error: not pushed: model.safetensors is damaged: its header nests deeper"), message
    assert "push to" not in message


def test_a_tensor_dtype_safetensors_does_not_have_is_named_by_info_and_convert(stock_gpt2, tmp_path):
    folder = tmp_path / "q9"
    shutil.copytree(stock_gpt2, folder)
    header = json.dumps({"wte.weight": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 4]}}).encode()
    safetensors_with(folder / "model.safetensors", header, b"\0" * 4)
    for command in (["info", folder], ["convert", folder, tmp_path / "out"]):
        message = fails(*command)
        assert str(folder) in message and 'model.safetensors is damaged: tensor wte.weight has dtype "Q9", which is ' \
            "not a safetensors dtype" in message, message
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path.read_bytes()


def tensor_info_at(data: bytes, name: bytes) -> int:
    """Where the header's record of tensor ``name`` starts (its name's length, then the name)."""
    at = data.index(struct.pack("<Q", len(name)) + name)
    return at


def test_a_gguf_tensor_name_that_is_not_utf8_is_named(gguf_bytes, tmp_path):
    path = tmp_path / "names.gguf"
    path.write_bytes(gguf_bytes.replace(b"token_embd.weight", b"token_embd.w\xffight", 1))
    for command in (["info", path], ["convert", path, tmp_path / "out"]):
        message = fails(*command)
        assert f"cannot read {path} as a GGUF checkpoint: a tensor name at byte " in message, message
        assert "is not UTF-8 text" in message and "JSON" not in message, message


def test_a_gguf_tensor_type_number_the_gguf_package_does_not_know_is_named_with_its_file(gguf_bytes, tmp_path):
    path = tmp_path / "types.gguf"
    data = bytearray(gguf_bytes)
    name = b"output_norm.weight"
    at = tensor_info_at(gguf_bytes, name) + 8 + len(name)
    (dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * dims, 99)
    path.write_bytes(bytes(data))
    message = fails("info", path)
    assert f"{path}: tensor output_norm.weight has GGML type number 99, which is not a type the gguf package knows" \
        in message, message
    assert str(path) in fails("convert", path, tmp_path / "out")


def test_info_refuses_a_gguf_version_convert_refuses(gguf_bytes, tmp_path):
    path = tmp_path / "v99.gguf"
    path.write_bytes(gguf_bytes[:4] + struct.pack("<I", 99) + gguf_bytes[8:])
    for command in (["info", path], ["convert", path, tmp_path / "out"]):
        message = fails(*command)
        assert f"cannot read {path} as a GGUF checkpoint: it is GGUF version 99, and versions 2 and 3 are read" in (
            message), message


CONFIG_EDITS = {
    "nan_width": ({"n_embd": float("nan")}, "Validation error for field 'n_embd': TypeError: Field 'n_embd' expected "
                  "int, got float (value: nan)"),
    "half_layer": ({"n_layer": 2.5}, "n_layer is 2.5, not a whole number of layers"),
    "activation": ({"activation_function": "os.system"}, "activation_function 'os.system' is not an activation "
                   "function transformers has (it has gelu,"),
}


@pytest.mark.parametrize("edit", list(CONFIG_EDITS))
def test_a_config_value_its_class_or_transformers_refuses_is_named_with_its_cause(stock_gpt2, tmp_path, edit):
    change, cause = CONFIG_EDITS[edit]
    folder = tmp_path / edit
    shutil.copytree(stock_gpt2, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    text = tmp_path / "text.txt"
    text.write_text("some text to measure\n" * 20)
    for command in (["convert", folder, tmp_path / "out"], ["perplexity", folder, "--text", text]):
        message = fails(*command)
        assert message.startswith(f"Error: {folder / 'config.json'}: {cause}"), message
    assert not (tmp_path / "out").exists()
