"""The GeoNorm settings as click options, shared by ``convert``, ``init``, ``angles``, ``perplexity`` and ``train``.

The choices are spelled out here (``tests/test_cli.py`` checks them against ``hf_geonorm``) so that
``hf-geonorm --help`` answers without importing torch and transformers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import click

NORM_STYLES = ("pre", "post", "sandwich", "deepnorm", "geo")
DECAYS = ("harmonic", "sqrt", "linear", "constant")
RADII = ("embedding", "sqrt_d")
CLAMPS = ("both", "final")
BRIDGE_ORDERS = ("together", "last-first")  # hf_geonorm.training.options.BRIDGE_ORDERS
DTYPES = ("auto", "float32", "bfloat16", "float16")
NO_CLAMP = "none"
PRESET_NAMES = ("tiny", "125m", "350m", "760m", "1.3b")  # hf_geonorm.training.presets.PRESETS, without importing torch


class AlphaType(click.ParamType):
    """A number, or a comma-separated list of numbers (one step size per layer)."""

    name = "FLOAT|LIST"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float, list)):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        if len(parts) > 1 and not all(parts):
            self.fail(f"{value!r} has an empty item; give numbers separated by single commas (e.g. 1,0.5,0.33)", param,
                      ctx)  # fmt: skip
        parts = [p for p in parts if p]
        try:
            numbers = [float(p) for p in parts]
        except ValueError:
            self.fail(
                f"{value!r} is not a number or a comma-separated list of numbers (e.g. 1.0 or 1,0.5,0.33)", param, ctx
            )
        if not numbers:
            self.fail("give a number or a comma-separated list of numbers", param, ctx)
        for number in numbers:
            if not math.isfinite(number) or number < 0:
                self.fail(f"step sizes must be finite numbers >= 0; got {number}", param, ctx)
        return numbers[0] if len(numbers) == 1 and "," not in str(value) else numbers


class MaxAngleType(click.ParamType):
    """Radians in (0, pi], written as a number, ``pi``, ``pi/N``, or ``none`` for no clamp."""

    name = "RAD|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float) or value == NO_CLAMP:
            return value
        text = str(value).strip().lower()
        if text in ("none", "off", "inf"):
            return NO_CLAMP
        match = re.fullmatch(r"(\d*\.?\d*)\s*\*?\s*pi(?:\s*/\s*(\d+\.?\d*))?", text)
        try:
            if match:
                factor = float(match.group(1)) if match.group(1) else 1.0
                angle = factor * math.pi / (float(match.group(2)) if match.group(2) else 1.0)
            else:
                angle = float(text)
        except (ValueError, ZeroDivisionError):
            self.fail(f"{value!r} is not an angle in radians (e.g. 0.785, pi/4) or 'none'", param, ctx)
        if not (0 < angle <= math.pi):
            self.fail(f"the max angle must be in (0, pi] radians, or 'none'; got {value}", param, ctx)
        return angle


SETTING_OPTIONS = {
    # option name -> GeoNormSettings field
    "norm_style": "norm_style",
    "decay": "geo_decay",
    "alpha": "geo_alpha",
    "max_angle": "geo_max_angle",
    "clamp": "geo_clamp",
    "radius": "geo_radius",
    "learnable_step": "geo_learnable_step",
    "bridge": "geo_bridge",
    "first_token_prenorm": "geo_first_token_prenorm",
}


def _setting_options(show_defaults: bool) -> list[Callable]:
    def note(text: str) -> str:
        return text if show_defaults else re.sub(r" \[default: [^\]]*\]$", "", text)

    return [
        click.option(
            "--norm-style",
            type=click.Choice(NORM_STYLES),
            help=note(
                "Residual update of every block: geo (GeoNorm), pre (stock Pre-Norm), post, sandwich, deepnorm. "
                "[default: geo]"
            ),
        ),
        click.option(
            "--decay",
            type=click.Choice(DECAYS),
            help=note(
                "Layer-wise step-size schedule a_k: harmonic a/k, sqrt a/sqrt(k), linear a(T+1-k)/T, constant a. "
                "[default: harmonic]"
            ),
        ),
        click.option(
            "--alpha",
            type=AlphaType(),
            help=note(
                "Base step size a, or a comma-separated list of T per-layer (or 2T per-update) step sizes (used as "
                "given). [default: 0.5]"
            ),
        ),
        click.option(
            "--max-angle",
            type=MaxAngleType(),
            help=note("Clamp on each rotation, in radians (a number, pi/4, ...) or 'none'. [default: pi/4]"),
        ),
        click.option(
            "--clamp",
            type=click.Choice(CLAMPS),
            help=note(
                "What --max-angle clamps: both the base angle |t|/|x| and the final angle (the paper's rule), or "
                "the final angle only (for small calibrated steps). [default: both]"
            ),
        ),
        click.option(
            "--radius",
            type=click.Choice(RADII),
            help=note("Sphere radius: each token's embedding norm, or sqrt(hidden_size). [default: embedding]"),
        ),
        click.option(
            "--learnable-step/--no-learnable-step",
            default=None,
            help=note("Give every sublayer a learnable scale and bias on its angle. [default: off]"),
        ),
        click.option(
            "--bridge",
            type=click.FloatRange(0.0, 1.0),
            help=note(
                "0 = exact Pre-Norm (the source model's outputs), 1 = pure GeoNorm; in between interpolates. "
                "[default: 1.0]"
            ),
        ),
        click.option(
            "--first-token-prenorm/--no-first-token-prenorm",
            default=None,
            help=note(
                "The first token of each sequence (position id 0) takes the Pre-Norm update x + u, for models "
                "converted from Pre-Norm. [default: off]"
            ),
        ),
    ]


def settings_options(func: Callable) -> Callable:
    """Add one option per GeoNorm setting; unset options stay None (the command fills in the defaults, or the
    current settings of a GeoNorm source)."""
    for option in reversed(_setting_options(show_defaults=True)):
        func = option(func)
    return func


def preview_settings_options(func: Callable) -> Callable:
    """The setting options of commands that run a model as it is unless told to convert it in memory."""
    for option in reversed(_setting_options(show_defaults=False)):
        func = option(func)
    return func


def pop_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the setting options from a command's kwargs; return the given ones as GeoNormSettings fields."""
    given = {}
    for option, setting in SETTING_OPTIONS.items():
        value = kwargs.pop(option, None)
        if value is None:
            continue
        given[setting] = None if value == NO_CLAMP else value
    return given


def _option_words(message: str) -> str:
    """Name the command-line options in a library message about settings (and the dtype)."""
    for option, setting in SETTING_OPTIONS.items():
        message = re.sub(rf"\b{setting}\b", f"--{option.replace('_', '-')}", message)
    return message.replace("use dtype ", "use --dtype ")
