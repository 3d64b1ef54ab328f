"""Families are built on first use: ``import hf_geonorm`` builds none and imports no stock modelling
module; loading a checkpoint, through the plugin or as remote code, builds its own family only. Each check runs
in a fresh Python process, whose modules no other test has imported."""

from __future__ import annotations

import json
import pickle
import sys

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

import hf_geonorm

from support.helpers import json_from_child
from support.tiny_models import tiny_model

# Prints, as JSON: the families built so far and the stock modelling modules of supported types imported so far.
REPORT = """
def families_built(modeling):
    import json, sys
    built = sorted(t for t, family in modeling.FAMILIES.items() if family.built)
    stock = sorted(
        name for name in sys.modules
        if name.startswith("transformers.models.") and ".modeling_" in name
        and name.split(".")[2] in modeling.FAMILIES
    )
    return {"built": built, "stock_modules": stock}
"""

IMPORT_ONLY = """
import json, sys
import hf_geonorm
peft_modules = sorted(name for name in sys.modules if name.split(".")[0] == "peft")
from hf_geonorm.modeling import modeling_geonorm
from transformers import AutoConfig
out = {"after_import": families_built(modeling_geonorm), "peft_after_import": peft_modules}
hf_geonorm.supported_architectures(), hf_geonorm.family_for("qwen2").layout, dir(hf_geonorm)
out["after_lookups"] = families_built(modeling_geonorm)
out["class"] = hf_geonorm.GeoNormQwen2Config.__name__
out["after_attribute"] = families_built(modeling_geonorm)
config = AutoConfig.for_model("geonorm_mistral", num_hidden_layers=2)
out["for_model"] = [type(config).__name__, config.num_hidden_layers]
out["after_for_model"] = families_built(modeling_geonorm)
print(json.dumps(out))
"""

LOAD = """
import json, sys
import hf_geonorm
from hf_geonorm.modeling import modeling_geonorm
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(sys.argv[1])
out = {"config": type(config).__name__, "after_config": families_built(modeling_geonorm)}
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
out["model"] = type(model).__name__
out["after_model"] = families_built(modeling_geonorm)
print(json.dumps(out))
"""

REMOTE = REPORT + """
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=True)
report["model"] = type(model).__name__
report.update(families_built(sys.modules[type(model).__module__]))
"""


def run_child(python, script: str, *args: str, cwd) -> dict:
    """``script`` (with ``families_built`` defined) in a fresh Python; what it reports."""
    modules = {"HF_MODULES_CACHE": str(cwd / "modules")}
    return json_from_child(REPORT + script, *args, cwd=cwd, python=python, env=modules)


def test_import_builds_no_family_imports_no_peft_and_a_lookup_builds_its_own(tmp_path):
    out = run_child(sys.executable, IMPORT_ONLY, cwd=tmp_path)
    nothing = {"built": [], "stock_modules": []}
    assert out["after_import"] == nothing
    assert out["peft_after_import"] == []  # import hf_geonorm does not import peft
    assert out["after_lookups"] == nothing  # listing types and reading a layout build nothing
    assert out["class"] == "GeoNormQwen2Config"
    assert out["after_attribute"] == {"built": ["qwen2"], "stock_modules": ["transformers.models.qwen2.modeling_qwen2"]}
    assert out["for_model"] == ["GeoNormMistralConfig", 2]  # AutoConfig's entry builds on first use
    assert out["after_for_model"]["built"] == ["mistral", "qwen2"]


def test_loading_a_saved_checkpoint_builds_its_own_family_only(tmp_path):
    hf_geonorm.convert(tiny_model("llama")).save_pretrained(tmp_path / "llama")
    out = run_child(sys.executable, LOAD, str(tmp_path / "llama"), cwd=tmp_path)
    assert out["config"] == "GeoNormLlamaConfig" and out["model"] == "GeoNormLlamaForCausalLM"
    only_llama = {"built": ["llama"], "stock_modules": ["transformers.models.llama.modeling_llama"]}
    assert out["after_config"]["built"] == ["llama"]
    assert out["after_model"] == only_llama


