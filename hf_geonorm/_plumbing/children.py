"""What a child process inherits when it starts: environment variables set in this process for the moment it
starts one (a sweep's workers, a tokenizing pool), and put back as they were afterwards."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def environment_set(values: dict[str, str]) -> Iterator[None]:
    """``values`` set in this process's environment for the block (a child started in it inherits them); each name
    gets back its earlier value, or is removed where it had none."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
