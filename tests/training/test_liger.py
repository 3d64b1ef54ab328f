"""Liger-Kernel's patches on GeoNorm models (``hf_geonorm.training.liger``).

Liger's kernels are Triton kernels that do not run on CPU (not even through Triton's interpreter), so these tests
check the swap structurally: which modules a patch replaces on a GeoNorm model, against what Liger replaces on the
stock model of the same config (an independent reference), and that the GeoNorm decoder layers and
``GeoNormResidual`` modules are not among them. ``benchmarks/gpu_check.sh`` checks the numbers on a GPU.

Liger's patches also replace attributes of transformers' modelling modules for the whole process, so each check
that applies them runs in a child Python.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import types
from pathlib import Path

import pytest

import hf_geonorm
from hf_geonorm.modeling.layouts import LAYOUTS
from hf_geonorm.training.liger import check_geonorm_kept, geonorm_liger_patch, geonorm_parts, register_liger_patches

from support.helpers import json_from_child
from support.tiny_models import tiny_model

LIGER_INSTALLED = importlib.util.find_spec("liger_kernel") is not None
needs_liger = pytest.mark.skipif(
    not LIGER_INSTALLED, reason="liger-kernel is not installed (pip install -e '.[liger]')"
)
TESTS = Path(__file__).resolve().parents[1]

# Defines state(model): each module's name -> (its class, the name it prints, the function bound on it as its own
# forward); a module a Liger patch replaces changes one of them.
STATE = """
import json, sys
sys.path.insert(0, sys.argv[1])
job = json.loads(sys.argv[2])
report = {}


def state(model):
    return {
        name: [type(module).__qualname__, module._get_name(),
               getattr(vars(module).get("forward"), "__qualname__", None)]
        for name, module in model.named_modules()
    }


def swapped(before, after):
    return sorted(name for name in after if after[name] != before.get(name))


def geonorm_names(model):
    import hf_geonorm.training.liger
    return sorted(hf_geonorm.training.liger.geonorm_parts(model))
"""

# Stock and GeoNorm models of each case built first; then Liger imported (after hf_geonorm, as Trainer imports it);
# then, where the job names folders, AutoLigerKernelForCausalLM on the GeoNorm folder and on the stock folder it was
# converted from (whose patch is the reference); then Liger applied to each model built first, as Trainer's and TRL's
# use_liger_kernel=True apply it, the last GeoNorm model through Trainer's own call.
SCRIPT = """
import hf_geonorm
import torch
import transformers
from support.tiny_models import tiny_model
from transformers import Trainer, TrainingArguments
from transformers.integrations.liger import apply_liger_kernel

models = {}
for case in job["cases"]:
    stock = tiny_model(case)
    models[case] = (stock, hf_geonorm.convert(stock))
trained = hf_geonorm.convert(tiny_model(job["cases"][0]))
before = {case: (state(stock), state(geo)) for case, (stock, geo) in models.items()}
trained_before = state(trained)
if "geo" in job:
    config = transformers.LlamaConfig.from_pretrained(job["stock"])
    report["auto"] = {"unpatched": state(transformers.LlamaForCausalLM(config))}
report["liger_imported_before_use"] = "liger_kernel.transformers.monkey_patch" in sys.modules

from liger_kernel.transformers import AutoLigerKernelForCausalLM, _apply_liger_kernel_to_instance
from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

report["registered"] = sorted(name for name in MODEL_TYPE_TO_APPLY_LIGER_FN if name.startswith("geonorm_"))
report["liger_types"] = sorted(MODEL_TYPE_TO_APPLY_LIGER_FN)
if "geo" in job:
    geo = AutoLigerKernelForCausalLM.from_pretrained(job["geo"])
    stock = AutoLigerKernelForCausalLM.from_pretrained(job["stock"])
    report["auto"].update(geo=state(geo), geo_forward=type(geo).forward.__module__, geonorm_parts=geonorm_names(geo),
                          stock=state(stock), stock_forward=type(stock).forward.__module__)
report["cases"] = {}
for case, (stock, geo) in models.items():
    _apply_liger_kernel_to_instance(model=stock)
    _apply_liger_kernel_to_instance(model=geo)
    layer = geo.base_model.layers[0]
    rope = getattr(sys.modules[type(layer.self_attn).__module__], "apply_rotary_pos_emb", None)
    report["cases"][case] = {
        "stock": swapped(before[case][0], state(stock)),
        "geo": swapped(before[case][1], state(geo)),
        "geonorm_parts": geonorm_names(geo),
        "layer_class": type(layer).__name__,
        "rope": getattr(rope, "__module__", None),
    }
