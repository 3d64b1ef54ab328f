"""Output folders written all or nothing (hf_geonorm._plumbing.atomic), on their own and through ``hf-geonorm convert``
killed with SIGTERM or SIGKILL, or raced, at points the test controls.

The kill tests run the real command line in a child process that stops at a named point (the weights are
written into the temporary folder) and waits on a FIFO; the test then signals it for real.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hf_geonorm._plumbing import atomic, full_device, signals
from hf_geonorm._plumbing.ownership import MARKER_NAME, mark_folder, mark_temporary
from hf_geonorm.conversion import convert as conversion
from hf_geonorm_cli.main import cli

from support.helpers import contents
from support.tiny_models import tiny_model


@pytest.fixture(params=["renameat2", "plain rename"])
def move_kind(request, monkeypatch):
    """Every test runs with Linux's one-step moves and with the two-step moves of other systems."""
    if request.param == "plain rename":
        monkeypatch.setattr(atomic, "_renameat2", lambda source, target, flags: False)
    return request.param


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_all_or_nothing(tmp_path, move_kind):
    target = tmp_path / "deep" / "er" / "out"
    with pytest.raises(RuntimeError), atomic.atomic_directory(target) as tmp:
        (tmp / "half.txt").write_text("x")
        raise RuntimeError("interrupted")
    assert not (tmp_path / "deep").exists()  # no output, no temp folder, no created parents
    with atomic.atomic_directory(target, command="convert") as tmp:  # an output of hf-geonorm: force replaces it
        (tmp / "a.txt").write_text("a")
    assert names(target.parent) == ["out"] and (target / "a.txt").read_text() == "a"
    assert stat.S_IMODE(target.stat().st_mode) != 0o700  # usual permissions, not mkdtemp's
    with pytest.raises(FileExistsError, match=r"not empty \(choose another folder, or pass force=True"):
        atomic.atomic_directory(target).__enter__()
    with pytest.raises(KeyboardInterrupt), atomic.atomic_directory(target, force=True) as tmp:
        (tmp / "b.txt").write_text("b")
        raise KeyboardInterrupt
    assert names(target.parent) == ["out"] and names(target) == [MARKER_NAME, "a.txt"]
    with atomic.atomic_directory(target, force=True, command="convert") as tmp:
        (tmp / "b.txt").write_text("b")
    assert names(target) == [MARKER_NAME, "b.txt"] and names(target.parent) == ["out"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic.atomic_directory(empty) as tmp:  # an empty folder is replaced without force
        (tmp / "c.txt").write_text("c")
    assert names(empty) == ["c.txt"]


def test_without_force_a_folder_that_appears_meanwhile_is_left_alone(tmp_path, move_kind):
    target = tmp_path / "out"
    with pytest.raises(FileExistsError, match="appeared while"), atomic.atomic_directory(target) as tmp:
        (tmp / "new.txt").write_text("new")
        target.mkdir()
        (target / "mine.txt").write_text("mine")
    assert names(tmp_path) == ["out"] and names(target) == ["mine.txt"]
    if move_kind == "renameat2":  # with one-step moves not even an empty folder is replaced
        other = tmp_path / "other"
        with pytest.raises(FileExistsError, match="appeared while"), atomic.atomic_directory(other) as tmp:
            (tmp / "new.txt").write_text("new")
            other.mkdir()
        assert names(other) == []
    file_target = tmp_path / "file"
    with pytest.raises(FileExistsError), atomic.atomic_directory(file_target) as tmp:
        file_target.write_text("mine")
    assert file_target.read_text() == "mine"


def test_force_replaces_read_only_folders_and_symlinks_without_leftovers(tmp_path, move_kind):
    target = tmp_path / "out"
    (target / "sub").mkdir(parents=True)
    (target / "sub" / "old.txt").write_text("old")
    mark_folder(target, "convert")  # as hf-geonorm wrote it: what force replaces
    for folder in (target / "sub", target):
        folder.chmod(0o555)
    with atomic.atomic_directory(target, force=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert names(tmp_path) == ["out"] and names(target) == ["new.txt"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(elsewhere, target_is_directory=True)
    with atomic.atomic_directory(link, force=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert not link.is_symlink() and names(link) == ["new.txt"]
    assert names(elsewhere) == ["keep.txt"]  # the folder the link pointed to is not touched
    assert names(tmp_path) == ["elsewhere", "link", "out"]


def leftover(path: Path, target: str, pid: int, proof: bool = True) -> Path:
    """A folder ``path`` holding a file, with the proof that process ``pid`` made it for ``target`` (``proof``)."""
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"x" * 100)
    if proof:
        mark_temporary(path, target, pid=pid)
    return path


def test_only_leftovers_proven_of_a_dead_process_are_removed_and_nothing_moves_into_the_output(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited (and been reaped)
    target = tmp_path / "out"
    leftover(tmp_path / f".out.partial-{dead_pid}-abcd", "out", dead_pid)
    leftover(tmp_path / f".out.old-{dead_pid}-abcd", "out", dead_pid)  # a two-step replacement killed half-way
    leftover(tmp_path / f".out.partial-{os.getppid()}-live", "out", os.getppid())  # a running process's
    leftover(tmp_path / f".other.partial-{dead_pid}-abcd", "other", dead_pid)  # another output's
    leftover(tmp_path / f".out.old-{dead_pid}-archive", "out", dead_pid, proof=False)  # the user's, named alike
    shutil.copytree(tmp_path / f".out.partial-{dead_pid}-abcd", tmp_path / f".out.partial-{dead_pid}-copy")
    # the copy's proof names the folder it was copied from: not this one
    kept = [f".other.partial-{dead_pid}-abcd", f".out.old-{dead_pid}-archive", f".out.partial-{dead_pid}-copy",
            f".out.partial-{os.getppid()}-live"]  # fmt: skip
    before = {name: contents(tmp_path / name) for name in kept}
    done = atomic.remove_stale_partials(target)
    assert len(done) == 2 and all(line.startswith("removed .out.") for line in done), done
    assert names(tmp_path) == sorted(kept)
    assert {name: contents(tmp_path / name) for name in kept} == before
    target.mkdir()  # nothing was moved into the missing output: it is made here, as hf-geonorm's
    (target / "a.txt").write_text("a")
    mark_folder(target, "convert")
    leftover(tmp_path / f".out.partial-{dead_pid}-efgh", "out", dead_pid)
    with pytest.warns(UserWarning, match=f"removed .out.partial-{dead_pid}-efgh"):
        with atomic.atomic_directory(target, force=True) as tmp:
            (tmp / "new.txt").write_text("new")
    assert names(target) == ["new.txt"]
    assert f".out.old-{dead_pid}-archive" in names(tmp_path)


# ---- hf-geonorm convert, for real ----


CHILD = """
import os, sys
import hf_geonorm.conversion.convert as conversion

def pause_after_saving(*args, **kwargs):
    result = save(*args, **kwargs)
    open(os.environ["PAUSE_READY"], "w").close()
    with open(os.environ["PAUSE_FIFO"]) as fifo:  # blocks until the test writes to the FIFO
        fifo.read()
    return result

save, conversion.save_shareable = conversion.save_shareable, pause_after_saving
from hf_geonorm_cli.main import cli
cli(sys.argv[1:], prog_name="hf-geonorm")
"""


def _drop_dac_override() -> None:
    """In a child of root: lose the right to ignore file permissions, as any other user has it."""
    if ctypes.CDLL(None, use_errno=True).prctl(24, 1, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_DAC_OVERRIDE
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def start_convert(tmp_path: Path, *args: str) -> subprocess.Popen:
    """``hf-geonorm convert ARGS`` in a child process, stopped once the weights are written (waiting on a FIFO)."""
    fifo, ready = tmp_path / "fifo", tmp_path / "ready"
    os.mkfifo(fifo)
    env = {**os.environ, "PAUSE_FIFO": str(fifo), "PAUSE_READY": str(ready), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, "convert", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while not ready.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            pytest.fail(f"the child did not reach the pause point: {child.communicate()[1][-2000:]}")
        time.sleep(0.05)
    return child


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    folder = tmp_path_factory.mktemp("source") / "stock_gpt2"
    tiny_model("gpt2").save_pretrained(folder)
    return folder


def partials(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def test_sigterm_during_convert_removes_the_temporary_folder(tmp_path, stock):
    child = start_convert(tmp_path, str(stock), str(tmp_path / "out"))
    (partial,) = partials(tmp_path)
    assert (partial / "model.safetensors").stat().st_size > 10_000  # stopped with the weights written
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert stderr.rstrip().splitlines()[-1] == "Error: terminated (SIGTERM); no partial output is left"
    assert names(tmp_path) == ["fifo", "ready"]  # no output, no temporary folder


def test_sigkill_during_convert_leaves_a_partial_that_the_next_run_removes(tmp_path, stock):
    child = start_convert(tmp_path, str(stock), str(tmp_path / "out"))
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=120)
    (partial,) = partials(tmp_path)  # nothing can clean up after SIGKILL ...
    assert f"partial-{child.pid}-" in partial.name
    assert names(tmp_path / "out") == [".hf-geonorm.lock"]  # OUT holds the killed run's lock file only
    result = CliRunner().invoke(cli, ["convert", str(stock), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert f"warning: removed {partial.name}" in result.stderr  # ... but the next run for that output does
    assert f"warning: took over the lock {tmp_path / 'out' / '.hf-geonorm.lock'}" in result.stderr
    assert names(tmp_path) == ["fifo", "out", "ready"] and (tmp_path / "out" / "model.safetensors").exists()


READ_ONLY_CHILD = """
import sys
from hf_geonorm._plumbing import atomic
with atomic.atomic_directory(sys.argv[1], force=True) as tmp:
    (tmp / "new.txt").write_text("new")
"""


def test_force_onto_a_read_only_folder_leaves_nothing_behind(tmp_path):
    """As any user but root (a child of root gives up the right to ignore permissions): the old contents of a
    read-only folder cannot be deleted until the folder is made writable again."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "sub" / "old.txt").write_text("old")
    mark_folder(out, "convert")
    for folder in (out / "sub", out):
        folder.chmod(0o555)
    child = subprocess.run(
        [sys.executable, "-c", READ_ONLY_CHILD, str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_drop_dac_override if os.geteuid() == 0 else None,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert names(tmp_path) == ["out"] and names(out) == ["new.txt"]


def test_convert_never_removes_an_output_that_appears_while_it_runs(tmp_path, stock, monkeypatch):
    out = tmp_path / "out"
    save = conversion.save_shareable

    def someone_else_writes_the_output(model, path, **kwargs):
        save(model, path, **kwargs)
        out.mkdir(exist_ok=True)  # there already, holding the run's lock file; another program ignores that
        (out / "theirs.txt").write_text("theirs")

    monkeypatch.setattr(conversion, "save_shareable", someone_else_writes_the_output)
    result = CliRunner().invoke(cli, ["convert", str(stock), str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.rstrip().splitlines()[-1].startswith(f"Error: {out} appeared while")
    assert names(tmp_path) == ["out"] and names(out) == ["theirs.txt"]


class SignalsWhenCollected:
    """Sends this process SIGTERM from its finalizer, where Python ignores the exception the handler raises."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs here, inside the finalizer


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the ignored one
def test_a_sigterm_swallowed_by_a_finalizer_is_raised_when_the_block_ends():
    reached = []
    with pytest.raises(signals.Terminated) as raised:
        with signals.terminate_raises():
            SignalsWhenCollected()  # collected at once: its Terminated is printed as ignored, not raised here
            reached.append(True)
    assert reached and raised.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    signals.raise_if_signalled()  # raised once: nothing left pending


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the ignored one
def test_a_swallowed_sigterm_stops_training_at_the_next_step():
    from hf_geonorm.training.run.trainer import SignalCheck

    with signals.terminate_raises():
        SignalsWhenCollected()
        with pytest.raises(signals.Terminated):
            SignalCheck().on_step_end()


# ---- output names and full devices ----


def test_an_output_name_of_240_characters_is_written(tmp_path):
    from hf_geonorm._plumbing.atomic import atomic_directory, remove_stale_partials

    output = tmp_path / ("m" * 240)
    with atomic_directory(output) as tmp:
        assert len(tmp.name) < 160
        (tmp / "weights").write_text("w")
    assert (output / "weights").read_text() == "w"
    # a killed run's partial folder of that output is found and removed by the next run
    with atomic_directory(tmp_path / ("m" * 240 + "2")) as other:
        stale = other.parent / other.name.replace(f"-{os.getpid()}-", "-999999999-")
        other.rename(stale)
        mark_temporary(stale, stale.name.split(".partial-")[0][1:], pid=999999999)  # a process that cannot run
        other.mkdir()
    assert remove_stale_partials(tmp_path / ("m" * 240 + "2")) and not stale.exists()


def test_a_full_device_is_one_clear_line(stock_llama, tmp_path):
    """On a 100 kB tmpfs mounted in a user namespace (skipped where unprivileged namespaces are not allowed)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-r", "-m", "true"]).returncode != 0:
        pytest.skip("unprivileged user namespaces are not available")
    small = tmp_path / "small"
    small.mkdir()
    command = (
        f"mount -t tmpfs -o size=100k tmpfs {small} && {sys.executable} -m hf_geonorm_cli.main convert {stock_llama} "
        f"{small / 'out'}; ls -A {small}"
    )
    done = subprocess.run(["unshare", "-r", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=300)
    errors = done.stderr.strip().splitlines()
    assert errors[-1] == f"Error: cannot write {small / 'out'}: No space left on device", done.stderr
    assert "SafetensorError" not in done.stderr and "Traceback" not in done.stderr
    assert done.stdout.strip() == ""  # nothing left behind on the full device


def test_a_full_device_reported_in_a_writers_own_type_is_raised_as_the_os_error():
    """safetensors' writer reports a full device as a ``SafetensorError`` with the system's words: convert and init
    raise it as the ``OSError`` ENOSPC any other write raises; any other error passes unchanged."""

    class SafetensorError(Exception):
        pass

    with pytest.raises(OSError) as raised, full_device.full_device_as_os_error():
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, message: "No space left on device" })')
    assert raised.value.errno == errno.ENOSPC and raised.value.strerror == os.strerror(errno.ENOSPC)
    with pytest.raises(SafetensorError, match="shape"), full_device.full_device_as_os_error():
        raise SafetensorError("shape mismatch")