def test_remote_code_builds_its_own_family_only(tmp_path, plugin_free_python):
    hf_geonorm.convert(tiny_model("gpt2")).save_pretrained(tmp_path / "gpt2")
    out, _ = plugin_free_python.run(REMOTE, {"folder": str(tmp_path / "gpt2")}, tmp_path / "child")
    assert out["model"] == "GeoNormGPT2ForCausalLM"
    assert out["built"] == ["gpt2"]
    assert out["stock_modules"] == ["transformers.models.gpt2.modeling_gpt2"]


def test_generated_classes_are_module_attributes_that_pickle():
    config_class = hf_geonorm.GeoNormLlamaConfig
    assert config_class is hf_geonorm.config_class_for("llama") is AutoConfig.for_model("geonorm_llama").__class__
    assert "GeoNormGPT2ForCausalLM" in dir(hf_geonorm)
    config = config_class(**tiny_model("llama").config.to_dict(), geo_alpha=0.6)
    clone = pickle.loads(pickle.dumps(config))
    assert type(clone) is config_class and clone == config
    assert type(AutoModelForCausalLM.from_config(clone)) is hf_geonorm.GeoNormLlamaForCausalLM


# Builds a tiny model of each family given (llama: q_proj/v_proj; gpt2: its fused c_attn) at the point the job says
# peft is imported, then asks LoRA for its default targets (no target_modules) and reports the modules it wrapped.
PEFT_ORDER = """
import importlib
order = job["order"]
if order == "peft first":
    import peft
import hf_geonorm
report["peft_after_import"] = "peft" in sys.modules
if order == "peft between":
    import peft
from transformers import AutoModelForCausalLM
sizes = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
configs = {
    "llama": hf_geonorm.config_class_for("llama")(intermediate_size=64, num_key_value_heads=2, **sizes),
    "gpt2": hf_geonorm.config_class_for("gpt2")(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=32),
}
models = {name: AutoModelForCausalLM.from_config(config) for name, config in configs.items()}
report["peft_after_build"] = "peft" in sys.modules
# (hf_geonorm.training.liger's finder, there where liger-kernel is installed, waits for Liger's module, not PEFT)
report["import_hooks"] = [type(f).__name__ for f in sys.meta_path
                          if "geonorm" in type(f).__module__ and type(f).__name__ != "LigerImportWatch"]
if order == "peft last":
    import peft
from peft import LoraConfig, get_peft_model
report["wrapped"] = {
    name: sorted({n.rsplit(".", 1)[-1] for n, m in get_peft_model(model, LoraConfig(r=2)).named_modules()
                  if hasattr(m, "lora_A")})
    for name, model in models.items()
}
"""


# "peft between" meets the build with peft imported, as "peft first" does: with --runslow
@pytest.mark.parametrize("order", ["peft first", pytest.param("peft between", marks=pytest.mark.slow), "peft last"])
def test_lora_default_targets_whenever_peft_is_imported(tmp_path, order):
    """PEFT learns each geonorm_X type's default LoRA targets whether a script imports it before hf_geonorm, after
    it, or after the models are built; expected from each layout's targets as the stock modules name them."""
    script = "import json, sys\nreport = {}\njob = json.loads(sys.argv[1])\n" + PEFT_ORDER + "print(json.dumps(report))"
    out = run_child(sys.executable, script, json.dumps({"order": order}), cwd=tmp_path)
    assert out["peft_after_import"] is (order == "peft first")
    assert out["peft_after_build"]  # a family's build puts its targets into PEFT's table, importing PEFT for it
    assert out["import_hooks"] == []  # no finder waits on sys.meta_path for PEFT to be imported
    assert out["wrapped"] == {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn"]}
