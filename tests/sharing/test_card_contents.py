"""What a model card says the model is, checked on the path a user takes to it:

- a GGUF source names its model (``general.*`` keys): the card's base model is the Hub id the file states, the
  card names the model as the file does, and says what the weights were de-quantised from;
- a ``--bridge 0`` model computes exact Pre-Norm: its card's title and tags, and a fine-tune's loss curve, say so;
- the LoRA example of a LLaMA card names LLaMA's own modules, as PEFT's table for llama picks them;
- the positions of a default ``train`` model, as the built config has them, are what the docs say;
- the learning rate's source (measured cell, rule, ..., or ``--lr``) is on the card and in metrics.json.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from support.helpers import LINEAGE, invoke, saved_with_lineage, succeeds, train_in
from support.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[2]


def card_of(folder: Path) -> tuple[dict, str]:
    """The card's metadata and its text."""
    card = ModelCard.load(folder / "README.md")
    return card.data.to_dict(), card.text


def title(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("# "))


# ---- a GGUF source ----

SMOL = "HuggingFaceTB/SmolLM2-135M"


@pytest.mark.parametrize(
    "keys",
    [
        {"general.name": "SmolLM2 135M", "general.source.repo_url": f"https://huggingface.co/{SMOL}"},
        {"general.organization": "HuggingFaceTB", "general.name": "SmolLM2-135M"},
        {"general.name": "Tiny Chat", "general.base_model.count": 1, "general.base_model.0.organization":
         "HuggingFaceTB", "general.base_model.0.name": "SmolLM2-135M"},  # fmt: skip
    ],
    ids=["its-own-repository", "its-organization-and-name", "the-model-it-was-made-from"],
)
def test_a_gguf_that_states_its_models_hub_id_gives_the_card_its_base_model(tmp_path, keys):
    pytest.importorskip("gguf")
    from support.tiny_gguf import write_tiny_gguf

    write_tiny_gguf(tmp_path / "model.gguf", metadata=keys)
    succeeds("convert", tmp_path / "model.gguf", tmp_path / "out")
    data, text = card_of(tmp_path / "out")
    assert data["base_model"] == SMOL
    assert json.loads((tmp_path / "out" / "geonorm_card.json").read_text())["base_model"] == SMOL
    assert keys.get("general.name", "SmolLM2-135M") in text  # named as the file names it


def test_a_gguf_card_names_the_model_and_says_what_its_weights_were_dequantised_from(tmp_path):
    gguf = pytest.importorskip("gguf")
    from support.tiny_gguf import write_tiny_gguf

    keys = {"general.name": "SmolLM2 135M", "general.basename": "SmolLM2", "general.size_label": "135M"}
    write_tiny_gguf(tmp_path / "model.gguf", metadata=keys, quantised="Q4_1")
    types = Counter(tensor.tensor_type.name for tensor in gguf.GGUFReader(str(tmp_path / "model.gguf")).tensors)
    assert types["Q4_1"] and types["F32"]  # what is at stake: quantised weights, float norms
    succeeds("convert", tmp_path / "model.gguf", tmp_path / "out")
    data, text = card_of(tmp_path / "out")
    words = " ".join(text.split())
    assert "SmolLM2 135M" in title(text)
    assert "base_model" not in data  # a title is no Hub id: nothing is guessed, and the card says how to add one
    assert "SmolLM2 135M" in words and "--base-model" in words
    assert f"de-quantised from Q4_1 ({types['Q4_1']} tensors) and F32 ({types['F32']} tensors) to float32" in words
    info = succeeds("info", tmp_path / "model.gguf")
    assert "SmolLM2 135M" in info and f"Q4_1 {types['Q4_1']}" in info


# ---- a model at bridge 0 ----


@pytest.fixture(scope="module")
def bridge_zero(tmp_path_factory) -> Path:
    """A tiny stock LLaMA converted with --bridge 0."""
    root = tmp_path_factory.mktemp("bridge0")
    tiny_model("llama", vocab_size=320).save_pretrained(root / "stock")
    succeeds("convert", root / "stock", root / "geo0", "--bridge", "0")
    return root / "geo0"


