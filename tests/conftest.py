"""Shared pytest setup: ``--runslow`` runs the tests marked ``@pytest.mark.slow`` (skipped otherwise), and every
test runs torch with one intra-op thread (the models are tiny; more threads only cost time on a busy machine)."""

from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def isolated_python(tmp_path_factory):
    """A Python with this environment's packages but without hf_geonorm (a venv whose .pth points at our
    site-packages, so the plugin's editable-install hook never runs): where remote code is tested."""
    root = tmp_path_factory.mktemp("isolated")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    target = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (Path(target) / "geonorm_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run the tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
