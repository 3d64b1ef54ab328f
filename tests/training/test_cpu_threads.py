"""A CPU run says when torch's threads do not fit the cores other processes leave free (training/run/cpu_threads.py):
the rule written out, /proc/stat read by hand, the other processes' share computed by hand, a real busy process
measured, and the line in `hf-geonorm train`'s output."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hf_geonorm.training.run import cpu_threads
from hf_geonorm.training.run.cpu_threads import CoreUse, contention_note, core_jiffies

from support.helpers import ONE_STEP, invoke, stdlib_text, train_in


@pytest.mark.parametrize(
    ("threads", "cores", "others", "fits"),
    [
        (2, 2, 1.0, 1),  # the README's case: one core busy, two threads
        (2, 2, 0.6, 1),  # free 1.4: two threads are half a core or more past it
        (2, 2, 0.4, None),  # free 1.6
        (1, 2, 1.9, None),  # one thread waits for nobody
        (8, 8, 4.0, 4),
        (4, 8, 4.0, None),  # a sweep worker's share: the other workers' threads fill the rest
        (2, 2, None, None),  # nothing measured
    ],
)
def test_the_note_names_the_threads_that_fit_where_torch_runs_more(threads, cores, others, fits):
    note = contention_note(threads, cores, others)
    if fits is None:
        assert note is None
    else:
        assert f"kept {others:.1f} of the {cores} cores busy" in note and f"torch runs {threads} threads" in note
        assert note.endswith(f"set OMP_NUM_THREADS={fits} before the command to run at the pace of the free cores")


def test_proc_stat_is_read_for_this_process_cores_only(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  900 0 0 900 0 0 0 0 0 0\n"
                    "cpu0 100 5 20 300 40 1 2 3 0 0\n"
                    "cpu1 200 0 10 100 10 0 0 0 0 0\n"
                    "cpu2 999 0 0 1 0 0 0 0 0 0\n"
                    "intr 1 2 3\n")  # fmt: skip
    busy0, total0 = 100 + 5 + 20 + 1 + 2 + 3, 100 + 5 + 20 + 300 + 40 + 1 + 2 + 3
    busy1, total1 = 200 + 10, 200 + 10 + 100 + 10
    assert core_jiffies(frozenset({0, 1}), stat) == (busy0 + busy1, total0 + total1)
    assert core_jiffies(frozenset({1}), stat) == (busy1, total1)
    assert core_jiffies(frozenset({0, 7}), stat) is None  # a core the file does not list
    assert core_jiffies(frozenset({0}), tmp_path / "missing") is None


def test_the_other_processes_share_is_the_cores_busy_less_this_process_own_time(monkeypatch):
    """Over 2 s on two cores: 300 of 400 ticks busy is 1.5 cores; this process used 1 s of CPU, half a core: the
    others kept 1.0 busy."""
    now = time.monotonic()
    monkeypatch.setattr(cpu_threads, "core_jiffies", lambda cores: (1300, 2400))
    monkeypatch.setattr(cpu_threads, "own_cpu_seconds", lambda: 11.0)
    use = CoreUse(cores=frozenset({0, 1}), wall=now - 2.0, own=10.0, jiffies=(1000, 2000))
    assert use.others_busy() == pytest.approx(1.5 - 0.5, abs=0.01)
    assert CoreUse(cores=frozenset({0, 1}), wall=now, own=10.0, jiffies=(1000, 2000)).others_busy() is None  # 0 s
    assert CoreUse(cores=frozenset({0, 1}), wall=now - 2.0, own=10.0, jiffies=None).others_busy() is None


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc/stat to measure the cores by (Linux only)")
def test_a_process_spinning_on_one_of_the_cores_is_measured():
    """A process that spins on a core of this one's is seen as (most of) a busy core; this process's own work is
    left out (a loaded machine can only add to the figure, so the test asks for a lower bound)."""
    core = min(cpu_threads.usable_cores())
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        use = CoreUse.start()
        time.sleep(2.0)
        others = use.others_busy()
    finally:
        spinner.kill()
        spinner.wait()
    assert others is not None and others >= 0.3, others


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    return stdlib_text(tmp_path_factory, "json/decoder.py", "textwrap.py")


@pytest.mark.parametrize("threads", [1, 2])
def test_train_says_so_where_its_threads_do_not_fit(tmp_path, data_file, monkeypatch, threads):
    """Two cores, one of them kept busy by another process (the measurement stood in for): two threads get the note,
    one thread none."""
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: frozenset({0, 1}))
    monkeypatch.setattr(CoreUse, "others_busy", lambda self: 1.0)
    torch.set_num_threads(threads)  # tests run on one thread: conftest's fixture sets it back
    result = train_in(tmp_path, data_file)
    assert result.exit_code == 0, result.output
    noted = [line for line in result.output.splitlines() if line.startswith("note: other processes kept")]
    if threads == 1:
        assert not noted
    else:
        assert len(noted) == 1 and "set OMP_NUM_THREADS=1 before the command" in noted[0], result.output


def test_a_sweep_says_it_once_on_its_console_and_each_run_in_its_log(tmp_path, data_file, monkeypatch):
    """A serial sweep of two real runs where the threads do not fit: the note on the console once, in both logs."""
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: frozenset({0, 1}))
    monkeypatch.setattr(CoreUse, "others_busy", lambda self: 1.0)
    torch.set_num_threads(2)
    output = tmp_path / "sweep"
    result = invoke("sweep", "--output", output, "--data", data_file, "--data-cache", tmp_path / "cache",
                    "--styles", "pre", "--lrs", "1e-3,2e-3", "--extend", "0", "--confirm-seeds", "none",
                    "--warmup-steps", "0", *ONE_STEP[:6], "--max-steps", "1", "--eval-every", "1",
                    "--eval-blocks", "8")  # fmt: skip
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "note: other processes kept" in line]
    assert len(said) == 1 and "said once for the sweep" in said[0], result.output
    logs = sorted((output / "logs").glob("*.log"))
    assert len(logs) == 2
    for log in logs:
        assert "set OMP_NUM_THREADS=1 before the command" in log.read_text(encoding="utf-8"), log
