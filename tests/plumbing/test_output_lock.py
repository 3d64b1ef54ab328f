"""One run per output folder (hf_geonorm._plumbing.output_lock): a second ``train`` into a folder another one writes
into fails at once, naming it; a stale lock of a killed run is taken over with a line; ``sweep``, ``convert`` and
``init`` refuse a folder another run holds, a folder inside one (a running sweep's logs and runs) and a folder
holding one; a symbolic link as the output folder leaves no lock file behind, and a lock file that is a symbolic link
is refused, never written through."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hf_geonorm._plumbing.output_lock import output_lock
from hf_geonorm._plumbing.ownership import mark_folder

from support.helpers import contents, error_lines, fails, invoke, stopped_run, train, train_in
from support.tiny_models import tiny_model

SMALL = ["--seq-len", "32", "--batch-size", "4", "--warmup-steps", "0", "--lr", "1e-3", "--eval-blocks", "8"]
ONE_SWEEP_STEP = ["--styles", "pre", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "0", "--eval-blocks",
                  "8", "--vocab-size", "300", "--max-steps", "1", "--eval-every", "1", "--extend", "0",
                  "--confirm-seeds", "none"]  # fmt: skip


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
    after = train(*args, "--force", "--keep-checkpoints")
    assert after.exit_code == 0, after.output
    assert f"took over the lock {out / '.hf-geonorm.lock'} of hf-geonorm train (process {holder['pid']}" in after.output
    assert sorted(p.name for p in out.iterdir()) == [".hf-geonorm-output.json", "checkpoint-1", "checkpoint-2", "final",
                                                     "loss_curve.png", "metrics.json"]  # fmt: skip


def test_sweep_convert_and_init_refuse_a_folder_another_run_holds(tmp_path, data_file):
    from hf_geonorm._plumbing.output_lock import output_lock
    from hf_geonorm._plumbing.ownership import mark_folder

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


@pytest.fixture(scope="module")
def stock(tmp_path_factory) -> Path:
    """A saved stock tiny GPT-2, as a user downloads one."""
    folder = tmp_path_factory.mktemp("stock") / "gpt2"
    tiny_model("gpt2").save_pretrained(folder)
    return folder


HOLDER = """
import sys
from contextlib import ExitStack
from hf_geonorm._plumbing.output_lock import output_lock
with ExitStack() as held:
    for folder, command in zip(sys.argv[1::2], sys.argv[2::2]):
        held.enter_context(output_lock(folder, command))
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def held_elsewhere(*locks: tuple[Path, str]) -> Iterator[int]:
    """The locks ``locks`` (folder, command) taken one after the other by another process, as a running sweep takes
    its folder's and then its run's, and held for the block; yields that process's id."""
    words = [str(word) for lock in locks for word in lock]
    child = subprocess.Popen([sys.executable, "-c", HOLDER, *words], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline() == "held\n", child.communicate(timeout=60)[1]
        yield child.pid
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0, child.stderr.read()
        child.stdout.close()
        child.stderr.close()


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) below ``folder``, lock files included."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def test_every_folder_a_running_sweep_writes_is_refused_to_other_commands(tmp_path, stock, data_file):
    """The sweep holds its folder; its logs, its runs and every run folder in it (the one training, and those it
    has yet to train) count as held: nothing else writes into them or replaces them."""
    sweep = tmp_path / "sweep"
    running, later = sweep / "runs" / "pre-lr1e-3-seed0", sweep / "runs" / "pre-lr2e-3-seed0"
    (sweep / "logs").mkdir(parents=True)
    (sweep / "logs" / "pre-lr1e-3-seed0.log").write_text("run 1/2: pre lr 1e-3 seed 0\n")
    with held_elsewhere((sweep, "sweep"), (running, "train")) as pid:
        before = tree(sweep)
        by_sweep = f"is in use by hf-geonorm sweep (process {pid} on host {socket.gethostname()}"
        attempts = {
            by_sweep: [
                ["convert", stock, sweep / "logs", "--force", "--norm-style", "pre"],
                ["convert", stock, sweep / "runs", "--force"],
                ["convert", stock, later],
                ["init", "gpt2", sweep / "logs" / "notes", "--preset", "tiny"],
                ["train", "--data", data_file, *SMALL, "--max-steps", 1, "--vocab-size", 300, "--output", later],
            ],
            f"{running} is in use by hf-geonorm train (process {pid}": [["convert", stock, running, "--force"]],
        }
        for held, commands in attempts.items():
            for args in commands:
                message = fails(*args)
                assert held in message, (args, message)
        assert tree(sweep) == before  # the sweep's log and lock files as they were, nothing added
    assert list(sweep.rglob(".hf-geonorm.lock")) == []  # the sweep's locks went with it


def test_a_sweep_refuses_its_folder_while_another_run_writes_inside_it(tmp_path, data_file):
    """A convert into ``sweep/logs`` that started first: the sweep, resumed, would write its logs into the folder
    the convert replaces."""
    sweep = tmp_path / "sweep"
    args = ["sweep", "--data", data_file, "--data-cache", tmp_path / "cache", "--output", sweep, *ONE_SWEEP_STEP]
    first = invoke(*args, "--lrs", "1e-3")
    assert first.exit_code == 0, first.output
    before = tree(sweep)
    with held_elsewhere((sweep / "logs", "convert")) as pid:
        message = fails(*args, "--lrs", "1e-3,2e-3")
        assert f"{sweep} holds {sweep / 'logs'}, in use by hf-geonorm convert (process {pid}" in message, message
        assert tree(sweep) == {**before, "logs/.hf-geonorm.lock": (sweep / "logs" / ".hf-geonorm.lock").read_bytes()}