trainer = Trainer(model=trained, args=TrainingArguments(output_dir="out", use_liger_kernel=True, report_to=[]))
# what Trainer.train runs first under use_liger_kernel=True (training itself would run Liger's kernels, GPU only)
apply_liger_kernel(trainer.model, trainer.args.liger_kernel_config)
report["trainer"] = swapped(trained_before, state(trained))
print(json.dumps(report))
"""


def run_child(script: str, job: dict, cwd: Path) -> dict:
    """``STATE`` and ``script`` in a fresh Python (``tests/`` on its path, the job as JSON); what it reports."""
    quiet = {"TRANSFORMERS_VERBOSITY": "error"}
    return json_from_child(STATE + script, str(TESTS), json.dumps(job), cwd=cwd, env=quiet)


def check_same_swaps_as_stock(found: dict, case: str, layers: int = 3) -> None:
    """The GeoNorm model of ``case`` had the stock model's modules swapped (by the same names), and none of its own."""
    assert found["geo"] == found["stock"], case
    assert found["stock"], f"{case}: Liger swapped nothing on the stock model, the reference is empty"
    assert not set(found["geo"]) & set(found["geonorm_parts"]), case
    residuals = [name for name in found["geonorm_parts"] if name.rsplit(".", 1)[-1].endswith("_residual")]
    assert len(residuals) == 2 * layers, case  # the parts checked are there: one update per sublayer


@needs_liger
def test_liger_on_a_geonorm_llama_swaps_the_stock_parts_and_not_the_update(tmp_path, stock_llama):
    """``_apply_liger_kernel_to_instance`` (and Trainer's ``use_liger_kernel=True``) replaces on a GeoNorm LLaMA
    exactly the modules it replaces on the stock LLaMA of the same weights: norms, MLPs and the causal LM's forward
    (fused linear cross-entropy); RoPE is the module function its attention calls. ``AutoLigerKernelForCausalLM``
    on a GeoNorm folder builds Liger's modules where it does from the stock folder. The decoder layers and
    ``GeoNormResidual`` modules are untouched."""
    geo_folder = tmp_path / "geo"
    hf_geonorm.convert(tiny_model("llama")).save_pretrained(geo_folder)
    out = run_child(SCRIPT, {"cases": ["llama"], "geo": str(geo_folder), "stock": str(stock_llama)}, tmp_path)
    assert not out["liger_imported_before_use"]  # the GeoNorm types were registered when Trainer imported Liger
    found = out["cases"]["llama"]
    check_same_swaps_as_stock(found, "llama")
    layer_parts = {name.split(".", 3)[-1] for name in found["geo"] if name.startswith("model.layers.")}
    assert layer_parts == {"input_layernorm", "post_attention_layernorm", "mlp"}
    assert {"", "model.norm"} <= set(found["geo"])  # the causal LM's forward and the final norm
    assert found["layer_class"] == "GeoNormLlamaDecoderLayer"
    assert found["rope"].startswith("liger_kernel.")
    assert out["trainer"] == found["stock"]
    expected = sorted(f"geonorm_{t}" for t in LAYOUTS if t in out["liger_types"])
    assert out["registered"] == expected and "geonorm_llama" in expected

    auto = out["auto"]
    stock, unpatched, geo = auto["stock"], auto["unpatched"], auto["geo"]
    liger_modules = {name: stock[name][1] for name in stock if stock[name] != unpatched[name]}
    assert liger_modules, "Liger swapped nothing on the stock model: the reference is empty"
    assert {name: geo[name][1] for name in liger_modules} == liger_modules  # the same modules, Liger's classes
    assert auto["geo_forward"] == auto["stock_forward"] and auto["stock_forward"].startswith("liger_kernel.")
    assert not set(auto["geonorm_parts"]) & set(liger_modules)
    assert len(auto["geonorm_parts"]) == 3 * 3  # each layer and its two updates, as built
    assert {geo[name][0] for name in auto["geonorm_parts"]} == {"GeoNormLlamaDecoderLayer", "GeoNormResidual"}


@needs_liger
@pytest.mark.slow
def test_liger_on_every_geonorm_type_liger_supports(tmp_path):
    """The same for every supported type whose stock type Liger patches (each block shape Liger knows: LLaMA's,
    Gemma 2's four norms, OLMo 2's output norms, Phi-3's fused MLP, Granite's multipliers, GLM-4's...)."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN  # defines the patches only

    from support.tiny_models import CASES

    cases = [name for name, case in CASES.items() if case.model_type in MODEL_TYPE_TO_APPLY_LIGER_FN]
    out = run_child(SCRIPT, {"cases": cases}, tmp_path)
    assert len(cases) >= 20
    for case in cases:
        check_same_swaps_as_stock(out["cases"][case], case)
        assert out["cases"][case]["layer_class"].startswith("GeoNorm"), case


def fake_table_module(**table: object) -> types.ModuleType:
    """A stand-in for Liger's module of patches: its dict of patch functions by model type."""
    module = types.ModuleType("liger_patches")
    module.MODEL_TYPE_TO_APPLY_LIGER_FN = dict(table)
    return module


def test_registration_covers_the_supported_types_liger_patches_and_keeps_existing_entries():
    def patch_llama(rope: bool = True, rms_norm: bool = True, model: object = None) -> None:
        pass

    def own_entry(model: object = None) -> None:
        pass

    module = fake_table_module(llama=patch_llama, qwen2=patch_llama, bert=patch_llama, geonorm_qwen2=own_entry)
    registered = register_liger_patches(module, ("llama", "qwen2", "gpt2"))
    table = module.MODEL_TYPE_TO_APPLY_LIGER_FN
    assert registered == ["geonorm_llama", "geonorm_qwen2"]
    assert table["geonorm_qwen2"] is own_entry and "geonorm_bert" not in table and "geonorm_gpt2" not in table
    # Liger passes a patch only the keyword arguments its signature names: the stock function's
    assert inspect.signature(table["geonorm_llama"]) == inspect.signature(patch_llama)


