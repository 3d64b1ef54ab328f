"""Shared pytest setup.

- ``pytest -q`` runs on two pytest-xdist workers (``addopts`` in pyproject.toml); ``-n 0`` runs in one process.
- ``--runslow`` runs the tests marked ``@pytest.mark.slow`` (skipped otherwise).
- The summary ends with why tests were skipped, one line per reason (``pytest -q`` would give only a count).
- Every test runs torch with one intra-op thread (the models are tiny; more threads only cost time on a busy
  machine), and every test module starts with the objects alive then frozen out of the garbage collector's walks.
- ``plugin_free_python``: the one harness for remote-code tests. It runs a snippet in a Python that sees this
  environment's packages but not hf_geonorm, so whatever loads there loads as Hub remote code.
- The helpers more than one test file uses, imported from here (``from conftest import fails, train``): text to
  train on (``stdlib_text``, the ``data_file`` fixture), the command line as a user meets it (``invoke``,
  ``train``, ``train_in``, ``fails``, ``error_lines``), a folder's files (``contents``), a checkpoint with edited
  tensors (``edited_copy``) and a training run stopped by a real signal (``stopped_run``).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import queue
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Remote code is copied into the Hub modules cache under the folder's name, so two pytest-xdist workers loading
# folders of the same name would write the same files at once: each process gets its own cache, set before
# transformers reads the variable (and the user's cache is left alone).
MODULES_CACHE = tempfile.mkdtemp(prefix="hf-geonorm-test-modules-")
os.environ["HF_MODULES_CACHE"] = MODULES_CACHE
atexit.register(shutil.rmtree, MODULES_CACHE, ignore_errors=True)
# Tokenized training data is cached per test process too: the user's cache is left alone, and no test starts from
# blocks another run cached (a test that wants a warm cache makes it itself).
DATA_CACHE = tempfile.mkdtemp(prefix="hf-geonorm-test-data-")
os.environ["HF_GEONORM_DATA_CACHE"] = DATA_CACHE
atexit.register(shutil.rmtree, DATA_CACHE, ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers.dynamic_module_utils as dynamic_module_utils  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

# A folder with remote code loaded without trust_remote_code=True raises at once instead of waiting 15 s for an
# answer on stdin (here and in the plugin-free child below).
dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0


STDLIB = Path(sysconfig.get_paths()["stdlib"])


def stdlib_text(tmp_path_factory: pytest.TempPathFactory, *names: str) -> Path:
    """A new text file holding the standard library's files ``names`` one after the other: real text to train on."""
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text("".join((STDLIB / name).read_text() for name in names))
    return path


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    """A small text file to train on (textwrap.py of the standard library); test modules with other data define
    their own (with ``stdlib_text``)."""
    return stdlib_text(tmp_path_factory, "textwrap.py")


# ---- the command line, as a user meets it ----


def invoke(*args: object) -> Any:
    """``hf-geonorm ARGS`` in this process (click's CliRunner); its result, whatever the exit status."""
    from click.testing import CliRunner

    from hf_geonorm_cli.main import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


def train(*args: object) -> Any:
    """``hf-geonorm train ARGS``; its result, whatever the exit status."""
    return invoke("train", *args)


ONE_STEP = ["--seq-len", "64", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--max-steps", "1",
            "--eval-every", "1", "--eval-blocks", "8"]  # fmt: skip


def train_in(tmp_path: Path, data: Path | str, *more: object, name: str = "run") -> Any:
    """One training step on ``data`` (seq-len 64 blocks, evaluated once on 8 of them) into ``tmp_path / name``, with
    the data cache in ``tmp_path / "cache"``; its result, whatever the exit status."""
    return train("--data", data, *ONE_STEP, "--data-cache", tmp_path / "cache", "--output", tmp_path / name, *more)


def fails(*args: object, code: int | None = None) -> str:
    """A command that must fail with a one-line error, a non-zero exit (``code`` where given) and no traceback;
    returns that last line."""
    result = invoke(*args)
    assert result.exit_code != 0, result.output
    assert code is None or result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    last = result.output.rstrip().splitlines()[-1]
    assert last.startswith("Error:"), result.output
    return last


def error_lines(output: str) -> list[str]:
    """The ``Error: ...`` lines of the output (a progress bar may precede one on its line)."""
    return [line[line.index("Error:") :] for line in output.splitlines() if "Error:" in line]


