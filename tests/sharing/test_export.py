"""Saved GeoNorm folders: remote code written by one writer on every save, the method specification beside it,
folder utilities (hf_geonorm.remote_code, hf_geonorm.sharing.folders).

The plugin-less side runs in a separate interpreter that sees torch and transformers but not hf_geonorm (the
``plugin_free_python`` fixture of conftest.py), and loads the saved folders with trust_remote_code=True.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import subprocess
import sys
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm.modeling.remote_code import METHOD_SPEC, remote_code_files
from hf_geonorm.sharing.card_checks import auto_map_for, check_remote_code
from hf_geonorm.sharing.folders import add_remote_code, save_config_with_remote_code
from hf_geonorm.sharing.hub import save_shareable
from hf_geonorm.sharing.model_card import CardInfo

from support.tiny_models import tiny_model, token_ids

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "hf_geonorm" / "modeling"
SPEC_SOURCE = REPO / "hf_geonorm" / "modeling" / "method.md"
STDLIB = set(sys.stdlib_module_names)


def geonorm_model(model_type, **settings):
    return hf_geonorm.convert(tiny_model(model_type), **settings).eval()


def expected_files() -> set[str]:
    return {p.name for p in remote_code_files()} | {METHOD_SPEC}


# ---- every file written once: an audit hook sees each open for writing, whoever opens it ----

_WRITES: list[str] | None = None


def _on_audit(event: str, args: tuple) -> None:
    if _WRITES is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
        if args[2] & (os.O_WRONLY | os.O_RDWR):
            _WRITES.append(os.fspath(args[0]))


sys.addaudithook(_on_audit)  # inert outside ``writes_into``


@contextlib.contextmanager
def writes_into(folder: Path) -> Iterator[Counter]:
    """Count how often each file directly in ``folder`` is opened for writing inside the block."""
    global _WRITES
    counts: Counter = Counter()
    _WRITES = []
    try:
        yield counts
    finally:
        writes, _WRITES = _WRITES, None
        counts.update(Path(p).name for p in writes if Path(p).parent == folder)


def test_plain_save_pretrained_writes_auto_map_code_and_spec_once_and_leaves_the_model_alone(tmp_path):
    model = geonorm_model("llama", geo_alpha=2.0, geo_decay="sqrt")
    with writes_into(tmp_path) as writes:
        model.save_pretrained(tmp_path)
    assert {name: writes[name] for name in expected_files()} == dict.fromkeys(expected_files(), 1)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "geonorm_llama"
    assert config["auto_map"] == {
        "AutoConfig": "modeling_geonorm.GeoNormLlamaConfig",
        "AutoModel": "modeling_geonorm.GeoNormLlamaModel",
        "AutoModelForCausalLM": "modeling_geonorm.GeoNormLlamaForCausalLM",
        "AutoModelForQuestionAnswering": "modeling_geonorm.GeoNormLlamaForQuestionAnswering",
        "AutoModelForSequenceClassification": "modeling_geonorm.GeoNormLlamaForSequenceClassification",
        "AutoModelForTokenClassification": "modeling_geonorm.GeoNormLlamaForTokenClassification",
    }
    for source in remote_code_files():
        assert (tmp_path / source.name).read_bytes() == source.read_bytes(), source.name
    assert (tmp_path / METHOD_SPEC).read_bytes() == SPEC_SOURCE.read_bytes()
    assert not any(p.name.endswith((".bin", ".pt", ".pth")) for p in tmp_path.iterdir())  # safetensors only
    assert "auto_map" not in vars(model.config)  # written into the folder, not into the model
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(token_ids()).logits, model(token_ids()).logits)


def test_a_shareable_folder_and_a_resave_of_a_loaded_folder_write_each_file_once(tmp_path):
    with writes_into(tmp_path / "shared") as writes:
        save_shareable(geonorm_model("gpt2"), tmp_path / "shared", card_info=CardInfo(license="mit"))
    assert {name: writes[name] for name in expected_files()} == dict.fromkeys(expected_files(), 1)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "shared")
    assert loaded.config.auto_map == auto_map_for("gpt2")  # the loaded config names the code ...
    with writes_into(tmp_path / "again") as writes:
        loaded.save_pretrained(tmp_path / "again")  # ... and its save still writes it once
    assert {name: writes[name] for name in expected_files()} == dict.fromkeys(expected_files(), 1)
    assert check_remote_code(tmp_path / "again").complete


def test_a_stock_checkpoint_patched_in_place_saves_as_its_geonorm_type(tmp_path):
    """from_pretrained keeps model_type on the config instance; apply_geonorm swaps the class. The folder names
    the GeoNorm type, so it reloads as GeoNorm."""
    tiny_model("llama").save_pretrained(tmp_path / "stock")
    model = hf_geonorm.apply_geonorm(AutoModelForCausalLM.from_pretrained(tmp_path / "stock"), geo_alpha=0.75).eval()
    model.save_pretrained(tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "geonorm_llama" and config["geo_alpha"] == 0.75
    assert config["auto_map"] == auto_map_for("llama")
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


def test_the_remote_code_is_the_relative_import_closure_of_the_modelling_file():
    """Computed here from the syntax tree (the library reads transformers' regexes): a flat module that
    modeling_geonorm.py imports, directly or through another, is shipped without being listed anywhere."""
    closure, queue = set(), ["modeling_geonorm"]
    while queue:
        name = queue.pop()
        if name not in closure:
            closure.add(name)
            queue += sorted(imported_modules(PACKAGE / f"{name}.py")[1])
    files = remote_code_files()
    assert files[0].name == "modeling_geonorm.py" and {p.name for p in files} == {f"{n}.py" for n in closure}
    assert "remote_code.py" in {p.name for p in files}  # the writer travels with the code it writes


def test_remote_code_imports_only_torch_transformers_and_flat_siblings(tmp_path):
    names = [p.name for p in remote_code_files()]
    assert "__init__.py" not in names
    for name in names:
        absolute, relative = imported_modules(PACKAGE / name)
        # triton only inside triton_kernels.py's guarded import (the CUDA kernel); the folder loads without it
        assert absolute - STDLIB <= {"torch", "transformers", "triton"}, name
        assert None not in relative, f"{name}: 'from . import x' breaks the saved folder"
        assert all("." not in module and f"{module}.py" in names for module in relative), name


def test_the_shipped_source_cites_the_spec_it_ships_with(tmp_path):
    """No citation of a file outside the repository (the old specification's name) in code that goes to the Hub."""
    geonorm_model("llama").save_pretrained(tmp_path)
    for name in {p.name for p in remote_code_files()}:
        assert "GEONORM" + ".md" not in (tmp_path / name).read_text(), name  # spelled so this file does not cite it


CHILD = r"""
import os
from collections import Counter
from pathlib import Path

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

writes = None


def on_audit(event, args):
    if writes is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
        if args[2] & (os.O_WRONLY | os.O_RDWR):
            writes.append(os.fspath(args[0]))


sys.addaudithook(on_audit)
report.update(folders={}, resaved={})
try:
    AutoModelForCausalLM.from_pretrained(job["folders"][0])
    report["refused"] = None
except ValueError as error:
    report["refused"] = str(error)
ids = torch.tensor(job["ids"])
for folder in job["folders"]:
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        results[folder] = {"logits": model(ids).logits, "hidden": base(ids).last_hidden_state,
                           "generated": model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False)}
    report["folders"][folder] = {"config_class": type(config).__name__, "model_module": type(model).__module__,
                                 "model_class": type(model).__name__, "model_type": config.model_type}
    resaved = folder + "_resaved_without_plugin"
    writes = []
    model.save_pretrained(resaved)
    counted, writes = Counter(Path(p).name for p in writes if Path(p).parent == Path(resaved)), None
    again = AutoModelForCausalLM.from_pretrained(resaved, trust_remote_code=True).eval()
    with torch.no_grad():
        results[resaved] = {"logits": again(ids).logits}
    report["resaved"][folder] = {"path": resaved, "writes": dict(counted), "module": type(again).__module__}
"""


def test_saved_folders_load_and_resave_where_the_plugin_is_not_installed(tmp_path, plugin_free_python):
    """The documented example: ``hf_geonorm.convert(stock).save_pretrained(out)`` loads without the plugin (so does a
    shareable folder); the loaded model saved there again writes each file once and loads again."""
    ids = token_ids()
    models = {
        "llama": geonorm_model("llama", geo_radius="sqrt_d", geo_alpha=[1.0, 0.7, 0.2], geo_max_angle=None),
        "gpt2": geonorm_model("gpt2", geo_learnable_step=True, geo_bridge=0.5),
    }
    with torch.no_grad():  # give the learnable step a non-identity value, so it must be loaded to match
        models["gpt2"].transformer.h[1].geonorm_mlp_residual.step_scale.fill_(0.6)
    models["llama"].save_pretrained(tmp_path / "plain_llama")  # a plain save, nothing else
    save_shareable(models["gpt2"], tmp_path / "shared_gpt2")
    folders = {str(tmp_path / "plain_llama"): models["llama"], str(tmp_path / "shared_gpt2"): models["gpt2"]}
    expected = {}
    with torch.no_grad():
        for folder, model in folders.items():
            expected[folder] = {
                "logits": model(ids).logits,
                "hidden": model.base_model(ids).last_hidden_state,
                "generated": model.generate(ids[:1, :4], max_new_tokens=6, do_sample=False),
            }
    report, results = plugin_free_python.run(CHILD, {"folders": list(folders), "ids": ids.tolist()}, tmp_path / "child")
    assert report["refused"] is not None and "trust_remote_code=True" in report["refused"]
    for folder in folders:
        info = report["folders"][folder]
        assert info["model_module"].startswith("transformers_modules.") and info["model_class"].startswith("GeoNorm")
        assert info["model_type"].startswith("geonorm_")
        for key in ("logits", "hidden", "generated"):
            assert torch.equal(results[folder][key], expected[folder][key]), (folder, key)
        resaved = report["resaved"][folder]
        assert resaved["module"].startswith("transformers_modules.")
        assert {name: resaved["writes"].get(name) for name in expected_files()} == dict.fromkeys(expected_files(), 1)
        assert torch.equal(results[resaved["path"]]["logits"], expected[folder]["logits"]), folder
        config = json.loads(Path(resaved["path"], "config.json").read_text())
        assert config["auto_map"] == auto_map_for(config["model_type"])
        for name in expected_files():  # the code and the spec, as the plugin wrote them
            assert Path(resaved["path"], name).read_bytes() == Path(folder, name).read_bytes(), name


def test_add_remote_code_completes_a_folder_written_elsewhere(tmp_path):
    model = geonorm_model("gpt2")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["auto_map"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    for name in expected_files():
        (tmp_path / name).unlink()
    assert not check_remote_code(tmp_path).present
    assert add_remote_code(tmp_path) == auto_map_for("gpt2")
    assert check_remote_code(tmp_path).complete and (tmp_path / METHOD_SPEC).is_file()
    (tmp_path / "residual.py").unlink()
    status = check_remote_code(tmp_path)
    assert status.present and not status.complete and status.missing == ["residual.py"]
    tiny_model("llama").save_pretrained(tmp_path / "stock")
    with pytest.raises(ValueError, match="GeoNorm models only"):
        add_remote_code(tmp_path / "stock")


def test_a_config_folder_gets_its_code(tmp_path):
    save_config_with_remote_code(geonorm_model("llama").config, tmp_path / "cfg")
    assert check_remote_code(tmp_path / "cfg").complete
    assert json.loads((tmp_path / "cfg" / "config.json").read_text())["auto_map"] == auto_map_for("llama")


def test_saving_refuses_stock_quantised_and_peft_models_and_save_with_push(tmp_path):
    with pytest.raises(ValueError, match="GeoNorm models"):
        save_shareable(tiny_model("llama"), tmp_path / "a")
    model = geonorm_model("llama")
    model.hf_quantizer = object()
    with pytest.raises(ValueError, match="quantised"):
        save_shareable(model, tmp_path / "b")
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(geonorm_model("llama"), LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="merge"):
        save_shareable(peft_model, tmp_path / "c")
    with pytest.raises(ValueError, match="GeoNorm"):
        save_config_with_remote_code(tiny_model("llama").config, tmp_path / "d")
    with pytest.raises(ValueError, match="model.push_to_hub"):
        geonorm_model("llama").save_pretrained(tmp_path / "e", push_to_hub=True)
    assert not (tmp_path / "e").exists()


def test_package_data_of_the_wheel(tmp_path):
    """After a non-editable install the card template and the method specification must be found: they are
    package data of hf_geonorm.model_cards (the folder model_cards/) and hf_geonorm.modeling."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "hf_geonorm", "cli", "model_cards"):
        subprocess.run(["cp", "-r", str(REPO / name), str(source / name)], check=True)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
         str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"hf_geonorm/model_cards/geonorm_model_card.md", "hf_geonorm/modeling/method.md"} <= names
    assert {f"hf_geonorm/modeling/{p.name}" for p in remote_code_files()} <= names
    assert {"hf_geonorm_cli/main.py", "hf_geonorm/sharing/hub.py", "hf_geonorm/sharing/model_card.py"} <= names


def test_markdown_links_of_a_saved_card_resolve_in_the_folder(tmp_path):
    save_shareable(geonorm_model("llama"), tmp_path, card_info=CardInfo(base_model="org/base"))
    text = (tmp_path / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http://", "https://"))]
    assert METHOD_SPEC in targets
    for target in targets:
        assert (tmp_path / target).is_file(), target
