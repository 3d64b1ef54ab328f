"""`hf-geonorm info` on what a user may point it at: it reports the sizes loading would build (read through the
config class loading uses), refuses a config whose size keys belong to another model type, and says what a path
is when it is not a checkpoint folder (a file, a config.json that is not a regular file, pickle weights)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from conftest import fails, invoke
from transformers import LlamaConfig

from hf_geonorm.patching import config_class_for


def tiny_gpt2(folder: Path) -> dict:
    """A config-only GeoNorm GPT-2 folder (``init --preset tiny``); its config."""
    result = invoke("init", "gpt2", folder, "--preset", "tiny")
    assert result.exit_code == 0, result.output
    return json.loads((folder / "config.json").read_text())


def info_json(path: Path) -> dict:
    result = invoke("info", path, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_config_whose_size_keys_belong_to_another_model_type_is_refused_naming_them(tmp_path, data_file):
    """A GPT-2 config relabelled geonorm_llama: info reported GPT-2's sizes, while loading builds LLaMA's."""
    folder = tmp_path / "relabelled"
    config = tiny_gpt2(folder)
    config["model_type"] = "geonorm_llama"
    (folder / "config.json").write_text(json.dumps(config))
    built = config_class_for("geonorm_llama").from_dict({k: v for k, v in config.items() if k != "model_type"})
    assert (built.num_hidden_layers, built.hidden_size) == (LlamaConfig().num_hidden_layers, LlamaConfig().hidden_size)
    assert (built.num_hidden_layers, built.hidden_size) != (config["n_layer"], config["n_embd"])  # what is at stake
    for args in (("info", folder), ("perplexity", folder, "--text", data_file)):
        message = fails(*args)
        assert f"{folder / 'config.json'}: model_type 'geonorm_llama' does not read n_embd, n_head, n_layer" in message
        assert "num_hidden_layers" in message and "fix model_type or those keys" in message, message


def test_info_reports_the_sizes_loading_builds_where_the_config_leaves_them_out(tmp_path):
    folder = tmp_path / "partial"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "vocab_size": 300}))
    data = info_json(folder)
    stock = LlamaConfig()  # the class transformers builds a llama config with, at its defaults
    assert (data["num_layers"], data["vocab_size"]) == (2, 300)
    assert (data["hidden_size"], data["positions"]) == (stock.hidden_size, stock.max_position_embeddings)
    output = invoke("info", folder).output
    assert f"2 layers, hidden size {stock.hidden_size}, vocabulary 300" in output, output


def test_info_on_a_file_that_is_not_a_gguf_says_it_is_a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("not a checkpoint")
    message = fails("info", path)
    assert f"{path} is a file, not a checkpoint folder" in message and ".gguf" in message, message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="the system has no FIFOs")
def test_info_refuses_a_config_json_that_is_not_a_regular_file_without_opening_it(tmp_path):
    folder = tmp_path / "fifo"
    folder.mkdir()
    fifo = folder / "config.json"
    os.mkfifo(fifo)

    def release_a_reader() -> None:  # should info open it after all: end its read, so that the test fails, not hangs
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # no reader: nothing waits on it
            pass

    watchdog = threading.Timer(60, release_a_reader)
    watchdog.start()
    try:
        message = fails("info", folder)
    finally:
        watchdog.cancel()
    assert f"{fifo} is a FIFO (named pipe), not a regular file" in message, message


def test_info_names_pickle_weights_and_how_to_convert_them(tmp_path):
    folder = tmp_path / "pickled"
    tiny_gpt2(folder)
    (folder / "pytorch_model.bin").write_bytes(b"a pickle hf-geonorm must never load")
    output = invoke("info", folder).output
    line = next((line for line in output.splitlines() if line.startswith("weights:")), output)
    assert "pytorch_model.bin" in line and "pickle" in line and "never loads" in line, output
    assert "save_pretrained" in line and "model.safetensors" in line, output
    assert info_json(folder)["pickle_weights"] == ["pytorch_model.bin"]
    (folder / "config.json").unlink()
    message = fails("info", folder)
    assert "has no config.json" in message and "pytorch_model.bin" in message and "pickle" in message, message
