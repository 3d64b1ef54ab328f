"""A full device, in the forms its writers report it: an ``OSError`` ENOSPC, or the system's words in the own
exception types of safetensors' writer (a ``SafetensorError``) and torch; and the one translation of the latter into
the former, so that every command names a full device alike."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator


def is_full_device(error: BaseException) -> bool:
    """Whether ``error`` reports a full device: an ``OSError`` ENOSPC, or the same reported by safetensors' writer
    (a ``SafetensorError``) or torch, which raise their own types with the system's words."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    return "No space left on device" in str(error) or "os error 28" in str(error)


@contextlib.contextmanager
def full_device_as_os_error() -> Iterator[None]:
    """Raise a full device that safetensors' writer or torch reports in their own exception types (a
    ``SafetensorError`` with the system's words) as the ``OSError`` ENOSPC every other write raises, so that the
    command line names it as it names any full device: ``cannot write OUTPUT_DIR: No space left on device``."""
    try:
        yield
    except Exception as error:
        if isinstance(error, OSError) or not is_full_device(error):
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from None
