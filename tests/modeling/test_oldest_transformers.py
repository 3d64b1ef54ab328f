"""GeoNorm folders saved by the plugin load where hf-geonorm is not installed under the oldest transformers release
the range names (``transformers_versions.OLDEST_TESTED``), as remote code: a GPT-2 (whose attention took the KV
cache as ``past_key_values`` then) and a LLaMA give cached generation equal to uncached, the same tokens and logits
as the plugin here, and every layer's hidden state.

That environment is ``.venv-oldest`` at the repository root, or the one ``HF_GEONORM_OLDEST_VENV`` names: torch
2.13.0 (the CPU wheel), that transformers release and peft, no hf-geonorm. ``.ci/run`` creates it and sets
``HF_GEONORM_OLDEST_VENV``, under which a missing environment fails the test; elsewhere the test skips, saying how
to create it. ``.ci/run`` also runs the modelling, round-trip and remote-code tests in it, with the plugin on the
path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm.modeling.transformers_versions import OLDEST_TESTED, release

from support.helpers import PluginFreePython, plugin_free_environment
from support.tiny_models import LAYERS, tiny_model

ROOT = Path(__file__).resolve().parents[2]
VENV_VARIABLE = "HF_GEONORM_OLDEST_VENV"
OLDEST = ".".join(map(str, OLDEST_TESTED))
CREATE = f"python3 -m venv .venv-oldest && .venv-oldest/bin/pip install torch==2.13.0 'transformers=={OLDEST}.*' peft"
FAMILIES = ("gpt2", "llama")
NEW_TOKENS = 12

# Runs in that environment (the plugin-free harness of helpers.py).
CHILD = """
import transformers
from transformers import AutoModelForCausalLM

for name, folder in job["folders"].items():
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    prompt = torch.tensor([job["prompt"]])
    greedy = {"max_new_tokens": job["new_tokens"], "min_new_tokens": job["new_tokens"], "do_sample": False,
              "pad_token_id": 0, "output_logits": True, "return_dict_in_generate": True}
    with torch.no_grad():
        out = model(prompt, output_hidden_states=True)
        cached, uncached = (model.generate(prompt, use_cache=use, **greedy) for use in (True, False))
    results[name] = {
        "cached": cached.sequences,
        "uncached": uncached.sequences,
        "cached_logits": torch.stack(cached.logits),  # each new token's logits
        "uncached_logits": torch.stack(uncached.logits),
        "logits": out.logits,
    }
    hidden = out.hidden_states
    report[name] = {"module": type(model).__module__, "hidden_states": None if hidden is None else len(hidden)}
    if hidden:
        results[name]["hidden_states"] = torch.stack(hidden)
report["transformers"] = transformers.__version__
"""


@pytest.fixture(scope="session")
def oldest_python() -> PluginFreePython:
    """The oldest-transformers environment's Python; a skip (a failure under .ci/run) without it."""
    python, versions = plugin_free_environment(VENV_VARIABLE, ROOT / ".venv-oldest", CREATE)
    installed = versions["transformers"]
    assert release(installed) == OLDEST_TESTED, f"it has transformers {installed}, not the oldest tested {OLDEST}"
    return python


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """A GeoNorm GPT-2 and LLaMA (the defaults: pure GeoNorm) saved by the plugin with this transformers."""
    root = tmp_path_factory.mktemp("oldest")
    folders = {}
    for name in FAMILIES:
        hf_geonorm.convert(tiny_model(name, perturb=True)).save_pretrained(root / name)
        folders[name] = root / name
    return folders


def test_saved_folders_generate_with_the_cache_and_report_hidden_states_under_the_oldest_release(
    oldest_python, saved, tmp_path
):
    prompt = [5, 17, 42, 9, 33, 71]
    job = {"folders": {name: str(folder) for name, folder in saved.items()}, "prompt": prompt,
           "new_tokens": NEW_TOKENS}  # fmt: skip
    report, results = oldest_python.run(CHILD, job, tmp_path / "child")
    assert release(report["transformers"]) == OLDEST_TESTED
    for name, folder in saved.items():
        seen, computed = report[name], results[name]
        assert seen["module"].startswith("transformers_modules."), name  # the folder's own code, not the plugin
        assert computed["cached"].shape[-1] == len(prompt) + NEW_TOKENS
        assert computed["cached"].tolist() == computed["uncached"].tolist(), f"{name}: the cache changes the tokens"
        torch.testing.assert_close(computed["cached_logits"], computed["uncached_logits"], atol=1e-5, rtol=1e-4)
        assert seen["hidden_states"] == LAYERS + 1, f"{name}: hidden states {seen['hidden_states']}"
        # the plugin, with this environment's transformers, on the same folder
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        ids = torch.tensor([prompt])
        with torch.no_grad():
            here = model(ids, output_hidden_states=True)
            generated = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                       pad_token_id=0)  # fmt: skip
        torch.testing.assert_close(computed["logits"], here.logits)
        torch.testing.assert_close(computed["hidden_states"], torch.stack(here.hidden_states))
        assert computed["cached"].tolist() == generated.tolist()
