"""``hf-geonorm sweep``: a grid of norm styles x learning rates x seeds, each run as ``hf-geonorm train`` runs it
(hf_geonorm.sweep.grid). Its options are ``SweepOptions``, ``EngineOptions`` and the ``TrainOptions`` and
GeoNorm settings that the grid does not set, generated from their one declaration."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import click

from hf_geonorm.sweep.engine_options import EngineOptions
from hf_geonorm.sweep.options import NOT_SWEPT, SweepOptions

from .errors import LEFT_BEHIND
from .options import GeoNormSettings, given, options_from, pop_settings
from .train import TrainOptions, run_job


@click.command()
@options_from(SweepOptions, EngineOptions)
@options_from(TrainOptions, leave_out=NOT_SWEPT)
@options_from(GeoNormSettings, overrides=True, leave_out=("norm_style",))  # --styles sets it
def sweep(**kwargs: Any) -> None:
    """Is GeoNorm better than Pre-Norm on this data, and at which learning rate and warm-up?

    Tunes every style (and --alphas for geo) on one rule, as `hf-geonorm train` would run each: its own rates at two
    warm-up shares, a rate beyond an edge (--extend) and the next share (--warmup-shares) while its best cell sits
    at one, chosen on validation, then three seeds at the chosen cell (--confirm-seeds); one run after the other (or
    --workers at once, or on every machine sharing a --storage). Appends each finished run to OUTPUT/runs.jsonl
    (the same command again trains only the runs that are missing) and writes OUTPUT/sweep.md and sweep.png: the
    loss at every cell, each style's chosen cell, and the styles compared there on test. --warmup-steps fixes the
    warm-up, --confirm-seeds none runs one seed: the report then says first what was not tuned.
    """
    settings = pop_settings(kwargs)
    sweep_values = {spec.name: kwargs.pop(spec.name) for spec in dataclasses.fields(SweepOptions)}
    engine_values = {spec.name: kwargs.pop(spec.name) for spec in dataclasses.fields(EngineOptions)}
    from hf_geonorm.sweep.engine import sweep_on

    options = SweepOptions(**sweep_values)
    click.get_current_context().meta[LEFT_BEHIND] = (
        f": the finished runs are in {options.output}/runs.jsonl, and the run that was training left no checkpoint "
        "(a sweep resumes by whole runs); the same command again trains the runs that are missing"
    )
    train = TrainOptions(settings=settings, **kwargs)
    run_job(lambda: sweep_on(EngineOptions(**engine_values), options, train, log=timestamped,
                             given=given(sweep_values)))  # fmt: skip


def timestamped(line: str) -> None:
    """A line of the sweep's log, with the time it was written (a sweep runs for hours)."""
    click.echo(f"{time.strftime('%H:%M:%S')} {line}")
