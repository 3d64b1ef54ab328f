"""Folders saved before the modelling code moved into ``hf_geonorm/modeling/`` still load (issue: the house).

``tests/data/saved_before_the_modeling_package/{llama,gpt2,mixtral}`` were written by the flat layout: their
remote code is the old files (``fused.py``, ``fused_kernels.py``, ...). Each must load through the plugin (the new
package) with nothing missing or unexpected, and as remote code where the plugin is not installed (the folder's
own old copies); the two independent code paths must give the same logits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_geonorm

FOLDERS = Path(__file__).resolve().parent / "data" / "saved_before_the_modeling_package"
NAMES = ("gpt2", "llama", "mixtral")
# token ids below every folder's vocabulary (128), two rows so that batching is part of what is compared
TOKEN_IDS = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(0))

REMOTE = """
import transformers
for name, folder in job["folders"].items():
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True,
                                                                    output_loading_info=True)
    report[name] = {"module": type(model).__module__, "class": type(model).__name__,
                    "dropped": {k: list(v) for k, v in info.items() if v}}
    with torch.no_grad():
        results[name] = {"logits": model.eval()(torch.tensor(job["ids"])).logits}
"""


def test_the_folders_are_the_flat_layout():
    """What makes the test meaningful: the folders carry the old remote code, not the new package's files."""
    assert sorted(p.name for p in FOLDERS.iterdir() if p.is_dir()) == sorted(NAMES)
    for name in NAMES:
        assert {"fused.py", "fused_kernels.py", "modeling_geonorm.py"} <= {p.name for p in (FOLDERS / name).iterdir()}


@pytest.fixture(scope="module")
def through_the_plugin() -> dict[str, tuple[type, dict, torch.Tensor]]:
    """name -> (the model's class, the non-empty entries of its loading info, its logits)."""
    out = {}
    for name in NAMES:
        model, info = AutoModelForCausalLM.from_pretrained(FOLDERS / name, output_loading_info=True)
        dropped = {k: list(v) for k, v in info.items() if v}
        with torch.no_grad():
            out[name] = (type(model), dropped, model.eval()(TOKEN_IDS).logits)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_loads_through_the_plugin_with_nothing_missing(name, through_the_plugin):
    cls, dropped, logits = through_the_plugin[name]
    assert cls is hf_geonorm.family_for(name).causal_class  # the new package's class, not the folder's copies
    assert cls.__module__ == "hf_geonorm.modeling.modeling_geonorm"
    assert dropped == {}
    assert torch.isfinite(logits).all()


def test_loads_as_remote_code_and_agrees_with_the_plugin(through_the_plugin, plugin_free_python, tmp_path):
    job = {"folders": {name: str(FOLDERS / name) for name in NAMES}, "ids": TOKEN_IDS.tolist()}
    report, results = plugin_free_python.run(REMOTE, job, tmp_path / "child", timeout=600)
    for name in NAMES:
        assert report[name]["module"].startswith("transformers_modules."), name  # the folder's own old code
        assert report[name]["class"] == through_the_plugin[name][0].__name__, name
        assert report[name]["dropped"] == {}, name
        torch.testing.assert_close(results[name]["logits"], through_the_plugin[name][2], rtol=0, atol=1e-6)
