"""One run per output folder (hf_geonorm.files.output_lock): a second ``train`` into a folder another one writes
into fails at once, naming it; a stale lock of a killed run is taken over with a line; ``sweep``, ``convert`` and
``init`` refuse a folder another run holds."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest
from conftest import error_lines, invoke, stopped_run, train
from tiny_models import tiny_model

SMALL = ["--seq-len", "32", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3", "--eval-blocks", "8"]


def test_a_second_train_into_the_same_output_fails_at_once_naming_the_first(tmp_path, data_file):
    out = tmp_path / "run"
    args = ["--data", data_file, "--vocab-size", 300, *SMALL, "--max-steps", 2, "--eval-every", 1, "--output", out]
    second: dict = {}

    def run_the_second() -> None:  # while the first (a child process) is about to write its first checkpoint
        second["holder"] = json.loads((out / ".hf-geonorm.lock").read_text())
        started = time.perf_counter()
        second["result"] = train(*args, "--seed", 1)
        second["seconds"] = time.perf_counter() - started
        second["listing"] = sorted(p.name for p in out.iterdir())

    status, output = stopped_run(list(map(str, args)), stop_at_save=1, sig=signal.SIGKILL, cwd=tmp_path,
                                 before_signal=run_the_second)  # fmt: skip
    assert status == -signal.SIGKILL, output
    holder, result = second["holder"], second["result"]
    assert holder["pid"] != os.getpid() and holder["host"] == socket.gethostname() and holder["command"] == "train"
    assert result.exit_code != 0 and len(error_lines(result.output)) == 1, result.output
    line = error_lines(result.output)[0]
    assert f"{out} is in use by hf-geonorm train (process {holder['pid']} on host {holder['host']}" in line, line
    assert second["seconds"] < 10  # at once: no data, no model
    assert [n for n in second["listing"] if not n.startswith(".")] == []  # the second wrote nothing
    # the first was killed: its lock file is left, and the next run takes it over with a line that names it
    with pytest.raises(ProcessLookupError):
        os.kill(holder["pid"], 0)
    assert (out / ".hf-geonorm.lock").is_file()
    after = train(*args, "--force")
    assert after.exit_code == 0, after.output
    assert f"took over the lock {out / '.hf-geonorm.lock'} of hf-geonorm train (process {holder['pid']}" in after.output
    assert sorted(p.name for p in out.iterdir()) == [".hf-geonorm-output.json", "checkpoint-1", "checkpoint-2", "final",
                                                     "loss_curve.png", "metrics.json"]  # fmt: skip


def test_sweep_convert_and_init_refuse_a_folder_another_run_holds(tmp_path, data_file):
    from hf_geonorm.files.output_lock import output_lock
    from hf_geonorm.files.ownership import mark_folder

    out = tmp_path / "busy"
    out.mkdir()
    (out / "theirs.txt").write_text("the other run's")
    mark_folder(out, "train")  # an output of hf-geonorm, which --force would replace were it not in use
    tiny_model("gpt2").save_pretrained(tmp_path / "stock")
    held = f"{out} is in use by hf-geonorm train (process {os.getpid()} on host {socket.gethostname()}"
    with output_lock(out, "train"):
        commands = {
            "sweep": ["sweep", "--data", data_file, "--output", out, "--lrs", "1e-3", "--max-steps", 1],
            "convert": ["convert", tmp_path / "stock", out, "--force", "--norm-style", "pre"],
            "init": ["init", "gpt2", out, "--preset", "tiny", "--force"],
        }
        for name, args in commands.items():
            result = invoke(*args)
            assert result.exit_code != 0 and held in result.output, (name, result.output)
    assert sorted(p.name for p in out.iterdir()) == [".hf-geonorm-output.json", "theirs.txt"]  # the lock went
