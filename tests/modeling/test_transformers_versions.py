"""The transformers releases hf-geonorm runs on (hf_geonorm.modeling.transformers_versions): the range is written
once and pyproject.toml's pin agrees with it; outside it the plugin and a folder's remote code refuse in one line
naming the range and the installed version (above the newest tested they run, warning, and refuse a decoder layer
they cannot take over); ``hf-geonorm train`` refuses a release too old for it; the names that transformers changed
within the range are the installed release's. The folders under the oldest release itself:
tests/modeling/test_oldest_transformers.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.modeling_layers import GradientCheckpointingLayer

import hf_geonorm
from hf_geonorm.modeling import blocks
from hf_geonorm.modeling import transformers_versions as versions
from hf_geonorm.training.options import OLDEST_TRANSFORMERS

from support.helpers import fails
from support.tiny_models import layers_of, tiny_model

ROOT = Path(__file__).resolve().parents[2]


def test_the_pin_in_pyproject_is_the_tested_range():
    pins = re.findall(r'^    "(transformers\b[^"]*)",', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert pins == [f"transformers{versions.SUPPORTED_RANGE}"]  # the one pin, in the dependencies
    oldest, newest = versions.OLDEST_TESTED, versions.NEWEST_TESTED
    assert versions.SUPPORTED_RANGE == f">={oldest[0]}.{oldest[1]},<{newest[0]}.{newest[1] + 1}"
    assert oldest <= (5, 23) and oldest <= OLDEST_TRANSFORMERS <= newest  # train's own oldest within the range
    assert oldest <= versions.INSTALLED <= newest  # this environment is one the range names


@pytest.mark.parametrize(("version", "expected"), [("5.16.1", (5, 16)), ("5.26.0.dev0", (5, 26)), ("6.0", (6, 0))])
def test_release_reads_major_and_minor(version, expected):
    assert versions.release(version) == expected


def test_an_older_transformers_is_refused_in_one_line_naming_the_range(monkeypatch):
    monkeypatch.setattr(versions, "INSTALLED", (5, 15))
    monkeypatch.setattr(versions, "INSTALLED_VERSION", "5.15.2")
    with pytest.raises(versions.UnsupportedTransformers) as refused:
        versions.check_transformers()
    message = str(refused.value)
    assert "\n" not in message and isinstance(refused.value, ValueError)
    assert f"transformers {versions.SUPPORTED_RANGE}" in message and "5.15.2 is installed" in message


def test_a_release_in_the_range_passes_silently_and_a_newer_one_warns(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        versions.check_transformers()
    monkeypatch.setattr(versions, "UNTESTED_RELEASE", True)
    monkeypatch.setattr(versions, "INSTALLED_VERSION", "5.99.0")
    with pytest.warns(UserWarning, match=r"5\.99\.0 is newer than the releases .* tested on \(>=5\.\d+,<5\.\d+\)"):
        versions.check_transformers()


def test_above_the_newest_release_a_decoder_layer_that_gained_a_method_is_refused(monkeypatch):
    stock = tiny_model("llama")
    layer_class = type(layers_of(stock)[0])
    blocks.check_stock_layer_class(layer_class)  # the stock LlamaDecoderLayer: __init__ and forward alone
    monkeypatch.setattr(blocks, "UNTESTED_RELEASE", True)
    assert hf_geonorm.convert(stock) is not None  # checked, and taken over
    monkeypatch.setattr(layer_class, "extra_step", lambda self: None, raising=False)
    with pytest.raises(versions.UnsupportedTransformers, match=r"LlamaDecoderLayer .* defines __init__, extra_step"):
        hf_geonorm.convert(stock)
    monkeypatch.setattr(blocks, "UNTESTED_RELEASE", False)  # within the range the tests vouch for the class instead
    assert hf_geonorm.convert(stock) is not None
    changed_base = type("LlamaDecoderLayer", (GradientCheckpointingLayer, torch.nn.Identity), {
        "__init__": layer_class.__init__, "forward": layer_class.forward})  # fmt: skip
    with pytest.raises(versions.UnsupportedTransformers, match="over GradientCheckpointingLayer, Identity"):
        blocks.check_stock_layer_class(changed_base)


# The command line in a process where the plugin's record of the installed transformers says 5.15.1: that module is
# made first, from its file, with transformers.__version__ reading so while it runs (transformers swaps its lazy module
# as its submodules load, so the version cannot be set earlier), and the plugin imported afterwards finds it.
COMMAND_UNDER_AN_OLDER_RELEASE = """
import importlib.util, sys
from pathlib import Path

import transformers

name = "hf_geonorm.modeling.transformers_versions"
package = Path(importlib.util.find_spec("hf_geonorm").origin).parent  # found, not imported
spec = importlib.util.spec_from_file_location(name, package / "modeling" / "transformers_versions.py")
versions = importlib.util.module_from_spec(spec)
transformers.__version__ = "5.15.1"
spec.loader.exec_module(versions)
assert versions.INSTALLED == (5, 15)
sys.modules[name] = versions
from hf_geonorm_cli import run  # the console script's entry point

