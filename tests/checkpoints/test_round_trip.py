"""The path users take, for every case of tests/support/tiny_models.py: a stock checkpoint folder -> ``hf-geonorm
convert --bridge 0`` -> a GeoNorm folder -> ``from_pretrained``, through the plugin and as remote code; a GeoNorm model
saved and reloaded; ``train --model <stock folder>`` for one step (these two for one case of each weight layout by
default, for every case with ``--runslow``).

transformers keeps some weights in memory in another layout than in checkpoint files (mixture-of-experts experts
fused, gpt_neox's ``embed_out``, exaone's GPT-style names) and translates by model type on load and save; a GeoNorm
type that lacked the translation loaded random tensors with only a log line. The reference everywhere is the stock
model loaded from the stock folder by transformers itself. The stock weights are perturbed, except the embedding's
padding row, which stays zero as in every trained checkpoint (``nn.Embedding`` gives it no gradient): youtu's stock
loader zeroes that row whatever the file holds, the GeoNorm classes load what the file holds.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm.checkpoints.loading import load_model, open_source
from hf_geonorm.sharing.card_checks import check_shareable
from hf_geonorm.sharing.hub import save_shareable
from hf_geonorm_cli.main import cli

from support.helpers import skip_where_train_refuses
from support.tiny_models import CASES, tiny_model, token_ids

VOCAB = 320  # above the 300-token tokenizer `train` trains on the fly (TRAIN)
TRAIN = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--max-steps", "1"]


def loaded(folder: Path, **kwargs) -> tuple[torch.nn.Module, dict]:
    """The causal LM of ``folder`` through the Auto class, with transformers' own report of what did not fit."""
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, **kwargs)
    return model.eval(), info


def assert_nothing_dropped(info: dict) -> None:
    assert {key: list(value) for key, value in info.items() if key != "error_msgs" and value} == {}
    assert not info.get("error_msgs")


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(token_ids()).logits


@functools.cache
def stock_folders(root: Path) -> dict[str, Path]:
    """Every case saved by stock transformers (perturbed weights, so that a tensor left at its initial value shows)."""
    folders = {}
    for name in CASES:
        model = tiny_model(name, perturb=True, vocab_size=VOCAB)
        embedding = model.get_input_embeddings()
        if embedding.padding_idx is not None:
            with torch.no_grad():
                embedding.weight[embedding.padding_idx] = 0
        folders[name] = root / name
        model.save_pretrained(folders[name])
    return folders


@pytest.fixture(scope="module")
def stock(tmp_path_factory) -> dict[str, Path]:
    return stock_folders(tmp_path_factory.mktemp("stock"))


@pytest.fixture(scope="module")
def converted(tmp_path_factory, stock) -> dict[str, Path]:
    """Every stock folder converted with ``hf-geonorm convert --bridge 0`` (the CLI, as users run it)."""
    root = tmp_path_factory.mktemp("converted")
    folders = {}
    for name, source in stock.items():
        folders[name] = root / name
        result = CliRunner().invoke(cli, ["convert", str(source), str(folders[name]), "--bridge", "0"])
        assert result.exit_code == 0, (name, result.output)
    return folders


@pytest.mark.parametrize("name", list(CASES))
def test_a_converted_stock_folder_loads_back_as_the_stock_model(name, stock, converted):
    reference, info = loaded(stock[name])
    assert_nothing_dropped(info)
    expected = logits(reference)
    model, info = loaded(converted[name])
    assert model.config.model_type == f"geonorm_{CASES[name].model_type}"
    assert_nothing_dropped(info)
    torch.testing.assert_close(logits(model), expected, rtol=0, atol=1e-6)
    # the strict loader of convert, perplexity and train --model (it refuses a missing or unexpected tensor)
    torch.testing.assert_close(logits(load_model(open_source(converted[name]))), expected, rtol=0, atol=1e-6)
    # the README's Python recipe: a GeoNorm config over the stock folder
    config = hf_geonorm.config_class_for(CASES[name].model_type).from_pretrained(stock[name], geo_bridge=0)
    model, info = loaded(stock[name], config=config)
    assert_nothing_dropped(info)
    torch.testing.assert_close(logits(model), expected, rtol=0, atol=1e-6)
    # the converted folder passes push's checks (its weights are the ones its config's model loads)
    assert [p for p in check_shareable(converted[name]) if "README.md" not in p] == []


# one case of each way transformers lays weights out on load (plain, GPT-style names, fused experts, MLA, GPT-2's
# Conv1D, embed_out and parallel blocks, sandwich norms): the save and reload and the train step run for these by
# default, for every case with --runslow (the paths the others add are the same; their loading is checked for every
# case above, and tests/test_models.py saves and reloads every case by default)
BY_DEFAULT = ("llama", "exaone", "mixtral", "deepseek_v3", "gpt2", "gpt_neox-parallel", "falcon-new", "gemma2")
REPRESENTATIVE = [name if name in BY_DEFAULT else pytest.param(name, marks=pytest.mark.slow) for name in CASES]


