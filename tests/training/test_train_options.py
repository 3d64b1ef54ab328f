"""`train`'s and `sweep`'s options come from one declaration (hf_geonorm.training.options): the help of every
option is its field's, the defaults are the dataclass's, the commands repeat none of them; and the default learning
rates are read from the one place they live."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path
from typing import get_type_hints

import pytest
from click.testing import CliRunner

from hf_geonorm._plumbing.declarations import LIMITS, members, option_name, range_text
from hf_geonorm.sweep import options as sweep_declared
from hf_geonorm.sweep.engine_options import EngineOptions
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.training import options as declared
from hf_geonorm.training import rate_rule
from hf_geonorm.training.options import FINE_TUNING_LR, TrainOptions
from hf_geonorm.training.run import trainer as trainer_module
from hf_geonorm.training.run.model import with_learning_rate
from hf_geonorm_cli import options as cli_options
from hf_geonorm_cli.main import cli

ROOT = Path(__file__).resolve().parents[2]

CLI = Path(cli_options.__file__).parent


def expected_help(spec: dataclasses.Field, hint: object) -> dict[str, str]:
    """The options a field should make, each with its help, written out from the field's declaration: the help, the
    range and the default (on for a switch that is on; none for one that is off)."""
    declared = spec.metadata
    if "flags" in declared:
        return {flag: f"{declared['help']} ({flag}: {value})" for flag, value in declared["flags"].items()}
    default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
    if bool in members(hint):
        return {option_name(spec): declared["help"] + (" [default: on]" if default else "")}
    shown = declared.get("default_text", ",".join(map(str, default)) if isinstance(default, tuple) else default)
    text = declared["help"] + (f" [{range_text(declared)}]" if any(key in declared for key in LIMITS) else "")
    return {option_name(spec): text if shown is None else f"{text} [default: {shown}]"}


@pytest.mark.parametrize(
    ("command", "declarations"), [("train", [TrainOptions]), ("sweep", [SweepOptions, EngineOptions, TrainOptions])]
)
def test_every_option_help_is_its_declared_field(command, declarations):
    params = {opt: param for param in cli.commands[command].params for opt in param.opts}
    settings = set(cli_options.SETTING_OPTIONS.values())
    expected: dict[str, str] = {}
    for declaration in declarations:
        hints = get_type_hints(declaration)
        for spec in dataclasses.fields(declaration):
            taken = not (command == "sweep" and declaration is TrainOptions and spec.name in sweep_declared.NOT_SWEPT)
            if "help" in spec.metadata and taken:
                expected.update(expected_help(spec, hints[spec.name]))
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


def test_bridge_takes_one_value_per_layer_as_the_config_does(monkeypatch):
    """``--bridge``, declared ``float | list[float]`` as ``--alpha`` is, takes a comma list, each value in [0, 1];
    the run's log then names the range the model computes at."""
    from hf_geonorm.training.run.model import what_it_computes

    seen = []
    monkeypatch.setattr(trainer_module, "run_training", lambda options, log: seen.append(options))
    assert CliRunner().invoke(cli, ["train", "--bridge", "0,0.5,1,1"]).exit_code == 0
    assert seen == [TrainOptions(settings={"geo_bridge": [0.0, 0.5, 1.0, 1.0]})]
    refused = CliRunner().invoke(cli, ["train", "--bridge", "0,2"])
    assert refused.exit_code == 2 and "--bridge must be a number in [0, 1]; got 2.0" in refused.output

    class Config:
        norm_style, geo_bridge = "geo", [0.0, 0.5, 1.0, 1.0]

    assert "geo_bridge 0 to 1" in what_it_computes(Config(), TrainOptions())
    Config.geo_bridge = [0.0] * 4
    assert "exact Pre-Norm" in what_it_computes(Config(), TrainOptions())


