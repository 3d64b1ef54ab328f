"""hf_geonorm.export: folders with remote code, auto_map and a model card (issue 4/5).

The remote-code proof runs in a separate virtual environment that sees torch and transformers but not
hf_geonorm (a venv without pip whose only site directory is this environment's site-packages, added by a
.pth line so that the editable-install hook of hf_geonorm is not run, plus an import blocker for the case of a
regular install), and loads the exported folders with trust_remote_code=True.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_model, token_ids
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm import export

REPO = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)


def geonorm_model(model_type, **settings):
    return hf_geonorm.convert(tiny_model(model_type), **settings).eval()


def test_saved_folder_has_auto_map_code_and_card_and_leaves_the_model_alone(tmp_path):
    model = geonorm_model("llama", geo_alpha=2.0, geo_decay="sqrt")
    assert "auto_map" not in vars(model.config)
    export.save_with_remote_code(model, tmp_path, card_info=export.CardInfo(base_model="org/base", license="mit"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "geonorm_llama"
    assert config["auto_map"] == {
        "AutoConfig": "modeling_geonorm.GeoNormLlamaConfig",
        "AutoModel": "modeling_geonorm.GeoNormLlamaModel",
        "AutoModelForCausalLM": "modeling_geonorm.GeoNormLlamaForCausalLM",
    }
    names = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "config.json", "README.md", "modeling_geonorm.py"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pth")) for n in names)  # safetensors only
    status = export.check_remote_code(tmp_path)
    assert status.complete and status.files[0] == "modeling_geonorm.py"
    assert set(status.files) == {p.name for p in export.remote_code_files()}
    # the in-memory config did not keep the auto_map: a later plain save writes no dangling auto_map
    assert "auto_map" not in vars(model.config)
    model.save_pretrained(tmp_path / "plain")
    assert "auto_map" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    # it reloads through the plugin with identical logits
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(token_ids()).logits, model(token_ids()).logits)


def test_a_stock_checkpoint_patched_in_place_saves_as_its_geonorm_type(tmp_path):
    """from_pretrained keeps model_type on the config instance; apply_geonorm swaps the class. The export writes
    the GeoNorm type anyway, so the folder reloads as GeoNorm."""
    tiny_model("llama").save_pretrained(tmp_path / "stock")
    model = hf_geonorm.apply_geonorm(AutoModelForCausalLM.from_pretrained(tmp_path / "stock"), geo_alpha=0.75).eval()
    export.save_with_remote_code(model, tmp_path / "out", card_info=False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "geonorm_llama" and config["geo_alpha"] == 0.75
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(reloaded) is hf_geonorm.family_for("llama").causal_class
    with torch.no_grad():
        assert torch.equal(reloaded(token_ids()).logits, model(token_ids()).logits)


def imported_modules(path: Path) -> tuple[set[str], set[str]]:
    """(absolute top-level modules, relative module names) imported anywhere in a file."""
    absolute, relative = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            absolute |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                relative.add(node.module)
            else:
                absolute.add(node.module.split(".")[0])
    return absolute, relative


def test_remote_code_imports_only_torch_transformers_and_flat_siblings(tmp_path):
    names = export.write_remote_code(tmp_path)
    assert names[0] == "modeling_geonorm.py" and "__init__.py" not in names
    for name in names:
        absolute, relative = imported_modules(tmp_path / name)
        # triton only inside fused.py's guarded import (the CUDA kernel); the folder loads without it
        assert absolute - STDLIB <= {"torch", "transformers", "triton"}, name
        assert None not in relative, f"{name}: 'from . import x' breaks the saved folder"
        assert all("." not in module and f"{module}.py" in names for module in relative), name


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
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

torch.set_num_threads(1)
job = json.loads(sys.argv[1])
report = {"plugin_on_path": plugin_on_path, "folders": {}}
dmu.TIME_OUT_REMOTE_CODE = 0
try:
    AutoModelForCausalLM.from_pretrained(job["folders"][0])
    report["refused"] = None
except ValueError as error:
    report["refused"] = str(error)
results = {}
for folder in job["folders"]:
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    ids = torch.tensor(job["ids"])
    with torch.no_grad():
        logits = model(ids).logits
        hidden = base(ids).last_hidden_state
        generated = model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False)
    results[folder] = {"logits": logits, "hidden": hidden, "generated": generated}
    report["folders"][folder] = {
        "config_class": type(config).__name__,
        "model_module": type(model).__module__,
        "model_class": type(model).__name__,
        "model_type": config.model_type,
    }
report["hf_geonorm_imported"] = any(name.split(".")[0] == "hf_geonorm" for name in sys.modules)
torch.save(results, job["out"])
print(json.dumps(report))
"""


