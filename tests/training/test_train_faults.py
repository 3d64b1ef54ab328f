"""`hf-geonorm train` when things go wrong, and what ``--output`` holds then (docs/training.md, "What `--output`
holds"): runs killed (SIGKILL) or terminated (SIGTERM) while a checkpoint or the final model is being written;
``--resume`` from damaged checkpoints (also those whose training state does not fit their step or their run's
record), from a finished run, and of a run that changed what it trains; the model folders, data and
outputs it must refuse; non-finite losses, the bridge anneal and a full disk.

The kills are real: ``helpers.stopped_run`` runs the CLI in a child process that announces its n-th weights file
and waits; the test then sends the signal.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import shutil
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from hf_geonorm._plumbing.ownership import mark_folder
from hf_geonorm.training.data.tokenizer import train_tokenizer
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.run import trainer
from hf_geonorm.training.run.bridge import anneal_weights, last_first_bridges
from hf_geonorm.training.run.trainer import run_training

from support.helpers import STDLIB, contents, error_lines, invoke, stopped_run, train, train_in, written_factor
from support.tiny_models import tiny_model

SMALL = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3"]


MARKER = ".hf-geonorm-output.json"  # what every output of hf-geonorm carries (docs/cli.md)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---- 1. runs killed or terminated while writing ----


def test_sigkill_during_the_final_save_leaves_no_partial_final_and_resume_completes_it(tmp_path, data_file):
    out = tmp_path / "run"
    args = ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "1", "--keep-checkpoints", "--output",
            str(out)]  # fmt: skip
    status, output = stopped_run(args, stop_at_save=3, sig=signal.SIGKILL, cwd=tmp_path)  # 1, 2: checkpoints
    assert status == -signal.SIGKILL, output
    assert not (out / "final").exists()  # not a config without weights
    assert [n for n in names(out) if not n.startswith(".")] == ["checkpoint-1", "checkpoint-2"]
    assert any(n.startswith(".final.partial-") for n in names(out))  # what SIGKILL leaves: hidden, removed below
    resumed = train(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "removed .final.partial-" in resumed.output
    assert names(out) == [MARKER, "checkpoint-1", "checkpoint-2", "final", "loss_curve.png", "metrics.json"]
    assert json.loads((out / "metrics.json").read_text())["resumed_from_step"] == 2
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    checkpoint = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2")
    for name, tensor in final.state_dict().items():
        assert torch.equal(tensor, checkpoint.state_dict()[name]), name


def test_sigkill_during_a_checkpoint_leaves_the_previous_one_to_resume_from(tmp_path, data_file):
    out = tmp_path / "run"
    args = ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "1", "--keep-checkpoints", "--output",
            str(out)]  # fmt: skip
    status, output = stopped_run(args, stop_at_save=2, sig=signal.SIGKILL, cwd=tmp_path)
    assert status == -signal.SIGKILL, output
    assert [n for n in names(out) if not n.startswith(".")] == ["checkpoint-1"]  # no checkpoint-2 without weights
    resumed = train(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 1 and metrics["steps"] == 2
    assert names(out) == [MARKER, "checkpoint-1", "checkpoint-2", "final", "loss_curve.png", "metrics.json"]


def test_sigterm_during_the_first_checkpoint_leaves_nothing_behind(tmp_path, data_file):
    out = tmp_path / "new" / "run"
    args = ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "1", "--output", str(out)]
    status, output = stopped_run(args, stop_at_save=1, sig=signal.SIGTERM, cwd=tmp_path)
    assert status == 128 + signal.SIGTERM and "terminated (SIGTERM)" in output, output
    assert "Traceback" not in output
    assert not (tmp_path / "new").exists()  # the run made both folders; nothing of it is left


def test_sigterm_removes_only_what_the_run_created(tmp_path, data_file):
    out = tmp_path / "new" / "run"
    args = ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "1", "--output", str(out)]

    def another_writer() -> None:  # e.g. a second run into the same new folder, or the user
        (out / "theirs.txt").write_text("not the run's")

    status, output = stopped_run(args, stop_at_save=1, sig=signal.SIGTERM, cwd=tmp_path, before_signal=another_writer)
    assert status == 128 + signal.SIGTERM and "Traceback" not in output, output
    assert names(out) == ["theirs.txt"]  # the run's staging folder is gone; the other file and its folders stay
    assert (out / "theirs.txt").read_text() == "not the run's"


def test_sigkill_during_a_force_run_leaves_no_results_of_the_earlier_run(tmp_path, data_file):
    out = tmp_path / "run"
    for folder in ("checkpoint-9", "final"):
        (out / folder).mkdir(parents=True)
        (out / folder / "config.json").write_text("{}")
    for name in ("metrics.json", "loss_curve.png"):
        (out / name).write_text("earlier")
    mark_folder(out, "train")  # an earlier output of hf-geonorm, which --force starts anew over
    args = ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "1", "--output", str(out), "--force"]
    status, output = stopped_run(args, stop_at_save=1, sig=signal.SIGKILL, cwd=tmp_path)
    assert status == -signal.SIGKILL, output
    # nothing of the earlier run presents itself as the result of this one
    assert [n for n in names(out) if not n.startswith(".")] == []


# ---- 2. --resume: damaged checkpoints, a finished run, a run that changed what it trains ----


def run_args(data: Path, out: Path, *more: object) -> list[object]:
    """A four-step run that keeps its checkpoints when it finishes (the tests below stop it, or damage them)."""
    return ["--data", data, *SMALL, "--eval-blocks", 8, "--max-steps", 4, "--eval-every", 2, "--keep-checkpoints",
            "--output", out, *more]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_file) -> Path:
    """A finished four-step run with checkpoints at steps 2 and 4; tests work on copies."""
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


def test_resume_skips_a_damaged_checkpoint_and_names_what_does_not_fit(tmp_path, data_file):
    out = tmp_path / "run"
    # within the warm-up the schedule does not depend on --max-steps: a longer run may resume the checkpoints
    common = ["--data", str(data_file), *SMALL, "--warmup-steps", "3", "--eval-every", "1", "--keep-checkpoints",
              "--output", str(out)]  # fmt: skip
    assert train(*common, "--max-steps", "2").exit_code == 0
    # another setting than the checkpoint's: named, before anything is written
    other = train(*common, "--max-steps", "3", "--resume", "--norm-style", "pre")
    assert other.exit_code != 0 and "--norm-style 'geo'" in other.output, other.output
    assert "checkpoint-2/config.json" in other.output and "Traceback" not in other.output
    # the newest checkpoint damaged: skipped with a warning that names the file
    (out / "checkpoint-2" / "trainer_state.json").write_text("garbage")
    resumed = train(*common, "--max-steps", "3", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "checkpoint-2/trainer_state.json is not valid JSON" in resumed.output
    assert "resuming from checkpoint-1" in resumed.output
    assert json.loads((out / "metrics.json").read_text())["resumed_from_step"] == 1
    assert [n for n in names(out) if n.startswith("checkpoint-")] == ["checkpoint-2", "checkpoint-3"]
    # every checkpoint damaged: an error that names each file
    for step in (2, 3):
        weights = out / f"checkpoint-{step}" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    failed = train(*common, "--max-steps", "4", "--resume")
    assert failed.exit_code != 0 and "no whole checkpoint" in failed.output, failed.output
    assert "checkpoint-3/model.safetensors" in failed.output and "checkpoint-2/model.safetensors" in failed.output


def test_resuming_a_finished_run_does_nothing_and_keeps_its_metrics(tmp_path, uninterrupted, data_file):
    out = shutil.copytree(uninterrupted, tmp_path / "run")
    before = contents(out)
    result = train(*run_args(data_file, out), "--resume")
    assert result.exit_code == 0, result.output
    assert "already finished at step 4; nothing to do" in result.output
    assert contents(out) == before  # metrics.json (its tokens/s), final/ and the plot as they were


def test_resume_refuses_a_checkpoint_missing_a_tensor_or_holding_an_unexpected_one(tmp_path, uninterrupted, data_file):
    out = shutil.copytree(uninterrupted, tmp_path / "run")
    # as if killed while writing final/ with checkpoint-4 the only one: --resume writes final/ from it
    for name in ("final", "checkpoint-2"):
        shutil.rmtree(out / name)
    (out / "metrics.json").unlink()
    weights = out / "checkpoint-4" / "model.safetensors"
    tensors = load_file(weights)
    missing = {k: v for k, v in tensors.items() if k != "transformer.h.0.attn.c_attn.weight"}
    save_file(missing, weights, metadata={"format": "pt"})
    before = contents(out)
    resumed = train(*run_args(data_file, out), "--resume")
    assert resumed.exit_code != 0, resumed.output
    assert f"{out / 'checkpoint-4'}" in resumed.output and "transformer.h.0.attn.c_attn.weight" in resumed.output
    assert "missing" in resumed.output and "Traceback" not in resumed.output
    assert contents(out) == before
    save_file({**tensors, "transformer.h.0.extra": torch.zeros(2)}, weights, metadata={"format": "pt"})
    extra = train(*run_args(data_file, out), "--resume")
    assert extra.exit_code != 0 and "unexpected" in extra.output and "transformer.h.0.extra" in extra.output


def test_resume_loads_every_tensor_of_a_checkpoint_saved_under_other_names(tmp_path, data_file):
    """transformers saves MoE experts one by one (not as the fused tensors the model holds): the resumed weights
    must still be the checkpoint's, not those of --model."""
    stock = tmp_path / "moe"
    tiny_model("deepseek_v3", vocab_size=320).save_pretrained(stock)
    out = tmp_path / "run"
    args = ["--model", stock, "--data", data_file, *SMALL, "--max-steps", "2", "--eval-every", "2",
            "--keep-checkpoints", "--output", out]  # fmt: skip
    assert train(*args).exit_code == 0
    shutil.rmtree(out / "final")  # as if killed while writing final/: --resume writes it from checkpoint-2
    (out / "metrics.json").unlink()
    resumed = train(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    final, saved = load_file(out / "final" / "model.safetensors"), load_file(out / "checkpoint-2" / "model.safetensors")
    assert any(".experts.0." in key for key in saved) and final.keys() == saved.keys()
    assert [key for key in saved if not torch.equal(final[key], saved[key])] == []


def test_resume_refuses_lora_adapters_missing_a_tensor(tmp_path, data_file):
    out = tmp_path / "run"
    args = ["--data", data_file, *SMALL, "--eval-every", "1", "--lora", "--keep-checkpoints", "--output", out]
    assert train(*args, "--max-steps", "1").exit_code == 0
    adapters = out / "checkpoint-1" / "adapter_model.safetensors"
    tensors = load_file(adapters)
    gone = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != gone}, adapters, metadata={"format": "pt"})
    resumed = train(*args, "--max-steps", "2", "--resume")
    assert resumed.exit_code != 0 and gone in resumed.output and "missing" in resumed.output, resumed.output
    assert not (out / "checkpoint-2").exists()


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
    before = contents(stopped)
    result = train(*run_args(other, stopped), "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert "was trained otherwise" in line and f"the data ({data_file} then, {other} now)" in line, line
    assert "Traceback" not in result.output and contents(stopped) == before


def test_resume_refuses_another_tokenizer_of_the_same_size(tmp_path, stopped, data_file):
    tokenizer = train_tokenizer([(STDLIB / "shlex.py").read_text()], 300)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    before = contents(stopped)
    args = [a for a in run_args(data_file, stopped) if a not in ("--vocab-size", "300")]
    result = train(*args, "--tokenizer", tmp_path / "tokenizer", "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    assert "the tokenizer (another" in error_lines(result.output)[0] and contents(stopped) == before


def test_resume_refuses_another_learning_rate_or_a_longer_decay_naming_each(stopped, data_file):
    before = contents(stopped)
    result = train(*run_args(data_file, stopped), "--resume", "--lr", "0.5", "--max-steps", "6")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert "--lr 0.001 then, 0.5 now" in line and "--max-steps 4 then, 6 now" in line, line
    assert contents(stopped) == before  # no metrics.json claiming the rate that was asked for


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
    from hf_geonorm.training.run.record import check_same_run, run_record, write_record

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


def edit_torch_file(path: Path, edit: object) -> None:
    """Rewrite the torch file ``path`` (tensors and plain containers) with ``edit`` applied to what it holds."""
    held = torch.load(path, weights_only=True)
    edit(held)
    torch.save(held, path)


def as_if_lr_1e2(scheduler: dict) -> None:
    """scheduler.pt as the same schedule over --lr 1e-2 writes it (the run's is over 1e-3)."""
    scheduler["base_lrs"] = [rate * 10 for rate in scheduler["base_lrs"]]
    scheduler["_last_lr"] = [rate * 10 for rate in scheduler["_last_lr"]]


def as_if_warmup_3(scheduler: dict) -> None:
    """scheduler.pt at step 2 of a --warmup-steps 3 schedule (the run's has none): (2 + 1) / 3 of the peak."""
    scheduler["_last_lr"] = [rate * (2 + 1) / 3 for rate in scheduler["base_lrs"]]


def optimizer_at_ten_times(optimizer: dict) -> None:
    for group in optimizer["param_groups"]:
        group["lr"] *= 10


@pytest.mark.parametrize("field, value", [("global_step", 3), ("max_steps", 6)])  # the folder says 2, the record 4
def test_resume_refuses_a_checkpoint_whose_trainer_state_disagrees_with_its_folder_or_record(
    stopped, data_file, field, value
):
    state_file = stopped / "checkpoint-2" / "trainer_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), field: value}))
    before = contents(stopped)
    result = train(*run_args(data_file, stopped), "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert "no whole checkpoint" in line and f"{state_file} says {field} {value}" in line, line
    assert "Traceback" not in result.output and contents(stopped) == before  # no metrics.json claiming 4 steps


@pytest.mark.parametrize(
    "file, edit, named",
    [
        ("scheduler.pt", as_if_lr_1e2, "the peak learning rate 0.01, its record's --lr 0.001"),
        ("scheduler.pt", lambda s: s.update(last_epoch=3), "at step 3 (last_epoch), not 2"),
        ("scheduler.pt", as_if_warmup_3, "the learning rate 0.001 after step 2, where its record's schedule"),
        ("optimizer.pt", optimizer_at_ten_times, f"the learning rate {10 * 1e-3 * written_factor(2, 0, 4, 0.1):g}"),
        ("rng_state.pth", None, "is missing"),
    ],
)
def test_resume_refuses_state_files_that_do_not_belong_to_the_checkpoint_or_its_run(
    stopped, data_file, file, edit, named
):
    path = stopped / "checkpoint-2" / file
    if edit is None:
        path.unlink()
    else:
        edit_torch_file(path, edit)
    before = contents(stopped)
    result = train(*run_args(data_file, stopped), "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert "no whole checkpoint" in line and f"{path} " in line and named in line, line
    assert "Traceback" not in result.output and contents(stopped) == before


@pytest.mark.parametrize("file", ["rng_state.pth", "scheduler.pt"])
def test_resume_falls_back_past_a_checkpoint_with_a_missing_or_foreign_state_file(
    tmp_path, uninterrupted, data_file, file
):
    out = shutil.copytree(uninterrupted, tmp_path / "run")  # as if killed while writing final/
    shutil.rmtree(out / "final")
    for name in ("metrics.json", "loss_curve.png"):
        (out / name).unlink()
    damaged = out / "checkpoint-4" / file
    if file == "rng_state.pth":
        damaged.unlink()
    else:
        edit_torch_file(damaged, as_if_lr_1e2)
    result = train(*run_args(data_file, out), "--resume", "--logging-steps", "1")
    assert result.exit_code == 0, result.output
    assert f"checkpoint-4 is damaged ({damaged} " in result.output and "resuming from checkpoint-2" in result.output
    metrics = json.loads((out / "metrics.json").read_text())
    expected = json.loads((uninterrupted / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 2 and metrics["steps"] == 4
    rates = {h["step"]: h["learning_rate"] for h in metrics["log_history"] if "learning_rate" in h}
    assert rates == pytest.approx({step: 1e-3 * written_factor(step - 1, 0, 4, 0.1) for step in (3, 4)})
    assert metrics["final_eval_loss"] == pytest.approx(expected["final_eval_loss"], rel=1e-5)


def test_resume_of_an_fp16_run_needs_its_loss_scale_where_the_trainer_keeps_one(tmp_path, data_file, monkeypatch):
    """On a GPU, fp16 keeps a loss scale, saved as scaler.pt (a CPU run keeps none): without it the scale would
    start anew, skipping steps until it is found again."""
    from hf_geonorm.training.run import checkpoint_state

    assert train_in(tmp_path, data_file, "--fp16", "--keep-checkpoints").exit_code == 0
    out = tmp_path / "run"
    shutil.rmtree(out / "final")  # as if killed while writing final/, with scaler.pt lost
    (out / "metrics.json").unlink()
    (out / "checkpoint-1" / "scaler.pt").unlink(missing_ok=True)
    monkeypatch.setattr(checkpoint_state, "keeps_loss_scale", lambda: True)
    result = train_in(tmp_path, data_file, "--fp16", "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert "no whole checkpoint" in line and f"{out / 'checkpoint-1' / 'scaler.pt'} is missing" in line, line


def test_resume_of_an_unrecorded_checkpoint_refuses_another_learning_rate_than_its_schedule(stopped, data_file):
    (stopped / "checkpoint-2" / "hf_geonorm_run.json").unlink()  # as an earlier hf-geonorm wrote it
    before = contents(stopped)
    args = [a if a != "1e-3" else "1e-2" for a in run_args(data_file, stopped)]
    result = train(*args, "--resume")
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert f"{stopped / 'checkpoint-2' / 'scheduler.pt'}" in line and "0.001" in line and "--lr 0.01" in line, line
    assert "Traceback" not in result.output and contents(stopped) == before


# ---- 3. what train refuses before it writes anything ----


@pytest.fixture(scope="module")
def stock_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stock") / "gpt2"
    tiny_model("gpt2", vocab_size=320).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def init_folder(tmp_path_factory) -> Path:
    """What `hf-geonorm init gpt2 --preset tiny` writes: a config folder without weights."""
    folder = tmp_path_factory.mktemp("init") / "cfg"
    result = invoke("init", "gpt2", folder, "--preset", "tiny", "--vocab-size", "320")
    assert result.exit_code == 0, result.output
    return folder


@pytest.mark.parametrize(
    "case, message",
    [
        ("pickle weights only", "pytorch_model.bin"),
        ("weights missing", "no weights (model.safetensors)"),
        ("a tensor missing", "transformer.h.0.attn.c_attn.weight"),
        ("empty folder", "has no config.json"),
    ],
)
def test_model_folders_whose_weights_would_be_dropped_are_refused(tmp_path, data_file, stock_folder, case, message):
    folder = shutil.copytree(stock_folder, tmp_path / "model")
    if case == "pickle weights only":
        torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    elif case == "weights missing":
        (folder / "model.safetensors").unlink()
    elif case == "a tensor missing":
        tensors = load_file(folder / "model.safetensors")
        del tensors["transformer.h.0.attn.c_attn.weight"]
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    else:
        for file in folder.iterdir():
            file.unlink()
    out = tmp_path / "run"
    result = train("--model", folder, "--data", data_file, *SMALL, "--max-steps", "1", "--output", out)
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and "model_type" not in result.output
    assert not out.exists()
    if case == "pickle weights only":
        assert "safetensors" in result.output


def test_a_config_folder_from_init_trains_from_scratch(tmp_path, data_file, init_folder):
    out = tmp_path / "run"
    result = train("--model", init_folder, "--data", data_file, *SMALL, "--max-steps", "1", "--output", out)
    assert result.exit_code == 0, result.output
    assert AutoModelForCausalLM.from_pretrained(out / "final").config.model_type == "geonorm_gpt2"


@pytest.mark.parametrize("name", ["weights.safetensors", "model-00001-of-00002.safetensors", "weights.bin"])
def test_a_config_folder_with_weights_under_another_name_is_refused(tmp_path, data_file, init_folder, name):
    folder = shutil.copytree(init_folder, tmp_path / "model")
    tiny_model("gpt2", vocab_size=320).save_pretrained(tmp_path / "saved")
    if name.endswith(".bin"):  # a pickle under a name transformers does not look for
        torch.save(load_file(tmp_path / "saved" / "model.safetensors"), folder / name)
    else:
        shutil.copy(tmp_path / "saved" / "model.safetensors", folder / name)
    out = tmp_path / "run"
    result = train("--model", folder, "--data", data_file, *SMALL, "--max-steps", "1", "--output", out)
    assert result.exit_code != 0, result.output
    assert name in result.output and "model.safetensors" in result.output and "index" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_invalid_settings_are_named_where_they_came_from(tmp_path, data_file, init_folder):
    folder = shutil.copytree(init_folder, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "geo_alpha": -1.0}))
    stored = train("--model", folder, "--data", data_file, *SMALL, "--max-steps", "1", "--output", tmp_path / "a")
    assert stored.exit_code != 0, stored.output
    assert f"{folder / 'config.json'}: geo_alpha must be" in stored.output and "--alpha" not in stored.output
    given = train("--data", data_file, *SMALL, "--max-steps", "1", "--alpha", "1e9", "--output", tmp_path / "b")
    assert given.exit_code == 2 and "--alpha must be at most" in given.output, given.output


def test_binary_data_is_refused_and_text_that_is_not_utf8_is_named(tmp_path):
    binary = tmp_path / "weights.txt"
    binary.write_bytes(bytes(range(256)) * 64)
    refused = train("--data", binary, *SMALL, "--max-steps", "1", "--output", tmp_path / "a")
    assert refused.exit_code != 0 and f"{binary} is a binary file" in refused.output, refused.output
    assert not (tmp_path / "a").exists()
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes((STDLIB / "textwrap.py").read_text().replace("e", "\u00e9").encode("latin-1"))
    read = train("--data", latin1, *SMALL, "--max-steps", "1", "--eval-every", "1", "--output", tmp_path / "b")
    assert read.exit_code == 0, read.output
    assert f"{latin1} is not valid UTF-8" in read.output


def test_an_output_that_is_a_dangling_symlink_is_named_and_left_alone(tmp_path, data_file):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone" / "run")
    result = train("--data", data_file, *SMALL, "--max-steps", "1", "--output", link)
    assert result.exit_code != 0, result.output
    error = error_lines(result.output)
    assert len(error) == 1 and "dangling symbolic link" in error[0] and str(tmp_path / "gone" / "run") in error[0]
    assert link.is_symlink() and not (tmp_path / "gone").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bridge-anneal", "5", "--max-steps", "4"], "--bridge-anneal 5 is longer than --max-steps 4"),
        (["--bridge-order", "last-first", "--max-steps", "4"], "--bridge-order last-first needs --bridge-anneal"),
    ],
)
def test_a_bridge_anneal_that_cannot_run_is_refused(tmp_path, data_file, args, message):
    result = train("--data", data_file, *SMALL, "--output", tmp_path / "o", *args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="longer than --max-steps"):
        TrainOptions(max_steps=4, bridge_anneal=5).validate()


# ---- 4. failures during the run ----


@pytest.mark.parametrize(
    "eval_every, what", [("1", "the validation loss at step 1"), ("5", "the training loss at step 2")]
)
def test_a_non_finite_loss_fails_the_run_naming_the_step(tmp_path, data_file, eval_every, what):
    # lr 1e30: the first update throws the weights to ~1e30, whose squares overflow float32 in the norms
    out = tmp_path / "run"
    args = ["--data", data_file, *SMALL, "--max-steps", "3", "--eval-every", eval_every, "--output", out]
    result = train(*args, "--lr", "1e30")
    assert result.exit_code != 0, result.output
    lines = error_lines(result.output)
    assert len(lines) == 1 and what in lines[0] and "nan" in lines[0].lower(), result.output
    assert "Traceback" not in result.output
    assert not out.exists()  # nothing published: the evaluation at step 1 comes before its checkpoint


def test_metrics_are_strict_json_with_null_for_non_finite_values():
    from hf_geonorm.training.run.outputs import strict_json

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    value = {"loss": [1.5, float("nan")], "grad_norm": float("inf"), "nested": {"x": -float("inf"), "n": 3}}
    parsed = json.loads(strict_json(value), parse_constant=refuse)
    assert parsed == {"loss": [1.5, None], "grad_norm": None, "nested": {"x": None, "n": 3}}


def test_huge_bridge_costs_give_the_shares_of_their_scaled_equivalent():
    huge = anneal_weights([1e308, 1e308, 1.0])
    scaled = [1.0, 1.0, 1e-308]  # the same proportions, divided by 1e308
    for progress in (0.0, 0.1, 0.25, 0.5, 0.6, 0.75, 0.99, 1.0):
        values = last_first_bridges(progress, huge)
        assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in values)
        assert values == pytest.approx(last_first_bridges(progress, scaled), abs=1e-12)
    # written out: the last update's share is ~0 (done at once), then the middle over 0-0.5, the first over 0.5-1
    assert last_first_bridges(0.25, huge) == pytest.approx([0.0, 0.5, 1.0])
    assert last_first_bridges(0.75, huge) == pytest.approx([0.5, 1.0, 1.0])
    # each update's share of the anneal: the progress over which it moves, finite and together 1
    grid = [i / 1000 for i in range(1001)]
    moving = [[0.0 < last_first_bridges(p, huge)[j] < 1.0 for p in grid] for j in range(3)]
    shares = [sum(m) / 1000 for m in moving]
    assert shares == pytest.approx([0.5, 0.5, 0.0], abs=0.002) and sum(shares) == pytest.approx(1.0, abs=0.003)


def test_the_bridge_anneal_runs_the_written_schedule_and_ends_at_one(tmp_path, data_file, monkeypatch):
    seen: list[float] = []
    build = trainer.build_model

    def observed(options, tokenizer, **kwargs):  # every training forward records the bridge it runs with
        model = build(options, tokenizer, **kwargs)
        model.register_forward_pre_hook(lambda module, args: seen.append(module.config.geo_bridge) if module.training
                                        else None)  # fmt: skip
        return model

    monkeypatch.setattr(trainer, "build_model", observed)
    out = tmp_path / "run"
    options = TrainOptions(data=str(data_file), seq_len=32, vocab_size=300, batch_size=4, warmup_steps=0, lr=1e-3,
                           max_steps=5, eval_every=1, logging_steps=1, bridge_anneal=4, settings={"geo_bridge": 0.2},
                           keep_checkpoints=True, output=str(out))  # fmt: skip
    metrics = run_training(options, log=lambda line: None)
    # step s (1-based) runs 0.2 + 0.8 * s / 4: 1.0 at the last anneal step, and after it
    schedule = [0.4, 0.6, 0.8, 1.0, 1.0]
    assert seen == pytest.approx(schedule)
    logged = {h["step"]: h["geo_bridge"] for h in metrics["log_history"] if "loss" in h}
    assert logged == pytest.approx({s: schedule[s - 1] for s in range(1, 6)})  # what the model ran at that step
    assert json.loads((out / "final" / "config.json").read_text())["geo_bridge"] == 1.0
    assert json.loads((out / "checkpoint-4" / "config.json").read_text())["geo_bridge"] == 1.0


def _raise_enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device", str(args[1]))


def _raise_torch_full(obj, path, *args, **kwargs):
    if str(path).endswith("optimizer.pt"):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 5120 vs 5016")
    return torch_save(obj, path, *args, **kwargs)


torch_save = torch.save


@pytest.mark.parametrize("writer", ["safetensors", "torch.save"])
def test_a_full_disk_during_a_checkpoint_is_named(tmp_path, data_file, monkeypatch, writer):
    import transformers.modeling_utils as modeling_utils

    if writer == "safetensors":
        monkeypatch.setattr(modeling_utils, "safe_save_file", _raise_enospc)
        named = "checkpoint-1/model.safetensors"
    else:
        monkeypatch.setattr(torch, "save", _raise_torch_full)
        named = "checkpoint-1"
    out = tmp_path / "run"
    result = train("--data", data_file, *SMALL, "--max-steps", "2", "--eval-every", "1", "--output", out)
    assert result.exit_code != 0, result.output
    error = error_lines(result.output)
    assert len(error) == 1 and f"no space left on device while writing {out / named}" in error[0], result.output
    assert ".partial-" not in error[0] and "Traceback" not in result.output
    assert not out.exists()


def test_a_finished_run_removes_only_its_own_checkpoints(tmp_path, data_file):
    """A ``checkpoint-N`` folder someone else made in the output (no train record in it) survives the removal of the
    run's own checkpoints at the end, byte for byte."""
    out = tmp_path / "run"
    common = ["--data", str(data_file), *SMALL, "--warmup-steps", "3", "--eval-every", "1", "--output", str(out)]
    assert train(*common, "--max-steps", "2", "--keep-checkpoints").exit_code == 0
    theirs = out / "checkpoint-1000"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("my own checkpoint notes")
    resumed = train(*common, "--max-steps", "3", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert [n for n in names(out) if n.startswith("checkpoint-")] == ["checkpoint-1000"]
    assert (theirs / "notes.txt").read_text() == "my own checkpoint notes"


def test_a_checkpoint_without_its_scheduler_is_skipped_for_an_earlier_one_or_refused(tmp_path, data_file):
    args = ["--warmup-steps", "3", "--lr", "1e-2", "--logging-steps", "1", "--max-steps", "4", "--eval-every", "2",
            "--keep-checkpoints"]  # fmt: skip
    whole = train_in(tmp_path, data_file, *args)
    assert whole.exit_code == 0, whole.output
    out = shutil.copytree(tmp_path / "run", tmp_path / "stopped")
    shutil.rmtree(out / "final")
    (out / "metrics.json").unlink()
    (out / "checkpoint-4" / "scheduler.pt").unlink()
    resumed = train_in(tmp_path, data_file, *args, "--resume", name="stopped")
    assert resumed.exit_code == 0, resumed.output
    assert "checkpoint-4/scheduler.pt is missing" in resumed.output and "resuming from checkpoint-2" in resumed.output

    def rates(folder: Path) -> dict[int, float]:
        history = json.loads((folder / "metrics.json").read_text())["log_history"]
        return {entry["step"]: entry["learning_rate"] for entry in history if "learning_rate" in entry}

    assert rates(out)[3] == rates(tmp_path / "run")[3] and rates(out)[4] == rates(tmp_path / "run")[4]
    for checkpoint in ("checkpoint-2", "checkpoint-4"):
        (out / checkpoint / "scheduler.pt").unlink(missing_ok=True)
    shutil.rmtree(out / "final")
    refused = train_in(tmp_path, data_file, *args, "--resume", name="stopped")
    assert refused.exit_code == 1 and "no whole checkpoint" in refused.output
    assert "scheduler.pt is missing (the learning-rate schedule would restart its warm-up)" in refused.output


# ---- sizes the data or the machine cannot hold ----

LOCK = ".hf-geonorm.lock"


def test_a_vocab_size_no_tokenizer_trained_on_the_fly_can_have_is_refused_up_front(tmp_path, data_file):
    """The rule, written out: a byte-level BPE tokenizer has 256 byte tokens and an end-of-text token and learns at
    most one token per byte of the text it trains on, which is at most 20 million characters of 4 UTF-8 bytes. A
    --vocab-size beyond that (the trial's 10^9 made the tokenizers library abort the process allocating 70 GB,
    leaving the lock file) is one line before anything is read or locked, for train and sweep."""
    most = 256 + 1 + 4 * 20_000_000
    for command in ("train", "sweep"):
        out = tmp_path / command
        result = invoke(command, "--data", data_file, "--vocab-size", most + 1, "--max-steps", "1", "--output", out)
        lines = error_lines(result.output)
        assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
        assert f"--vocab-size {most + 1:,} is more than a tokenizer trained on the data can hold" in lines[0]
        assert f"so {most:,} at most; give a smaller --vocab-size" in lines[0], lines[0]
        assert not out.exists()


def test_a_vocab_size_beyond_the_data_is_refused_before_training_with_no_lock_left(tmp_path, data_file):
    """textwrap.py's 20 kB cannot give 50,000 tokens: refused when the tokenizer's sample is read, before the
    tokenizers library trains, naming the bytes it has; the lock is released and the output folder it made
    removed."""
    out = tmp_path / "run"
    result = train_in(tmp_path, data_file, "--vocab-size", "50000", name="run")
    lines = error_lines(result.output)
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "--vocab-size 50,000 is more than a tokenizer trained on the data can hold" in lines[0], lines[0]
    sampled = int(lines[0].split("per byte it trains on, here ")[1].split(" bytes")[0].replace(",", ""))
    assert 0 < sampled <= data_file.stat().st_size and f"so {257 + sampled:,} at most" in lines[0], lines[0]
    assert not out.exists() and not list(tmp_path.rglob(LOCK))
    # the same number from a from-scratch --model folder's config is named as that
    assert invoke("init", "gpt2", tmp_path / "cfg", "--preset", "tiny", "--vocab-size", "50000").exit_code == 0
    result = train("--data", data_file, "--model", tmp_path / "cfg", "--max-steps", "1", "--data-cache",
                   tmp_path / "cache", "--output", out)  # fmt: skip
    lines = error_lines(result.output)
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert f"the vocab_size of --model {tmp_path / 'cfg'} 50,000 is more than a tokenizer" in lines[0], lines[0]
    assert not out.exists() and not list(tmp_path.rglob(LOCK))
    # neither given: the default size, named as that (not as a --model None)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text(data_file.read_text()[:1500])
    result = train("--data", tiny, "--max-steps", "1", "--data-cache", tmp_path / "cache", "--output", out)
    lines = error_lines(result.output)
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "the default tokenizer size (--vocab-size) 2,048 is more than a tokenizer" in lines[0], lines[0]


def test_a_vocab_size_the_machine_cannot_train_is_refused_by_its_memory(tmp_path, data_file, monkeypatch):
    """The tokenizers library reserves about 70 bytes a token when it starts training: on a machine of 1 GB,
    20 million tokens (1.4 GB) are refused, naming both figures and the most it can train."""
    from hf_geonorm.training import options

    monkeypatch.setattr(options, "machine_memory", lambda: 10**9)
    out = tmp_path / "run"
    result = train("--data", data_file, "--vocab-size", 20_000_000, "--output", out)
    lines = error_lines(result.output)
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "1.4 GB, and this machine has 1.0 GB; give --vocab-size 14,285,714 or less" in lines[0], lines[0]
    assert not out.exists()


def test_a_crash_of_the_tokenizer_library_is_one_line_and_leaves_no_lock(tmp_path, data_file, monkeypatch):
    """A Rust panic in the tokenizers library reaches Python as pyo3's PanicException, a BaseException that no
    ``except Exception`` catches: it is one line naming the library, and the run's lock is released."""
    from hf_geonorm.training.data import tokenizer as tokenizer_module

    class PanicException(BaseException):  # the name pyo3 gives it
        pass

    def panics(texts, vocab_size):
        raise PanicException("capacity overflow")

    monkeypatch.setattr(tokenizer_module, "train_tokenizer", panics)
    result = train_in(tmp_path, data_file, name="run")
    lines = error_lines(result.output)
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert "the tokenizers library failed training a tokenizer of 300 tokens" in lines[0], lines[0]
    assert "capacity overflow" in lines[0]
    assert not (tmp_path / "run").exists() and not list(tmp_path.rglob(LOCK))
