"""Sharing GeoNorm models: every folder the project writes loads where hf-geonorm is not
installed, plain saves included, and the model card says what it must, rendered from facts stored as data.

The plugin-less side is a separate virtual environment (the ``plugin_free_python`` fixture: a venv whose only site
directory is this environment's site-packages, so that the editable-install hook of hf_geonorm is not run, plus
an import blocker). One child process loads every folder -- a folder from
``hf-geonorm convert``, a plain re-save of it, Trainer checkpoints and the final folder of
``run_training``, a LoRA adapter trained on the GeoNorm model, and the converted folder pushed to a local Hub
(tests/support/fake_hub.py) and loaded back by repository id -- with ``trust_remote_code=True``, and compares logits and
greedy generations with what the plugin computes in this process.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from huggingface_hub import ModelCard, constants
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm.modeling.remote_code import METHOD_SPEC, remote_code_files
from hf_geonorm.sharing.card_checks import auto_map_for, check_remote_code, check_shareable
from hf_geonorm.sharing.card_metadata import validate_card
from hf_geonorm.sharing.hub import save_shareable, shareable_files
from hf_geonorm.sharing.model_card import (
    CARD_DATA,
    CardInfo,
    load_card_info,
    max_rotation,
    render_model_card,
    write_model_card,
)
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.run.trainer import run_training
from hf_geonorm_cli.main import cli

from support.fake_hub import FakeHub
from support.helpers import saved_with_lineage, skip_where_train_refuses
from support.tiny_models import tiny_model, token_ids

TEXT = Path(json.__file__).with_name("decoder.py")  # real text: a Python stdlib source file
REPO_ID = "tester/tiny-geonorm"


def invoke(*args):
    result = CliRunner().invoke(cli, ["--debug", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def hub():
    with FakeHub() as server, pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "HF_HUB_OFFLINE", False)  # the local Hub is reachable also where HF_HUB_OFFLINE=1 is set
        mp.setenv("HF_HUB_OFFLINE", "0")
        mp.setattr(constants, "ENDPOINT", server.url)
        mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
        mp.setenv("HF_TOKEN", server.token)
        yield server
        assert not server.unhandled, server.unhandled


@pytest.fixture(scope="module")
def folders(tmp_path_factory, hub):
    """Every kind of folder the project writes, and the LoRA adapter; built once."""
    skip_where_train_refuses()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sharing")
    tiny_model("llama").save_pretrained(root / "stock")
    invoke("convert", root / "stock", root / "converted", "--alpha", "0.7", "--decay", "sqrt", "--bridge", "0.5",
           "--max-angle", "0.6", "--license", "mit")  # fmt: skip
    # a model loaded from that folder and saved plainly
    AutoModelForCausalLM.from_pretrained(root / "converted").save_pretrained(root / "resaved")
    # hf-geonorm train's library path: Trainer checkpoints (RemoteCodeOnSave) and the final folder
    options = TrainOptions(max_steps=4, eval_every=2, seq_len=32, batch_size=4, max_tokens=20_000, vocab_size=300,
                           output=str(root / "run"), warmup_steps=0, keep_checkpoints=True)  # fmt: skip
    run_training(options, log=lambda *a: None)
    # LoRA adapters trained on the GeoNorm model (a few steps, so that they change the outputs)
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(root / "converted"), LoraConfig(r=4, lora_alpha=8))
    optimizer = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=0.5)
    ids = token_ids()
    for _ in range(3):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    peft_model.eval()
    peft_model.save_pretrained(root / "adapter")
    # the converted folder on the (local) Hub
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "ENDPOINT", hub.url)
        assert CliRunner().invoke(cli, ["push", str(root / "converted"), REPO_ID]).exit_code == 0
    return {
        "root": root,
        "converted": root / "converted",
        "resaved": root / "resaved",
        "checkpoint-2": root / "run" / "checkpoint-2",
        "checkpoint-4": root / "run" / "checkpoint-4",
        "final": root / "run" / "final",
        "adapter": root / "adapter",
        "peft_model": peft_model,
    }


CHILD = r"""
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM

