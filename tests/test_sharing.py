"""Sharing GeoNorm models (issue 5): every folder the project writes loads where hf-geonorm is not installed,
plain saves never leave a dangling ``auto_map``, and the model card says what it must.

The plugin-less side is a separate virtual environment (the approach of test_export.py: a venv without pip
whose only site directory is this environment's site-packages, added by a .pth line so that the editable-install
hook of hf_geonorm is not run, plus an import blocker). One child process loads every folder -- a folder from
``hf-geonorm convert``, a re-save of it without export, Trainer checkpoints and the final folder of
``run_training``, a LoRA adapter trained on the GeoNorm model, and the converted folder pushed to a local Hub
(tests/fake_hub.py) and loaded back by repository id -- with ``trust_remote_code=True``, and compares logits and
greedy generations with what the plugin computes in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from fake_hub import FakeHub
from hf_geonorm_cli.main import cli
from huggingface_hub import ModelCard, constants
from tiny_models import tiny_model, token_ids
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm import export
from hf_geonorm.training import TrainOptions, run_training

TEXT = Path(json.__file__).with_name("decoder.py")  # real text: a Python stdlib source file
REPO_ID = "tester/tiny-geonorm"


def invoke(*args):
    result = CliRunner().invoke(cli, ["--debug", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def hub():
    with FakeHub() as server, pytest.MonkeyPatch.context() as mp:
        mp.setattr(constants, "ENDPOINT", server.url)
        mp.setattr(constants, "HF_HUB_DISABLE_XET", True)
        mp.setenv("HF_TOKEN", server.token)
        yield server
        assert not server.unhandled, server.unhandled


@pytest.fixture(scope="module")
def folders(tmp_path_factory, hub):
    """Every kind of folder the project writes, and the LoRA adapter; built once."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("sharing")
    tiny_model("llama").save_pretrained(root / "stock")
    invoke("convert", root / "stock", root / "converted", "--alpha", "0.7", "--decay", "sqrt", "--bridge", "0.5",
           "--max-angle", "0.6", "--license", "mit")  # fmt: skip
    # a model loaded from an exported folder and saved by a process that did not enable export
    AutoModelForCausalLM.from_pretrained(root / "converted").save_pretrained(root / "resaved")
    # hf-geonorm train's library path: Trainer checkpoints (RemoteCodeOnSave) and the final folder
    options = TrainOptions(max_steps=4, eval_every=2, seq_len=32, batch_size=4, max_chars=50_000, vocab_size=300,
                           output=str(root / "run"), warmup_steps=0)  # fmt: skip
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
import importlib.abc, importlib.util, json, sys

plugin_on_path = importlib.util.find_spec("hf_geonorm") is not None


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hf_geonorm", "hf_geonorm_cli"):
            raise ModuleNotFoundError(f"{name} is blocked in this test")


sys.meta_path.insert(0, Block())
import torch
import transformers.dynamic_module_utils as dmu
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM

torch.set_num_threads(1)
job = json.loads(sys.argv[1])
ids = torch.tensor(job["ids"])
dmu.TIME_OUT_REMOTE_CODE = 0
report = {"plugin_on_path": plugin_on_path, "refused": {}, "models": {}}
results = {}
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
    if name == "converted":  # saved again here, where export was never enabled
        model.save_pretrained(job["resave_to"])
        again = AutoModelForCausalLM.from_pretrained(job["resave_to"], trust_remote_code=True).eval()
        results["resaved_here"] = run(again)
base = AutoModelForCausalLM.from_pretrained(job["sources"]["converted"], trust_remote_code=True)
peft_model = PeftModel.from_pretrained(base, job["adapter"]).eval()
with torch.no_grad():
    generated = peft_model.generate(input_ids=ids[:1, :4], max_new_tokens=6, do_sample=False)
    results["adapter"] = {"logits": peft_model(ids).logits, "generated": generated}