def test_each_trainer_counterpart_carries_its_option_to_the_trainingarguments_field_of_that_meaning():
    """Every option that has a ``TrainingArguments`` counterpart, at a value other than its default, arrives at the
    field that means the same (written out here from Trainer's documentation), and only real fields are set."""
    from transformers import TrainingArguments

    options = TrainOptions(
        max_steps=7, batch_size=3, gradient_accumulation_steps=2, lr=2e-3, warmup_steps=1, weight_decay=0.05,
        adam_beta2=0.9, precision="bf16", compile=True, gradient_checkpointing=True, eval_every=4, logging_steps=2,
        report_to="none", seed=5, fsdp=True, streaming=True,
    )  # fmt: skip
    arguments = declared.trainer_arguments(options)
    assert arguments == {
        "max_steps": 7, "per_device_train_batch_size": 3, "per_device_eval_batch_size": 3,
        "gradient_accumulation_steps": 2, "learning_rate": 2e-3, "warmup_steps": 1, "weight_decay": 0.05,
        "adam_beta2": 0.9, "bf16": True, "fp16": False, "torch_compile": True, "activation_checkpointing": True,
        "eval_steps": 4, "logging_steps": 2, "save_steps": 4, "report_to": [], "seed": 5, "data_seed": 5,
        "fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": True},
        "accelerator_config": {"dispatch_batches": False},
    }  # fmt: skip
    assert set(arguments) <= {spec.name for spec in dataclasses.fields(TrainingArguments)}
    assert declared.trainer_arguments(dataclasses.replace(options, save_every=6, fsdp=False))["save_steps"] == 6


def rate_rule_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rate_rule", ROOT / "benchmarks" / "rate_rule.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_the_rule_fits_an_exponent_only_where_cells_measure_it_apart():
    """Rates made by lr = 0.5 * width^-1 * depth^0.5 (written out here) are fit back exactly from three cells that
    vary width at one depth and depth at one width; two cells that change both at once measure neither exponent."""
    fit = rate_rule_script().fit
    cells = [{"width": w, "layers": d, "lr": 0.5 * w**-1 * d**0.5} for w, d in ((64, 4), (128, 4), (128, 2))]
    rule = fit(cells)
    assert (rule["a"], rule["b"], rule["c"]) == pytest.approx((-1.0, 0.5, 0.5)) and rule["borrowed"] == []
    confounded = fit([{"width": 64, "layers": 4, "lr": 2e-3}, {"width": 128, "layers": 2, "lr": 2e-3}], {"a": -0.5})
    assert (confounded["a"], confounded["b"], confounded["borrowed"]) == (-0.5, 0.0, ["a", "b"])
    assert confounded["c"] == pytest.approx(math.exp((math.log(2e-3 * 64**0.5) + math.log(2e-3 * 128**0.5)) / 2))


def test_the_library_rule_is_the_one_the_committed_journals_give():
    """hf_geonorm/training/rate_rule.json is what benchmarks/rate_rule.py writes from the committed journals today
    (tests/training/test_default_rates.py checks train's rate at every measured cell against the journals
    themselves)."""
    bench = rate_rule_script()
    sweeps = ROOT / "benchmarks" / "results" / "sweeps"
    cells, edges = bench.measured_cells(sweeps)
    record = {**bench.report(cells, edges), "tuned_warmup_cells": bench.tuned_warmup_cells(sweeps)}
    assert json.loads(rate_rule.RATE_RULE.read_text()) == json.loads(json.dumps(bench.library_rule(record)))


