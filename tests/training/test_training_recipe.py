"""The training recipe is written once: ``hf-geonorm init`` + ``train --model`` and ``train --arch`` build the same
from-scratch config (dropout off), and ``train`` trains with the one optimizer (AdamW, betas (0.9, beta2), decay on
the weight matrices only) and schedule (warm-up, cosine to a floor)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, TrainingArguments

import hf_geonorm  # noqa: F401 - registers the GeoNorm classes with the Auto classes
from hf_geonorm.training.data.tokenizer import train_tokenizer
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.run.model import build_model
from hf_geonorm.training.run.trainer import CheckedTrainer, run_training
from hf_geonorm_cli.main import cli

from support.helpers import STDLIB, stdlib_text, written_factor

RUN_NAMING = {"_name_or_path"}  # config fields that name where a run came from, not what it is


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    return stdlib_text(tmp_path_factory, "json/decoder.py", "textwrap.py")


@pytest.fixture
def adamw_steps(monkeypatch) -> list[dict]:
    """What every AdamW step of the test runs with: learning rate and weight decay per group, betas."""
    seen: list[dict] = []
    original = torch.optim.AdamW.step

    def step(self, *args, **kwargs):
        groups = self.param_groups
        seen.append({"lr": [g["lr"] for g in groups], "decay": [g["weight_decay"] for g in groups],
                     "betas": [tuple(g["betas"]) for g in groups]})  # fmt: skip
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    return seen


# ---- one config recipe ----


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_init_then_train_and_train_from_arch_build_the_same_model(arch, tmp_path, data_file):
    vocab, seq = 512, 32
    runner = CliRunner()
    made = runner.invoke(cli, ["init", arch, str(tmp_path / "cfg"), "--preset", "tiny", "--vocab-size", str(vocab)])
    assert made.exit_code == 0, made.output
    common = ["--data", str(data_file), "--vocab-size", str(vocab), "--seq-len", str(seq), "--batch-size", "4",
              "--max-steps", "2", "--eval-every", "2"]  # fmt: skip
    runs = {"from_init": ["--model", str(tmp_path / "cfg")], "arch": ["--arch", arch, "--preset", "tiny"]}
    for out, args in runs.items():
        result = runner.invoke(cli, ["train", *args, *common, "--output", str(tmp_path / out)])
        assert result.exit_code == 0, result.output
    from_init, from_arch = (json.loads((tmp_path / out / "final" / "config.json").read_text())
                            for out in ("from_init", "arch"))  # fmt: skip
    differ = {k for k in from_init.keys() | from_arch.keys() if from_init.get(k) != from_arch.get(k)}
    assert differ <= RUN_NAMING, {k: (from_init.get(k), from_arch.get(k)) for k in differ}
    dropouts = {k: v for k, v in from_arch.items() if k.endswith(("pdrop", "dropout"))}
    assert dropouts and set(dropouts.values()) == {0.0}, dropouts
    sizes = ("n_positions", "n_layer", "n_embd") if arch == "gpt2" else (
        "max_position_embeddings", "num_hidden_layers", "hidden_size")  # fmt: skip
    # the tiny preset's 256 positions, not the 32 of a training block: generate goes past the blocks it trained on
    assert [from_arch[k] for k in ("vocab_size", *sizes)] == [vocab, 256, 4, 128]
    # the preset sizes count the embedding once (the paper's shapes), and the saved model generates with its cache
    assert from_arch["tie_word_embeddings"] is True and from_arch["use_cache"] is True
    # the same recipe, seed and data: the same trained weights
    weights = [load_file(tmp_path / out / "final" / "model.safetensors") for out in ("from_init", "arch")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_a_config_with_fewer_rows_than_its_own_tokenizer_is_refused(tmp_path, data_file):
    runner = CliRunner()
    made = runner.invoke(cli, ["init", "gpt2", str(tmp_path / "cfg"), "--preset", "tiny", "--vocab-size", "64"])
    assert made.exit_code == 0, made.output
    train_tokenizer([data_file.read_text()], 300).save_pretrained(tmp_path / "cfg")  # put there by hand
    result = runner.invoke(cli, ["train", "--model", str(tmp_path / "cfg"), "--data", str(data_file), "--seq-len",
                                 "32", "--output", str(tmp_path / "run")])  # fmt: skip
    assert result.exit_code != 0 and "vocab_size 64" in result.output and "--vocab-size 320" in result.output
    assert not (tmp_path / "run").exists()


# ---- one optimizer and schedule ----


def test_train_steps_at_the_written_schedule_and_resumes_it(tmp_path, data_file, adamw_steps):
    out = tmp_path / "run"
    options = dict(data=str(data_file), seq_len=32, vocab_size=300, batch_size=4, max_steps=8, warmup_steps=3, lr=1e-3,
                   min_lr_ratio=0.2, adam_beta2=0.99, weight_decay=0.1, eval_every=4, keep_checkpoints=True,
                   output=str(out))  # fmt: skip
    run_training(TrainOptions(**options), log=lambda line: None)
    expected = [1e-3 * written_factor(s, 3, 8, 0.2) for s in range(8)]
    assert [s["lr"] for s in adamw_steps] == [pytest.approx([lr, lr], rel=1e-12) for lr in expected]
    assert {tuple(s["decay"]) for s in adamw_steps} == {(0.1, 0.0)}
    assert {b for s in adamw_steps for b in s["betas"]} == {(0.9, 0.99)}
    # stopped after step 4: the resumed run continues the schedule where it was
    for name in ("checkpoint-8", "final", "metrics.json", "loss_curve.png"):
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    adamw_steps.clear()
    run_training(TrainOptions(**options, resume=True), log=lambda line: None)
    assert [s["lr"][0] for s in adamw_steps] == pytest.approx(expected[4:], rel=1e-12)


EMBEDDING_NAMES = ("wte.weight", "wpe.weight", "embed_tokens.weight")  # GPT-2's token and position, LLaMA's


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_weight_decay_falls_on_the_weight_matrices_only(arch, tmp_path):
    tokenizer = train_tokenizer([(STDLIB / "textwrap.py").read_text()], 300)
    options = TrainOptions(arch=arch, preset="tiny", seq_len=32, settings={"geo_learnable_step": True})
    model = build_model(options, tokenizer)
    args = TrainingArguments(output_dir=str(tmp_path), weight_decay=0.1, report_to=[], use_cpu=True)
    optimizer = CheckedTrainer(model=model, args=args).create_optimizer()
    names = {id(p): name for name, p in model.named_parameters()}
    decayed, kept = ({names[id(p)] for p in group["params"]} for group in optimizer.param_groups)
    expected = {name for name, p in model.named_parameters() if p.ndim >= 2 and not name.endswith(EMBEDDING_NAMES)}
    assert decayed == expected and decayed.isdisjoint(kept) and decayed | kept == set(names.values())
    assert not [n for n in decayed if re.search(r"norm|ln_|bias|step_|wte|wpe|embed", n)]
    # the checks have something to find: GeoNorm's step parameters and the embeddings are there, undecayed
    assert any("step_scale" in n for n in kept) and any("step_bias" in n for n in kept)
    assert any(n.endswith(EMBEDDING_NAMES) for n in kept)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


def test_the_optimizer_defaults_are_the_recipe():
    """The command line passes only what was given (tests/training/test_train_options.py): these defaults are
    train's."""
    from hf_geonorm.training.options import FINE_TUNING_WEIGHT_DECAY, PRETRAINING_WEIGHT_DECAY

    assert (TrainOptions().adam_beta2, TrainOptions().min_lr_ratio) == (0.95, 0.1)
    # weight decay and warm-up depend on the run (with_learning_rate): 0.1 from scratch, 0 to fine-tune
    assert (TrainOptions().weight_decay, PRETRAINING_WEIGHT_DECAY, FINE_TUNING_WEIGHT_DECAY) == (None, 0.1, 0.0)


@pytest.mark.parametrize(("seq_len", "positions"), [(32, 256), (300, 300)])
def test_a_model_built_by_train_has_its_presets_positions_or_the_block_length_when_longer(
    seq_len, positions, tmp_path, data_file
):
    result = CliRunner().invoke(cli, [
        "train", "--arch", "gpt2", "--data", str(data_file), "--vocab-size", "512", "--seq-len", str(seq_len),
        "--batch-size", "1", "--max-steps", "1", "--eval-every", "1", "--eval-blocks", "1",
        "--output", str(tmp_path / "run")])  # fmt: skip
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final")
    assert model.config.n_positions == positions
    prompt = torch.zeros(1, 4, dtype=torch.long)
    made = model.generate(prompt, max_new_tokens=200, min_new_tokens=200, do_sample=False)
    assert made.shape[1] == 204  # beyond a block of 32 tokens: no error
