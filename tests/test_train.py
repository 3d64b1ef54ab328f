"""`hf-geonorm train` and hf_geonorm.training: Trainer runs, checkpoints, resume, the bridge anneal, LoRA, and
DDP / FSDP2 on CPU (gloo) against the single-process run."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_geonorm_cli.main import cli
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_geonorm
from hf_geonorm.training import BridgeAnneal, read_texts, stdlib_files

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text((STDLIB / "json" / "decoder.py").read_text() + (STDLIB / "textwrap.py").read_text())
    return path


def train(*args: str) -> object:
    result = CliRunner().invoke(cli, ["train", *args])
    return result


def eval_loss_of(folder: Path, data_file: Path) -> float:
    """The validation loss of a saved model, computed here from the saved tokenizer and weights."""
    from hf_geonorm.training import split_blocks, token_blocks

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    _, val = split_blocks(token_blocks(tokenizer, [data_file.read_text()], 32))
    with torch.no_grad():
        return model(val, labels=val).loss.item()


def test_train_writes_metrics_curve_checkpoints_and_a_reloadable_model(tmp_path, data_file):
    out = tmp_path / "run"
    result = train("--data", str(data_file), *SMALL, "--max-steps", "6", "--eval-every", "3", "--output", str(out))
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 6 and metrics["model_type"] == "geonorm_gpt2"
    assert metrics["settings"]["norm_style"] == "geo"
    assert (out / "loss_curve.png").stat().st_size > 1000
    evals = [h["eval_loss"] for h in metrics["log_history"] if "eval_loss" in h]
    assert len(evals) >= 2 and all(math.isfinite(v) for v in evals)
    # the final folder reloads through the Auto classes and gives the reported validation loss
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    assert type(final).__name__ == "GeoNormGPT2ForCausalLM"
    assert eval_loss_of(out / "final", data_file) == pytest.approx(metrics["final_eval_loss"], rel=1e-4)
    checkpoint = AutoModelForCausalLM.from_pretrained(out / "checkpoint-6")
    assert type(checkpoint) is type(final)
    for name, param in final.state_dict().items():
        assert torch.equal(param, checkpoint.state_dict()[name]), name
    assert json.loads((out / "checkpoint-6" / "config.json").read_text())["auto_map"]


def test_resume_from_a_checkpoint_gives_the_uninterrupted_result(tmp_path, data_file):
    import shutil

    out = tmp_path / "run"
    common = ["--data", str(data_file), *SMALL, "--eval-every", "2", "--max-steps", "4", "--output", str(out)]
    assert train(*common).exit_code == 0
    uninterrupted = json.loads((out / "metrics.json").read_text())["final_eval_loss"]
    # as if the run had been stopped after step 2
    for name in ("checkpoint-4", "final", "metrics.json", "loss_curve.png"):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    result = train(*common, "--resume")
    assert result.exit_code == 0, result.output
    resumed = json.loads((out / "metrics.json").read_text())
    assert resumed["steps"] == 4
    assert resumed["final_eval_loss"] == pytest.approx(uninterrupted, rel=1e-5)


def test_bridge_anneal_moves_a_converted_prenorm_checkpoint_to_geonorm(tmp_path, data_file):
    from transformers import GPT2Config, GPT2LMHeadModel

    stock = tmp_path / "stock"
    GPT2LMHeadModel(GPT2Config(vocab_size=320, n_embd=32, n_layer=2, n_head=4, n_positions=64)).save_pretrained(stock)
    convert = CliRunner().invoke(cli, ["convert", str(stock), str(tmp_path / "bridged"), "--bridge", "0"])
    assert convert.exit_code == 0, convert.output
    out = tmp_path / "anneal"
    result = train(
        "--model", str(tmp_path / "bridged"), "--data", str(data_file), *SMALL, "--max-steps", "6",
        "--eval-every", "2", "--bridge-anneal", "4", "--output", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    history = json.loads((out / "metrics.json").read_text())["log_history"]
    bridges = [h["geo_bridge"] for h in history if "geo_bridge" in h]
    assert bridges == sorted(bridges) and bridges[0] < 1.0 and bridges[-1] == 1.0
    assert json.loads((out / "final" / "config.json").read_text())["geo_bridge"] == 1.0
    anneal = BridgeAnneal(model=None, steps=4, start=0.2)
    assert [anneal.value_at(s) for s in (0, 2, 4, 9)] == pytest.approx([0.2, 0.6, 1.0, 1.0])


def test_lora_and_gradient_checkpointing_train(tmp_path, data_file):
    out = tmp_path / "lora"
    options = ["--max-steps", "3", "--eval-every", "3", "--lora", "--gradient-checkpointing", "--decay", "sqrt"]
    result = train("--data", str(data_file), *SMALL, *options, "--output", str(out))
    assert result.exit_code == 0, result.output
    merged = AutoModelForCausalLM.from_pretrained(out / "final")
    assert type(merged).__name__ == "GeoNormGPT2ForCausalLM" and merged.config.geo_decay == "sqrt"
    assert not any("lora" in name for name in merged.state_dict())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--norm-style", "sideways"], "--norm-style"),
        (["--data", "no/such/file.txt"], "no/such/file.txt"),
        (["--arch", "bloom"], "supported"),
        (["--max-steps", "0"], "--max-steps"),
        (["--resume"], "no checkpoint"),
        (["--alpha", "-1"], "alpha"),
    ],
)
def test_bad_input_is_one_line_and_nonzero(tmp_path, data_file, args, message):
    defaults = ["--data", str(data_file)] if "--data" not in args else []
    result = train(*defaults, *SMALL, "--max-steps", "2", "--output", str(tmp_path / "o"), *args)
    assert result.exit_code != 0 and message in result.output
    assert "Traceback" not in result.output


def test_a_non_empty_output_is_refused_without_resume(tmp_path, data_file):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    result = train("--data", str(data_file), *SMALL, "--max-steps", "2", "--output", str(out))
    assert result.exit_code != 0 and "--resume" in result.output
    assert (out / "mine.txt").read_text() == "keep me"


def test_the_embedded_default_reads_the_standard_library():
    texts, label = read_texts(None, max_chars=10_000)
    assert "standard library" in label and sum(len(t) for t in texts) == 10_000
    assert stdlib_files() and all(p.suffix == ".py" for p in stdlib_files())


def torchrun(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "hf_geonorm_cli.main", "train", *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    if done.returncode != 0:  # one relaunch: this launch failed intermittently in full-suite runs (cause unknown)
        first = done.stderr[-3000:]
        shutil.rmtree(args[args.index("--output") + 1], ignore_errors=True)
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        done.stderr = f"first launch:\n{first}\nsecond launch:\n{done.stderr}"
    return done


@pytest.mark.parametrize("sharding", ["ddp", "fsdp2"])
def test_two_process_training_equals_one_process_with_the_same_global_batch(tmp_path, data_file, sharding):
    common = ["--data", str(data_file), "--seq-len", "32", "--vocab-size", "300", "--max-steps", "3",
              "--eval-every", "1", "--warmup-steps", "0", "--lr", "1e-3"]  # fmt: skip
    single = train(*common, "--batch-size", "4", "--output", str(tmp_path / "single"))
    assert single.exit_code == 0, single.output
    extra = ["--fsdp"] if sharding == "fsdp2" else []
    done = torchrun([*common, "--batch-size", "2", *extra, "--output", str(tmp_path / "multi")], tmp_path)
    assert done.returncode == 0, done.stderr[-6000:]

    def losses(folder):
        history = json.loads((tmp_path / folder / "metrics.json").read_text())["log_history"]
        return [h["loss"] for h in history if "loss" in h] + [h["eval_loss"] for h in history if "eval_loss" in h]

    assert losses("multi") == pytest.approx(losses("single"), rel=1e-5)
    reloaded = eval_loss_of(tmp_path / "multi" / "final", data_file)
    assert reloaded == pytest.approx(json.loads((tmp_path / "multi" / "metrics.json").read_text())["final_eval_loss"],
                                     rel=1e-4)  # fmt: skip
    assert hf_geonorm.family_for(AutoModelForCausalLM.from_pretrained(tmp_path / "multi" / "final").config.model_type)


def test_bf16_mixed_precision_trains(tmp_path, data_file):
    out = tmp_path / "bf16"
    result = train("--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "2", "--bf16",
                   "--output", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["options"]["precision"] == "bf16" and math.isfinite(metrics["final_eval_loss"])
