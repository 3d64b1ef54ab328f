"""Shared pytest setup.

- ``pytest -q`` runs on two pytest-xdist workers (``addopts`` in pyproject.toml); ``-n 0`` runs in one process.
- ``--runslow`` runs the tests marked ``@pytest.mark.slow`` (skipped otherwise).
- The summary ends with why tests were skipped, one line per reason (``pytest -q`` would give only a count).
- Every test runs torch with one intra-op thread (the models are tiny; more threads only cost time on a busy
  machine).
- ``plugin_free_python``: the one harness for remote-code tests. It runs a snippet in a Python that sees this
  environment's packages but not hf_geonorm, so whatever loads there loads as Hub remote code.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import textwrap
from collections import Counter
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
from safetensors.torch import load_file  # noqa: E402

# A folder with remote code loaded without trust_remote_code=True raises at once instead of waiting 15 s for an
# answer on stdin (here and in the plugin-free child below).
dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    """A small text file to train on (textwrap.py of the standard library); test modules with other data define
    their own."""
    import sysconfig

    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text((Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text())
    return path


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
