"""`hf-geonorm sweep --workers N` (hf_geonorm.sweep.engine): the study's protocol walked over whatever runs
have ended (``protocol.walk``) takes the serial sweep's steps in any order of completion, and a sweep trained by two
worker processes writes the serial sweep's journal, report and plot: the same runs, choice and numbers."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hf_geonorm._plumbing.children import environment_set
from hf_geonorm.sweep import grid as grid_module
from hf_geonorm.sweep import workers as workers_module
from hf_geonorm.sweep.engine import LocalBoard, ParallelSweep
from hf_geonorm.sweep.engine_options import EngineOptions
from hf_geonorm.sweep.journal import JournalError, entry_key, load_journal
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.sweep.protocol import Task, serial_order, walk
from hf_geonorm.sweep.record import RecordError
from hf_geonorm.training.options import TrainOptions
from hf_geonorm_cli.main import cli

from support.helpers import FIXED, STDLIB, TINY, write_sweep_journal

# each arm's made-up validation loss: a parabola in log2(rate) around its own best rate, so that --extend walks out
# of the grid on one side (pre upwards, geo downwards) and the confirmation runs land at the rate it reaches
BEST = {"pre": 8e-3, "geo": 1.25e-4}
TIMINGS = ("train_seconds", "training_seconds", "evaluation_seconds")


def made_up_loss(style: str, lr: float, seed: int) -> float:
    return 3.0 + 0.1 * math.log2(lr / BEST[style]) ** 2 + 0.01 * seed


def made_up_entry(run: grid_module.Run, role: str) -> dict:
    loss = made_up_loss(run.style, run.lr, run.seed)
    return {"run": run.name, "style": run.style, "alpha": run.alpha, "lr": run.lr, "seed": run.seed, "val_loss": loss,
            "test_loss": loss + 0.05, "role": role, "warmup_share": run.warmup_share}  # fmt: skip


def test_the_protocol_walked_in_any_order_of_completion_takes_the_serial_sweeps_steps(tmp_path, corpus, monkeypatch):  # noqa: F811
    """The serial sweep (``grid._Sweep``, its training replaced by the made-up losses) against the protocol walked
    with up to three runs at once, finished in a random order, several times: the same runs in the same roles, and
    ``serial_order`` puts them in the serial journal's order."""

    def made_up_run(run: grid_module.Run, train: TrainOptions, folder: Path, thread_note: object = None) -> dict:
        """A made-up run with the sweep's identity (the journal's header), as a trained one records it."""
        header = json.loads((folder / "runs.jsonl").read_text().splitlines()[0])
        marks = header["fingerprints"]
        return made_up_entry(run, "") | {
            "settings": run.settings(header["settings"]), "train_options": header["train_options"],
            "data": {"fingerprint": marks["data"], "tokenizer": marks["tokenizer"]},
            "steps": header["train_options"]["max_steps"], "tokens": 128,
        }  # fmt: skip

    monkeypatch.setattr(grid_module, "_train", made_up_run)
    args = ["--styles", "pre,geo", "--lrs", "1e-3,2e-3", "--seeds", "0,1", "--extend", "2", "--confirm-seeds", "2,3"]
    result = CliRunner().invoke(cli, ["sweep", "--output", str(tmp_path / "serial"), "--data", str(corpus), *TINY,
                                      *FIXED, *args])  # fmt: skip
    assert result.exit_code == 0, result.output
    serial = [json.loads(line) for line in (tmp_path / "serial" / "runs.jsonl").read_text().splitlines()[1:]]
    assert {e["role"] for e in serial} == {"grid", "extension", "confirmation"}
    assert {e["lr"] for e in serial if e["role"] == "confirmation"} == {8e-3, 2.5e-4}  # two steps beyond each edge

    sweep = SweepOptions(styles=("pre", "geo"), lrs=(1e-3, 2e-3), seeds=(0, 1), extend=2, confirm_seeds=(2, 3),
                         warmup_shares=None)  # --warmup-steps fixed it above  # fmt: skip
    grids = grid_module.style_grids(sweep, TrainOptions(), lambda _: None)
    for order in range(5):
        shuffled, entries, running = random.Random(order), [], []
        while True:
            found = walk(sweep, grids, entries)
            startable = [task for task in found.due if task not in running]
            running += startable[: 3 - len(running)]
            if not running:
                break
            task = running.pop(shuffled.randrange(len(running)))
            entries.append(made_up_entry(task.run, task.role))
        assert sorted(map(entry_key, entries)) == sorted(map(entry_key, serial))
        assert {entry["run"]: entry["role"] for entry in entries} == {entry["run"]: entry["role"] for entry in serial}
        assert [e["run"] for e in serial_order(entries, found.reached)] == [e["run"] for e in serial]


