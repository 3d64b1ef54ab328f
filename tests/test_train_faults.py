"""`hf-geonorm train` when things go wrong: model folders it must refuse, runs killed (SIGKILL) or terminated
(SIGTERM) while a checkpoint or the final model is being written, and damaged checkpoints on --resume.

The kills are real: a child process runs the CLI with transformers' safetensors writer wrapped so that the n-th
weights file announces itself on stdout and waits; the test then sends the signal.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_geonorm_cli.main import cli
from safetensors.torch import load_file, save_file
from tiny_models import tiny_model
from transformers import AutoModelForCausalLM

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3"]
STOP_MARK = "STOPPED BEFORE WRITING"
CHILD = f"""
import os, sys, time
import transformers.modeling_utils as modeling_utils
from hf_geonorm_cli.main import cli

stop_at, calls, write = int(os.environ["STOP_AT_SAVE"]), [0], modeling_utils.safe_save_file

def save_file(*args, **kwargs):  # the n-th weights file: say so, then wait for the test's signal
    calls[0] += 1
    if calls[0] == stop_at:
        print("{STOP_MARK}", args[1], flush=True)
        time.sleep(600)
    return write(*args, **kwargs)

modeling_utils.safe_save_file = save_file
cli(sys.argv[1:])
"""


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text((STDLIB / "textwrap.py").read_text())
    return path


def train(*args: str) -> object:
    return CliRunner().invoke(cli, ["train", *map(str, args)])


def stopped_run(
    args: list[str], stop_at_save: int, sig: int, cwd: Path, before_signal: Callable[[], None] | None = None
) -> tuple[int, str]:
    """Run ``hf-geonorm train ARGS`` in a child process, send ``sig`` when it is about to write its
    ``stop_at_save``-th weights file (after calling ``before_signal``); return its exit status and output."""
    env = {**os.environ, "STOP_AT_SAVE": str(stop_at_save), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "train", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, cwd=cwd,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, child.stdout), lines.put(None)], daemon=True).start()
    seen = []
    try:
        while (line := lines.get(timeout=300)) is not None:
            seen.append(line)
            if STOP_MARK in line:  # after a progress bar's carriage return, on the same line
                if before_signal is not None:
                    before_signal()
                child.send_signal(sig)
                break
        status = child.wait(timeout=120)
    except (queue.Empty, subprocess.TimeoutExpired):
        child.kill()
        raise AssertionError("the child did not stop or end in time:\n" + "".join(seen)[-3000:]) from None
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    output = "".join(seen)
    assert STOP_MARK in output, f"the child ended before its weights file {stop_at_save}:\n{output[-3000:]}"
    return status, output


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_sigkill_during_the_final_save_leaves_no_partial_final_and_resume_completes_it(tmp_path, data_file):
    out = tmp_path / "run"
    args = ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "1", "--output", str(out)]
    status, output = stopped_run(args, stop_at_save=3, sig=signal.SIGKILL, cwd=tmp_path)  # 1, 2: checkpoints
    assert status == -signal.SIGKILL, output
    assert not (out / "final").exists()  # not a config without weights
    assert [n for n in names(out) if not n.startswith(".")] == ["checkpoint-1", "checkpoint-2"]
    assert any(n.startswith(".final.partial-") for n in names(out))  # what SIGKILL leaves: hidden, removed below
    resumed = train(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "removed .final.partial-" in resumed.output
    assert names(out) == ["checkpoint-1", "checkpoint-2", "final", "loss_curve.png", "metrics.json"]
    assert json.loads((out / "metrics.json").read_text())["resumed_from_step"] == 2
    final = AutoModelForCausalLM.from_pretrained(out / "final")
    checkpoint = AutoModelForCausalLM.from_pretrained(out / "checkpoint-2")
    for name, tensor in final.state_dict().items():
        assert torch.equal(tensor, checkpoint.state_dict()[name]), name


def test_sigkill_during_a_checkpoint_leaves_the_previous_one_to_resume_from(tmp_path, data_file):
    out = tmp_path / "run"
    args = ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "1", "--output", str(out)]
    status, output = stopped_run(args, stop_at_save=2, sig=signal.SIGKILL, cwd=tmp_path)
    assert status == -signal.SIGKILL, output
    assert [n for n in names(out) if not n.startswith(".")] == ["checkpoint-1"]  # no checkpoint-2 without weights
    resumed = train(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 1 and metrics["steps"] == 2
    assert names(out) == ["checkpoint-1", "checkpoint-2", "final", "loss_curve.png", "metrics.json"]


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
    for name in ("metrics.json", "loss_curve.png", "notes.txt"):
        (out / name).write_text("earlier")
    args = ["--data", str(data_file), *SMALL, "--max-steps", "2", "--eval-every", "1", "--output", str(out), "--force"]
    status, output = stopped_run(args, stop_at_save=1, sig=signal.SIGKILL, cwd=tmp_path)
    assert status == -signal.SIGKILL, output
    # nothing of the earlier run presents itself as the result of this one; the user's own file stays
    assert [n for n in names(out) if not n.startswith(".")] == ["notes.txt"]


def test_resume_skips_a_damaged_checkpoint_and_names_what_does_not_fit(tmp_path, data_file):
    out = tmp_path / "run"
    # within the warm-up the schedule does not depend on --max-steps: a longer run may resume the checkpoints
    common = ["--data", str(data_file), *SMALL, "--warmup-steps", "3", "--eval-every", "1", "--output", str(out)]
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


@pytest.fixture(scope="module")
def stock_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stock") / "gpt2"
    tiny_model("gpt2", vocab_size=320).save_pretrained(folder)
    return folder


def _copy(folder: Path, target: Path) -> Path:
    target.mkdir()
    for file in folder.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    return target


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
    folder = _copy(stock_folder, tmp_path / "model")
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


def test_a_config_folder_from_init_trains_from_scratch(tmp_path, data_file):
    init = CliRunner().invoke(cli, ["init", "gpt2", str(tmp_path / "cfg"), "--preset", "tiny", "--vocab-size", "320"])
    assert init.exit_code == 0, init.output
    out = tmp_path / "run"
    result = train("--model", tmp_path / "cfg", "--data", data_file, *SMALL, "--max-steps", "1", "--output", out)
    assert result.exit_code == 0, result.output
    assert AutoModelForCausalLM.from_pretrained(out / "final").config.model_type == "geonorm_gpt2"


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
