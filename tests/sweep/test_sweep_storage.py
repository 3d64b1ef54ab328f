"""`hf-geonorm sweep --storage postgresql://...` (hf_geonorm.sweep.storage): one sweep shared by several
machines through a real PostgreSQL server (``postgres_server``), each machine a process of its own with its own
working folder and data cache. The runs, the choice and the test means equal a serial sweep's over the same grid,
also when a machine is killed mid-run (another takes its run over after --takeover-after), when the database
restarts between runs, and when a machine with other data or options asks to join (refused, the difference
named)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from hf_geonorm_cli.main import cli

from support.helpers import FIXED, STDLIB, TINY
from support.postgres_server import PostgresServer, find_server

GRID = ["--styles", "pre,geo", "--lrs", "1e-5,2e-5", "--seeds", "0", "--extend", "1", "--confirm-seeds", "1"]
RUNS = 8  # the grid's 4, an extension per arm, a confirmation run per arm
TAKEOVER = "4"  # seconds: a killed machine's run is taken over after this
TIMINGS = ("train_seconds", "training_seconds", "evaluation_seconds", "model")


@pytest.fixture(scope="module")
def postgres():
    binaries, why = find_server()
    if binaries is None:
        pytest.skip(f"no PostgreSQL server can be started here: {why}")
    server = PostgresServer(binaries)
    yield server
    server.remove()


@pytest.fixture(scope="module")
def serial(tmp_path_factory, corpus):  # noqa: F811
    """The serial sweep over GRID, one run after the other in a process started as each machine is (one thread:
    the same kernels, so the same numbers to the bit)."""
    machine = Machine(tmp_path_factory.mktemp("serial"), None, "", corpus)
    machine.finish()
    return machine.output


class Machine:
    """``hf-geonorm sweep --storage`` in a process of its own (a session of its own: killed whole, as a machine
    dies), in its own working folder with its own data cache; its output collected as it comes."""

    def __init__(self, folder: Path, url: str | None, study: str, data: Path, *more: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.output = folder, folder / "sweep"
        shared = ["--storage", url, "--study", study, "--takeover-after", TAKEOVER] if url is not None else []
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "HF_GEONORM_DATA_CACHE": str(folder / "cache")}  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hf_geonorm_cli.main", "sweep", "--output", str(self.output), *shared, *GRID,
             "--data", str(data), *TINY, *more],
            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 600) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text)
            if found:
                return found
            assert self.process.poll() is None or re.search(pattern, self.text), self.text
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} in {timeout} s:\n{self.text}")

    def finish(self, timeout: float = 900) -> str:
        self.process.wait(timeout=timeout)
        time.sleep(0.5)  # the reader thread's last lines
        assert self.process.returncode == 0, self.text
        return self.text

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def trained(self) -> set[str]:
        runs = self.output / "runs"
        return {path.name for path in runs.iterdir() if (path / "final").is_dir()} if runs.is_dir() else set()


def journal(output: Path) -> list[dict]:
    """The journal's runs, but for how long each took and where its model lies (the machine that trained it)."""
    lines = [json.loads(line) for line in (output / "runs.jsonl").read_text().splitlines()]
    return [{name: value for name, value in entry.items() if name not in TIMINGS} for entry in lines[1:]]


def assert_equals_serial(output: Path, serial: Path) -> None:
    """The journal's runs (in the serial order) and the report are the serial sweep's."""
    assert journal(output) == journal(serial)
    assert (output / "sweep.md").read_text() == (serial / "sweep.md").read_text()


def trials_per_run(url: str, study: str) -> tuple[Counter, Counter]:
    """How many COMPLETE and how many FAIL trials each run has in the study."""
    trials = optuna.load_study(study_name=study, storage=url).get_trials(deepcopy=False)
    state = optuna.trial.TrialState
    return (Counter(t.user_attrs["run"] for t in trials if t.state == state.COMPLETE),
            Counter(t.user_attrs["run"] for t in trials if t.state == state.FAIL))  # fmt: skip


@pytest.mark.slow
def test_two_machines_share_one_sweep_and_report_the_serial_choice(tmp_path, postgres, serial, corpus):  # noqa: F811
    """Two machines on one study: every run trained once, by one of them; the journal each writes and its report
    (the choice, the test means) are the serial sweep's."""
    machines = [Machine(tmp_path / name, postgres.url, "two", corpus) for name in ("a", "b")]
    for machine in machines:
        machine.finish()
    complete, failed = trials_per_run(postgres.url, "two")
    assert set(complete.values()) == {1} and len(complete) == RUNS and not failed
    a, b = (machine.trained() for machine in machines)
    assert not a & b and len(a | b) == RUNS  # each run trained by one machine, in that machine's folder
    for machine in machines:
        assert_equals_serial(machine.output, serial)


