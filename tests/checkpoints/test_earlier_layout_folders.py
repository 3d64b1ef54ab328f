"""Folders saved by the flat layout, before the modelling code moved into ``hf_geonorm/modeling/``, still load.

``tests/data/flat_layout`` holds one frozen copy of that layout's remote code (``code/``: ``fused.py``,
``fused_kernels.py``, ...) and three models saved with it (``gpt2``, ``llama``, ``mixtral``: config, weights, card);
each folder is put together here as the flat layout wrote it, its files and the code beside them. Each must load
through the plugin (the new package) with nothing missing or unexpected, and as remote code where the plugin is not
installed (the folder's own old copies); the two independent code paths must give the same logits.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_geonorm

SAVED = Path(__file__).resolve().parents[1] / "data" / "flat_layout"
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


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """The saved folders as the flat layout wrote them: each model's files with the old remote code beside them."""
    root = tmp_path_factory.mktemp("flat_layout")
    for name in NAMES:
        shutil.copytree(SAVED / name, root / name)
        for code in (SAVED / "code").iterdir():
            shutil.copy(code, root / name / code.name)
    return root


def test_the_folders_are_the_flat_layout(folders):
    """What makes the test meaningful: the folders carry the old remote code, not the new package's files."""
    assert sorted(p.name for p in SAVED.iterdir() if p.is_dir()) == sorted([*NAMES, "code"])
    for name in NAMES:
        assert {"fused.py", "fused_kernels.py", "modeling_geonorm.py"} <= {p.name for p in (folders / name).iterdir()}


@pytest.fixture(scope="module")
def through_the_plugin(folders) -> dict[str, tuple[type, dict, torch.Tensor]]:
    """name -> (the model's class, the non-empty entries of its loading info, its logits)."""
    out = {}
    for name in NAMES:
        model, info = AutoModelForCausalLM.from_pretrained(folders / name, output_loading_info=True)
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


def test_loads_as_remote_code_and_agrees_with_the_plugin(folders, through_the_plugin, plugin_free_python, tmp_path):
    job = {"folders": {name: str(folders / name) for name in NAMES}, "ids": TOKEN_IDS.tolist()}
    report, results = plugin_free_python.run(REMOTE, job, tmp_path / "child", timeout=600)
    for name in NAMES:
        assert report[name]["module"].startswith("transformers_modules."), name  # the folder's own old code
        assert report[name]["class"] == through_the_plugin[name][0].__name__, name
        assert report[name]["dropped"] == {}, name
        torch.testing.assert_close(results[name]["logits"], through_the_plugin[name][2], rtol=0, atol=1e-6)
