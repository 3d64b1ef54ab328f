"""Ctrl-C (SIGINT) and SIGTERM stop `hf-geonorm train` and `hf-geonorm sweep` at the next safe point wherever they
land (docs/training.md, "Stopping a run"): also inside a weak-reference callback or a ``__del__``, where Python
prints "Exception ignored in: ..." and drops the exception the signal handler raised. The job then exits with the
usual status (130, 143) and its one-line message, never a traceback, and runs nothing more: no evaluation, no
further step or run.

The signals are real: ``signalled_job`` runs the CLI in a forked child (torch and the command already imported, as
``helpers.stopped_run`` does), where the chosen function of the library sends the signal to its own process from
inside such a callback (``signal.raise_signal`` runs the handler before it returns, so the handler's exception is
raised inside the callback).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hf_geonorm.sweep import grid as grid_module
from hf_geonorm.training.run import trainer as trainer_module

from support.helpers import ONE_STEP

EVALUATED = "EVALUATED AT STEP"
LANDED = "THE SIGNAL LANDED IN A CALLBACK"


def swallowed_signal(sig: int, where: str) -> None:
    """Send ``sig`` to this process from inside a weakref callback or a ``__del__``: the handler's exception is
    raised there, and Python reports it as ignored."""
    print(LANDED, flush=True)

    class Doomed:
        if where == "__del__":

            def __del__(self) -> None:
                signal.raise_signal(sig)

    doomed = Doomed()
    watch = weakref.ref(doomed, lambda _: signal.raise_signal(sig)) if where == "weakref" else None
    del doomed  # the callback (or __del__) runs here, and the exception it raised stops here
    del watch


def land_once(owner: Any, name: str, sig: int, where: str) -> None:
    """Wrap ``owner.name`` so that its first call sends ``sig`` from inside a callback (``swallowed_signal``)."""
    original, calls = getattr(owner, name), [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            swallowed_signal(sig, where)
        return original(*args, **kwargs)

    setattr(owner, name, wrapped)


def count_evaluations() -> None:
    """Say on the output each time the run evaluates (and at which step)."""
    original = trainer_module.CheckedTrainer.evaluate

    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        print(EVALUATED, self.state.global_step, flush=True)
        return original(self, *args, **kwargs)

    trainer_module.CheckedTrainer.evaluate = evaluate


def signalled_job(args: list[str], cwd: Path, prepare: Callable[[], None]) -> tuple[int, str]:
    """``hf-geonorm ARGS`` in a forked child after ``prepare()`` (which arranges where the signal lands); its exit
    status (minus the signal where one ended it) and its output."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_end)
            os.dup2(write_end, 1)
            os.dup2(write_end, 2)
            sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
            sys.stdin = open(os.devnull)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a new process's handlers, not the test runner's
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.unraisablehook = sys.__unraisablehook__  # Python's own report of an ignored exception
            os.chdir(cwd)
            from hf_geonorm_cli.main import cli

            prepare()
            cli([str(a) for a in args], prog_name="hf-geonorm")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(code)
    os.close(write_end)
    with open(read_end, errors="replace") as output:
        text = output.read()  # to the child's end: it exits, whatever happens, or the test runner times it out
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


def quiet_stop(status: int, output: str, sig: int) -> str:
    """The child stopped with ``sig``'s status and one ``Error:`` line, no traceback; that line."""
    assert LANDED in output, output
    assert status == 128 + sig, output
    assert "Traceback" not in output and "Exception ignored" not in output, output
    return output.rstrip().splitlines()[-1]


