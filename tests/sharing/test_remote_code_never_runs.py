"""No code shipped with a folder runs, whatever the user answers: a GeoNorm folder whose config.json and
tokenizer_config.json point their ``auto_map`` at a module of its own that writes a marker file when imported. Every
command that reads a folder is run on it in a child process with ``y`` piped into stdin (the answer transformers'
"Do you wish to run the custom code? [y/N]" would take), and the marker never appears; the commands that need the
tokenizer refuse it in one line that says why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hf_geonorm.conversion.convert import convert_checkpoint
from hf_geonorm.training.data.tokenizer import train_tokenizer

from support.helpers import fails
from support.tiny_models import tiny_model

STDLIB = Path(sysconfig.get_paths()["stdlib"])
MARKER_CODE = """
import sys

with open({marker!r}, "a") as f:  # the proof that this module ran
    f.write(" ".join(sys.argv[1:3]) + "\\n")

from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast


class MarkerTokenizer(PreTrainedTokenizerFast):
    pass


class MarkerConfig(GPT2Config):
    pass


class MarkerModel(GPT2LMHeadModel):
    config_class = MarkerConfig
"""
# each command as a user types it, under CliRunner with "y" for every prompt; sys.argv names the command for the marker
CHILD = """
import json, sys
from click.testing import CliRunner
from hf_geonorm_cli.main import cli

results = {}
for name, args in json.loads(sys.argv[1]).items():
    sys.argv = ["hf-geonorm", *args]
    result = CliRunner().invoke(cli, args, input="y\\n" * 50)
    results[name] = {"exit_code": result.exit_code, "output": result.output}
print("RESULTS", json.dumps(results))
"""


@pytest.fixture(scope="module")
def hostile_folder(tmp_path_factory) -> tuple[Path, Path]:
    """A converted tiny GPT-2 with a tokenizer, whose auto_map entries all name the folder's own marker module."""
    root = tmp_path_factory.mktemp("hostile")
    marker = root / "marker.txt"
    tiny_model("gpt2", vocab_size=320).save_pretrained(root / "stock")
    folder = root / "hostile"
    convert_checkpoint(str(root / "stock"), str(folder), {"norm_style": "pre"})
    train_tokenizer([(STDLIB / "textwrap.py").read_text()], 300).save_pretrained(folder)
    (folder / "marker_code.py").write_text(MARKER_CODE.format(marker=str(marker)))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    marker_tokenizer = [None, "marker_code.MarkerTokenizer"]
    tokenizer_config.update(tokenizer_class="MarkerTokenizer", auto_map={"AutoTokenizer": marker_tokenizer})
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {name: "marker_code.MarkerModel" for name in config["auto_map"]}
    config["auto_map"].update(AutoConfig="marker_code.MarkerConfig", AutoTokenizer=marker_tokenizer)
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


def test_no_command_runs_a_folders_code_even_when_the_user_answers_yes(hostile_folder, tmp_path):
    folder, marker = hostile_folder
    text = tmp_path / "text.txt"
    text.write_text((STDLIB / "textwrap.py").read_text())
    small = ["--data", str(text), "--seq-len", "32", "--batch-size", "4", "--max-steps", "1", "--eval-blocks", "8",
             "--lr", "1e-3", "--warmup-steps", "0"]  # fmt: skip
    commands = {
        "train --model": ["train", "--model", str(folder), *small, "--output", str(tmp_path / "run-model")],
        "train --tokenizer": ["train", "--tokenizer", str(folder), *small, "--output", str(tmp_path / "run-tok")],
        "convert": ["convert", str(folder), str(tmp_path / "converted")],
        "perplexity": ["perplexity", str(folder), "--text", str(text), "--max-tokens", "64"],
        "angles": ["angles", str(folder), "--text", str(text), "--max-tokens", "64"],
        "init --tokenizer": ["init", "gpt2", str(tmp_path / "init"), "--preset", "tiny", "--tokenizer", str(folder)],
        "info": ["info", str(folder)],
        "push": ["push", str(folder), "someone/hostile"],
    }
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "HF_TOKEN": "hf_not_used", "HF_ENDPOINT": "http://127.0.0.1:9"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(commands)], input="y\n" * 200, capture_output=True, text=True,
        env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.split("RESULTS", 1)[1])
    assert not marker.exists(), f"the folder's code ran for: {marker.read_text()}"
    for name in ("train --model", "train --tokenizer", "convert", "perplexity", "angles", "init --tokenizer"):
        result = results[name]
        errors = [line for line in result["output"].splitlines() if line.startswith("Error:")]
        assert result["exit_code"] != 0 and len(errors) == 1, (name, result["output"][-2000:])
        assert "needs custom code" in errors[0] and "never runs" in errors[0] and "standard tokenizer" in errors[0]
        assert str(folder) in errors[0], errors[0]
        assert "Do you wish to run the custom code" not in result["output"], name  # not even asked
        assert "Traceback" not in result["output"], name
    assert results["info"]["exit_code"] == 0, results["info"]["output"]
    assert "Traceback" not in results["push"]["output"]
    for output in ("run-model", "run-tok", "converted", "init"):
        assert not (tmp_path / output).exists(), output


# ---- tokenizers that need custom code ----


TEXT = Path(json.__file__).with_name("decoder.py")  # real text: a Python stdlib source file


def standard_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(TEXT.read_text().splitlines()[:200], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def custom_code_tokenizer(tmp_path_factory) -> Path:
    """A tokenizer folder whose tokenizer_config.json points at code of its own (its tokenizer.json is standard, so
    transformers loads a standard class in its place without a word)."""
    folder = tmp_path_factory.mktemp("tokenizers") / "custom"
    standard_tokenizer().save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_evil.py").write_text("raise SystemExit('custom code ran')\n")
    return folder


def test_a_custom_code_tokenizer_is_refused_by_convert_init_and_train(stock_llama, custom_code_tokenizer, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(stock_llama, source)
    for name in os.listdir(custom_code_tokenizer):
        shutil.copy(custom_code_tokenizer / name, source / name)
    for args in (
        ("convert", source, tmp_path / "converted"),
        ("init", "gpt2", tmp_path / "init", "--preset", "tiny", "--tokenizer", custom_code_tokenizer),
        ("train", "--tokenizer", custom_code_tokenizer, "--data", TEXT, "--max-steps", "1", "--output",
         tmp_path / "run"),
    ):  # fmt: skip
        message = fails(*args)
        assert "needs custom code" in message and "auto_map" in message, (args, message)
    assert not any((tmp_path / name).exists() for name in ("converted", "init"))