@pytest.mark.slow
def test_a_machine_killed_mid_run_is_taken_over_and_nothing_counts_twice(tmp_path, postgres, serial, corpus):  # noqa: F811
    """SIGKILL to a whole machine while its second run trains: the other machine takes that run over once its
    heartbeat is older than --takeover-after; the killed run's half-written output stays in the dead machine's
    folder and no entry of it is read; the dead machine's command run again finds every run in and writes the
    serial report."""
    first = Machine(tmp_path / "a", postgres.url, "killed", corpus)
    killed = first.wait_for(r"run 2: (\S+) lr (\S+) seed (\d+)")
    name = "{}-lr{}-seed{}".format(*killed.groups())
    while not (first.output / "logs" / f"{name}.log").exists():  # the run has started: kill the machine now
        time.sleep(0.05)
    first.kill()
    second = Machine(tmp_path / "b", postgres.url, "killed", corpus)
    second.finish()
    complete, failed = trials_per_run(postgres.url, "killed")
    assert set(complete.values()) == {1} and len(complete) == RUNS
    assert list(failed.values()) == [1]  # the killed run's trial, failed as stale, and no other
    assert list(failed) == [name]
    assert name in second.trained() and name not in first.trained()
    assert_equals_serial(second.output, serial)
    again = Machine(tmp_path / "a", postgres.url, "killed", corpus)
    assert f"all {RUNS} runs of the sweep are in" in again.finish()
    assert_equals_serial(again.output, serial)


@pytest.mark.slow
def test_a_database_restart_between_runs_loses_nothing(tmp_path, postgres, serial, corpus):  # noqa: F811
    """The server stopped as the machine's second run starts and started again a few seconds later: the machine
    waits for it, says so, and goes on; the sweep is the serial one. The same sweep started twice in one folder is
    refused by the folder's lock (in another folder it is a second machine)."""
    machine = Machine(tmp_path / "a", postgres.url, "restart", corpus)
    machine.wait_for(r"run 1: ")
    twice = CliRunner().invoke(cli, ["sweep", "--output", str(machine.output), "--storage", postgres.url, "--study",
                                     "restart", *GRID, "--data", str(corpus), *TINY])  # fmt: skip
    assert twice.exit_code == 1 and "is in use by hf-geonorm sweep" in twice.output, twice.output
    machine.wait_for(r"run 2: ")
    postgres.stop()
    time.sleep(3)
    postgres.start()
    text = machine.finish()
    assert "cannot be reached" in text and "trying again every" in text
    complete, failed = trials_per_run(postgres.url, "restart")
    assert set(complete.values()) == {1} and len(complete) == RUNS and not failed
    assert_equals_serial(machine.output, serial)


def test_a_machine_with_other_data_options_or_grid_is_refused_naming_the_difference(tmp_path, postgres, corpus):  # noqa: F811
    """The first machine records the study's header; one with another corpus, another --seq-len or another grid
    is refused before it trains, with the difference named, and the study keeps its one run."""
    one_run = ["--styles", "pre", "--lrs", "1e-5", "--seeds", "0", "--max-steps", "1", "--eval-every", "1"]

    def sweep(folder: str, data: Path, *more: str):
        args = ["--output", str(tmp_path / folder), "--storage", postgres.url, "--study", "refusals"]
        return CliRunner().invoke(cli, ["sweep", *args, "--data", str(data), *TINY, *FIXED, *one_run, *more])

    first = sweep("a", corpus)
    assert first.exit_code == 0, first.output
    other = tmp_path / "other.txt"
    other.write_text((STDLIB / "textwrap.py").read_text())
    for folder, data, more, message in [
        ("b", other, (), "its header: fingerprints.data: expected"),
        ("c", corpus, ("--seq-len", "16"), "its header: train_options.seq_len: expected 32, found 16"),
        ("d", corpus, ("--lrs", "1e-5,2e-5"), "holds a sweep of another grid (grids"),
    ]:
        refused = sweep(folder, data, *more)
        assert refused.exit_code == 1 and message in refused.output, refused.output
        assert "study 'refusals' in postgresql://geonorm@127.0.0.1" in refused.output
        assert "Traceback" not in refused.output and not (tmp_path / folder / "runs").exists()
        assert not (tmp_path / folder / "runs.jsonl").exists()  # this folder's journal is not started
    complete, failed = trials_per_run(postgres.url, "refusals")
    assert complete == {"pre-lr1e-5-seed0": 1} and not failed


