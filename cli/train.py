"""``hf-geonorm train``: a thin command over transformers' Trainer (hf_geonorm.training.run.trainer). Its options are
generated from ``hf_geonorm.training.options.TrainOptions``, where each is declared once."""

from __future__ import annotations

from typing import Any

import click

from .errors import first_line
from .options import _option_words, declared_options, given, pop_settings


@click.command()
@declared_options("TrainOptions", command="train")
def train(**kwargs: Any) -> None:
    """Train a GeoNorm model with transformers' Trainer.

    With no arguments: a tiny GeoNorm GPT-2 on the Python standard library's own source files (no download),
    a few minutes on a CPU. Writes checkpoints (they reload through the Auto classes and resume), the final
    model with its remote code, metrics.json and loss_curve.png to --output.
    """
    settings = pop_settings(kwargs)
    from hf_geonorm.training.options import TrainOptions
    from hf_geonorm.training.run.trainer import run_training

    run_checked(lambda: run_training(TrainOptions(settings=settings, **given(kwargs)).validate(), log=click.echo))


def run_checked(run: Any) -> Any:
    """Run a training job: the library's mistakes as one-line errors (a setting as a usage error, exit 2); Ctrl-C
    and SIGTERM stop it wherever they land, also where Python swallows their exception (``signals_stop_the_job``:
    at the job's next step, evaluation, save or run)."""
    from hf_geonorm.errors import NonFiniteError, SettingsError
    from hf_geonorm.files.signals import signals_stop_the_job
    from hf_geonorm.training.options import OptionError

    try:
        with signals_stop_the_job():
            return run()
    except (SettingsError, OptionError) as error:  # a value given on the command line: named as its option
        raise click.UsageError(_option_words(first_line(error))) from None
    except NonFiniteError as error:  # names the model's settings, as perplexity does
        raise click.ClickException(_option_words(first_line(error, limit=600))) from None
    except ValueError as error:  # settings from a config.json keep their field names and name the file
        raise click.ClickException(first_line(error, limit=600)) from None
