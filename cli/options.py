"""The click options of the commands: the GeoNorm settings, shared by ``convert``, ``init``, ``angles``,
``perplexity``, ``train`` and ``sweep``, and the options of ``train`` and ``sweep`` generated from their one
declaration (``hf_geonorm.training.options``).

The settings' choices are spelled out here (``tests/test_cli.py`` checks them against ``hf_geonorm``), and the
declaration is read from its file without importing the package (``declarations``), so that ``hf-geonorm --help``
answers without importing torch and transformers.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import click

from .library import library_module

NORM_STYLES = ("pre", "post", "sandwich", "deepnorm", "geo")
DECAYS = ("harmonic", "sqrt", "linear", "constant")
RADII = ("embedding", "sqrt_d")
CLAMPS = ("both", "final")
DTYPES = ("auto", "float32", "bfloat16", "float16")
NO_CLAMP = "none"


def declarations() -> ModuleType:
    """``hf_geonorm/training/options.py`` (``TrainOptions``, ``SweepOptions``) read from its file (``library``), for
    a ``--help`` without torch. The commands build the library's own classes from the values."""
    return library_module("training/options")


PRESET_NAMES = declarations().PRESET_NAMES


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


class ListType(click.ParamType):
    """A comma-separated list of values of one type: ``2e-3,4e-3``."""

    def __init__(self, item: type) -> None:
        self.item, self.name = item, f"{item.__name__.upper()},..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        if not all(parts):
            self.fail(f"{value!r} has an empty item; give values separated by single commas", param, ctx)
        try:
            items = tuple(self.item(part) for part in parts)
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of {self.item.__name__} values", param, ctx)
        if self.item is float and not all(math.isfinite(item) for item in items):
            self.fail(f"{value!r} holds a value that is not a finite number", param, ctx)
        return items


class FiniteFloatRange(click.FloatRange):
    """A number in the range, never NaN or infinite (a NaN passes every comparison of ``click.FloatRange``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


VALUE_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def option_help(form: dict[str, Any], default: Any) -> str:
    """An option's help as ``--help`` shows it: the declared help and its default (none for a switch)."""
    if form.get("flag") or "flag_values" in form:
        return form["help"]
    text = form.get("default_text", default)
    if text is None:
        return form["help"]
    if isinstance(text, tuple):
        text = ",".join(map(str, text))
    return f"{form['help']} [default: {text}]"


def _value_type(annotation: str, form: dict[str, Any]) -> Any:
    if "items" in form:
        return ListType(form["items"])
    if "pair" in form:
        return form["pair"]
    if "choices" in form:
        return click.Choice(form["choices"])
    if "folder" in form:
        return click.Path(exists=form["folder"] == "existing", file_okay=False)
    kind = VALUE_TYPES[annotation.split("|")[0].strip()]
    if "minimum" in form or "maximum" in form:
        limits = {
            "min": form.get("minimum"), "max": form.get("maximum"),
            "min_open": form.get("min_open", False), "max_open": form.get("max_open", False),
        }  # fmt: skip
        return click.IntRange(**limits) if kind is int else FiniteFloatRange(**limits)
    return FiniteFloatRange() if kind is float else kind


def _one_switch(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """The value of the switches that set one field (``--bf16``, ``--fp16``), collected by click as a tuple: two
    that differ are refused (click would keep the last without a word)."""
    if value is None or isinstance(value, str):
        return value
    if len(set(value)) > 1:
        flags = [opt for other in ctx.command.params if other.name == param.name for opt in other.opts]
        raise click.UsageError(f"{' and '.join(flags)} exclude each other: give one", ctx)
    return value[0] if value else None


def field_options(field: dataclasses.Field, form: dict[str, Any], default: Any) -> list[Callable]:
    """The click options of one declared field (several for a field set by switches, e.g. ``--bf16``)."""
    if "flag_values" in form:
        return [
            click.option(flag, field.name, flag_value=value, multiple=True, callback=_one_switch,
                         help=f"{form['help']} ({flag}: {value})")  # fmt: skip
            for flag, value in form["flag_values"].items()
        ]
    name = form.get("name", "--" + field.name.replace("_", "-"))
    help_text = option_help(form, default)
    if form.get("flag"):
        return [click.option(name, field.name, is_flag=True, default=None, help=help_text)]
    extra: dict[str, Any] = {"nargs": 2} if "pair" in form else {}
    if "optional_value" in form:  # the option given alone takes this value: `--extend` or `--extend 3`
        extra |= {"is_flag": False, "flag_value": form["optional_value"]}
    metavar = {"metavar": form["metavar"]} if "metavar" in form else {}
    value_type = _value_type(field.type, form)
    return [click.option(name, field.name, type=value_type, default=None, help=help_text, **extra, **metavar)]


def declared_options(*names: str, command: str) -> Callable:
    """Decorate a command with the options of the declarations ``names`` (``TrainOptions``, ``SweepOptions`` of
    ``hf_geonorm.training.options``), in their order, the GeoNorm settings' options after ``--preset``; the
    fields ``sweep`` does not take are left out of it. Every option defaults to None, so that only what the user
    gave reaches the declaration (``given``) and its defaults apply: they are written once, in the declaration."""
    decorators: list[Callable] = []
    for name in names:
        for field, form, default in declared_fields(getattr(declarations(), name)):
            if command == "sweep" and form.get("sweep") is False:
                continue
            decorators.extend(field_options(field, form, default))
            if field.name == "preset":
                decorators.append(settings_options)

    def decorate(func: Callable) -> Callable:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


def declared_fields(declaration: type) -> list[tuple[dataclasses.Field, dict[str, Any], Any]]:
    """The fields of a declaration that are options: each with its option metadata and its default (a
    ``default_factory`` field: the factory's value now)."""
    declared = []
    for spec in dataclasses.fields(declaration):
        if "option" in spec.metadata:
            factory = spec.default_factory
            default = factory() if factory is not dataclasses.MISSING else spec.default
            declared.append((spec, spec.metadata["option"], default))
    return declared


def given(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The options the user gave (the others are None: the declaration's defaults apply)."""
    return {name: value for name, value in kwargs.items() if value is not None}