def without_timings(output: Path) -> list[dict]:
    lines = [json.loads(line) for line in (output / "runs.jsonl").read_text().splitlines()]
    for entry in lines[1:]:
        for name in TIMINGS:
            entry.pop(name)
        assert not Path(entry["model"]).is_absolute()  # relative to the sweep's folder: no path of this machine
    return lines


def test_two_workers_write_the_serial_sweeps_journal_report_and_plot(tmp_path, corpus, monkeypatch):  # noqa: F811
    """A grid of two styles and its confirmation runs (which start once the grid's results are in), trained by a
    serial sweep and by `--workers 2`: every line of the journal but its timings, sweep.md and sweep.png are the
    same. Each worker trains on one thread, as this test process does, so the numbers are the same to the bit."""
    monkeypatch.setattr(workers_module.os, "sched_getaffinity", lambda _: {0, 1})  # two cores: a thread per worker
    args = ["--styles", "pre,geo", "--lrs", "2e-5", "--seeds", "0", "--confirm-seeds", "1", "--data", str(corpus),
            "--data-cache", str(tmp_path / "cache"), *TINY, "--extend", "0"]  # fmt: skip
    serial = CliRunner().invoke(cli, ["sweep", "--output", str(tmp_path / "serial"), *args])
    assert serial.exit_code == 0, serial.output
    parallel = CliRunner().invoke(cli, ["sweep", "--output", str(tmp_path / "parallel"), "--workers", "2", *args])
    assert parallel.exit_code == 0, parallel.output
    assert "on 2 worker(s): worker 1 on CPU, 1 thread(s); worker 2 on CPU, 1 thread(s)" in parallel.output
    assert "(confirmation) on worker" in parallel.output
    assert without_timings(tmp_path / "parallel") == without_timings(tmp_path / "serial")
    for name in ("sweep.md", "sweep.png"):
        assert (tmp_path / "parallel" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes(), name
    again = CliRunner().invoke(cli, ["sweep", "--output", str(tmp_path / "parallel"), "--workers", "2", *args])
    assert again.exit_code == 0 and "all 4 runs of the sweep are in" in again.output, again.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "--workers must be a whole number in [1, 256]"),
        (["--devices", "7"], "--devices names 7, not a visible accelerator"),
        (["--devices", " "], "--devices is empty"),
        (["--storage", "sqlite:///x.db"], "--storage takes a PostgreSQL URL"),
    ],
)
def test_bad_engine_options_are_one_line_errors(tmp_path, corpus, args, message):  # noqa: F811
    result = CliRunner().invoke(cli, ["sweep", "--output", str(tmp_path / "s"), "--lrs", "1e-3", "--data",
                                      str(corpus), *TINY, *FIXED, *args])  # fmt: skip
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_workers_spread_over_the_devices_named_each_seeing_its_own(monkeypatch):
    """--devices auto: a worker per visible accelerator, --workers spread over them in turn, each worker's
    CUDA_VISIBLE_DEVICES the physical device its index names where the variable already narrowed them; on the CPU
    the cores are shared out, at most OMP_NUM_THREADS each."""
    monkeypatch.setattr(workers_module, "visible_accelerators", lambda: ["0", "1"])
    monkeypatch.setattr(workers_module.os, "sched_getaffinity", lambda _: set(range(12)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [(s.device, s.threads) for s in workers_module.worker_slots(None, "auto")] == [("0", 6), ("1", 6)]
    assert [s.device for s in workers_module.worker_slots(3, None)] == ["0", "1", "0"]
    assert [s.device for s in workers_module.worker_slots(None, "1")] == ["1"]
    assert workers_module.device_id("1", "4,6") == "6" and workers_module.device_id("1", None) == "1"
    monkeypatch.setattr(workers_module, "visible_accelerators", lambda: [])
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert [(s.device, s.threads) for s in workers_module.worker_slots(4, None)] == [(None, 2)] * 4
    assert workers_module.device_id(None, "4,6") == ""


def test_a_child_started_in_environment_set_inherits_it_and_the_parent_gets_its_own_back(monkeypatch):
    """What workers and tokenizing pools start under: the child sees the values; afterwards a name the parent had
    holds its own value again and a name it lacked is gone, also when the block raised."""
    monkeypatch.setenv("GEONORM_KEPT", "mine")
    monkeypatch.delenv("GEONORM_NEW", raising=False)
    child = [sys.executable, "-c", "import os; print(os.environ['GEONORM_KEPT'], os.environ['GEONORM_NEW'])"]
    with environment_set({"GEONORM_KEPT": "child", "GEONORM_NEW": "1"}):
        seen = subprocess.run(child, capture_output=True, text=True, check=True).stdout.split()
    assert seen == ["child", "1"]
    assert os.environ["GEONORM_KEPT"] == "mine" and "GEONORM_NEW" not in os.environ
    with pytest.raises(RuntimeError), environment_set({"GEONORM_KEPT": "child", "GEONORM_NEW": "1"}):
        raise RuntimeError
    assert os.environ["GEONORM_KEPT"] == "mine" and "GEONORM_NEW" not in os.environ


def test_a_worker_is_forked_only_where_it_runs_one_cpu_thread(monkeypatch):
    """A forked worker starts with this process's imports (no second import of torch and transformers), but a forked
    child cannot initialise CUDA, and its OpenMP threads hang once this process has used OpenMP's own: fork for a
    CPU worker of one thread on Linux, spawn for the others."""
    monkeypatch.setattr(workers_module.sys, "platform", "linux")
    slot = workers_module.Slot
    assert workers_module.start_method(slot(1, None, 1)) == "fork"
    assert workers_module.start_method(slot(1, None, 2)) == "spawn"
    assert workers_module.start_method(slot(1, "0", 1)) == "spawn"
    monkeypatch.setattr(workers_module.sys, "platform", "darwin")
    assert workers_module.start_method(slot(1, None, 1)) == "spawn"


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or torch.cuda.is_available(),
                    reason="a CPU worker of two threads needs two cores and no accelerator")
def test_a_worker_of_two_threads_trains_after_the_sweeps_process_used_openmp(tmp_path, corpus):  # noqa: F811
    """The sweep's process runs a two-thread matmul (OpenMP's threads started), then `--devices auto` with no
    accelerator: its one worker, on two threads, trains and the sweep ends (a forked worker's first two-thread
    matmul would never return)."""
    script = ("import sys, torch\ntorch.set_num_threads(2)\nm = torch.randn(1500, 1500)\n(m @ m).sum()\n"
              "from hf_geonorm_cli.main import cli\ncli(sys.argv[1:])\n")  # fmt: skip
    args = [sys.executable, "-c", script, "sweep", "--output", str(tmp_path / "s"), "--devices", "auto", "--styles",
            "pre", "--lrs", "1e-3", "--data", str(corpus), *TINY, *FIXED]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"} | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "worker 1 on CPU, 2 thread(s)" in done.stdout and "validation loss" in done.stdout, done.stdout


def test_runs_that_decide_others_start_first():
    """Two workers, runs of equal length, two arms of two rates and a confirmation seed: the grids' four runs
    first, then both confirmation runs at once, three rounds; in the serial order the first arm's confirmation run
    would take a worker before the second arm's grid, and the second arm's confirmation run would end alone in a
    fourth round."""
    sweep = SweepOptions(styles=("pre", "geo"), lrs=(1e-3, 2e-3), seeds=(0,), confirm_seeds=(1,), extend=0,
                         warmup_shares=None)  # fmt: skip
    grids = grid_module.style_grids(sweep, TrainOptions(), lambda _: None)
    entries: list[dict] = []
    rounds = []
    while not walk(sweep, grids, entries).finished:
        started: list = []
        for _ in range(2):
            task = walk(sweep, grids, entries).next_due({task.run.key() for task in started})
            if task is not None:
                started.append(task)
        rounds.append([task.role for task in started])
        entries += [made_up_entry(task.run, task.role) for task in started]
    assert rounds == [["grid", "grid"], ["grid", "grid"], ["confirmation", "confirmation"]]


def test_storage_without_optuna_says_what_to_install(tmp_path, corpus, monkeypatch):  # noqa: F811
    """Optuna is an optional extra: a --storage without it is a one-line error naming the extra, before any
    data is read or folder written."""
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed: importing it raises ImportError
    result = CliRunner().invoke(cli, ["sweep", "--output", str(tmp_path / "s"), "--lrs", "1e-3", "--data", str(corpus),
                                      *TINY, *FIXED, "--storage", "postgresql://u@127.0.0.1:1/db"])  # fmt: skip
    assert result.exit_code != 0 and "pip install 'hf-geonorm[distributed]'" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "s" / "runs.jsonl").exists()