def test_a_patch_that_replaces_the_geonorm_update_is_refused():
    """A patch (a later Liger, say) that binds its own forward on a GeoNorm decoder layer or residual module, or
    changes its class, is a ``ValueError`` naming the module; one that swaps a norm is not."""
    model = hf_geonorm.convert(tiny_model("llama"))

    def swap_norm(model: object = None) -> None:
        model.model.norm.forward = lambda hidden_states: hidden_states

    def bypass_update(model: object = None) -> None:
        layer = model.model.layers[1]
        layer.geonorm_mlp_residual.forward = lambda residual, update, *args: residual + update

    def replace_layer(model: object = None) -> None:
        model.model.layers[0].__class__ = type(tiny_model("llama").model.layers[0])

    geonorm_liger_patch(swap_norm)(model=model)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.geonorm_mlp_residual \(GeoNormResidual\)"):
        geonorm_liger_patch(bypass_update)(model=model)
    with pytest.raises(ValueError, match=r"model\.layers\.0 \(GeoNormLlamaDecoderLayer\)"):
        geonorm_liger_patch(replace_layer)(model=hf_geonorm.convert(tiny_model("llama")))


def test_geonorm_parts_are_the_layers_and_updates():
    model = hf_geonorm.convert(tiny_model("llama"))
    parts = geonorm_parts(model)
    assert sorted(parts) == sorted(
        [f"model.layers.{k}" for k in range(3)]
        + [f"model.layers.{k}.geonorm_{part}_residual" for k in range(3) for part in ("attn", "mlp")]
    )
    check_geonorm_kept(model, parts)  # an untouched model passes


def test_the_gpu_check_stops_without_cuda_and_measures_relative_differences(monkeypatch, capsys):
    """benchmarks/liger_check.py (gpu_check.sh's Liger stage) on CPU: it refuses in one line without CUDA (exit 2);
    its step and its comparison run, a gradient 0.1% off is 1e-3 off, a loss 2% off is 2e-2 off."""
    import torch

    spec = importlib.util.spec_from_file_location("liger_check", TESTS.parent / "benchmarks" / "liger_check.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", "checked"]) == 2
    assert capsys.readouterr().err.strip() == (
        "liger_check.py needs a CUDA device: Liger-Kernel's kernels run on GPUs only"
    )
    monkeypatch.setitem(bench.SIZES, "num_hidden_layers", 2)
    step = bench.one_step(bench.tiny_geonorm_llama("geo", torch.float32, "cpu"), torch.randint(0, 1024, (1, 16)))
    assert len(step["grads"]) == len(list(bench.tiny_geonorm_llama("geo", torch.float32, "cpu").parameters()))
    off = {"loss": step["loss"] * 1.02, "loss_after": step["loss_after"],
           "grads": {name: grad * 1.001 for name, grad in step["grads"].items()}}  # fmt: skip
    found = bench.compare(step, off)
    assert found["loss_difference"] == pytest.approx(0.02) and found["loss_after_difference"] == 0
    assert found["grad_difference"] == pytest.approx(1e-3, rel=1e-4)


def test_registration_when_liger_is_imported_before_or_after_the_plugin(tmp_path, monkeypatch):
    """Liger's table module already imported: ``enable_liger_kernels`` registers at once. Not yet: the finder it
    leaves on ``sys.meta_path`` registers when the module is imported, then leaves (a stand-in module by another
    name here, so that this runs with or without liger-kernel)."""
    from hf_geonorm.training import liger

    def patch_llama(model: object = None) -> None:
        pass

    monkeypatch.setitem(sys.modules, liger.LIGER_PATCHES, fake_table_module(llama=patch_llama))
    liger.enable_liger_kernels()
    assert "geonorm_llama" in sys.modules[liger.LIGER_PATCHES].MODEL_TYPE_TO_APPLY_LIGER_FN

    stand_in = "def patch_qwen2(model=None):\n    pass\n\nMODEL_TYPE_TO_APPLY_LIGER_FN = {'qwen2': patch_qwen2}\n"
    (tmp_path / "stand_in_liger_table.py").write_text(stand_in)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(liger, "LIGER_PATCHES", "stand_in_liger_table")
    others = [finder for finder in sys.meta_path if not isinstance(finder, liger.LigerImportWatch)]
    monkeypatch.setattr(sys, "meta_path", [liger.LigerImportWatch(), *others])
    try:
        table = importlib.import_module("stand_in_liger_table").MODEL_TYPE_TO_APPLY_LIGER_FN
    finally:
        sys.modules.pop("stand_in_liger_table", None)
    assert sorted(table) == ["geonorm_qwen2", "qwen2"]
    assert not any(isinstance(finder, liger.LigerImportWatch) for finder in sys.meta_path)
