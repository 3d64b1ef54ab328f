"""Sizes a config.json or a GGUF file's metadata states that loading would not build as stated: a config without
its number of layers (a class's default sizes, 6.7B parameters for LLaMA), a depth no model can have, and a GGUF
whose metadata claims far more than its tensors hold. Every command that reads a model refuses them in one line
before anything is built; each command here runs with its address space bounded, so a regression fails with a
MemoryError instead of taking the machine down."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from support.helpers import fails, invoke
from support.tiny_gguf import write_tiny_gguf
from support.tiny_models import BASE

HEADROOM = 3 * 2**30  # bytes of address space a command may add: far more than any tiny model, far less than 6.7B


@contextlib.contextmanager
def bounded_memory(headroom: int = HEADROOM) -> Iterator[None]:
    """Inside, this process may map at most ``headroom`` more bytes (RLIMIT_AS): an allocation beyond it is a
    MemoryError (a command's `Error:` line), not the system's out-of-memory killer. Unbounded where the system has
    no such limit."""
    status = Path("/proc/self/status")
    try:
        import resource
    except ImportError:
        resource = None
    if resource is None or not status.is_file():
        yield
        return
    line = next(line for line in status.read_text().splitlines() if line.startswith("VmSize:"))
    used = int(line.split()[1]) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = used + headroom if hard == resource.RLIM_INFINITY else min(used + headroom, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A tiny LLaMA checkpoint (safetensors weights, no tokenizer)."""
    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**BASE)).save_pretrained(folder)
    return folder


def with_config(source: Path, folder: Path, config: dict) -> Path:
    """A copy of the checkpoint ``source`` whose config.json is ``config``."""
    shutil.copytree(source, folder)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def reading_commands(source: Path, tmp_path: Path, text: Path) -> list[tuple[object, ...]]:
    """Every command that reads a model: info, convert, perplexity and angles."""
    return [
        ("info", source),
        ("convert", source, tmp_path / "out"),
        ("perplexity", source, "--text", text),
        ("angles", source, "--text", text),
    ]


def test_a_config_without_its_number_of_layers_is_refused_by_every_command_alike(llama, tmp_path, data_file):
    """perplexity and angles built LLaMA's default sizes (6.7B parameters) and were killed; info and convert
    refused it: all four refuse it with the same check."""
    folder = with_config(llama, tmp_path / "sizeless", {"model_type": "llama", "vocab_size": BASE["vocab_size"]})
    with bounded_memory():
        messages = [fails(*args) for args in reading_commands(folder, tmp_path, data_file)]
    assert len(set(messages)) == 1, messages
    assert f"{folder / 'config.json'} states no number of layers (num_hidden_layers)" in messages[0], messages[0]
    assert not (tmp_path / "out").exists()


def test_a_config_deeper_than_any_model_is_refused_without_building_its_layers(tmp_path, data_file):
    """info built the per-layer step sizes of 10^9 layers whole (23.5 GB)."""
    folder = tmp_path / "deep"
    assert invoke("init", "gpt2", folder, "--preset", "tiny").exit_code == 0
    config = json.loads((folder / "config.json").read_text())
    config["n_layer"] = 10**9
    (folder / "config.json").write_text(json.dumps(config))
    with bounded_memory():
        messages = [fails(*args) for args in reading_commands(folder, tmp_path, data_file)]
    assert len(set(messages)) == 1, messages
    assert "n_layer is 1,000,000,000" in messages[0] and "at most 1,000,000 layers" in messages[0], messages[0]


@pytest.mark.parametrize(
    ("stated", "said"),
    [
        ({"block_count": 10**9}, "llama.block_count is 1,000,000,000, but the file holds the tensors of 2 blocks"),
        ({"embedding_length": 2**20}, "its tensors hold 37,792 values"),
    ],
    ids=["block_count", "embedding_length"],
)
def test_a_gguf_whose_metadata_claims_more_than_its_tensors_is_refused_before_loading(tmp_path, data_file, stated,
                                                                                       said):  # fmt: skip
    """A .gguf whose block count said 10^9 grew past 3.7 GB while loading."""
    pytest.importorskip("gguf")
    path = tmp_path / "claims.gguf"
    write_tiny_gguf(path, stated=stated)
    vocab, hidden, ffn, layers = 300, 32, 64, 2  # write_tiny_gguf's tensors, as it writes them
    per_layer = 2 * hidden + 2 * hidden * hidden + 2 * (hidden // 2) * hidden + 3 * ffn * hidden
    assert 2 * vocab * hidden + hidden + layers * per_layer == 37_792
    with bounded_memory():
        messages = [fails(*args) for args in reading_commands(path, tmp_path, data_file)]
    assert len(set(messages)) == 1, messages
    assert str(path) in messages[0] and said in messages[0], messages[0]


def test_init_refuses_a_model_beyond_the_machine_memory(tmp_path):
    message = fails("init", "gpt2", tmp_path / "huge", "--preset", "1.3b", "--vocab-size", 10**10)
    assert "parameters" in message and "GB in float32" in message and "machine's" in message and "memory" in message
    assert not (tmp_path / "huge").exists()


def test_a_head_count_of_zero_is_named(stock_llama, tmp_path):
    folder = tmp_path / "heads"
    shutil.copytree(stock_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_attention_heads"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    for args in (("info", folder), ("convert", folder, tmp_path / "out")):
        message = fails(*args)
        assert "num_attention_heads is 0" in message and "config.json" in message, message