@pytest.mark.slow
def test_sigterm_stops_the_workers_leaves_no_checkpoint_and_the_same_command_finishes(tmp_path, corpus):  # noqa: F811
    """SIGTERM to a `--workers 2` sweep while its runs train: exit 143 with the one-line message, every worker
    process gone, no checkpoint or half-written run folder left; the same command again trains the missing runs."""
    args = [sys.executable, "-m", "hf_geonorm_cli.main", "sweep", "--output", str(tmp_path / "s"), "--workers", "2",
            "--styles", "pre,geo", "--lrs", "1e-5,2e-5", "--data", str(corpus), *TINY, *FIXED, "--max-steps", "400",
            "--eval-every", "100"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    sweep = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(sweep.stdout), daemon=True)
    reader.start()
    logs = tmp_path / "s" / "logs"
    while not (logs.is_dir() and len(list(logs.glob("*.log"))) == 2):  # both workers have started a run
        assert sweep.poll() is None, "".join(lines)
        time.sleep(0.1)
    workers = [int(pid) for pid in Path(f"/proc/{sweep.pid}/task/{sweep.pid}/children").read_text().split()]
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=300) == 143
    reader.join(timeout=10)
    assert "Error: terminated (SIGTERM): the finished runs are in" in "".join(lines)
    assert workers and not [pid for pid in workers if Path(f"/proc/{pid}").exists()
                            and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]]  # fmt: skip
    assert not list((tmp_path / "s").rglob("checkpoint-*"))
    finished = {json.loads(line)["run"] for line in (tmp_path / "s" / "runs.jsonl").read_text().splitlines()[1:]}
    runs = tmp_path / "s" / "runs"
    assert ({path.name for path in runs.iterdir()} if runs.is_dir() else set()) == finished  # no half-written run
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len((tmp_path / "s" / "runs.jsonl").read_text().splitlines()) == 5


