"""``hf-geonorm train``: a thin command over transformers' Trainer (hf_geonorm.training.run.trainer). Its options are
generated from ``hf_geonorm.training.options.TrainOptions`` and ``GeoNormSettings``, where each is declared once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from hf_geonorm.training.options import TrainOptions

from .options import options_from, pop_settings, settings_options


@click.command()
@options_from(TrainOptions)
@settings_options
def train(**kwargs: Any) -> None:
    """Train a GeoNorm model with transformers' Trainer.

    With no arguments: a tiny GeoNorm GPT-2 on the Python standard library's own source files (no download),
    a few minutes on a CPU. Writes checkpoints (they reload through the Auto classes and resume), the final
    model with its remote code, metrics.json and loss_curve.png to --output.
    """
    settings = pop_settings(kwargs)
    from hf_geonorm.training.run.trainer import run_training

    run_job(lambda: run_training(TrainOptions(settings=settings, **kwargs).validate(), log=click.echo))
    leave_process_group()


def leave_process_group() -> None:
    """Under torchrun, leave the process group accelerate opened once the run has finished: left to the interpreter's
    exit, a process could abort there (SIGABRT, "terminate called without an active exception") after writing all
    its results, and torchrun would report the run failed. Not after an error: the process is leaving anyway."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run_job(run: Callable[[], Any]) -> Any:
    """Run a training job so that Ctrl-C and SIGTERM stop it wherever they land, also where Python swallows their
    exception (``signals_stop_the_job``: at the job's next step, evaluation, save or run); its errors reach the
    user as every command's do (``errors.GeoNormGroup``)."""
    from hf_geonorm._plumbing.signals import signals_stop_the_job

    with signals_stop_the_job():
        return run()
