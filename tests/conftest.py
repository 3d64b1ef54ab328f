"""Shared pytest setup: fixtures and hooks only (the helpers test files share are in tests/support/helpers.py).

- ``pytest -q`` runs on two pytest-xdist workers (``addopts`` in pyproject.toml); ``-n 0`` runs in one process.
- ``--runslow`` runs the tests marked ``@pytest.mark.slow`` (skipped otherwise).
- The summary ends with why tests were skipped, one line per reason (``pytest -q`` would give only a count).
- The tests run against an install of the project (``pip install -e ".[dev]"``, as .ci/run does): the command line
  (``cli/``) and the card template (``model_cards/``) import under their installed names only, so a run where they
  would come from another install than ``hf_geonorm`` stops at once, saying so (``pytest_configure``).
- Every test runs torch with one intra-op thread (the models are tiny; more threads only cost time on a busy
  machine), and every test module starts with the objects alive then frozen out of the garbage collector's walks.
- Every test runs with ``HOME`` and its working folder in temporary folders (``machine_left_alone``).
- ``plugin_free_python``: the one harness for remote-code tests. It runs a snippet in a Python that sees this
  environment's packages but not hf_geonorm, so whatever loads there loads as Hub remote code.
- ``data_file``: a small text file to train on; ``stock_llama``: a saved stock tiny LLaMA; ``short_run``: a
  four-step run of `hf-geonorm train` (both made once per test process).
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import site
import subprocess
import sys
import tempfile
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

from support.helpers import SHORT_RUN, PluginFreePython, stdlib_text, succeeds  # noqa: E402

# A folder with remote code loaded without trust_remote_code=True raises at once instead of waiting 15 s for an
# answer on stdin (here and in the plugin-free child of helpers.PluginFreePython).
dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0


def pytest_configure(config: pytest.Config) -> None:
    """Stop, naming the fix, unless the command line and the card template come from the same install as the
    ``hf_geonorm`` imported here (this checkout installed editable, or one wheel): ``PYTHONPATH=.`` alone finds the
    library only, and would test it with another install's command line, or none."""
    import importlib.util

    import hf_geonorm

    library = Path(hf_geonorm.__file__).resolve().parent
    found = {name: importlib.util.find_spec(name) for name in ("hf_geonorm_cli", "hf_geonorm.model_cards")}
    places = {name: Path(spec.origin).resolve().parent if spec and spec.origin else None
              for name, spec in found.items()}  # fmt: skip
    beside = {  # an editable install of a checkout, or an installed wheel
        "hf_geonorm_cli": (library.parent / "cli", library.parent / "hf_geonorm_cli"),
        "hf_geonorm.model_cards": (library.parent / "model_cards", library / "model_cards"),
    }
    strays = [f"{name} from {places[name]}" for name in found if places[name] not in beside[name]]
    if strays:
        raise pytest.UsageError(
            f"the tests need the hf_geonorm of {library.parent} installed (pip install -e \".[dev]\" there), but found "
            + ", ".join(strays)
        )


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    """A small text file to train on (textwrap.py of the standard library); test modules with other data define
    their own (with ``stdlib_text``)."""
    return stdlib_text(tmp_path_factory, "textwrap.py")


@pytest.fixture(scope="session")
def stock_llama(tmp_path_factory) -> Path:
    """A saved stock tiny LLaMA, as a user downloads one."""
    from support.tiny_models import tiny_model

    folder = tmp_path_factory.mktemp("stock") / "llama"
    tiny_model("llama").save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def short_run(tmp_path_factory) -> tuple[Path, str]:
    """A short run as a new user makes one: 4 steps, evaluated at step 0, at the end and on test; its output folder
    and what it printed."""
    data = stdlib_text(tmp_path_factory, "json/decoder.py", "textwrap.py")
    out = tmp_path_factory.mktemp("runs") / "run"
    output = succeeds("train", "--data", data, *SHORT_RUN, "--max-steps", 4, "--output", out)
    return out, output


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