sys.argv = ["hf-geonorm", "architectures"]
run()
"""


def test_the_command_line_refuses_an_older_transformers_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-c", COMMAND_UNDER_AN_OLDER_RELEASE], capture_output=True, text=True,
                          cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=300)  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert lines == [
        f"Error: GeoNorm models need transformers {versions.SUPPORTED_RANGE} (the releases their code is tested on), "
        f"but 5.15.1 is installed: pip install 'transformers{versions.SUPPORTED_RANGE}'"
    ]
    assert "Traceback" not in done.stderr


def test_train_refuses_a_transformers_too_old_for_it_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(versions, "INSTALLED", (5, 22))
    monkeypatch.setattr(versions, "INSTALLED_VERSION", "5.22.0")
    line = fails("train", "--arch", "gpt2", "--preset", "tiny", "--max-steps", "1", "--output", tmp_path / "run")
    assert line.startswith("Error: hf-geonorm train needs transformers >=5.23") and "5.22.0 is installed" in line
    assert not (tmp_path / "run").exists()


def test_the_renamed_names_are_the_installed_releases():
    import inspect

    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
    from transformers.models.gptj.modeling_gptj import GPTJAttention

    assert versions.CACHE_ARGUMENT in inspect.signature(GPT2Attention.forward).parameters
    assert versions.GPTJ_BLOCK_RETURNS_TUPLE == hasattr(GPTJAttention, "_split_heads")
    registry = type(__import__("transformers.utils.output_capturing").utils.output_capturing._CAN_RECORD_REGISTRY)
    assert versions.CAPTURE_REGISTRY_BY_MODEL == (registry is not dict)


def test_a_forward_past_the_learned_positions_with_a_cache_names_the_limit():
    """The position guard counts the cached tokens under the installed release's name of the cache argument."""
    config = hf_geonorm.GeoNormGPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=128)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        cache = getattr(model(torch.ones((1, 60), dtype=torch.long), use_cache=True), versions.CACHE_ARGUMENT)
        with pytest.raises(ValueError, match="reaches 68 tokens .* beyond this model's 64 learned positions"):
            model(torch.ones((1, 8), dtype=torch.long), use_cache=True, **{versions.CACHE_ARGUMENT: cache})


# Runs where hf_geonorm cannot be imported: loads each folder as remote code (each its own module, under its own
# name), keeping what each raises and warns.
LOAD_AS_REMOTE_CODE = """
import warnings
from transformers import AutoModelForCausalLM

for name, folder in job["folders"].items():
    report[name] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        except Exception as error:
            report[name]["refused"] = {"type": type(error).__name__, "message": str(error)}
        else:
            with torch.no_grad():
                results[name] = {"logits": model(torch.tensor([job["ids"]])).logits}
    report[name]["warnings"] = [str(w.message) for w in caught if "GeoNorm" in str(w.message)]
report["installed"] = transformers.__version__
"""


def folder_tested_on(source: Path, target: Path, oldest: tuple[int, int], newest: tuple[int, int]) -> Path:
    """A copy of the saved folder ``source`` whose code names another tested range: the installed transformers is
    then below or above it, as an older or newer release would be for the real range."""
    shutil.copytree(source, target)
    code = target / "transformers_versions.py"
    text = code.read_text()
    for name, value in (("OLDEST_TESTED", oldest), ("NEWEST_TESTED", newest)):
        text, count = re.subn(rf"^{name} = \(\d+, \d+\)$", f"{name} = {value}", text, flags=re.M)
        assert count == 1, name
    code.write_text(text)
    return target


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("versions") / "llama"
    hf_geonorm.convert(tiny_model("llama", perturb=True)).save_pretrained(folder)
    return folder


def test_a_folders_code_refuses_an_older_transformers_and_runs_under_a_newer_one_with_a_warning(
    saved_llama, plugin_free_python, tmp_path
):
    """One child loads both folders: one whose range lies above the installed release, one whose range lies below."""
    major, minor = versions.INSTALLED
    above = folder_tested_on(saved_llama, tmp_path / "above", (major, minor + 1), (major, minor + 2))
    below = folder_tested_on(saved_llama, tmp_path / "below", (major, minor - 2), (major, minor - 1))
    job = {"folders": {"newer": str(below), "older": str(above)}, "ids": [5, 17, 42, 9]}
    report, results = plugin_free_python.run(LOAD_AS_REMOTE_CODE, job, tmp_path / "child")
    refused = report["older"]["refused"]
    assert refused["type"] == "UnsupportedTransformers" and "\n" not in refused["message"]
    assert f"need transformers >={major}.{minor + 1},<{major}.{minor + 3} (" in refused["message"]
    assert f"but {report['installed']} is installed" in refused["message"]
    assert "older" not in results

    assert "refused" not in report["newer"]
    (warning,) = report["newer"]["warnings"]
    assert warning.startswith(f"transformers {report['installed']} is newer than the releases the GeoNorm code is")
    model = AutoModelForCausalLM.from_pretrained(saved_llama).eval()
    with torch.no_grad():
        torch.testing.assert_close(results["newer"]["logits"], model(torch.tensor([job["ids"]])).logits)
