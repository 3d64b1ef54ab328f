"""Folders written by ``hf-geonorm convert`` load where hf-geonorm is not installed with the newest transformers and
peft the package registry serves, not only with the range pyproject.toml pins: the tokenizer as a stock one with no
trust prompt, the model with ``trust_remote_code=True`` and LoRA with PEFT's default targets, peft imported after
the models; their logits are those the plugin computes for the same folders here. Beyond the newest release the
range names (``transformers_versions.NEWEST_TESTED``) the folders' code runs with a warning saying so, and only
there.

That environment is ``.venv-newest`` at the repository root, or the one ``HF_GEONORM_NEWEST_VENV`` names: torch
2.13.0 (the CPU wheel), the newest transformers and peft, no hf-geonorm. ``.ci/run`` creates or upgrades it before
every test run and sets ``HF_GEONORM_NEWEST_VENV``, under which a missing environment fails the test; elsewhere the
test skips, saying how to create it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_geonorm
from hf_geonorm.modeling.transformers_versions import NEWEST_TESTED, release

from support.helpers import PluginFreePython, bpe_tokenizer, invoke, plugin_free_environment
from support.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[2]
VENV_VARIABLE = "HF_GEONORM_NEWEST_VENV"
CREATE = "python3 -m venv .venv-newest && .venv-newest/bin/pip install --upgrade torch==2.13.0 transformers peft"
TEXT = "def wrap(text, width=70, **kwargs):"
FAMILIES = ("llama", "gpt2")  # separate q/k/v projections; GPT-2's fused Conv1D c_attn

# Runs in that environment (the plugin-free harness of helpers.py: stdin closed, hf_geonorm blocked). transformers'
# prompt is switched back on (the harness turns it into an error, which AutoTokenizer would swallow), so a folder that
# asks whether to trust its code prints the question here, where it is caught; input() gets no answer from closed
# stdin.
CHILD = """
import contextlib, io, warnings
import transformers
import transformers.dynamic_module_utils
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

transformers.dynamic_module_utils.TIME_OUT_REMOTE_CODE = 15  # transformers' own default: ask, 15 s for an answer
printed, models = io.StringIO(), {}
caught = warnings.catch_warnings(record=True)
warned = caught.__enter__()
warnings.simplefilter("always")
for name, folder in job["folders"].items():
    with contextlib.redirect_stdout(printed):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)  # the card's line: no trust_remote_code
        auto_tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        models[name] = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    ids = tokenizer(job["text"], return_tensors="pt").input_ids
    report[name] = {
        "tokenizers": [f"{type(t).__module__}.{type(t).__name__}" for t in (tokenizer, auto_tokenizer)],
        "same_ids": auto_tokenizer(job["text"], return_tensors="pt").input_ids.tolist() == ids.tolist(),
        "model_module": type(models[name]).__module__,
    }
    with torch.no_grad():
        results[name] = {"ids": ids, "logits": models[name](ids).logits}
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict  # after the models' remote code ran
from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

for name, model in models.items():
    torch.manual_seed(0)  # LoRA's B starts random, not zero, so the adapter changes the logits
    lora = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=8, init_lora_weights=False)).eval()
    report[name]["wrapped"] = sorted({n.rsplit(".", 1)[-1] for n, m in lora.named_modules() if hasattr(m, "lora_A")})
    report[name]["stock_targets"] = sorted(PEFT_TARGETS[name])
    with torch.no_grad():
        results[name]["lora_logits"] = lora(results[name]["ids"]).logits
    results[f"{name}_adapter"] = get_peft_model_state_dict(lora)
caught.__exit__(None, None, None)
report["prompts"] = printed.getvalue()
report["untested_release_warnings"] = [str(w.message) for w in warned if "is newer than the releases" in str(w.message)]
report["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__}
"""


@pytest.fixture(scope="session")
def newest_python() -> tuple[PluginFreePython, dict[str, str]]:
    """The newest-transformers environment's Python and its versions; a skip (a failure under .ci/run) without it."""
    return plugin_free_environment(VENV_VARIABLE, ROOT / ".venv-newest", CREATE)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, Path]:
    """A GeoNorm folder of each family, converted by ``hf-geonorm convert`` from a stock folder with a tokenizer."""
    root, tokenizer = tmp_path_factory.mktemp("newest"), bpe_tokenizer()
    folders = {}
    for name in FAMILIES:
        stock = root / f"stock-{name}"
        tiny_model(name, perturb=True, vocab_size=320).save_pretrained(stock)
        tokenizer.save_pretrained(stock)
        result = invoke("convert", stock, root / name)
        assert result.exit_code == 0, result.output
        folders[name] = root / name
    return folders


def test_converted_folders_load_without_the_plugin_under_the_newest_transformers(newest_python, converted, tmp_path):
    python, versions = newest_python
    job = {"folders": {name: str(folder) for name, folder in converted.items()}, "text": TEXT}
    report, results = python.run(CHILD, job, tmp_path / "child")
    assert report["versions"]["transformers"] == versions["transformers"]
    assert report["prompts"] == "", f"a trust prompt under transformers {versions['transformers']}"
    # beyond the newest release tested, the folders' code runs and says so
    beyond = release(versions["transformers"]) > NEWEST_TESTED
    assert bool(report["untested_release_warnings"]) == beyond, report["untested_release_warnings"]
    for name, folder in converted.items():
        seen, computed = report[name], results[name]
        assert seen["tokenizers"][0].startswith("transformers.") and seen["tokenizers"][1].startswith("transformers.")
        assert seen["same_ids"] and seen["model_module"].startswith("transformers_modules.")
        assert seen["wrapped"] == seen["stock_targets"], name  # PEFT's own targets for the stock type
        # the plugin, with this environment's transformers, on the same folder
        ids = AutoTokenizer.from_pretrained(folder)(TEXT, return_tensors="pt").input_ids
        assert computed["ids"].tolist() == ids.tolist()
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        assert type(model) is hf_geonorm.family_for(name).causal_class
        with torch.no_grad():
            torch.testing.assert_close(computed["logits"], model(ids).logits)
        config = LoraConfig(task_type="CAUSAL_LM", r=8, target_modules=seen["wrapped"], fan_in_fan_out=name == "gpt2")
        lora = get_peft_model(model, config).eval()
        loaded = set_peft_model_state_dict(lora, results[f"{name}_adapter"])
        assert not loaded.unexpected_keys
        with torch.no_grad():
            torch.testing.assert_close(computed["lora_logits"], lora(ids).logits)
        assert not torch.allclose(computed["lora_logits"], computed["logits"])  # the adapter is not a no-op
