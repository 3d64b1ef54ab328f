"""The sweep tests' corpus: three files of the standard library, written once per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.helpers import STDLIB


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sweep-corpus") / "text.txt"
    path.write_text("".join((STDLIB / name).read_text() for name in ("textwrap.py", "shlex.py", "string.py")))
    return path