ids = torch.tensor(job["ids"])
report.update(refused={}, models={})
for name in job["refuse"]:
    try:
        AutoModelForCausalLM.from_pretrained(job["sources"][name])
        report["refused"][name] = None
    except ValueError as error:
        report["refused"][name] = str(error)


def run(model):
    with torch.no_grad():
        return {"logits": model(ids).logits,
                "generated": model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False)}


for name, source in job["sources"].items():
    config = AutoConfig.from_pretrained(source, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=True).eval()
    results[name] = run(model)
    report["models"][name] = {"module": type(model).__module__, "class": type(model).__name__,
                              "model_type": config.model_type}
    if name == "converted":  # saved again here, where the plugin is not installed
        model.save_pretrained(job["resave_to"])
        again = AutoModelForCausalLM.from_pretrained(job["resave_to"], trust_remote_code=True).eval()
        results["resaved_here"] = run(again)
base = AutoModelForCausalLM.from_pretrained(job["sources"]["converted"], trust_remote_code=True)
peft_model = PeftModel.from_pretrained(base, job["adapter"]).eval()
with torch.no_grad():
    generated = peft_model.generate(input_ids=ids[:1, :4], max_new_tokens=6, do_sample=False)
    results["adapter"] = {"logits": peft_model(ids).logits, "generated": generated}
