"""Signals while a job runs and while output is written:

- ``signals_stop_the_job``: around a job (``hf-geonorm train`` and ``sweep`` run theirs in it), SIGINT raises
  ``KeyboardInterrupt`` and SIGTERM ``Terminated`` wherever they land, so that cleanup runs, and each is recorded:
  Python swallows an exception raised inside a finalizer or a weakref callback (it prints "Exception ignored in:
  ..." and goes on), so the job calls ``raise_if_signalled`` at its safe points (each training step, evaluation and
  save; between a sweep's runs) and the block does when it ends: a swallowed signal still stops the job, and
  without that report;
- ``terminate_raises``: SIGTERM alone, for a block that writes a folder (so that its temporary folder is removed);
- ``signals_held``: SIGINT and SIGTERM held back during the final moves of a folder, so that a move is never cut
  in half.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

# Python's own handlers: a handler of this module replaces only these (never one the program set itself)
DEFAULT_HANDLERS: dict[int, Any] = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class Terminated(SystemExit):
    """SIGTERM arrived while a job ran or an output folder was being written (the temporary folder is removed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


_RECEIVED: list[int] = []  # signals a handler of this module raised for, in the block that installed it


def stop_for(signum: int) -> BaseException:
    """The exception that stops the job for ``signum``: ``KeyboardInterrupt`` for SIGINT, as Python's own."""
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _raise_for_signal(signum: int, frame: object) -> None:
    _RECEIVED.append(signum)
    raise stop_for(signum)


def raise_if_signalled() -> None:
    """Raise again the stop of a signal that arrived in the block (``signals_stop_the_job``, ``terminate_raises``);
    once raised, it is no longer pending."""
    if _RECEIVED:
        signum = _RECEIVED[-1]
        _RECEIVED.clear()
        raise stop_for(signum)


def _quiet_when_signalled(report: Callable[[Any], None], unraisable: Any) -> None:
    """``sys.unraisablehook`` in the block: the stop that a signal raised where Python swallows exceptions is not
    reported (with a traceback) but raised again at the next safe point; anything else is reported as before."""
    if _RECEIVED and unraisable.exc_type is not None and issubclass(unraisable.exc_type, (KeyboardInterrupt,
                                                                                          Terminated)):  # fmt: skip
        return
    report(unraisable)


@contextlib.contextmanager
def _raising(signums: tuple[int, ...]) -> Iterator[None]:
    """Raise the stop of each of ``signums`` still at Python's default handler for the block (main thread only,
    where handlers run), recorded; raise a swallowed one again when the block ends. Nested blocks leave the
    signals an outer one took to it."""
    taken = [s for s in signums if signal.getsignal(s) == DEFAULT_HANDLERS[s]]
    if threading.current_thread() is not threading.main_thread() or not taken:
        yield
        return
    report = sys.unraisablehook
    for signum in taken:
        signal.signal(signum, _raise_for_signal)
    sys.unraisablehook = lambda unraisable: _quiet_when_signalled(report, unraisable)
    try:
        yield
        raise_if_signalled()
    finally:
        for signum in taken:
            signal.signal(signum, DEFAULT_HANDLERS[signum])
        sys.unraisablehook = report
        _RECEIVED.clear()  # raised, or superseded by the exception that ends the block


def signals_stop_the_job() -> contextlib.AbstractContextManager[None]:
    """SIGINT and SIGTERM stop the job (a training run, a sweep) wherever they land: raised at once and, when
    Python swallowed that, at the job's next ``raise_if_signalled`` or when the block ends."""
    return _raising((signal.SIGINT, signal.SIGTERM))


def terminate_raises() -> contextlib.AbstractContextManager[None]:
    """Turn SIGTERM into ``Terminated`` for the block, so that cleanup runs (raised again when the block ends where
    Python swallowed it)."""
    return _raising((signal.SIGTERM,))


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
