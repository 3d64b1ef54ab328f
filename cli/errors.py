"""How the command line reports, for every command in one place (``GeoNormGroup``): the library's ``ValueError``s
become one-line ``Error: ...`` messages (a bad setting or option value a usage error, exit 2), its warnings
one-line ``warning: ...`` messages, Ctrl-C and SIGTERM exits 130 and 143, and unexpected exceptions one line with a
pointer to ``--debug``."""

from __future__ import annotations

import os
import signal
import sys
import warnings
from typing import Any

import click

from hf_geonorm.errors import first_line

from .options import option_words


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
            if _is_instance(error, "hf_geonorm._plumbing.signals", "Terminated"):
                raise _stopped(ctx, "terminated (SIGTERM)", signal.SIGTERM) from None
            raise
        except KeyboardInterrupt:
            raise _stopped(ctx, "interrupted", signal.SIGINT) from None
        except BrokenPipeError:  # e.g. `hf-geonorm architectures | head`
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(1)
        except Exception as error:
            if _is_users(error, ctx.invoked_subcommand):  # a message for the user
                raise user_error(error) from None
            if ctx.obj and ctx.obj.get("debug"):
                raise
            raise click.ClickException(
                f"{type(error).__name__}: {first_line(error)} (run with hf-geonorm --debug for the traceback)"
            ) from None


def cannot_write(output: str, error: OSError) -> click.ClickException:
    """The one-line error of an output that could not be written: one there already (with the way to replace it),
    or what the system said."""
    from hf_geonorm._plumbing.atomic import OutputExists

    if isinstance(error, OutputExists):
        return click.ClickException(f"{error.reason} (choose another folder, or pass --force to replace it)")
    if isinstance(error, FileExistsError):
        return click.ClickException(first_line(error))
    return click.ClickException(f"cannot write {output}: {error.strerror or first_line(error)}")


# Where a command says what a stop leaves behind (``ctx.meta``, shared by the group's and the command's contexts):
# the words after "interrupted" or "terminated (SIGTERM)"
LEFT_BEHIND = "hf_geonorm.left_behind"


def _stopped(ctx: click.Context, what: str, signum: int) -> click.ClickException:
    """Ctrl-C or SIGTERM as the one-line error and the exit status a shell gives a process the signal ends."""
    stopped = click.ClickException(what + ctx.meta.get(LEFT_BEHIND, "; no partial output is left"))
    stopped.exit_code = 128 + signum
    return stopped


# Commands that run a training job: a ValueError raised anywhere in one is the user's (their data, model and
# options), not only one raised by hf_geonorm's own code
TRAINING_JOBS = ("train", "sweep")


def _is_users(error: BaseException, command: str | None) -> bool:
    """Whether ``error`` is a mistake to report to the user in one line, not a failure to debug (a job whose extra
    is not installed is one)."""
    if _is_instance(error, "hf_geonorm.errors", "MissingExtraError"):
        return True
    if isinstance(error, ValueError) and command in TRAINING_JOBS:
        return True
    return isinstance(error, (ValueError, OSError)) and _raised_by_library(error)


def user_error(error: BaseException) -> click.ClickException:
    """The one-line error of a user's mistake: a value given on the command line (a setting, or an option outside
    its declared limits) a usage error, exit 2, naming it as its option; a perplexity that is not finite names the
    model's settings as options; anything else as the library words it (a setting read from a config.json keeps
    its field name and names the file), exit 1."""
    if _is_instance(error, "hf_geonorm.errors", "SettingsError") or _is_instance(
        error, "hf_geonorm._plumbing.declarations", "OptionError"
    ):
        return click.UsageError(option_words(first_line(error)))
    if _is_instance(error, "hf_geonorm.errors", "NonFiniteError"):
        return click.ClickException(option_words(first_line(error, limit=600)))
    return click.ClickException(first_line(error, limit=600))


def _raised_by_library(error: BaseException) -> bool:
    """Whether ``error`` was raised in hf_geonorm's own code (its messages name the file and the fix), not deeper
    down in torch or transformers."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(tb.tb_frame.f_globals.get("__name__", "")).startswith("hf_geonorm.")