@pytest.mark.parametrize("loaded_as", ["geonorm", "stock"])
@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_a_geonorm_model_saved_and_reloaded_is_the_same_model(name, loaded_as, stock, converted, tmp_path):
    """A GeoNorm computation that is not Pre-Norm (bridge 0.5, learnable steps moved off their initial value),
    saved by the model's own ``save_pretrained`` and loaded back through the Auto class: from a converted folder,
    and converted in memory from a stock model loaded from its folder (it carries the stock conversion)."""
    model, _ = loaded(converted[name] if loaded_as == "geonorm" else stock[name])
    hf_geonorm.apply_geonorm(model, geo_bridge=0.5, geo_learnable_step=True)
    with torch.no_grad():
        for index, param in enumerate(p for n, p in model.named_parameters() if "step_" in n):
            param.add_(0.1 * (index + 1))
    expected = logits(model)
    model.save_pretrained(tmp_path / "saved")
    again, info = loaded(tmp_path / "saved")
    assert_nothing_dropped(info)
    torch.testing.assert_close(logits(again), expected, rtol=0, atol=1e-6)


REMOTE = """
import transformers
for name, folder in job["folders"].items():
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True,
                                                                    output_loading_info=True)
    report[name] = {"module": type(model).__module__, "dropped": {k: list(v) for k, v in info.items() if v}}
    with torch.no_grad():
        results[name] = {"logits": model.eval()(torch.tensor(job["ids"])).logits}
"""


def test_converted_folders_load_as_remote_code_without_the_plugin(stock, converted, plugin_free_python, tmp_path):
    """Where hf-geonorm is not installed, the folder's own code must translate the checkpoint layout too."""
    job = {"folders": {name: str(folder) for name, folder in converted.items()}, "ids": token_ids().tolist()}
    report, results = plugin_free_python.run(REMOTE, job, tmp_path / "child", timeout=600)
    for name in CASES:
        assert report[name]["module"].startswith("transformers_modules."), name
        assert report[name]["dropped"] == {}, name
        torch.testing.assert_close(results[name]["logits"], logits(loaded(stock[name])[0]), rtol=0, atol=1e-6)


def test_push_refuses_a_folder_whose_weights_its_model_does_not_load(converted, tmp_path):
    """A tensor deleted, a tensor added, experts renamed out of the Mixtral checkpoint layout: each folder is
    refused by push's checks, naming what does not fit, before anything is sent."""
    model, _ = loaded(converted["mixtral"])
    save_shareable(model, tmp_path / "whole")
    assert check_shareable(tmp_path / "whole") == []
    tensors = load_file(tmp_path / "whole" / "model.safetensors")
    dropped = "model.layers.1.self_attn.q_proj.weight"
    edits = {
        "missing": ({k: v for k, v in tensors.items() if k != dropped}, [dropped, "missing"]),
        "unexpected": (
            {**tensors, "model.layers.0.extra.weight": torch.ones(2)},
            ["model.layers.0.extra", "unexpected"],
        ),
        "renamed": ({k.replace(".w1.", ".w_in."): v for k, v in tensors.items()}, ["layout of a mixtral checkpoint"]),
    }
    for case, (edited, words) in edits.items():
        folder = tmp_path / case
        folder.mkdir()
        for file in (tmp_path / "whole").iterdir():
            (folder / file.name).write_bytes(file.read_bytes())
        save_file(edited, folder / "model.safetensors", metadata={"format": "pt"})
        problems = check_shareable(folder)
        assert len(problems) == 1 and all(word in problems[0] for word in words), (case, problems)
        result = CliRunner().invoke(cli, ["push", str(folder), "someone/model"], env={"HF_TOKEN": "hf_x"})
        assert result.exit_code != 0 and "not pushed" in result.output and words[0] in result.output, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_train_model_from_a_stock_folder_starts_from_its_weights(name, stock, tmp_path, data_file):
    """One step of ``train --model <stock folder>`` at bridge 0: AdamW's first step moves no weight by more than the
    learning rate (|m / sqrt(v)| <= 1), so every tensor of ``final/`` must be within ``lr`` of the stock folder's
    (a tensor the run did not load would be a fresh random one)."""
    skip_where_train_refuses()
    lr = 1e-4
    out = tmp_path / "run"
    # no weight decay: it would move each weight by a further lr * decay * |weight|
    args = ["--model", stock[name], "--data", data_file, *TRAIN, "--bridge", "0", "--lr", lr, "--weight-decay", 0,
            "--output", out]  # fmt: skip
    result = CliRunner().invoke(cli, ["train", *map(str, args)])
    assert result.exit_code == 0, result.output
    trained, info = loaded(out / "final")
    assert_nothing_dropped(info)
    reference = dict(loaded(stock[name])[0].state_dict())
    state = trained.state_dict()
    assert state.keys() == reference.keys()
    moved = {key: (state[key] - reference[key]).abs().max().item() for key in reference}
    assert max(moved.values()) <= lr * 1.01, sorted(moved.items(), key=lambda kv: -kv[1])[:3]
    assert json.loads((out / "metrics.json").read_text())["steps"] == 1
