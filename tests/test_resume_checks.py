"""``--resume`` refuses a run that changed what it trains (issue 30): every checkpoint carries its tokenizer and the
record of its run; other data, another tokenizer or other shaping options are refused in one line naming each change,
the harmless options may change (and then apply); a checkpoint file that pickles more than tensors is refused without
torch's advice to load it anyway."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
from test_train_faults2 import error_lines, train
from test_training_recipe import written_factor

from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.tokenizer import train_tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL = ["--seq-len", "32", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3", "--eval-blocks", "8"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_args(data: Path, out: Path, *more: object) -> list[object]:
    return ["--data", data, "--vocab-size", 300, *SMALL, "--max-steps", 4, "--eval-every", 2, "--output", out, *more]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_file) -> Path:
    """A finished four-step run with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = train(*run_args(data_file, out))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def stopped(tmp_path, uninterrupted) -> Path:
    """A copy of that run as if stopped after step 2."""
    out = shutil.copytree(uninterrupted, tmp_path / "run")
    for name in ("checkpoint-4", "final"):
        shutil.rmtree(out / name)
    for name in ("metrics.json", "loss_curve.png"):
        (out / name).unlink()
    return out


def test_checkpoints_carry_their_tokenizer_and_the_record_of_their_run(uninterrupted, data_file):
    from transformers import AutoTokenizer

    record = json.loads((uninterrupted / "checkpoint-2" / "hf_geonorm_run.json").read_text())
    assert record["options"]["lr"] == 1e-3 and record["options"]["seq_len"] == 32 and record["max_steps"] == 4
    assert record["data"]["label"] == str(data_file) and record["processes"] == 1
    final, saved = AutoTokenizer.from_pretrained(uninterrupted / "final"), uninterrupted / "checkpoint-2"
    assert AutoTokenizer.from_pretrained(saved).get_vocab() == final.get_vocab()


def test_resume_refuses_changed_data_naming_it(tmp_path, stopped, data_file):
    other = tmp_path / "other.txt"
    other.write_text((STDLIB / "shlex.py").read_text())
    before = snapshot(stopped)
    result = train(*run_args(other, stopped), "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert "was trained otherwise" in line and f"the data ({data_file} then, {other} now)" in line, line
    assert "Traceback" not in result.output and snapshot(stopped) == before


def test_resume_refuses_another_tokenizer_of_the_same_size(tmp_path, stopped, data_file):
    tokenizer = train_tokenizer([(STDLIB / "shlex.py").read_text()], 300)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    before = snapshot(stopped)
    args = [a for a in run_args(data_file, stopped) if a not in ("--vocab-size", 300)]
    result = train(*args, "--tokenizer", tmp_path / "tokenizer", "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    assert "the tokenizer (another" in error_lines(result.output)[0] and snapshot(stopped) == before


def test_resume_refuses_another_learning_rate_or_a_longer_decay_naming_each(stopped, data_file):
    before = snapshot(stopped)
    result = train(*run_args(data_file, stopped), "--resume", "--lr", "0.5", "--max-steps", "6")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert "--lr 0.001 then, 0.5 now" in line and "--max-steps 4 then, 6 now" in line, line
    assert snapshot(stopped) == before  # no metrics.json claiming the rate that was asked for


def test_resume_with_other_logging_steps_continues_the_run_and_says_so(stopped, uninterrupted, data_file):
    result = train(*run_args(data_file, stopped), "--resume", "--logging-steps", "1")
    assert result.exit_code == 0, result.output
    assert "continuing checkpoint-2 with --logging-steps 10 then, 1 now" in result.output
    metrics = json.loads((stopped / "metrics.json").read_text())
    expected = json.loads((uninterrupted / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 2 and metrics["options"]["logging_steps"] == 1
    assert metrics["final_eval_loss"] == pytest.approx(expected["final_eval_loss"], rel=1e-5)
    assert [h["step"] for h in metrics["log_history"] if "loss" in h][-2:] == [3, 4]  # logged every step now


@pytest.mark.parametrize("warmup, floor", [(0, 0.1), (3, 0.1), (0, 1.0)])
def test_a_longer_run_is_allowed_exactly_where_the_steps_done_keep_their_learning_rates(tmp_path, warmup, floor):
    from hf_geonorm.training.run_record import check_same_run, run_record, write_record

    step, old, new = 2, 4, 8
    base = TrainOptions(max_steps=old, warmup_steps=warmup, min_lr_ratio=floor, lr=1e-3)
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    write_record(checkpoint, run_record(base, ("data", "key"), "tokenizer", {}, 1))
    longer = run_record(dataclasses.replace(base, max_steps=new), ("data", "key"), "tokenizer", {}, 1)
    kept = all(math.isclose(written_factor(s, warmup, old, floor), written_factor(s, warmup, new, floor))
               for s in range(step))  # fmt: skip
    lines: list[str] = []
    if kept:
        check_same_run(checkpoint, longer, step, lines.append)
        assert "--max-steps 4 then, 8 now" in lines[0]
    else:
        with pytest.raises(ValueError, match="--max-steps 4 then, 8 now"):
            check_same_run(checkpoint, longer, step, lines.append)
    assert kept == (warmup >= step or floor == 1.0)  # the rule the docs state


class NotATensor:
    pass


def test_a_pickled_object_in_the_optimizer_state_is_refused_without_advice_to_load_it(stopped, data_file):
    torch.save({"state": {}, "param_groups": [], "payload": NotATensor()}, stopped / "checkpoint-2" / "optimizer.pt")
    result = train(*run_args(data_file, stopped), "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert "more than tensors" in line and "never loads" in line and "checkpoint-2" in line, line
    assert "weights_only" not in result.output and "Traceback" not in result.output