@pytest.mark.slow
def test_a_trial_that_is_not_a_run_of_the_sweep_is_refused_naming_it(tmp_path, postgres, corpus):  # noqa: F811
    """A COMPLETE trial whose run was recorded with other options (an older hf-geonorm, or an edit) never counts:
    the next machine to read the study is refused with the trial's number and the field, before it trains."""
    one_run = ["--styles", "pre", "--lrs", "1e-5", "--seeds", "0,1", "--max-steps", "1", "--eval-every", "1"]

    def sweep(folder: str):
        args = ["--output", str(tmp_path / folder), "--storage", postgres.url, "--study", "foreign"]
        return CliRunner().invoke(cli, ["sweep", *args, "--data", str(corpus), *TINY, *FIXED, *one_run])

    first = sweep("a")
    assert first.exit_code == 0, first.output
    study = optuna.load_study(study_name="foreign", storage=postgres.url)
    trial = next(t for t in study.get_trials(deepcopy=False) if t.user_attrs["run"] == "pre-lr1e-5-seed1")
    entry = trial.user_attrs["entry"]
    options = {**entry["train_options"], "seq_len": 16}
    foreign = {**entry, "run": "pre-lr1e-5-seed2", "seed": 2, "train_options": options}
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, value=entry["val_loss"],
                                              user_attrs={"run": foreign["run"], "key": ["pre", None, 1e-5, 2],
                                                          "entry": foreign}))  # fmt: skip
    refused = sweep("b")
    assert refused.exit_code == 1, refused.output
    assert "study 'foreign' in postgresql://" in refused.output and "trial 2: seq_len: expected 32, found 16" in (
        refused.output), refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "b" / "runs").exists()


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_database_errors_fail_at_once_with_their_cause(tmp_path, postgres, corpus, monkeypatch):  # noqa: F811
    """Only a lost connection is waited out (a restart, above). A refused login, a missing database, a malformed URL,
    a study name longer than Optuna's column, a closed port and an unknown host each fail at once, in one line that
    says why, the password never shown; nothing is written to the output folder."""
    from hf_geonorm.sweep import storage

    monkeypatch.setattr(storage, "RETRY_SECONDS", 0.01)  # a retry, were there one, would only say so
    with_password = postgres.add_user_with_password("geonorm_secret", "right")
    one_run = ["--styles", "pre", "--lrs", "1e-5", "--seeds", "0", "--max-steps", "1", "--takeover-after", "600"]
    port = postgres.url.rsplit(":", 1)[1].split("/")[0]
    cases = [
        (with_password.replace("geonorm_secret@", "geonorm_secret:wrong@"), "hf", 'password authentication failed '
         'for user "geonorm_secret"'),
        (postgres.url.rsplit("/", 1)[0] + "/no_such_db", "hf", 'database "no_such_db" does not exist'),
        (f"postgresql://geonorm:wrong@127.0.0.1:{port}x/postgres", "hf", "--storage is not a valid URL (its port is "
         "not a number); give postgresql://USER:PASSWORD@HOST:PORT/DATABASE"),
        (postgres.url, "s" * 600, "--study is 600 characters long; the study's name is stored in at most 512"),
        (f"postgresql://geonorm:wrong@127.0.0.1:{closed_port()}/postgres", "hf", "Connection refused"),
        ("postgresql://geonorm:wrong@no-such-host.invalid:5432/postgres", "hf", "no-such-host.invalid"),
    ]
    for number, (url, study, cause) in enumerate(cases):
        out = tmp_path / f"sweep{number}"
        started = time.monotonic()
        result = CliRunner().invoke(cli, ["sweep", "--output", str(out), "--storage", url, "--study", study,
                                          "--data", str(corpus), *TINY, *one_run])  # fmt: skip
        lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert result.exit_code != 0 and len(lines) == 1 and "Traceback" not in result.output, result.output
        assert cause in lines[0] and "wrong" not in lines[0], (url, lines[0])
        assert "trying again" not in result.output and time.monotonic() - started < 60, (url, result.output)
        assert not (out / "runs").exists() and not (out / "runs.jsonl").exists()
    import psycopg  # the right password logs in: the refusal above was the password's

    with psycopg.connect(with_password.replace("geonorm_secret@", "geonorm_secret:right@")) as connection:
        assert connection.execute("SELECT current_user").fetchone() == ("geonorm_secret",)


def test_machines_joining_a_new_database_together_create_its_tables_once(postgres):
    """Optuna creates its tables when a machine first opens a database; machines that start together each tried to,
    and all but one failed on a duplicate type. Opened at one instant by six threads (each its own connections, as
    machines), the boards all join one study."""
    import psycopg

    from hf_geonorm.sweep.options import SweepOptions
    from hf_geonorm.sweep.storage import StudyBoard

    with psycopg.connect(postgres.url, autocommit=True) as connection:
        connection.execute("CREATE DATABASE together")
    url = postgres.url.rsplit("/", 1)[0] + "/together"
    start, opened, failed = threading.Barrier(6), [], []

    def machine() -> None:
        start.wait()
        try:
            opened.append(StudyBoard(url, "one", 60.0, SweepOptions(), {}, lambda line: None).study_id)
        except Exception as error:  # noqa: BLE001 - the failure is the finding
            failed.append(error)

    threads = [threading.Thread(target=machine) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failed, failed
    assert len(opened) == 6 and len(set(opened)) == 1