report["peft_base_module"] = type(peft_model.get_base_model()).__module__
report["hf_geonorm_imported"] = any(name.split(".")[0] == "hf_geonorm" for name in sys.modules)
torch.save(results, job["out"])
print(json.dumps(report))
"""


def plugin_results(source, ids):
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    with torch.no_grad():
        generated = model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False)
        return {"logits": model(ids).logits, "generated": generated}


def test_every_folder_loads_without_the_plugin_with_identical_outputs(folders, hub, isolated_python, tmp_path):
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update({
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_HUB_DISABLE_XET": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": "",
        "TRANSFORMERS_VERBOSITY": "error",
    })  # fmt: skip
    job = {
        "sources": sources,
        "refuse": ["converted", "hub"],
        "adapter": str(folders["adapter"]),
        "resave_to": str(tmp_path / "resaved_here"),
        "ids": ids.tolist(),
        "out": str(tmp_path / "results.pt"),
    }
    run = subprocess.run(
        [str(isolated_python), "-c", CHILD, json.dumps(job)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert not report["hf_geonorm_imported"]
    for name, message in report["refused"].items():  # without trust_remote_code=True transformers refuses
        assert message is not None and "trust_remote_code=True" in message, name
    results = torch.load(tmp_path / "results.pt")
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
    assert export.check_remote_code(tmp_path / "resaved_here").complete
    # the Hub served the pushed files: the code was downloaded from it
    assert any(f"/{REPO_ID}/resolve/" in p and p.endswith("/modeling_geonorm.py") for _, p in hub.requests)


def test_folders_carry_auto_map_and_the_flat_self_contained_source(folders):
    code = {p.name: p.read_bytes() for p in export.remote_code_files()}
    for name in ("converted", "resaved", "checkpoint-2", "checkpoint-4", "final"):
        folder = folders[name]
        config = json.loads((folder / "config.json").read_text())
        assert config["auto_map"] == export.auto_map_for(config["model_type"]), name
        assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM"}
        status = export.check_remote_code(folder)
        assert status.complete and set(status.files) == set(code), name
        assert all((folder / f).read_bytes() == data for f, data in code.items()), name
    # the pushable folders: convert's and train's final one; a checkpoint once it has a card
    assert export.check_shareable(folders["converted"]) == []
    assert export.check_shareable(folders["final"]) == []
    checkpoint = folders["checkpoint-4"]
    assert export.check_shareable(checkpoint) == [
        f"{checkpoint} has no README.md model card: write one with "
        f"hf_geonorm.export.write_model_card({str(checkpoint)!r})"
    ]
    assert "optimizer.pt" not in export.shareable_files(checkpoint)  # Trainer state is not uploaded


def test_a_checkpoint_becomes_pushable_with_a_card(folders, tmp_path):
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(folders["checkpoint-4"], checkpoint)
    export.write_model_card(checkpoint, export.CardInfo(evaluation=["validation loss 5.3 after 4 steps"]))
    assert export.check_shareable(checkpoint) == []
    card = ModelCard.load(checkpoint / "README.md")
    assert "validation loss 5.3 after 4 steps" in card.text and "geonorm_gpt2" in card.data.tags
    # re-rendered without CardInfo: metadata, evaluation lines and the repository id are kept
    export.write_model_card(checkpoint, export.CardInfo(license="mit", repo_id="me/ckpt", evaluation=["x: 1"]))
    first = (checkpoint / "README.md").read_text()
    export.write_model_card(checkpoint)
    assert (checkpoint / "README.md").read_text() == first


def test_plain_saves_never_leave_a_dangling_auto_map(folders, tmp_path):
    # a stock model saved after `import hf_geonorm`
    tiny_model("llama").save_pretrained(tmp_path / "stock")
    # a GeoNorm model built in this process, saved without export: no auto_map, no code (loads with the plugin)
    geo = hf_geonorm.convert(tiny_model("gpt2"))
    geo.save_pretrained(tmp_path / "plain")
    for name in ("stock", "plain"):
        assert "auto_map" not in json.loads((tmp_path / name / "config.json").read_text()), name
        assert not list((tmp_path / name).glob("*.py")), name
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "plain")) is type(geo)
    # loaded from an exported folder, saved plainly: auto_map and all of its code
    assert export.check_remote_code(folders["resaved"]).complete
    # the same after the folder's code went missing: save_pretrained writes it again
    model = AutoModelForCausalLM.from_pretrained(folders["converted"])
    model.save_pretrained(tmp_path / "again")
    (tmp_path / "again" / "settings.py").unlink()
    assert not export.check_remote_code(tmp_path / "again").complete
    model.save_pretrained(tmp_path / "again")
    assert export.check_remote_code(tmp_path / "again").complete


# ---- the model card ----


def test_card_metadata_settings_loading_and_evaluation(folders, tmp_path):
    converted = tmp_path / "eval"
    result = invoke("convert", folders["root"] / "stock", converted, "--bridge", "0.25", "--decay", "linear",
                    "--license", "apache-2.0", "--base-model", "org/tiny-llama", "--eval-text", TEXT,
                    "--eval-tokens", "64")  # fmt: skip
    assert "source perplexity" in result.output
    angles = json.loads(invoke("angles", converted, "--text", TEXT, "--max-tokens", "64", "--json").stdout)
    summary = {**angles["summary"], "text": TEXT.name, "tokens": angles["tokens"], "sublayers": angles["sublayers"]}
    written = (converted / "README.md").read_text()
    export.write_model_card(converted)  # keeps the metadata and the perplexity lines of the existing card
    assert (converted / "README.md").read_text() == written
    kept = ModelCard.load(converted / "README.md")
    assert "perplexity on decoder.py" in kept.text and "before conversion" in kept.text
    info = export.CardInfo(base_model="org/tiny-llama", license="apache-2.0", angles=summary, repo_id="me/geo",
                           evaluation=[line.removeprefix("- ") for line in kept.text.splitlines()
                                       if line.startswith("- perplexity")])  # fmt: skip
    export.write_model_card(converted, info)
    text = (converted / "README.md").read_text()
    card = ModelCard(text)
    # YAML metadata, exactly the fields and types the Hub reads
    front = yaml.safe_load(text.split("---")[1])
    assert front == card.data.to_dict()
    assert front["library_name"] == "transformers" and front["pipeline_tag"] == "text-generation"
    assert front["license"] == "apache-2.0" and front["base_model"] == "org/tiny-llama"
    assert {"geonorm", "llama", "geonorm_llama", "norm-style-geo"} <= set(front["tags"])
    assert export.validate_card(card) == [] and export.validate_card(converted / "README.md") == []
    body = card.text
    # what GeoNorm is, the exact settings, the per-layer step sizes and largest rotations
    assert "## What GeoNorm is" in body and "exponential map" in body
    config = json.loads((converted / "config.json").read_text())
    assert "| `norm_style` | `geo`" in body and "`geo_decay` | `linear`" in body and "`geo_alpha` | `0.25`" in body
    assert f"`geo_max_angle` | {config['geo_max_angle']:.6g} rad" in body and "`geo_bridge` | `0.25`" in body
    for k, a in enumerate(hf_geonorm.step_sizes("linear", 0.25, 3), start=1):
        rotation = export.max_rotation(a, config["geo_max_angle"])
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
    assert {"geonorm", "gpt2", "geonorm_gpt2"} <= set(data["tags"]) and export.validate_card(card) == []


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
    assert export.validate_card(CARD) == []
    problems = export.validate_card(change(CARD))
    assert any(problem in p for p in problems), problems


def test_validate_card_accepts_the_spec_forms():
    text = CARD.replace(
        "license: mit",
        "license: other\nlicense_name: my-license\nlicense_link: LICENSE\nlanguage: [en, fr]\n"
        "base_model: [org/a, org/b]\ndatasets: [org/data]\nmetrics: [perplexity]",
    )
    assert export.validate_card(text) == []
    assert export.validate_card(text.replace("tags:\n- geonorm\n", ""), geonorm=False) == []
