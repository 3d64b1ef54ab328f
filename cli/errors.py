"""How the command line reports: the library's ``ValueError``s become one-line ``Error: ...`` messages (a bad
setting a usage error, exit 2), its warnings one-line ``warning: ...`` messages, and unexpected exceptions
one line with a pointer to ``--debug``. Imports nothing heavy, so ``--help`` stays fast."""

from __future__ import annotations

import os
import signal
import sys
import warnings
from typing import Any

import click

from .library import library_module
from .options import _option_words as option_words

first_line = library_module("errors").first_line  # the library's, read without importing torch


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    click.echo(f"warning: {first_line(Warning(str(message)), limit=600)}", err=True)


def _is_instance(error: BaseException, module: str, name: str) -> bool:
    """isinstance against a library class, without importing the library (and torch) when it is not loaded."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(error, getattr(loaded, name))


class GeoNormGroup(click.Group):
    """Turns the library's errors into one-line messages, and unexpected exceptions too unless debugging."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning
                return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except SystemExit as error:
            if _is_instance(error, "hf_geonorm.files.signals", "Terminated"):
                stopped = click.ClickException("terminated (SIGTERM); no partial output is left")
                stopped.exit_code = 128 + signal.SIGTERM
                raise stopped from None
            raise
        except KeyboardInterrupt:
            stopped = click.ClickException("interrupted; no partial output is left")
            stopped.exit_code = 128 + signal.SIGINT
            raise stopped from None
        except BrokenPipeError:  # e.g. `hf-geonorm architectures | head`
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        except Exception as error:
            if isinstance(error, (ValueError, OSError)) and _raised_by_library(error):  # a message for the user
                if _is_instance(error, "hf_geonorm.errors", "SettingsError"):
                    raise click.UsageError(option_words(first_line(error))) from None
                if _is_instance(error, "hf_geonorm.errors", "NonFiniteError"):
                    raise click.ClickException(option_words(first_line(error, limit=600))) from None
                raise click.ClickException(first_line(error, limit=600)) from None
            if ctx.obj and ctx.obj.get("debug"):
                raise
            raise click.ClickException(
                f"{type(error).__name__}: {first_line(error)} (run with hf-geonorm --debug for the traceback)"
            ) from None


def _raised_by_library(error: BaseException) -> bool:
    """Whether ``error`` was raised in hf_geonorm's own code (its messages name the file and the fix), not deeper
    down in torch or transformers."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("hf_geonorm.")
