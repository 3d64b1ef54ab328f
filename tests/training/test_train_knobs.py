"""The knobs of a pretraining run: gradient accumulation, trackers (--report-to), what a person watching the run
sees (progress, one final evaluation, warnings), what metrics.json records, and a model folder that agrees with
its tokenizer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

import hf_geonorm
from hf_geonorm.training import options as options_module
from hf_geonorm.training.data.prepare import evaluation_size
from hf_geonorm.training.data.tokenizer import train_tokenizer
from hf_geonorm.training.options import EVAL_BLOCKS, TrainOptions
from hf_geonorm.training.run.trainer import CheckedTrainer, run_training
from hf_geonorm_cli.main import cli

from support.helpers import fails, stdlib_text, train, train_in

TINY = {"seq_len": 32, "vocab_size": 300, "warmup_steps": 0, "lr": 1e-3}
SMALL = ["--seq-len", "32", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    return stdlib_text(tmp_path_factory, "json/decoder.py", "textwrap.py")


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory, data_file) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer([data_file.read_text()], 300).save_pretrained(folder)
    return folder


# ---- gradient accumulation ----


def test_accumulated_batches_train_as_one_large_batch(tmp_path, data_file):
    runs = {}
    for name, batch, accumulate in (("whole", 16, 1), ("accumulated", 4, 4)):
        options = TrainOptions(**TINY, data=str(data_file), batch_size=batch, gradient_accumulation_steps=accumulate,
                               max_steps=3, eval_every=3, logging_steps=1, output=str(tmp_path / name))  # fmt: skip
        runs[name] = run_training(options, log=lambda line: None)
    losses = {name: [h["loss"] for h in m["log_history"] if "loss" in h] for name, m in runs.items()}
    assert len(losses["whole"]) == 3
    assert losses["accumulated"] == pytest.approx(losses["whole"], rel=1e-4)
    weights = [load_file(tmp_path / name / "final" / "model.safetensors") for name in runs]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        # AdamW moves a weight whose gradient is rounding noise by noise of up to lr (2e-3) a step
        torch.testing.assert_close(weights[1][key], weights[0][key], rtol=1e-4, atol=1e-4)
    for metrics in runs.values():  # 3 optimizer steps of 16 blocks of 32 tokens, however they were batched
        assert metrics["tokens"] == 3 * 16 * 32 and metrics["tokens_per_step"] == 16 * 32
        assert metrics["tokens_per_second"] == pytest.approx(metrics["tokens"] / metrics["training_seconds"])
        assert metrics["training_seconds"] < metrics["train_seconds"]  # the evaluations in train() left out


def test_the_training_time_leaves_out_only_the_evaluations_inside_training(tmp_path, data_file, monkeypatch):
    """The final test evaluation runs after training: a slow one (a second here) is not taken from the training
    time, which stays within the run's time (a sweep refuses a record of negative seconds)."""
    base = CheckedTrainer.__mro__[1]  # transformers' Trainer: what CheckedTrainer.evaluate times
    evaluate = base.evaluate

    def slow_test(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        if metric_key_prefix == "test":
            time.sleep(1.0)
        return evaluate(self, eval_dataset, ignore_keys, metric_key_prefix)

    monkeypatch.setattr(base, "evaluate", slow_test)
    assert train_in(tmp_path, data_file).exit_code == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["evaluation_seconds"] > 1.0  # the slow test evaluation counted among the evaluations
    assert 0 < metrics["training_seconds"] <= metrics["train_seconds"]


# ---- trackers ----


def test_report_to_tensorboard_writes_the_logged_losses_under_the_output(tmp_path, data_file):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    result = train("--data", data_file, "--vocab-size", "300", *SMALL, "--max-steps", "4", "--eval-every", "4",
                   "--logging-steps", "2", "--report-to", "tensorboard", "--output", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    event_files = list((out / "runs").rglob("events.out.tfevents.*"))
    assert event_files
    events = EventAccumulator(str(event_files[0].parent))
    events.Reload()
    history = json.loads((out / "metrics.json").read_text())["log_history"]
    logged = [(h["step"], h["loss"]) for h in history if "loss" in h]
    assert [(e.step, pytest.approx(e.value, rel=1e-5)) for e in events.Scalars("train/loss")] == logged
    assert [e.step for e in events.Scalars("eval/loss")] == [0, 4]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("wandb", "--report-to wandb: the wandb package is not installed; pip install wandb"),
        ("tensorboard,mlflow", "unknown tracker 'mlflow'"),
        ("none,tensorboard", "--report-to is none or trackers"),
    ],
)
def test_a_tracker_that_cannot_report_is_one_line(tmp_path, data_file, monkeypatch, value, message):
    real = options_module.importlib.util.find_spec
    absent = {"wandb"}  # as on a machine without it, whatever this one has
    monkeypatch.setattr(options_module.importlib.util, "find_spec", lambda name: None if name in absent else real(name))
    result = train("--data", data_file, "--report-to", value, "--output", tmp_path / "run")
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