def test_fine_tuning_defaults_reach_the_peak_and_the_card_says_what_was_reached(tmp_path):
    class Config:
        norm_style, model_type, hidden_size, num_hidden_layers = "sandwich", "gpt2", 128, 4

    options, lines = with_learning_rate(TrainOptions(), Config())
    assert "measured cell: sandwich's best rate at gpt2 4 x 128" in lines[0]
    assert with_learning_rate(TrainOptions(lr=5e-3, weight_decay=0.1, warmup_steps=3), Config()) == (
        TrainOptions(lr=5e-3, weight_decay=0.1, warmup_steps=3),
        [],
    )
    # a folder with trained weights is fine-tuned: one real run from `train`'s own final model
    first, second = tmp_path / "first", tmp_path / "second"
    small = ["--eval-every", "4", "--seq-len", "32", "--batch-size", "2", "--max-tokens", "20000", "--eval-blocks", "8"]
    result = CliRunner().invoke(cli, ["train", *small, "--max-steps", "1", "--warmup-steps", "0", "--vocab-size", "300",
                                      "--norm-style", "pre", "--output", str(first)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "the default for training from scratch, measured cell: pre's best rate at gpt2 4 x 128" in result.output
    # fewer steps (4) than train's pretraining warm-up (30): the warm-up is a tenth of them, and the peak is reached
    result = CliRunner().invoke(cli, ["train", *small, "--max-steps", "4", "--logging-steps", "1",
                                      "--model", str(first / "final"),
                                      "--norm-style", "geo", "--bridge", "0", "--output", str(second)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"learning rate {FINE_TUNING_LR:g}, the default for {first / 'final'} holds trained weights" in result.output
    assert "it computes exact Pre-Norm" in result.output and "--bridge-anneal" in result.output
    metrics = json.loads((second / "metrics.json").read_text())
    assert (metrics["options"]["lr"], metrics["options"]["weight_decay"]) == (FINE_TUNING_LR, 0.0)
    assert metrics["options"]["warmup_steps"] == 0  # 4 // 10: the first step is at the peak
    rates = [entry["learning_rate"] for entry in metrics["log_history"] if "learning_rate" in entry]
    assert rates and max(rates) == pytest.approx(FINE_TUNING_LR)
    assert metrics["log_history"][0]["step"] == 0 and "eval_loss" in metrics["log_history"][0]  # where it started
    card = json.loads((second / "final" / "geonorm_card.json").read_text())["training"]
    assert card["peak learning rate"].startswith(f"{FINE_TUNING_LR:g} reached of {FINE_TUNING_LR:g}")
    assert card["learning rate source"] == "fine-tuning: the default for a --model with trained weights (no --lr given)"
    assert metrics["learning_rate"]["source"] == "fine-tuning"
    assert card["weight decay"] == "0" and card["steps"] == "4"
    assert card["final validation loss"].startswith(f"{metrics['final_eval_loss']:.4f}")
    assert "## Training" in (second / "final" / "README.md").read_text()


def test_a_card_states_the_rate_a_short_run_reached_not_the_one_it_asked():
    from hf_geonorm.training.run.model import rate_choice
    from hf_geonorm.training.run.optim import peak_reached
    from hf_geonorm.training.run.outputs import training_facts

    options = TrainOptions(lr=1e-3, warmup_steps=30, max_steps=300, weight_decay=0.0)
    peak = peak_reached(options.lr, 20, options.warmup_steps, options.max_steps, options.min_lr_ratio)
    rate = rate_choice(options.lr, None, None)  # --lr given: the model does not matter
    facts = training_facts(options, "d", 20, peak, 1.0, 1.0, rate)  # stopped at step 20 of a 30-step warm-up: 20/30
    assert facts["peak learning rate"].startswith(f"{1e-3 * 20 / 30:.3g} reached of 0.001")
    assert facts["learning rate source"] == "given by --lr"


@pytest.mark.parametrize("option", ["--data", "--model", "--tokenizer", "--data-cache", "--output"])
def test_an_empty_path_option_is_refused_as_an_empty_output_is(option, tmp_path, monkeypatch):
    """An empty value (an unset shell variable) would name the working folder: `train --data ""` trained on it.
    Each path option refuses it in one line before anything is read or written, for train and for sweep."""
    from support.helpers import contents, fails

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("the user's own file\n" * 50)
    before = contents(tmp_path)
    others = [] if option == "--output" else ["--output", "run"]
    for command in ("train", "sweep"):
        message = fails(command, option, "", *others, "--max-steps", "1", code=2)
        said = (f"Error: {option} is empty (an unset shell variable?); give ",
                f"Error: Invalid value for '{option}': Directory '' does not exist")  # sweep's --model: click's check
        assert message.startswith(said), message
        assert "  " not in message, message
    assert contents(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