@pytest.mark.slow
def test_a_sweep_killed_outright_takes_its_workers_with_it(tmp_path, corpus):  # noqa: F811
    """SIGKILL to a `--workers 2` sweep (no handler runs in it) while its runs train: each worker is stopped as by
    SIGTERM, well before its run would end, so no orphan trains on for nobody holding the folder's lock, and no
    checkpoint is left."""
    args = [sys.executable, "-m", "hf_geonorm_cli.main", "sweep", "--output", str(tmp_path / "s"), "--workers", "2",
            "--styles", "pre,geo", "--lrs", "1e-5", "--data", str(corpus), *TINY, *FIXED, "--max-steps", "100000",
            "--eval-every", "100000"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    sweep = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    logs = tmp_path / "s" / "logs"
    while not (logs.is_dir() and len(list(logs.glob("*.log"))) == 2):  # both workers have started a run
        assert sweep.poll() is None
        time.sleep(0.1)
    workers = [int(pid) for pid in Path(f"/proc/{sweep.pid}/task/{sweep.pid}/children").read_text().split()]
    sweep.kill()
    sweep.wait(timeout=60)

    def running() -> list[int]:
        return [pid for pid in workers if Path(f"/proc/{pid}").exists()
                and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]]  # fmt: skip

    deadline = time.monotonic() + 120  # a run of 100,000 steps trains for far longer
    while running() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert workers and not running()
    assert not list((tmp_path / "s").rglob("checkpoint-*"))


