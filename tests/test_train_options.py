"""`train`'s and `sweep`'s options come from one declaration (hf_geonorm.training.options): the help of every
option is its field's, the defaults are the dataclass's, the commands repeat none of them; and the default learning
rates are read from the one place they live."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hf_geonorm_cli import options as cli_options
from hf_geonorm_cli.main import cli

from hf_geonorm.training import options as declared
from hf_geonorm.training import trainer as trainer_module
from hf_geonorm.training.model import with_learning_rate
from hf_geonorm.training.options import FINE_TUNING_LR, PRETRAINING_LR, SweepOptions, TrainOptions

CLI = Path(cli_options.__file__).parent


def expected_help(spec: dataclasses.Field) -> dict[str, str]:
    """The options a field should make, each with its help, written out from the field's metadata."""
    form = spec.metadata["option"]
    if "flag_values" in form:
        return {flag: f"{form['help']} ({flag}: {value})" for flag, value in form["flag_values"].items()}
    name = form.get("name", "--" + spec.name.replace("_", "-"))
    if form.get("flag"):
        return {name: form["help"]}
    default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
    shown = form.get("default_text", ",".join(map(str, default)) if isinstance(default, tuple) else default)
    return {name: form["help"] if shown is None else f"{form['help']} [default: {shown}]"}


@pytest.mark.parametrize(
    ("command", "declarations"), [("train", [TrainOptions]), ("sweep", [SweepOptions, TrainOptions])]
)
def test_every_option_help_is_its_declared_field(command, declarations):
    params = {opt: param for param in cli.commands[command].params for opt in param.opts}
    settings = {"--" + name.replace("_", "-") for name in cli_options.SETTING_OPTIONS}
    expected: dict[str, str] = {}
    for declaration in reversed(declarations):  # sweep's --output is its own, not train's
        for spec in dataclasses.fields(declaration):
            if "option" in spec.metadata and not (command == "sweep" and spec.metadata["option"].get("sweep") is False):
                expected.update(expected_help(spec))
    for name, text in expected.items():
        assert name in params, f"{command} has no {name}"
        assert params[name].help == text, name
    covered = set(expected) | settings | {"--help"} | {o for p in params.values() for o in p.secondary_opts}
    assert set(params) <= covered, sorted(set(params) - covered)  # no option the declarations do not hold


def test_the_commands_repeat_no_option_and_no_default():
    for name in ("train.py", "sweep.py"):
        tree = ast.parse((CLI / name).read_text())
        calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
        options = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "option"]
        assert not options, f"cli/{name} declares options of its own"
        keywords = {k.arg for c in calls for k in c.keywords}
        fields = {spec.name for spec in dataclasses.fields(TrainOptions)} - {"settings"}
        assert not keywords & fields, f"cli/{name} passes {sorted(keywords & fields)} by name"


def test_train_with_no_options_gets_the_declarations_defaults(monkeypatch):
    seen = []
    monkeypatch.setattr(trainer_module, "run_training", lambda options, log: seen.append(options))
    assert CliRunner().invoke(cli, ["train"]).exit_code == 0
    assert seen == [TrainOptions()]
    assert CliRunner().invoke(cli, ["train", "--bf16", "--streaming", "--lr", "3e-3"]).exit_code == 0
    assert seen[1] == TrainOptions(precision="bf16", streaming=True, lr=3e-3)


def test_the_default_rates_are_the_best_of_the_committed_sweep_of_trains_default_model():
    """The defaults follow the evidence: each style's best rate in the study's journal, chosen on validation."""
    from hf_geonorm.training.sweep import read_journal
    from hf_geonorm.training.sweep_report import best_rates

    journal = Path(__file__).parent.parent / "benchmarks" / "results" / "sweeps" / "a_gpt2" / "runs.jsonl"
    header, runs = read_journal(journal)
    shape = header["train_options"]
    assert (shape["arch"], shape["preset"], shape["model"], shape["settings"]) == ("gpt2", "tiny", None, {})
    assert (shape["seq_len"], shape["batch_size"]) == (TrainOptions().seq_len, TrainOptions().batch_size)
    by_validation = {}
    for style in PRETRAINING_LR:  # written out: the lowest seed-0 validation loss of each style
        seed0 = [r for r in runs if r["style"] == style and r["seed"] == 0]
        by_validation[style] = min(seed0, key=lambda r: r["val_loss"])["lr"]
    assert PRETRAINING_LR == by_validation == best_rates(runs)


def test_the_default_learning_rate_follows_the_norm_style_and_fine_tuning(tmp_path):
    class Config:
        norm_style = "geo"

    options, why = with_learning_rate(TrainOptions(), Config())
    assert options.lr == PRETRAINING_LR["geo"] and "from scratch, norm_style geo" in why
    Config.norm_style = "pre"
    assert with_learning_rate(TrainOptions(), Config())[0].lr == PRETRAINING_LR["pre"]
    Config.norm_style = "sandwich"  # not measured: Pre-Norm's rate, and the line says so
    options, why = with_learning_rate(TrainOptions(), Config())
    assert options.lr == PRETRAINING_LR["pre"] and "not measured" in why
    assert with_learning_rate(TrainOptions(lr=5e-3), Config()) == (TrainOptions(lr=5e-3), None)
    # a folder with trained weights is fine-tuned: one real run from `train`'s own final model
    first, second = tmp_path / "first", tmp_path / "second"
    small = ["--max-steps", "1", "--eval-every", "1", "--seq-len", "32", "--batch-size", "2", "--warmup-steps", "0",
             "--max-tokens", "20000", "--eval-blocks", "8"]  # fmt: skip
    result = CliRunner().invoke(cli, ["train", *small, "--vocab-size", "300", "--norm-style", "pre",
                                      "--output", str(first)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"learning rate {PRETRAINING_LR['pre']:g}, the default for training from scratch" in result.output
    assert json.loads((first / "metrics.json").read_text())["options"]["lr"] == PRETRAINING_LR["pre"]
    result = CliRunner().invoke(cli, ["train", *small, "--model", str(first / "final"), "--norm-style", "geo",
                                      "--bridge", "0", "--output", str(second)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"learning rate {FINE_TUNING_LR:g}, the default for {first / 'final'} holds trained weights" in result.output
    assert "it computes exact Pre-Norm" in result.output and "--bridge-anneal" in result.output
    metrics = json.loads((second / "metrics.json").read_text())
    assert metrics["options"]["lr"] == FINE_TUNING_LR
    assert metrics["log_history"][0]["step"] == 0 and "eval_loss" in metrics["log_history"][0]  # where it started
    card = json.loads((second / "final" / "geonorm_card.json").read_text())["training"]
    assert card["peak learning rate"].startswith(f"{FINE_TUNING_LR:g} ") and card["steps"] == "1"
    assert card["final validation loss"].startswith(f"{metrics['final_eval_loss']:.4f}")
    assert "## Training" in (second / "final" / "README.md").read_text()


def test_the_declaration_module_imports_only_the_standard_library():
    tree = ast.parse(Path(declared.__file__).read_text())
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    modules = [(node.module or "") if isinstance(node, ast.ImportFrom) else node.names[0].name for node in top]
    assert all(not name.startswith((".", "hf_geonorm", "torch", "transformers")) for name in modules), modules
    assert all(node.level == 0 for node in top if isinstance(node, ast.ImportFrom)), "relative import at the top"
