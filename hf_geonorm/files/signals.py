"""Signals while output is written: SIGTERM raised as ``Terminated`` for a block (``terminate_raises``), so that its
cleanup runs, and never lost when Python swallows it (``raise_if_terminated``); SIGINT and SIGTERM held back during
the final moves of a folder (``signals_held``), so that a move is never cut in half."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(SystemExit):
    """SIGTERM arrived while an output folder was being written (the temporary folder is removed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


_TERMINATIONS: list[int] = []  # SIGTERMs raised as Terminated and not yet seen to propagate


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """Turn SIGTERM into ``Terminated`` for the block (main thread, default handler only), so cleanup runs. A
    signal handler raises wherever the main thread is, and Python ignores an exception raised inside a finalizer or
    a weakref callback: such a SIGTERM is raised again at ``raise_if_terminated`` (each training step) and when the
    block ends, so that it is never lost."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: object) -> None:
        _TERMINATIONS.append(signum)
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except Terminated:
        _TERMINATIONS.clear()
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise_if_terminated()


def raise_if_terminated() -> None:
    """Raise ``Terminated`` again for a SIGTERM whose first ``Terminated`` was swallowed (``terminate_raises``)."""
    if _TERMINATIONS:
        signum = _TERMINATIONS[-1]
        _TERMINATIONS.clear()
        raise Terminated(signum)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back during the final moves; they arrive, unchanged, right after."""
    held = {signal.SIGINT, signal.SIGTERM}
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