# ---- what a person watching the run sees, and what metrics.json says ----


def test_progress_bar_log_lines_one_final_evaluation_and_the_warmup_warning(tmp_path, data_file, monkeypatch):
    evaluations = []
    real_evaluate = CheckedTrainer.evaluate

    def counted(self, *args, **kwargs):
        evaluations.append(kwargs.get("metric_key_prefix", "eval"))
        return real_evaluate(self, *args, **kwargs)

    monkeypatch.setattr(CheckedTrainer, "evaluate", counted)
    out = tmp_path / "run"
    result = train("--data", data_file, "--vocab-size", "300", *SMALL[:-4], "--warmup-steps", "4", "--max-steps", "4",
                   "--eval-every", "2", "--logging-steps", "1", "--output", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4/4 [" in result.output and "<" in result.output  # tqdm: steps done, total, elapsed<left
    for step in range(1, 5):
        assert f"step {step}/4: loss " in result.output
    assert "step 4/4: validation loss " in result.output
    assert "warning: --warmup-steps 4 is not below --max-steps 4" in result.output
    # the evaluation's bar on the training bar's line, not nested (cursor-up escapes garble a log file), no
    # checkpoint shard bars
    assert "evaluating" in result.output
    assert "\x1b[A" not in result.output and result.output.count("Writing model shards: 100%") == 1
    metrics = json.loads((out / "metrics.json").read_text())
    evals = [h for h in metrics["log_history"] if "eval_loss" in h]
    # the step-4 evaluation is the final one; the test split is evaluated once, at the end
    assert [h["step"] for h in evals] == [0, 2, 4] and evaluations == ["eval", "eval", "eval", "test"]
    assert metrics["final_eval_loss"] == evals[-1]["eval_loss"]


def test_metrics_record_the_options_that_applied(tmp_path, data_file, tokenizer_folder):
    runner = CliRunner()
    made = runner.invoke(cli, ["init", "llama", str(tmp_path / "cfg"), "--preset", "tiny", "--tokenizer",
                               str(tokenizer_folder)])  # fmt: skip
    assert made.exit_code == 0, made.output
    runs = {"model": ["--model", tmp_path / "cfg"], "arch": ["--arch", "llama", "--vocab-size", "300"]}
    for name, args in runs.items():
        result = train("--data", data_file, *args, *SMALL, "--max-steps", "2", "--eval-every", "2",
                       "--gradient-accumulation-steps", "2", "--output", tmp_path / name)  # fmt: skip
        assert result.exit_code == 0, result.output
    model_run, arch_run = (json.loads((tmp_path / run / "metrics.json").read_text())["options"] for run in runs)
    assert model_run["model"] == str(tmp_path / "cfg") and not {"arch", "preset", "vocab_size"} & model_run.keys()
    assert (arch_run["arch"], arch_run["preset"], arch_run["vocab_size"]) == ("llama", "tiny", 300)
    assert "model" not in arch_run and "tokenizer" not in arch_run
    for used in (model_run, arch_run):
        assert not {"bridge_anneal", "bridge_order"} & used.keys()
        assert used["gradient_accumulation_steps"] == 2 and used["weight_decay"] == 0.1
        assert used["adam_beta2"] == 0.95 and used["min_lr_ratio"] == 0.1 and used["batch_size"] == 4
        assert {"max_tokens", "streaming", "data_workers", "data_cache", "seed", "logging_steps"} <= used.keys()


# ---- a model folder and its tokenizer agree ----


def test_a_config_without_a_tokenizer_is_sized_to_the_tokenizer_trained(tmp_path, data_file):
    made = CliRunner().invoke(cli, ["init", "gpt2", str(tmp_path / "cfg"), "--preset", "tiny"])
    assert made.exit_code == 0, made.output
    written = json.loads((tmp_path / "cfg" / "config.json").read_text())["vocab_size"]
    result = train("--model", tmp_path / "cfg", "--data", data_file, "--vocab-size", "300", *SMALL, "--max-steps", "1",
                   "--output", tmp_path / "run")  # fmt: skip
    assert result.exit_code == 0, result.output
    tokens = len(json.loads((tmp_path / "run" / "final" / "tokenizer.json").read_text())["model"]["vocab"])
    rows = -(-tokens // 64) * 64
    assert written != rows
    assert (
        f"{tmp_path / 'cfg' / 'config.json'} has vocab_size {written}; the tokenizer has {tokens} tokens: the model is "
        f"built with {rows} rows"
    ) in result.output.replace("\n", " ")
    final = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert final["vocab_size"] == rows
    assert load_file(tmp_path / "run" / "final" / "model.safetensors")["transformer.wte.weight"].shape[0] == rows


def test_a_config_with_a_tokenizer_trains_with_it(tmp_path, data_file, tokenizer_folder):
    runner = CliRunner()
    made = runner.invoke(cli, ["init", "gpt2", str(tmp_path / "cfg"), "--preset", "tiny", "--tokenizer",
                               str(tokenizer_folder)])  # fmt: skip
    assert made.exit_code == 0, made.output
    written = json.loads((tmp_path / "cfg" / "config.json").read_text())["vocab_size"]
    result = train("--model", tmp_path / "cfg", "--data", data_file, *SMALL, "--max-steps", "1",
                   "--output", tmp_path / "run")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "training a byte-level BPE" not in result.output and "rows" not in result.output
    vocab = [json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
             for folder in (tokenizer_folder, tmp_path / "run" / "final")]  # fmt: skip
    assert vocab[0] == vocab[1]
    assert json.loads((tmp_path / "run" / "final" / "config.json").read_text())["vocab_size"] == written
    other = tmp_path / "other"
    train_tokenizer([data_file.read_text()], 280).save_pretrained(other)
    for args, message in (
        (["--vocab-size", "300"], "--vocab-size 300: "),
        (["--tokenizer", other], f"--tokenizer {other}: "),
    ):
        refused = train("--model", tmp_path / "cfg", "--data", data_file, *args, "--output", tmp_path / "refused")
        assert refused.exit_code == 1 and message in refused.output and "has a tokenizer of its own" in refused.output
        assert len(refused.output.strip().splitlines()) == 1 and not (tmp_path / "refused").exists()


# ---- TRL's SFTTrainer fine-tunes a GeoNorm checkpoint ----

PAIRS = [("def add(a, b):", " return a + b"), ("import json", "\njson.loads('{}')"), ("class A:", " pass"),
         ("for i in range(3):", " print(i)")]  # fmt: skip


def geonorm_folder(arch: str, folder: Path, tokenizer_folder: Path) -> Path:
    """A tiny from-scratch GeoNorm ``arch`` model with its tokenizer, saved as a checkpoint folder."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from hf_geonorm.sharing.hub import save_shareable

    made = CliRunner().invoke(cli, ["init", arch, str(folder / "cfg"), "--preset", "tiny", "--tokenizer",
                                    str(tokenizer_folder)])  # fmt: skip
    assert made.exit_code == 0, made.output
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder / "cfg"))
    save_shareable(model, folder / "model", tokenizer=AutoTokenizer.from_pretrained(tokenizer_folder))
    return folder / "model"


def sft_trainer(folder: Path, output: Path, **kwargs: object) -> object:
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = trl.SFTConfig(output_dir=str(output), max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2,
                         max_length=32, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)  # fmt: skip
    dataset = Dataset.from_list([{"prompt": p, "completion": c} for p, c in PAIRS])
    return trl.SFTTrainer(model=AutoModelForCausalLM.from_pretrained(folder), args=args, train_dataset=dataset,
                          processing_class=AutoTokenizer.from_pretrained(folder), **kwargs)  # fmt: skip


def test_sft_trainer_fine_tunes_a_geonorm_checkpoint(tmp_path, tokenizer_folder):
    from transformers import AutoModelForCausalLM

    folder = geonorm_folder("gpt2", tmp_path, tokenizer_folder)
    trainer = sft_trainer(folder, tmp_path / "sft")
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[name], after[name]) for name in before)
    trainer.save_model(str(tmp_path / "sft" / "final"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "sft" / "final")
    assert isinstance(reloaded, hf_geonorm.GeoNormGPT2ForCausalLM) and reloaded.config.norm_style == "geo"
    for name, p in reloaded.named_parameters():
        torch.testing.assert_close(p, after[name].detach(), rtol=0, atol=0)


def test_sft_trainer_with_lora_trains_only_the_adapters_and_merges_into_geonorm(tmp_path, tokenizer_folder):
    peft = pytest.importorskip("peft")

    folder = geonorm_folder("llama", tmp_path, tokenizer_folder)
    trainer = sft_trainer(folder, tmp_path / "lora", peft_config=peft.LoraConfig(r=4, lora_alpha=8))
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trained = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name for name in trained)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and changed <= trained
    merged = trainer.model.merge_and_unload()
    assert isinstance(merged, hf_geonorm.GeoNormLlamaForCausalLM) and merged.config.norm_style == "geo"


# ---- the larger presets take a real step (benchmarks/presets_step.py measures them) ----


@pytest.mark.slow
def test_the_125m_preset_takes_a_training_step(tmp_path, data_file):
    out = tmp_path / "run"
    result = train("--arch", "gpt2", "--preset", "125m", "--data", data_file, "--vocab-size", "300", "--seq-len", "64",
                   "--batch-size", "1", "--max-steps", "1", "--eval-every", "2", "--warmup-steps", "0",
                   "--output", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 1 and metrics["final_eval_loss"] < 10
    # GPT-2 small's body, 12 layers of width 768 (12 d^2 + 13 d each), the 300-token vocabulary padded to 320 rows
    # (tied to the head), the preset's 2048 positions (room to generate past the 64-token training blocks) and the
    # final norm; GeoNorm adds a few scalars per layer
    d, layers = 768, 12
    expected = layers * (12 * d * d + 13 * d) + 320 * d + 2048 * d + 2 * d
    assert 0 <= metrics["parameters"] - expected <= 16 * layers, metrics["parameters"] - expected


# ---- options refused before a run starts ----


def test_non_finite_rates_and_two_precisions_are_usage_errors(tmp_path):
    message = fails("train", "--lr", "nan", "--output", tmp_path / "run", code=2)
    assert "'--lr'" in message and "not a finite number" in message
    assert "'--lr'" in fails("train", "--lr", "inf", "--output", tmp_path / "run", code=2)
    assert "'--lrs'" in fails("sweep", "--lrs", "1e-3,nan", "--output", tmp_path / "sweep", code=2)
    message = fails("train", "--bf16", "--fp16", "--output", tmp_path / "run", code=2)
    assert "--bf16 and --fp16 exclude each other" in message
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


# ---- the evaluation of a short run ----


def test_the_default_evaluation_is_sized_to_the_run_and_the_held_out_documents_are_not():
    assert evaluation_size(TrainOptions()) == EVAL_BLOCKS  # train's default run: as before
    assert evaluation_size(TrainOptions(max_steps=20)) == 32  # a 20-step fine-tune
    assert evaluation_size(TrainOptions(max_steps=4, batch_size=2)) == 8  # the floor
    assert evaluation_size(TrainOptions(max_steps=4, eval_blocks=100)) == 100  # given: kept
    assert TrainOptions(max_steps=4).held_out_blocks() == TrainOptions().held_out_blocks() == EVAL_BLOCKS


def test_a_short_run_shows_its_evaluation_and_leaves_it_out_of_tokens_per_second(short_run):
    out, output = short_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["evaluated_blocks"] == {"validation": 8, "test": 8}, metrics["data_facts"]
    assert metrics["options"]["eval_blocks"] is None  # the default: the documents held out are 64 blocks' worth
    assert 0 < metrics["evaluation_seconds"] < metrics["train_seconds"] + metrics["evaluation_seconds"]
    assert "evaluating" in output  # the evaluation's own progress bar
    assert "left out" in output and "tokens/s" in output
    assert metrics["tokens_per_second"] == pytest.approx(metrics["tokens"] / metrics["training_seconds"])
    assert metrics["training_seconds"] < metrics["train_seconds"]  # the evaluations inside train() are left out


# ---- per-layer settings at a preset's depth ----


def test_a_per_layer_alpha_takes_the_presets_depth(tmp_path, data_file):
    # the tiny preset has 4 layers (GPT-2's class default is 12): four values are one per layer
    result = train_in(tmp_path, data_file, "--arch", "gpt2", "--preset", "tiny", "--alpha", "0.1,0.2,0.3,0.4")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert (config["n_layer"], config["geo_alpha"]) == (4, [0.1, 0.2, 0.3, 0.4])
    line = fails("train", "--data", data_file, "--arch", "gpt2", "--preset", "tiny", "--alpha", ",".join(["0.1"] * 12),
                 "--output", tmp_path / "twelve")  # fmt: skip
    assert "one value per layer (4)" in line and "got 12" in line