@pytest.mark.parametrize(
    ("sig", "where", "land_in"),
    [
        (signal.SIGINT, "weakref", "training_step"),
        (signal.SIGTERM, "weakref", "build_model"),
        (signal.SIGINT, "__del__", "build_model"),
        (signal.SIGTERM, "__del__", "training_step"),
    ],
)
def test_a_signal_python_swallows_stops_training_at_the_next_step(tmp_path, data_file, sig, where, land_in):
    """A signal that lands while the model is built stops the run before its first evaluation; one that lands in
    the first step stops it before that step's evaluation. The output folder the run created is removed."""
    out = tmp_path / "run"
    args = ["train", "--data", data_file, *ONE_STEP, "--max-steps", "2", "--data-cache", tmp_path / "cache",
            "--output", out]  # fmt: skip

    def prepare() -> None:
        count_evaluations()
        if land_in == "build_model":
            land_once(trainer_module, "build_model", sig, where)
        else:
            land_once(trainer_module.CheckedTrainer, "training_step", sig, where)

    status, output = signalled_job(args, tmp_path, prepare)
    last = quiet_stop(status, output, sig)
    word = "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert last == f"Error: {word}; no partial output is left", output
    evaluations = [line[line.index(EVALUATED) :] for line in output.splitlines() if EVALUATED in line]  # after a bar
    assert evaluations == ([] if land_in == "build_model" else [f"{EVALUATED} 0"]), output
    assert not out.exists()


def sweep_args(corpus: Path, output: Path) -> list[object]:
    return ["sweep", "--output", output, "--styles", "pre", "--lrs", "1e-3,2e-3,4e-3", "--data", corpus,
            "--data-cache", output.parent / "cache", *ONE_STEP, "--extend", "0", "--confirm-seeds", "none"]  # fmt: skip


def journal_runs(output: Path) -> list[str]:
    return [json.loads(line)["run"] for line in (output / "runs.jsonl").read_text().splitlines()[1:]]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_python_swallows_in_a_run_stops_the_sweep_with_no_more_runs(tmp_path, data_file, sig):
    output = tmp_path / "sweep"

    def prepare() -> None:
        land_once(trainer_module.CheckedTrainer, "training_step", sig, "weakref")

    status, text = signalled_job(sweep_args(data_file, output), tmp_path, prepare)
    last = quiet_stop(status, text, sig)
    assert "the finished runs are in" in last and "the same command again trains the runs that are missing" in last
    assert "run 1/3" in text and "run 2/3" not in text, text
    assert journal_runs(output) == []  # the stopped run is not journaled: it trains again on the next sweep
    assert not list(output.glob("runs/*/checkpoint-*"))


def test_a_ctrl_c_python_swallows_between_runs_stops_the_sweep_before_the_next(tmp_path, data_file):
    """Landing in the sweep's own code (the report written after run 1): run 1 stays journaled, run 2 never
    starts."""
    output = tmp_path / "sweep"

    def prepare() -> None:
        land_once(grid_module, "write_report", signal.SIGINT, "weakref")

    status, text = signalled_job(sweep_args(data_file, output), tmp_path, prepare)
    quiet_stop(status, text, signal.SIGINT)
    assert "run 2/3" not in text, text
    assert journal_runs(output) == ["pre-lr1e-3-seed0"]


@pytest.mark.parametrize(("sig", "command"), [(signal.SIGINT, "convert"), (signal.SIGTERM, "init")])
def test_a_signal_python_swallows_while_an_output_is_written_stops_before_it_moves(tmp_path, sig, command):
    """``convert`` and ``init``: the signal lands while the output is written into its temporary folder; nothing is
    moved into place, and the temporary folder is removed."""
    from hf_geonorm.conversion import convert as conversion
    from hf_geonorm.training.run import model as model_module

    from support.tiny_models import tiny_model

    tiny_model("gpt2").save_pretrained(tmp_path / "stock")
    out = tmp_path / "out"
    args = ["convert", tmp_path / "stock", out] if command == "convert" else ["init", "gpt2", out, "--preset", "tiny"]

    def prepare() -> None:
        if command == "convert":
            land_once(conversion, "save_shareable", sig, "weakref")
        else:
            land_once(model_module, "save_config_with_remote_code", sig, "__del__")

    status, output = signalled_job(args, tmp_path, prepare)
    last = quiet_stop(status, output, sig)
    word = "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert last == f"Error: {word}; no partial output is left", output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stock"]  # no output, no temporary folder