def test_a_bridge_zero_card_and_a_fine_tunes_loss_curve_say_it_computes_pre_norm(bridge_zero, tmp_path, data_file):
    from PIL import Image
    from transformers import AutoModelForCausalLM

    import hf_geonorm  # noqa: F401  (the GeoNorm classes)

    stock = AutoModelForCausalLM.from_pretrained(bridge_zero.parent / "stock")
    geo = AutoModelForCausalLM.from_pretrained(bridge_zero)
    tokens = torch.arange(1, 17)[None]
    assert geo.config.norm_style == "geo" and geo.config.geo_bridge == 0.0
    assert (geo(tokens).logits - stock(tokens).logits).abs().max() < 1e-5  # the claim: it computes Pre-Norm
    data, text = card_of(bridge_zero)
    assert "computes exactly Pre-Norm" in title(text) and "bridge 0" in title(text)
    assert "computes-pre-norm" in data["tags"] and "norm-style-geo" not in data["tags"]
    result = train_in(tmp_path, data_file, "--model", bridge_zero)
    assert result.exit_code == 0, result.output
    data, text = card_of(tmp_path / "run" / "final")
    assert "computes exactly Pre-Norm" in title(text) and "computes-pre-norm" in data["tags"]
    curve = Image.open(tmp_path / "run" / "loss_curve.png").text["Title"]  # the plot's title, as drawn
    assert "computes exactly Pre-Norm" in curve and ", geo," not in curve, curve


# ---- the LoRA example ----


def test_a_llama_cards_lora_example_names_llamas_own_modules(bridge_zero):
    from peft import LoraConfig, get_peft_model
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS
    from transformers import AutoModelForCausalLM

    stock = AutoModelForCausalLM.from_pretrained(bridge_zero.parent / "stock")
    names = {name.rsplit(".", 1)[-1] for name, _ in stock.named_modules()}
    expected = [target for target in PEFT_TARGETS["llama"] if target in names]
    _, text = card_of(bridge_zero)
    shown = re.search(r"target_modules=(\[[^\]]*\])", text)
    assert shown is not None, text
    targets = json.loads(shown[1].replace("'", '"'))
    assert targets == expected and expected, (targets, expected)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(bridge_zero), LoraConfig(r=4, target_modules=targets))
    assert sum(p.numel() for n, p in model.named_parameters() if "lora_" in n) > 0  # the card's line, as it reads


# ---- the positions of a default train model ----


def test_the_docs_state_the_positions_a_default_train_model_is_built_with():
    from hf_geonorm.training.options import TrainOptions
    from hf_geonorm.training.run.model import planned_config

    built = planned_config(TrainOptions())  # the config train builds when given nothing
    positions = built.n_positions if built.model_type.endswith("gpt2") else built.max_position_embeddings
    docs = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    stated = re.search(r"A default `train` model has (\d+)", docs)
    assert stated is not None and int(stated[1]) == positions, (stated and stated[0], positions)


# ---- where the learning rate came from ----


def test_a_run_without_lr_records_the_rates_source_on_its_card_and_in_its_metrics(tmp_path, data_file):
    from hf_geonorm.training.rate_rule import RATE_RULE

    result = train_in(tmp_path, data_file)  # the default model: a tiny GeoNorm GPT-2 (geo, 4 x 128)
    assert result.exit_code == 0, result.output
    cell = next(c for c in json.loads(RATE_RULE.read_text())["cells"]
                if (c["arch"], c["style"], c["layers"], c["width"]) == ("gpt2", "geo", 4, 128))  # fmt: skip
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["options"]["lr"] == cell["lr"]
    assert metrics["learning_rate"]["value"] == cell["lr"] and metrics["learning_rate"]["source"] == "measured cell"
    assert cell["phase"] in metrics["learning_rate"]["why"]
    training = json.loads((tmp_path / "run" / "final" / "geonorm_card.json").read_text())["training"]
    assert "--lr" not in training["peak learning rate"], training
    assert training["learning rate source"].startswith("measured cell") and "no --lr given" in training[
        "learning rate source"]  # fmt: skip
    _, text = card_of(tmp_path / "run" / "final")
    assert "learning rate source: measured cell" in text


# ---- a source's card that takes unbounded work to read ----