def test_exported_folders_load_where_the_plugin_is_not_installed(tmp_path, isolated_python):
    ids = token_ids()
    models = {
        "llama": geonorm_model("llama", geo_radius="sqrt_d", geo_alpha=[1.0, 0.7, 0.2], geo_max_angle=None),
        "gpt2": geonorm_model("gpt2", geo_learnable_step=True, geo_bridge=0.5),
    }
    with torch.no_grad():  # give the learnable step a non-identity value, so it must be loaded to match
        models["gpt2"].transformer.h[1].geonorm_mlp_residual.step_scale.fill_(0.6)
    expected, folders = {}, []
    for name, model in models.items():
        folder = tmp_path / f"exported_{name}"
        export.save_with_remote_code(model, folder)
        folders.append(str(folder))
        with torch.no_grad():
            expected[str(folder)] = {
                "logits": model(ids).logits,
                "hidden": model.base_model(ids).last_hidden_state,
                "generated": model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False),
            }
    env = {
        **os.environ,
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": "",
    }
    job = {"folders": folders, "ids": ids.tolist(), "out": str(tmp_path / "results.pt")}
    run = subprocess.run(
        [str(isolated_python), "-c", CHILD, json.dumps(job)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert not report["hf_geonorm_imported"]
    assert report["refused"] is not None and "trust_remote_code=True" in report["refused"]
    results = torch.load(tmp_path / "results.pt")
    for folder in folders:
        info = report["folders"][folder]
        assert info["model_module"].startswith("transformers_modules.") and info["model_class"].startswith("GeoNorm")
        assert info["model_type"].startswith("geonorm_")
        for key in ("logits", "hidden", "generated"):
            assert torch.equal(results[folder][key], expected[folder][key]), (folder, key)


def test_plain_save_of_a_reloaded_export_has_no_dangling_auto_map(tmp_path):
    export.save_with_remote_code(geonorm_model("llama"), tmp_path / "exported", card_info=False)
    AutoModelForCausalLM.from_pretrained(tmp_path / "exported").save_pretrained(tmp_path / "resaved")
    status = export.check_remote_code(tmp_path / "resaved")
    assert not status.present or status.complete


def test_add_remote_code_completes_a_plain_checkpoint(tmp_path):
    model = geonorm_model("gpt2")
    model.save_pretrained(tmp_path)
    assert not export.check_remote_code(tmp_path).present
    auto_map = export.add_remote_code(tmp_path)
    assert auto_map["AutoModelForCausalLM"] == "modeling_geonorm.GeoNormGPT2ForCausalLM"
    assert export.check_remote_code(tmp_path).complete
    (tmp_path / "residual.py").unlink()
    status = export.check_remote_code(tmp_path)
    assert status.present and not status.complete and status.missing == ["residual.py"]


def test_export_refuses_stock_quantised_and_peft_models(tmp_path):
    with pytest.raises(ValueError, match="GeoNorm models"):
        export.save_with_remote_code(tiny_model("llama"), tmp_path / "a")
    model = geonorm_model("llama")
    model.hf_quantizer = object()
    with pytest.raises(ValueError, match="quantised"):
        export.save_with_remote_code(model, tmp_path / "b")
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(geonorm_model("llama"), LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="merge"):
        export.save_with_remote_code(peft_model, tmp_path / "c")
    with pytest.raises(ValueError, match="GeoNorm"):
        export.save_config_with_remote_code(tiny_model("llama").config, tmp_path / "d")


def test_model_card_metadata_and_body(tmp_path):
    model = geonorm_model("llama", geo_decay="linear", geo_alpha=0.5, geo_bridge=0.25)
    info = export.CardInfo(
        base_model="HuggingFaceTB/SmolLM2-135M",
        license="apache-2.0",
        language="en",
        evaluation=["perplexity on x.txt: 14.5 before, 14.5 after"],
        repo_id="me/smol-geonorm",
    )
    export.save_with_remote_code(model, tmp_path, card_info=info)
    from huggingface_hub import ModelCard

    card = ModelCard.load(tmp_path / "README.md")
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "text-generation"
    assert {"geonorm", "llama", "geonorm_llama"} <= set(data["tags"])
    assert data["base_model"] == "HuggingFaceTB/SmolLM2-135M" and data["license"] == "apache-2.0"
    body = card.text
    steps = hf_geonorm.step_sizes("linear", 0.5, 3)
    for k, a in enumerate(steps, start=1):
        assert f"| {k} | {a:.6g} |" in body
    assert "`geo_bridge` | `0.25`" in body and "`geo_decay` | `linear`" in body
    assert "trust_remote_code=True" in body and 'from_pretrained("me/smol-geonorm")' in body
    assert "import hf_geonorm" in body and "14.5 before" in body
    assert "36.1K parameters" in body  # counted from the safetensors header
    # a stock-style member (no step sizes) renders too
    plain = export.render_model_card(geonorm_model("gpt2", norm_style="pre").config)
    assert 'apply to `norm_style="geo"` only' in plain.text and "base_model" not in plain.data.to_dict()


def test_card_template_is_package_data_of_the_wheel(tmp_path):
    """The template must be found after a non-editable install: it is installed as hf_geonorm.model_cards."""
    from importlib import resources

    assert resources.files("hf_geonorm.model_cards").joinpath(export.CARD_TEMPLATE).is_file()
    assert export.card_template() == (REPO / "model_cards" / export.CARD_TEMPLATE).read_text()
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "hf_geonorm", "cli", "model_cards"):
        copy = subprocess.run(["cp", "-r", str(REPO / name), str(source / name)], check=True)
        assert copy.returncode == 0
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert f"hf_geonorm/model_cards/{export.CARD_TEMPLATE}" in names
    assert {"hf_geonorm/export.py", "hf_geonorm_cli/main.py", "hf_geonorm/modeling_geonorm.py"} <= names


def test_atomic_directory_all_or_nothing(tmp_path):
    target = tmp_path / "deep" / "er" / "out"
    with pytest.raises(RuntimeError), export.atomic_directory(target) as tmp:
        (tmp / "half.txt").write_text("x")
        raise RuntimeError("interrupted")
    assert not (tmp_path / "deep").exists()  # no output, no temp folder, no created parents
    with export.atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("a")
    assert [p.name for p in target.parent.iterdir()] == ["out"] and (target / "a.txt").read_text() == "a"
    assert oct(target.stat().st_mode & 0o777) != oct(0o700)  # usual permissions, not mkdtemp's
    with pytest.raises(FileExistsError, match="not empty"), export.atomic_directory(target) as tmp:
        pass
    with pytest.raises(KeyboardInterrupt), export.atomic_directory(target, force=True) as tmp:
        (tmp / "b.txt").write_text("b")
        raise KeyboardInterrupt
    assert sorted(p.name for p in target.parent.iterdir()) == ["out"] and (target / "a.txt").exists()
    with export.atomic_directory(target, force=True) as tmp:
        (tmp / "b.txt").write_text("b")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["out"]