report["peft_base_module"] = type(peft_model.get_base_model()).__module__
"""


def plugin_results(source, ids):
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    with torch.no_grad():
        generated = model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False)
        return {"logits": model(ids).logits, "generated": generated}


def test_every_folder_loads_without_the_plugin_with_identical_outputs(folders, hub, plugin_free_python, tmp_path):
    torch.set_num_threads(1)
    ids = token_ids()
    names = ["converted", "resaved", "checkpoint-2", "checkpoint-4", "final"]
    sources = {name: str(folders[name]) for name in names} | {"hub": REPO_ID}
    expected = {name: plugin_results(folders[name], ids) for name in names}
    expected["hub"] = expected["converted"]
    expected["resaved_here"] = expected["converted"]
    with torch.no_grad():
        generated = folders["peft_model"].generate(input_ids=ids[:1, :4], max_new_tokens=6, do_sample=False)
        expected["adapter"] = {"logits": folders["peft_model"](ids).logits, "generated": generated}
    assert not torch.equal(expected["adapter"]["logits"], expected["converted"]["logits"])  # the adapter matters
    job = {
        "sources": sources,
        "refuse": ["converted", "hub"],
        "adapter": str(folders["adapter"]),
        "resave_to": str(tmp_path / "resaved_here"),
        "ids": ids.tolist(),
    }
    hub_env = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}
    report, results = plugin_free_python.run(CHILD, job, tmp_path, env=hub_env)
    for name, message in report["refused"].items():  # without trust_remote_code=True transformers refuses
        assert message is not None and "trust_remote_code=True" in message, name
    for name, info in report["models"].items():
        assert info["module"].startswith("transformers_modules.") and info["class"].startswith("GeoNorm"), name
        assert info["model_type"] == ("geonorm_gpt2" if name in ("checkpoint-2", "checkpoint-4", "final")
                                      else "geonorm_llama"), name  # fmt: skip
    assert report["peft_base_module"].startswith("transformers_modules.")
    assert set(results) == set(expected)
    for name, values in expected.items():
        for key, value in values.items():
            assert torch.equal(results[name][key], value), (name, key)
    # the folder re-saved where the plugin is not installed is complete too
    assert check_remote_code(tmp_path / "resaved_here").complete
    # the Hub served the pushed files: the code was downloaded from it
    assert any(f"/{REPO_ID}/resolve/" in p and p.endswith("/modeling_geonorm.py") for _, p in hub.requests)


def test_folders_carry_auto_map_the_flat_self_contained_source_and_the_spec(folders):
    code = {p.name: p.read_bytes() for p in remote_code_files()}
    for name in ("converted", "resaved", "checkpoint-2", "checkpoint-4", "final"):
        folder = folders[name]
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"] == auto_map_for(config["model_type"]), name
        assert set(config["auto_map"]) == {  # llama has every head
            "AutoConfig",
            "AutoModel",
            "AutoModelForCausalLM",
            "AutoModelForSequenceClassification",
            "AutoModelForTokenClassification",
            "AutoModelForQuestionAnswering",
        }
        status = check_remote_code(folder)
        assert status.complete and set(status.files) == set(code), name
        assert all((folder / f).read_bytes() == data for f, data in code.items()), name
        assert (folder / METHOD_SPEC).is_file(), name
    # the pushable folders: convert's and train's final one; a checkpoint once it has a card
    assert check_shareable(folders["converted"]) == []
    assert check_shareable(folders["final"]) == []
    checkpoint = folders["checkpoint-4"]
    assert check_shareable(checkpoint) == [f"{checkpoint} has no README.md model card: write one with hf-geonorm card "
                                           f"{checkpoint}"]  # fmt: skip
    assert "optimizer.pt" not in shareable_files(checkpoint)  # Trainer state is not uploaded


def test_a_checkpoint_becomes_pushable_with_a_card(folders, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(folders["checkpoint-4"], checkpoint)
    write_model_card(checkpoint, CardInfo(evaluation=["validation loss 5.3 after 4 steps"]))
    assert check_shareable(checkpoint) == []
    card = ModelCard.load(checkpoint / "README.md")
    assert "validation loss 5.3 after 4 steps" in card.text and "geonorm_gpt2" in card.data.tags
    # re-rendered without CardInfo: metadata, evaluation lines and the repository id are kept
    write_model_card(checkpoint, CardInfo(license="mit", repo_id="me/ckpt", evaluation=["x: 1"]))
    first = (checkpoint / "README.md").read_text()
    write_model_card(checkpoint)
    assert (checkpoint / "README.md").read_text() == first


def test_plain_saves_of_geonorm_models_carry_their_code(folders, tmp_path):
    """The documented example, in this process: a model converted here and saved plainly gets auto_map and its code
    (the plugin-less load of such a folder is tests/sharing/test_export.py's); a stock model saved after
    ``import hf_geonorm`` stays a stock folder."""
    tiny_model("llama").save_pretrained(tmp_path / "stock")
    assert "auto_map" not in json.loads((tmp_path / "stock" / "config.json").read_text())
    assert not list((tmp_path / "stock").glob("*.py"))
    geo = hf_geonorm.convert(tiny_model("gpt2"))
    geo.save_pretrained(tmp_path / "plain")
    assert check_remote_code(tmp_path / "plain").complete
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["auto_map"] == auto_map_for("gpt2")
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "plain")) is type(geo)
    # loaded from a folder, saved plainly: auto_map and all of its code
    assert check_remote_code(folders["resaved"]).complete
    # the same after the folder's code went missing: save_pretrained writes it again
    model = AutoModelForCausalLM.from_pretrained(folders["converted"])
    model.save_pretrained(tmp_path / "again")
    (tmp_path / "again" / "settings.py").unlink()
    assert not check_remote_code(tmp_path / "again").complete
    model.save_pretrained(tmp_path / "again")
    assert check_remote_code(tmp_path / "again").complete


# ---- the model card ----


def test_card_metadata_settings_loading_and_evaluation(folders, tmp_path):
    converted = tmp_path / "eval"
    result = invoke("convert", folders["root"] / "stock", converted, "--bridge", "0.25", "--decay", "linear",
                    "--alpha", "0.25", "--license", "apache-2.0", "--base-model", "org/tiny-llama", "--eval-text", TEXT,
                    "--eval-tokens", "64")  # fmt: skip
    assert "source perplexity" in result.output
    angles = json.loads(invoke("angles", converted, "--text", TEXT, "--max-tokens", "64", "--json").stdout)
    summary = {**angles["summary"], "text": TEXT.name, "tokens": angles["tokens"], "sublayers": angles["sublayers"]}
    written = (converted / "README.md").read_text()
    write_model_card(converted)  # re-rendered from the stored facts: the same card
    assert (converted / "README.md").read_text() == written
    stored = load_card_info(converted)
    assert len(stored.evaluation) == 1 and "before conversion" in stored.evaluation[0]
    info = dataclasses.replace(stored, base_model="org/tiny-llama", license="apache-2.0", angles=summary,
                               repo_id="me/geo")  # fmt: skip
    write_model_card(converted, info)
    assert load_card_info(converted) == info
    text = (converted / "README.md").read_text()
    card = ModelCard(text)
    # YAML metadata, exactly the fields and types the Hub reads
    front = yaml.safe_load(text.split("---")[1])
    assert front == card.data.to_dict()
    assert front["library_name"] == "transformers" and front["pipeline_tag"] == "text-generation"
    assert front["license"] == "apache-2.0" and front["base_model"] == "org/tiny-llama"
    assert {"geonorm", "llama", "geonorm_llama", "norm-style-geo"} <= set(front["tags"])
    assert validate_card(card) == [] and validate_card(converted / "README.md") == []
    body = card.text
    # what GeoNorm is, the exact settings, the per-layer step sizes and largest rotations
    assert "## What GeoNorm is" in body and "exponential map" in body and f"]({METHOD_SPEC})" in body
    config = json.loads((converted / "config.json").read_text())
    assert "| `norm_style` | `geo`" in body and "`geo_decay` | `linear`" in body and "`geo_alpha` | `0.25`" in body
    assert f"`geo_max_angle` | {config['geo_max_angle']:.6g} rad" in body and "`geo_bridge` | `0.25`" in body
    for k, a in enumerate(hf_geonorm.step_sizes("linear", 0.25, 3), start=1):
        rotation = max_rotation(a, config["geo_max_angle"])
        assert f"| {k} | {a:.6g} | {rotation:.4g} |" in body
    # loading with and without the plugin
    assert 'import hf_geonorm' in body and 'from_pretrained("me/geo")' in body
    assert 'from_pretrained("me/geo", trust_remote_code=True)' in body and "modeling_geonorm.py" in body
    # the evaluation numbers the project produced: perplexity before/after conversion, the angles summary
    assert "before conversion (source)" in body and "after (this model)" in body
    assert f"{summary['lower_third_mean_angle']:.4f} rad in the lowest third" in body
    assert f"(ratio {summary['lower_to_upper_ratio']:.2f})" in body and "(64 tokens)" in body
    for row in summary["sublayers"]:
        assert f"| {row['layer']} | {row['sublayer']} | {row['angle']:.4f} |" in body


def test_card_without_source_information_has_no_base_model_or_license(folders):
    card = ModelCard.load(folders["final"] / "README.md")
    data = card.data.to_dict()
    assert "base_model" not in data and "license" not in data and "## Evaluation" not in card.text
    assert {"geonorm", "gpt2", "geonorm_gpt2"} <= set(data["tags"]) and validate_card(card) == []


def test_model_card_metadata_and_body(tmp_path):
    model = hf_geonorm.convert(tiny_model("llama"), geo_decay="linear", geo_alpha=0.5, geo_bridge=0.25)
    info = CardInfo(
        base_model="HuggingFaceTB/SmolLM2-135M",
        license="apache-2.0",
        language="en",
        evaluation=["perplexity on x.txt: 14.5 before, 14.5 after"],
        repo_id="me/smol-geonorm",
    )
    save_shareable(model, tmp_path, card_info=info)
    card = ModelCard.load(tmp_path / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-generation"
    assert {"geonorm", "llama", "geonorm_llama"} <= set(data["tags"])
    assert data["base_model"] == "HuggingFaceTB/SmolLM2-135M" and data["license"] == "apache-2.0"
    body = card.text
    for k, a in enumerate(hf_geonorm.step_sizes("linear", 0.5, 3), start=1):
        assert f"| {k} | {a:.6g} |" in body
    assert "`geo_bridge` | `0.25`" in body and "`geo_decay` | `linear`" in body
    assert "trust_remote_code=True" in body and 'from_pretrained("me/smol-geonorm")' in body
    assert "import hf_geonorm" in body and "14.5 before" in body
    n_params = sum(p.numel() for p in model.parameters())  # no tied weights in the tiny LLaMA
    assert f"{n_params / 1e3:.1f}K parameters" in body  # counted from the safetensors header
    # a stock-style member (no step sizes) renders too
    plain = render_model_card(hf_geonorm.convert(tiny_model("gpt2"), norm_style="pre").config)
    assert 'apply to `norm_style="geo"` only' in plain.text and "base_model" not in plain.data.to_dict()
    # a half-way layer-wise conversion: per-update bridges, frames, only the final angle clamped at 1.5 rad
    layerwise = hf_geonorm.convert(tiny_model("llama"), geo_alpha=[0.1] * 6, geo_bridge=[0.0, 0.0, 0.5, 1.0, 1.0, 1.0],
                                   geo_frames=[1.0, 0.5, 0.4, 0.3, 0.2, 0.125], geo_clamp="final", geo_max_angle=1.5,
                                   geo_bridge_costs=[0.5, 0.25, -0.01, 0.01, 0.125, 0.0])
    body = render_model_card(layerwise.config).text
    assert "`geo_clamp` | `final` (only the final angle is clamped)" in body
    assert "(between Pre-Norm and GeoNorm, update by update)" in body
    assert "| `geo_frames` | 6 Pre-Norm frames, from the calibration (`1` ... `0.125`)" in body
    assert "| `geo_bridge_costs` | 6 bridge costs in nats, from the calibration (largest `0.5`, sum `0.875`)" in body
    assert "| 1 attention | 0.1 | 1.5 |" in body  # the final clamp caps every update at 1.5 rad, not 0.1 x 1.5
    assert "`geo_clamp` | `both` (the base angle, then the scaled angle)" in render_model_card(model.config).text


def test_card_facts_round_trip_as_data_not_markdown(tmp_path):
    """The card is rendered from geonorm_card.json: a README that was deleted or edited is rendered again from
    the stored facts, which read back equal to what was given."""
    info = CardInfo(base_model="org/base", license="mit", language=["en", "fr"], source="stock-folder",
                    repo_id="me/round-trip", evaluation=["perplexity on a.txt: 9.5 before, 9.6 after"],
                    angles={"lower_third_mean_angle": 0.3, "upper_third_mean_angle": 0.1,
                            "lower_to_upper_ratio": 3.0, "text": "a.txt", "tokens": 64,
                            "sublayers": [{"layer": 0, "sublayer": "attn", "angle": 0.25}]},
                    tags=["my-run"], model_name="round trip")  # fmt: skip
    save_shareable(hf_geonorm.convert(tiny_model("llama")), tmp_path, card_info=info)
    assert load_card_info(tmp_path) == info
    assert json.loads((tmp_path / CARD_DATA).read_text()) == dataclasses.asdict(info)
    written = (tmp_path / "README.md").read_text()
    (tmp_path / "README.md").unlink()
    write_model_card(tmp_path)
    assert (tmp_path / "README.md").read_text() == written
    (tmp_path / "README.md").write_text(written.replace("## Evaluation", "## Something else").replace("me/", "x/"))
    write_model_card(tmp_path)
    assert (tmp_path / "README.md").read_text() == written
    (tmp_path / CARD_DATA).write_text(json.dumps({**dataclasses.asdict(info), "licence": "mit"}))
    with pytest.raises(ValueError, match="unknown card facts licence"):
        write_model_card(tmp_path)


CARD = """---
library_name: transformers
pipeline_tag: text-generation
license: mit
tags:
- geonorm
---
# x
"""


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda t: t.replace("license: mit", "license: MIT License"), "is not a Hub license identifier"),
        (lambda t: t.replace("license: mit", "license: other"), "license: other needs license_name"),
        (lambda t: t.replace("license: mit", "license: [mit, apache-2.0]"), "one license identifier"),
        (lambda t: t.replace("text-generation", "causal-lm"), "pipeline_tag 'causal-lm' is not a Hub task"),
        (lambda t: t.replace("- geonorm", "- geonorm\n- 3"), "tags must be a list of non-empty strings"),
        (lambda t: t.replace("tags:\n- geonorm", "tags: geonorm"), "tags must be a list"),
        (lambda t: t.replace("license: mit", "license: mit\nlanguage: English"), "language must be ISO 639 codes"),
        (lambda t: t.replace("license: mit", "license: mit\nbase_model: https://x.org/m"), "base_model must be"),
        (lambda t: t.replace("license: mit", "license: mit\ndatasets: [a b]"), "datasets must be Hub dataset ids"),
        (lambda t: t.replace("license: mit", "license: [mit"), "not valid YAML"),
        (lambda t: t.replace("library_name: transformers\n", ""), "needs library_name: transformers"),
        (lambda t: "# no metadata\n", "no YAML metadata block"),
        (lambda t: "---\n- a\n- b\n---\n", "not a mapping"),
        (lambda t: t.replace("license: mit", "license: mit\nmodel-index:\n- name: x\n  results:\n  - task: 3"),
         "cannot parse the metadata"),
    ],
)
def test_validate_card_finds_what_the_hub_rejects(change, problem):
    assert validate_card(CARD) == []
    problems = validate_card(change(CARD))
    assert any(problem in p for p in problems), problems


def test_validate_card_accepts_the_spec_forms():
    text = CARD.replace(
        "license: mit",
        "license: other\nlicense_name: my-license\nlicense_link: LICENSE\nlanguage: [en, fr]\n"
        "base_model: [org/a, org/b]\ndatasets: [org/data]\nmetrics: [perplexity]",
    )
    assert validate_card(text) == []
    assert validate_card(text.replace("tags:\n- geonorm\n", ""), geonorm=False) == []


# ---- without the plugin: the tokenizer and LoRA's default targets ----


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A GeoNorm folder whose card knows its license, source, base model and language (as convert writes it)."""
    return saved_with_lineage(tmp_path_factory.mktemp("converted") / "geo")


WITHOUT_PLUGIN = """
if job["peft_first"]:
    import peft  # imported first, as a LoRA script does
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

tokenizer = PreTrainedTokenizerFast.from_pretrained(job["folder"])  # the card's line: no trust prompt
report["tokenizer"] = type(tokenizer).__name__
model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=True)
from peft import LoraConfig, get_peft_model  # noqa: E402  (imported here when not above)

model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=4))  # PEFT's default targets, as with the plugin
report["wrapped"] = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")})
# the card's LoRA line, its targets named (peft imported after the model, where peft_first is false)
model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=True)
model = get_peft_model(model, LoraConfig(r=4, target_modules=job["targets"], fan_in_fan_out=True))
report["lora"] = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
"""


@pytest.mark.parametrize("peft_first", [True, False], ids=["peft-before-the-model", "peft-after-the-model"])
def test_without_the_plugin_the_tokenizer_asks_nothing_and_lora_finds_targets(converted, tmp_path, plugin_free_python,
                                                                              peft_first):  # fmt: skip
    """LoRA's default targets are PEFT's own for the stock type (GPT-2: c_attn), and the card's targets work, whether
    the script imports peft before or after the model's remote code runs (one child each)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    card = (converted / "README.md").read_text()
    assert 'PreTrainedTokenizerFast.from_pretrained("path/to/this/folder")' in card
    assert "target_modules=['c_attn']" in card and "fan_in_fan_out=True" in card
    job = {"folder": str(converted), "peft_first": peft_first, "targets": ["c_attn"]}
    report, _ = plugin_free_python.run(WITHOUT_PLUGIN, job, tmp_path / "a")
    assert report["tokenizer"] in ("TokenizersBackend", "PreTrainedTokenizerFast")
    assert report["wrapped"] == sorted(PEFT_TARGETS["gpt2"])
    assert report["lora"] > 0


TWO_FOLDERS = """
from transformers import AutoModelForCausalLM

models = {name: AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
          for name, folder in job["folders"].items()}  # two copies of the remote code, each waiting for peft
from peft import LoraConfig, get_peft_model  # noqa: E402

report["wrapped"] = {
    name: sorted({n.rsplit(".", 1)[-1] for n, m in get_peft_model(model, LoraConfig(r=2)).named_modules()
                  if hasattr(m, "lora_A")})
    for name, model in models.items()
}
"""


def test_two_folders_loaded_as_remote_code_before_peft_both_get_loras_default_targets(converted, tmp_path,
                                                                                      plugin_free_python):  # fmt: skip
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    from support.tiny_models import tiny_model

    llama = tmp_path / "llama"
    hf_geonorm.convert(tiny_model("llama")).save_pretrained(llama)
    job = {"folders": {"gpt2": str(converted), "llama": str(llama)}}
    report, _ = plugin_free_python.run(TWO_FOLDERS, job, tmp_path / "child")
    assert report["wrapped"] == {name: sorted(PEFT_TARGETS[name]) for name in ("gpt2", "llama")}