def contents(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` by its relative path, with its bytes: equal before and after means untouched."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def edited_copy(source: Path, target: Path, edit: Callable[[dict[str, torch.Tensor]], object]) -> Path:
    """A copy of the checkpoint folder ``source`` whose tensors ``edit`` changed (a dict, in place)."""
    shutil.copytree(source, target)
    tensors = load_file(source / "model.safetensors")
    edit(tensors)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


# ---- a sweep's journal written by hand ----


def write_sweep_journal(path: Path, options: Any, runs: list[Any]) -> None:
    """``path`` (a runs.jsonl) as `hf-geonorm sweep` writes it for the runs of ``options`` (a ``TrainOptions``): its
    header with the sweep's identity measured as the sweep measures it (the data's source resolved, its tokenizer
    trained on the fly and cached where the tests cache data), then each run; a run given as a dict is completed
    with the identity fields it leaves out (its settings over the shared ones), a str is written as it is (any other
    value as its JSON)."""
    from hf_geonorm.training.data.prepare import data_request, data_source
    from hf_geonorm.training.sweep.record import sweep_header, sweep_identity

    source = data_source(data_request(options), lambda _: None)
    identity = sweep_identity(options, source.corpus.fingerprint, source.tokenizer_hash)
    facts = {"fingerprint": source.corpus.fingerprint, "tokenizer": source.tokenizer_hash}
    lines = [json.dumps(sweep_header(identity, {}))]
    for run in runs:
        if isinstance(run, dict):
            trained = run.get("val_loss") is not None
            completed = {"role": "grid", "train_options": identity["train_options"], "data": facts if trained else None,
                         "fingerprints": identity["fingerprints"], **run}  # fmt: skip
            if isinstance(run.get("settings"), dict):
                completed["settings"] = {**identity["settings"], **run["settings"]}
            run = completed
        lines.append(run if isinstance(run, str) else json.dumps(run))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


# ---- a training run stopped by a real signal ----

STOP_MARK = "STOPPED BEFORE WRITING"


def _stopping_child(args: list[str], stop_at_save: int, cwd: Path, out: int) -> None:
    """In a forked child: ``hf-geonorm train ARGS`` as the command runs it (its own stdout and stderr, the default
    signal handlers), with transformers' safetensors writer wrapped so that the ``stop_at_save``-th weights file
    announces itself on ``out`` and waits for the test's signal. Never returns."""
    code = 1
    try:
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # the child's own
        sys.stdin = open(os.devnull)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a new process's handlers, not the test runner's
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(cwd)
        os.environ.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"})
        import transformers.modeling_utils as modeling_utils

        from hf_geonorm_cli.main import cli

        calls, write = [0], modeling_utils.safe_save_file

        def save_file(*save_args: Any, **kwargs: Any) -> Any:  # the n-th weights file: say so, then wait
            calls[0] += 1
            if calls[0] == stop_at_save:
                print(STOP_MARK, save_args[1], flush=True)
                time.sleep(600)
            return write(*save_args, **kwargs)

        modeling_utils.safe_save_file = save_file
        cli(["train", *args])
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # shown in the output the test reads, as a child's traceback would be
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)  # no atexit handlers of the test process (they remove its caches)


def stopped_run(
    args: list[str], stop_at_save: int, sig: int, cwd: Path, before_signal: Callable[[], None] | None = None
) -> tuple[int, str]:
    """Run ``hf-geonorm train ARGS`` in a child process, send ``sig`` when it is about to write its
    ``stop_at_save``-th weights file (after calling ``before_signal``); return its exit status (minus the signal
    where one ended it, as ``subprocess`` gives it) and its output.

    The child is a fork of this process, so it starts with torch, transformers and the command already imported
    (a new interpreter spends most of a tiny run importing them); the signal is a real one, to a process of its own.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _stopping_child([str(a) for a in args], stop_at_save, cwd, write_end)
    os.close(write_end)
    output_file = open(read_end, errors="replace")  # closed below
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, output_file), lines.put(None)], daemon=True).start()

    def wait(seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        raise subprocess.TimeoutExpired("the stopped child", seconds)

    seen = []
    try:
        while (line := lines.get(timeout=300)) is not None:
            seen.append(line)
            if STOP_MARK in line:  # after a progress bar's carriage return, on the same line
                if before_signal is not None:
                    before_signal()
                os.kill(pid, sig)
                break
        status = wait(120)
    except (queue.Empty, subprocess.TimeoutExpired):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the child did not stop or end in time:\n" + "".join(seen)[-3000:]) from None
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    output_file.close()
    output = "".join(seen)
    assert STOP_MARK in output, f"the child ended before its weights file {stop_at_save}:\n{output[-3000:]}"
    return status, output


@pytest.fixture(autouse=True, scope="module")
def frozen_heap():
    """Each test module starts with the objects alive then moved out of the cyclic garbage collector's sight
    (``gc.freeze``), after a collection of those not yet frozen, so no garbage is kept. A full collection walks every
    object it sees, and the libraries and what earlier modules keep (their caches of models, the test items) grow to
    millions: seconds a walk. Trainer runs one at the end of every training run (accelerate's ``free_memory``),
    besides those Python starts itself. Nothing a test checks depends on it: frozen objects are still freed when
    their last reference goes (only a cycle of them that dies later is kept)."""
    gc.collect()
    gc.freeze()
    yield


SENTINEL_TEXT = "a file of the user's, which no test may remove"


@pytest.fixture(autouse=True)
def machine_left_alone(tmp_path_factory, monkeypatch):
    """Every test runs with ``HOME`` in a temporary folder and its working folder in another, so that a command that
    removes or replaces a folder by mistake (``~``, ``.``, ``$HOME/$UNSET``) can only reach temporary ones. After
    the test, a sentinel file in that home and one outside both must still be there."""
    root = tmp_path_factory.mktemp("machine")
    home, work, outside = root / "home", root / "work", root / "outside"
    for folder in (home, work, outside):
        folder.mkdir()
    sentinels = [home / "sentinel.txt", outside / "sentinel.txt"]
    for sentinel in sentinels:
        sentinel.write_text(SENTINEL_TEXT)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    yield
    for sentinel in sentinels:
        assert sentinel.is_file() and sentinel.read_text() == SENTINEL_TEXT, f"the test removed {sentinel}"


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


CHILD_PROLOGUE = '''
import importlib.abc, json, sys


class BlockThePlugin(importlib.abc.MetaPathFinder):
    """Refuses hf_geonorm even where it is installed as a regular package (not only as an editable hook)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("hf_geonorm", "hf_geonorm_cli"):
            raise ModuleNotFoundError(f"{name} is blocked in this test")


sys.meta_path.insert(0, BlockThePlugin())
import torch
import transformers.dynamic_module_utils

transformers.dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0  # no prompt: refuse at once
torch.set_num_threads(1)
job = json.loads(open(sys.argv[1]).read())
report, results = {}, {}
'''
CHILD_EPILOGUE = """
from safetensors.torch import save_file

report["hf_geonorm_imported"] = any(name.split(".")[0] == "hf_geonorm" for name in sys.modules)
save_file({f"{name}/{key}": value.contiguous() for name, values in results.items() for key, value in values.items()},
          sys.argv[2])
with open(sys.argv[3], "w") as out:
    json.dump(report, out)
"""


class PluginFreePython:
    """Runs code where hf_geonorm cannot be imported, with remote-code prompts off and stdin closed.

    ``run(code, job, workdir)`` executes ``code`` with ``job`` (JSON data) defined; the code fills ``report``
    (JSON data) and ``results`` (name -> {key: tensor}), which come back as ``(report, results)``. The run
    must exit 0 and must not have imported hf_geonorm.
    """

    def __init__(self, python: Path) -> None:
        self.python = python

    def run(
        self, code: str, job: dict, workdir: Path, env: dict[str, str] | None = None, timeout: int = 300
    ) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
        workdir.mkdir(parents=True, exist_ok=True)
        script, job_file = workdir / "child.py", workdir / "job.json"
        results_file, report_file = workdir / "results.safetensors", workdir / "report.json"
        script.write_text(CHILD_PROLOGUE + textwrap.dedent(code) + CHILD_EPILOGUE)
        job_file.write_text(json.dumps(job))
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        child_env.update({
            "HF_HOME": str(workdir / "hf_home"),
            "HF_MODULES_CACHE": str(workdir / "modules"),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": "",
            "TRANSFORMERS_VERBOSITY": "error",
        })  # fmt: skip
        child_env.update(env or {})
        done = subprocess.run(
            [str(self.python), str(script), str(job_file), str(results_file), str(report_file)],
            cwd=workdir,
            env=child_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads(report_file.read_text())
        assert not report.pop("hf_geonorm_imported"), "the plugin-free child imported hf_geonorm"
        results: dict[str, dict[str, torch.Tensor]] = {}
        for flat, value in load_file(results_file).items():
            name, _, key = flat.rpartition("/")
            results.setdefault(name, {})[key] = value
        return report, results


@pytest.fixture(scope="session")
def plugin_free_python(tmp_path_factory) -> PluginFreePython:
    """A venv without pip whose site directory points, by a .pth line, at this environment's site-packages:
    torch, transformers and peft import, but the editable-install hook of hf_geonorm never runs (.pth files
    inside directories named by a .pth line are not processed), and the child blocks the package besides."""
    root = tmp_path_factory.mktemp("plugin_free")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    target = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(target) / "geonorm_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return PluginFreePython(python)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run the tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """One line per reason tests were skipped, with its count: a bare "128 skipped" does not say what was left
    out (the slow tests, those that need a GPU or a package)."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_sep("-", "skipped, by reason")
        for reason, count in reasons.most_common():
            terminalreporter.write_line(f"{count:5d}  {reason}")