def test_workers_refuse_a_sweep_begun_on_other_data_before_any_starts(tmp_path):
    """`--workers 2` over a journal begun on other data: refused with the field named, as a serial sweep is, before a
    worker starts or the journal changes."""
    data = tmp_path / "text.txt"
    data.write_text((STDLIB / "textwrap.py").read_text())
    args = ["--output", str(tmp_path / "sweep"), "--styles", "pre", "--lrs", "2e-3", "--seeds", "0", "--data",
            str(data), "--data-cache", str(tmp_path / "cache"), *TINY, *FIXED]  # fmt: skip
    options = TrainOptions(data=str(data), data_cache=str(tmp_path / "cache"), seq_len=32, batch_size=4,
                           vocab_size=300, max_steps=3, eval_every=3, warmup_steps=0, eval_blocks=8)  # fmt: skip
    write_sweep_journal(tmp_path / "sweep" / "runs.jsonl", options, [])
    before = (tmp_path / "sweep" / "runs.jsonl").read_bytes()
    data.write_text((STDLIB / "shlex.py").read_text())
    result = CliRunner().invoke(cli, ["sweep", *args, "--workers", "2"])
    assert result.exit_code == 1 and "holds runs on other data" in result.output, result.output
    assert "on 2 worker(s)" not in result.output and "Traceback" not in result.output
    assert (tmp_path / "sweep" / "runs.jsonl").read_bytes() == before and not (tmp_path / "sweep" / "runs").exists()


@pytest.fixture
def begun(tmp_path, corpus):  # noqa: F811
    """A sweep's folder whose journal holds its header alone, and the options of its runs."""
    options = TrainOptions(data=str(corpus), data_cache=str(tmp_path / "cache"), seq_len=32, batch_size=4,
                           vocab_size=300, max_steps=3, eval_every=3, warmup_steps=0, eval_blocks=8)  # fmt: skip
    write_sweep_journal(tmp_path / "sweep" / "runs.jsonl", options, [])
    return tmp_path / "sweep", options


def test_a_worker_measures_the_identity_again_before_each_run_and_trains_nothing_on_changed_data(tmp_path, begun):
    """The data changed after the sweep began: the worker's next run is refused before it trains (``RecordError``
    naming the worker, the run and the fingerprint), and no run folder or log is written."""
    folder, options = begun
    header = load_journal(folder / "runs.jsonl").header
    Path(options.data).write_text((STDLIB / "shlex.py").read_text())
    task = Task(grid_module.Run("pre", None, 2e-3, 0), "grid")
    with pytest.raises(RecordError, match=r"before pre lr 2e-3 seed 0 on worker 1: fingerprints\.data: expected"):
        workers_module.checked_run(task, replace(options, lr=1e-3), folder, header, 1)
    assert not (folder / "runs").exists() and not (folder / "logs").exists()


def test_a_workers_record_is_checked_against_the_header_before_it_counts(begun):
    """A record a worker returns that is not one of this sweep (its options differ from the header's) is refused,
    naming the run, the worker and the field, and the journal does not take it."""
    folder, options = begun
    journal = load_journal(folder / "runs.jsonl")
    sweep = SweepOptions(output=str(folder), styles=("pre",), lrs=(2e-3,), seeds=(0,), warmup_shares=None)
    parallel = ParallelSweep(EngineOptions(workers=2), sweep, replace(options, lr=1e-3), folder, journal, print)
    parallel.board = LocalBoard(journal, sweep, parallel.grids)
    run = grid_module.Run("pre", None, 2e-3, 0)
    header, loss = journal.header, made_up_loss("pre", 2e-3, 0)
    marks = header["fingerprints"]
    entry = made_up_entry(run, "grid") | {
        "settings": run.settings(header["settings"]), "train_options": {**header["train_options"], "seq_len": 16},
        "data": {"fingerprint": marks["data"], "tokenizer": marks["tokenizer"]}, "fingerprints": marks, "steps": 3,
        "tokens": 128,
    }  # fmt: skip
    before = (folder / "runs.jsonl").read_bytes()
    with pytest.raises(JournalError, match=r"run pre lr 2e-3 seed 0 from worker 2: seq_len: expected 32, found 16"):
        parallel.ended(Task(run, "grid"), entry, loss, 2)
    assert (folder / "runs.jsonl").read_bytes() == before and not journal.entries
    parallel.ended(Task(run, "grid"), {**entry, "train_options": header["train_options"]}, loss, 2)  # the same, whole
    assert [line["run"] for line in load_journal(folder / "runs.jsonl").entries] == [run.name]