def test_a_yaml_alias_bomb_in_a_source_card_does_not_hang(stock_llama, tmp_path):
    folder = tmp_path / "bomb"
    shutil.copytree(stock_llama, folder)
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
    (folder / "README.md").write_text("---\n" + "\n".join(lines) + "\nlicense: mit\n---\n# a model\n")
    started = time.monotonic()
    result = invoke("info", folder)
    assert result.exit_code == 0, result.output
    assert "YAML aliases" in result.output
    result = invoke("convert", folder, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 120


def test_a_yaml_alias_bomb_in_a_hub_models_card_is_refused_before_it_is_built(stock_llama, tmp_path):
    """A Hub id's card is downloaded (here from a pre-filled offline cache) and checked like a local one."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hf" / "hub" / "models--someone--bomb"
    shutil.copytree(stock_llama, snapshot / "snapshots" / revision)
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text(revision)
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
    (snapshot / "snapshots" / revision / "README.md").write_text("---\n" + "\n".join(lines) + "\n---\n# a model\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", "from hf_geonorm_cli.main import cli; cli()"]
    result = subprocess.run([*command, "convert", "someone/bomb", str(tmp_path / "out"), "--bridge", "0"],
                            capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "README.md: the metadata uses YAML aliases" in result.stderr and "its card is not read" in result.stderr
    assert "base_model: someone/bomb" in (tmp_path / "out" / "README.md").read_text()


# ---- the card's lineage through train, and the context it states ----


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A GeoNorm folder whose card knows its license, source, base model and language (as convert writes it)."""
    return saved_with_lineage(tmp_path_factory.mktemp("converted") / "geo")


def test_train_from_a_converted_folder_keeps_its_license_source_and_base_model(converted, tmp_path, data_file):
    out = tmp_path / "tuned"
    succeeds("train", "--model", converted, "--data", data_file, "--seq-len", 32, "--batch-size", 2, "--max-steps", 1,
             "--output", out)  # fmt: skip
    stored = json.loads((out / "final" / "geonorm_card.json").read_text())
    assert {key: stored[key] for key in LINEAGE} == LINEAGE
    front = ModelCard.load(out / "final" / "README.md").data.to_dict()
    assert front["license"] == "mit" and front["base_model"] == "org/base-model"
    assert "some/original" in (out / "final" / "README.md").read_text()


def test_info_and_the_card_state_the_positions_and_generate_beyond_them_names_the_limit(converted):
    assert "positions:    64 " in succeeds("info", converted)
    assert "Its context is 64 positions" in (converted / "README.md").read_text()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(converted)
    prompt = torch.zeros((1, 8), dtype=torch.long)
    fill = {"do_sample": False, "pad_token_id": 0}
    assert model.generate(prompt, max_new_tokens=8, min_new_tokens=8, **fill).shape[-1] == 16
    with pytest.raises(ValueError, match=r"beyond this model's 64 learned positions.*max_new_tokens"):
        model.generate(prompt, max_new_tokens=200, min_new_tokens=200, **fill)


# ---- a sweep's baseline run ----


def test_a_sweeps_baseline_run_is_carded_as_its_style_with_the_sweeps_rate_and_its_data_by_name(tmp_path, data_file):
    """A Pre-Norm run of a sweep: the card's title names Pre-Norm as a baseline (not "GeoNorm gpt2"), its rate
    source names the sweep (not --lr), and its data is named by the file's name with the fingerprint train's data
    step gives it, with no folder of this machine in the card."""
    from hf_geonorm.training.data.corpus import resolve_corpus

    folder = tmp_path / "my-corpus"
    folder.mkdir()
    shutil.copy(data_file, folder / "notes.txt")
    output = tmp_path / "sweep"
    succeeds("sweep", "--output", output, "--styles", "pre", "--lrs", "2e-3", "--seeds", "0", "--data", folder,
             "--data-cache", tmp_path / "cache", "--seq-len", "64", "--vocab-size", "300", "--batch-size", "4",
             "--warmup-steps", "0", "--max-steps", "1", "--eval-every", "1", "--eval-blocks", "8")  # fmt: skip
    final = output / "runs" / "pre-lr2e-3-seed0" / "final"
    data, text = card_of(final)
    assert title(text) == "# Pre-Norm gpt2 (hf-geonorm baseline)", title(text)
    assert "GeoNorm gpt2" not in text
    assert "A Pre-Norm model of the gpt2 architecture (a baseline hf-geonorm trains beside GeoNorm)" in text
    training = json.loads((final / "geonorm_card.json").read_text())["training"]
    assert "hf-geonorm sweep" in training["learning rate source"] and "--lr" not in training["learning rate source"]
    fingerprint = resolve_corpus(str(folder)).fingerprint
    assert training["data"] == f"1 files under my-corpus/ (content fingerprint {fingerprint[:16]})", training["data"]
    assert str(tmp_path) not in (final / "README.md").read_text() and str(tmp_path) not in json.dumps(training)


def test_a_geonorm_run_keeps_its_title_and_a_given_rate_says_so(tmp_path, data_file):
    """A train run of the default GeoNorm model with --lr: the card is titled GeoNorm, its rate source is --lr."""
    result = train_in(tmp_path, data_file, "--lr", "3e-3")
    assert result.exit_code == 0, result.output
    data, text = card_of(tmp_path / "run" / "final")
    assert title(text) == "# GeoNorm gpt2" and "baseline" not in title(text)
    training = json.loads((tmp_path / "run" / "final" / "geonorm_card.json").read_text())["training"]
    assert training["learning rate source"] == "given by --lr"
    assert training["data"].startswith(f"{data_file.name} (content fingerprint ")