def linked_output(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """``name``: a symbolic link to the empty folder ``name-real``."""
    real = tmp_path / f"{name}-real"
    real.mkdir()
    (tmp_path / name).symlink_to(real, target_is_directory=True)
    return tmp_path / name, real


def lock_files(*folders: Path) -> list[Path]:
    return [folder / ".hf-geonorm.lock" for folder in folders if os.path.lexists(folder / ".hf-geonorm.lock")]


@pytest.mark.parametrize("force", [[], ["--force"]], ids=["into-the-linked-folder", "replacing-the-link"])
def test_convert_and_init_into_a_linked_output_leave_no_lock_file(tmp_path, stock, force):
    """Without --force the empty folder the link points to becomes the output; with it the link is replaced and
    that folder left as it was. Either way the lock, taken in the folder the link points to, goes with the run."""
    for command in (["convert", stock], ["init", "gpt2"]):
        out, real = linked_output(tmp_path, command[0])
        result = invoke(*command, out, *force, *(["--preset", "tiny"] if command[0] == "init" else []))
        assert result.exit_code == 0, result.output
        assert "took over" not in result.output
        assert (out / "config.json").is_file() and out.is_symlink() != bool(force)
        assert lock_files(out, real) == []
        assert (real / "config.json").is_file() != bool(force)


def test_train_into_a_linked_output_leaves_no_lock_file_and_takes_over_none(tmp_path, data_file):
    out, real = linked_output(tmp_path, "run")
    for more in ([], ["--force"]):
        result = train_in(tmp_path, data_file, *more)
        assert result.exit_code == 0, result.output
        assert "took over" not in result.output and lock_files(out, real) == []
    assert out.is_symlink() and (real / "final" / "config.json").is_file()


@pytest.fixture
def lock_linked_to_a_users_file(tmp_path) -> tuple[Path, Path]:
    """An empty output folder whose ``.hf-geonorm.lock`` is a symbolic link to a file of the user's."""
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes, which no lock record may replace\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".hf-geonorm.lock").symlink_to(mine)
    return out, mine


@pytest.mark.parametrize("command", ["convert", "init", "train", "sweep"])
def test_a_lock_file_that_is_a_symbolic_link_is_refused_not_written_through(
    tmp_path, stock, data_file, lock_linked_to_a_users_file, command
):
    out, mine = lock_linked_to_a_users_file
    before = mine.read_bytes()
    args = {
        "convert": ["convert", stock, out],
        "init": ["init", "gpt2", out, "--preset", "tiny"],
        "train": ["train", "--data", data_file, *SMALL, "--max-steps", 1, "--vocab-size", 300, "--output", out],
        "sweep": ["sweep", "--data", data_file, "--output", out, "--lrs", "1e-3", *ONE_SWEEP_STEP],
    }[command]
    message = fails(*args)
    assert f"{out / '.hf-geonorm.lock'} is a symbolic link" in message and "remove the link" in message, message
    assert mine.read_bytes() == before
    assert (out / ".hf-geonorm.lock").is_symlink() and sorted(p.name for p in out.iterdir()) == [".hf-geonorm.lock"]


def test_a_lock_file_with_another_name_is_refused_not_written_over(tmp_path, stock):
    """A hard link: the same file under the user's name, which the lock record would replace."""
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes, which no lock record may replace\n")
    out = tmp_path / "out"
    out.mkdir()
    os.link(mine, out / ".hf-geonorm.lock")
    message = fails("convert", stock, out)
    assert f"{out / '.hf-geonorm.lock'} has other names (hard links)" in message and "remove it" in message, message
    assert mine.read_text() == "my notes, which no lock record may replace\n"
    assert sorted(p.name for p in out.iterdir()) == [".hf-geonorm.lock"]


def test_replacing_a_folder_respects_a_run_working_inside_it(stock_llama, tmp_path):
    running = tmp_path / "sweep" / "runs" / "geo-lr1e-3-seed0"
    running.mkdir(parents=True)
    (running / "checkpoint-50").mkdir()
    (running / "checkpoint-50" / "model.safetensors").write_bytes(b"weights")
    mark_folder(tmp_path / "sweep", "sweep")  # outputs of hf-geonorm, which --force replaces when no run is inside
    mark_folder(tmp_path / "sweep" / "runs", "sweep")
    before = contents(tmp_path / "sweep")
    with output_lock(running, "train"):  # as the sweep's run holds it while it trains
        message = fails("convert", stock_llama, tmp_path / "sweep" / "runs", "--force")
        assert "in use by hf-geonorm train" in message and str(running) in message
        assert "in use" in fails("init", "gpt2", tmp_path / "sweep", "--preset", "tiny", "--force")
        assert (running / "checkpoint-50" / "model.safetensors").read_bytes() == b"weights"
    assert contents(tmp_path / "sweep") == before
    # once the run has ended, --force replaces the folder as asked
    result = invoke("convert", stock_llama, tmp_path / "sweep" / "runs", "--force")
    assert result.exit_code == 0, result.output
    assert not running.exists()
