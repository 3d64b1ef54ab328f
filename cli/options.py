"""The click options of every command, generated from their one declaration (the only ``click.option`` calls of
the command line): the GeoNorm settings' (``hf_geonorm.modeling.settings``), shared by ``convert``, ``init``,
``angles``, ``perplexity``, ``train`` and ``sweep``; the options of ``train`` and ``sweep``
(``hf_geonorm.training.options``: ``declared_options``); those of the other commands (``convert``'s
``ConversionOptions``, ``command_options.py``: ``command_options``).

"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import click

from hf_geonorm._plumbing import declarations as library_declarations
from hf_geonorm.modeling import settings as library_settings
from hf_geonorm.sweep.engine_options import EngineOptions
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.training.options import TrainOptions

NO_CLAMP = "none"


# The declarations of the commands' options, by name.
DECLARATIONS = {"TrainOptions": TrainOptions, "SweepOptions": SweepOptions, "EngineOptions": EngineOptions}


def declarations() -> ModuleType:
    """``hf_geonorm._plumbing.declarations``: how a field declares its option, and the limits checked alike by the
    API."""
    return library_declarations


def declaration(name: str) -> type:
    """The declaration ``name`` of ``DECLARATIONS`` (``TrainOptions``, ``SweepOptions``)."""
    return DECLARATIONS[name]


def setting_declarations() -> ModuleType:
    """``hf_geonorm.modeling.settings`` (``GeoNormSettings`` and its choices)."""
    return library_settings



class AlphaType(click.ParamType):
    """A number, or a comma-separated list of numbers (one step size per layer), each at least ``minimum``."""

    name = "step size"

    def __init__(self, minimum: float) -> None:
        self.minimum = minimum

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
            if not math.isfinite(number) or number < self.minimum:
                self.fail(f"step sizes must be finite numbers >= {self.minimum:g}; got {number}", param, ctx)
        return numbers[0] if len(numbers) == 1 and "," not in str(value) else numbers


class MaxAngleType(click.ParamType):
    """Radians in the declared range, (0, pi], written as a number, ``pi``, ``pi/N``, or ``none`` for no clamp."""

    name = "angle"

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum, self.maximum = minimum, maximum

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
        if not (self.minimum < angle <= self.maximum):
            self.fail(f"the max angle must be in ({self.minimum:g}, {angle_text(self.maximum)}] radians, or 'none'; "
                      f"got {value}", param, ctx)  # fmt: skip
        return angle


def angle_text(radians: float) -> str:
    """An angle as the help writes it: ``pi/4``, ``pi``."""
    fraction = math.pi / radians
    return "pi" if fraction == 1 else f"pi/{fraction:g}"


def setting_default_text(form: dict[str, Any], default: Any) -> str:
    """A setting's default as its help states it: on/off for a switch, ``pi/4`` for an angle, else the value."""
    if form.get("flag"):
        return "on" if default else "off"
    if form.get("angle"):
        return NO_CLAMP if default is None else angle_text(default)
    return str(default)


def _setting_type(form: dict[str, Any]) -> click.ParamType:
    if "choices" in form:
        return click.Choice(form["choices"])
    if form.get("per_layer"):
        return AlphaType(form["minimum"])
    if form.get("angle"):
        return MaxAngleType(form["minimum"], form["maximum"])
    return FiniteFloatRange(form["minimum"], form["maximum"])


def _setting_option(spec: dataclasses.Field, show_default: bool) -> Callable:
    """The click option of one declared setting; its value is None unless given (see ``settings_options``)."""
    form = spec.metadata["option"]
    name = form["name"]
    help_text = form["help"] + (f" [default: {setting_default_text(form, spec.default)}]" if show_default else "")
    if form.get("flag"):
        return click.option(f"{name}/--no-{name.removeprefix('--')}", spec.name, default=None, help=help_text)
    metavar = {"metavar": form["metavar"]} if "metavar" in form else {}
    return click.option(name, spec.name, type=_setting_type(form), help=help_text, **metavar)


def declared_settings() -> list[dataclasses.Field]:
    """The fields of ``GeoNormSettings`` that the commands take as options, in their declared order."""
    return [spec for spec in dataclasses.fields(setting_declarations().GeoNormSettings) if "option" in spec.metadata]


SETTING_OPTIONS = {spec.name: spec.metadata["option"]["name"] for spec in declared_settings()}  # field -> option


def _with_settings(func: Callable, show_defaults: bool, leave_out: frozenset[str] = frozenset()) -> Callable:
    for spec in reversed(declared_settings()):
        if spec.name not in leave_out:
            func = _setting_option(spec, show_defaults)(func)
    return func


def settings_options(func: Callable) -> Callable:
    """Add one option per GeoNorm setting; unset options stay None (the command fills in the defaults, or the
    current settings of a GeoNorm source)."""
    return _with_settings(func, show_defaults=True)


def preview_settings_options(func: Callable) -> Callable:
    """The setting options of commands that run a model as it is unless told to convert it in memory (their help
    states no default: the model's own settings apply)."""
    return _with_settings(func, show_defaults=False)


def pop_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the setting options from a command's kwargs; return the given ones as GeoNormSettings fields."""
    given = {}
    for setting in SETTING_OPTIONS:
        value = kwargs.pop(setting, None)
        if value is None:
            continue
        given[setting] = None if value == NO_CLAMP else value
    return given


def _option_words(message: str) -> str:
    """Name the command-line options in a library message about settings (and the dtype)."""
    for setting, option in SETTING_OPTIONS.items():
        message = re.sub(rf"\b{setting}\b", option, message)
    return message.replace("use dtype ", "use --dtype ")


class ListType(click.ParamType):
    """A comma-separated list of values of one type: ``2e-3,4e-3``."""

    def __init__(self, item: type, none: bool = False) -> None:
        self.item, self.name, self.none = item, f"{item.__name__.upper()},...", none

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        if self.none and str(value).strip().lower() == "none":
            return ()
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


class _DeclaredLimits:
    """A value type that refuses a value outside its declared field's limits with the declaration's own message
    (``refusal``): the message ``validate`` gives for the same value from the API."""

    spec: dataclasses.Field

    def parse(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return value

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        parsed = self.parse(value, param, ctx)
        problem = declarations().refusal(self.spec, parsed)
        if problem is not None:
            self.fail(problem, param, ctx)
        return parsed


class DeclaredChoice(_DeclaredLimits, click.Choice):
    def __init__(self, spec: dataclasses.Field) -> None:
        super().__init__(spec.metadata["option"]["choices"])
        self.spec = spec


class _DeclaredRange(_DeclaredLimits):
    """A declared number range: click's range for ``--help``, the number read as ``number`` reads it, and the
    declaration's limits checked by ``_DeclaredLimits``."""

    number: click.ParamType

    def __init__(self, spec: dataclasses.Field) -> None:
        super().__init__(**_range(spec.metadata["option"]))
        self.spec = spec

    def parse(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return self.number.convert(value, param, ctx)


class DeclaredIntRange(_DeclaredRange, click.IntRange):
    number = click.INT


class DeclaredFloatRange(_DeclaredRange, click.FloatRange):
    number = click.FLOAT


def _range(form: dict[str, Any]) -> dict[str, Any]:
    """click's range of a declared number range (for the range ``--help`` shows)."""
    return {"min": form.get("minimum"), "max": form.get("maximum"), "min_open": form.get("min_open", False),
            "max_open": form.get("max_open", False)}  # fmt: skip


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


def _value_type(spec: dataclasses.Field, form: dict[str, Any]) -> Any:
    if "items" in form:
        return ListType(form["items"], none=form.get("none", False))
    if "pair" in form:
        return form["pair"]
    if "choices" in form:
        return DeclaredChoice(spec)
    if "folder" in form:
        return click.Path(exists=form["folder"] == "existing", file_okay=False)
    kind = VALUE_TYPES[spec.type.split("|")[0].strip()]
    if "minimum" in form or "maximum" in form:
        return DeclaredIntRange(spec) if kind is int else DeclaredFloatRange(spec)
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
    value_type = _value_type(field, form)
    return [click.option(name, field.name, type=value_type, default=None, help=help_text, **extra, **metavar)]


def declared_options(*names: str, command: str) -> Callable:
    """Decorate a command with the options of the declarations ``names`` (``DECLARATIONS``: ``TrainOptions``,
    ``SweepOptions``), in their order, the GeoNorm settings' options after ``--preset``; the
    fields ``sweep`` does not take, and the settings its own options set (``replaces``: ``--styles`` sets the norm
    style), are left out of it. Every option defaults to None, so that only what the user gave reaches the
    declaration (``given``) and its defaults apply: they are written once, in the declaration."""
    declared = [entry for name in names for entry in declared_fields(declaration(name))]
    replaced = frozenset(form["replaces"] for _, form, _ in declared if "replaces" in form)
    decorators: list[Callable] = []
    for field, form, default in declared:
        if command == "sweep" and form.get("sweep") is False:
            continue
        decorators.extend(field_options(field, form, default))
        if field.name == "preset":
            decorators.append(lambda func: _with_settings(func, show_defaults=True, leave_out=replaced))

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


def command_options(*declarations: type, settings: Callable[[Callable], Callable] | None = None) -> Callable:
    """Decorate a command other than ``train`` and ``sweep`` with the options its declarations (dataclasses whose
    fields declare them) hold, in their order, and the GeoNorm settings' options (``settings_options`` or
    ``preview_settings_options``) after the field declared ``settings_follow``, else first. Each option has its
    field's name and default, and click's own value types and statement of the default (``show_default``), so that
    the command builds its options object from the values as they come (``ConversionOptions(**values)``)."""
    specs = [spec for declaration in declarations for spec in dataclasses.fields(declaration)]
    follows = any(spec.metadata["option"].get("settings_follow") for spec in specs)
    decorators = [settings] if settings is not None and not follows else []
    for spec in specs:
        decorators.append(_command_option(spec))
        if settings is not None and spec.metadata["option"].get("settings_follow"):
            decorators.append(settings)

    def decorate(func: Callable) -> Callable:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


def _command_option(spec: dataclasses.Field) -> Callable:
    form = spec.metadata["option"]
    name = form.get("name", "--" + spec.name.replace("_", "-"))
    extra = {key: form[key] for key in ("metavar", "envvar", "required", "show_default") if key in form}
    if spec.default is not None:  # (a default of None would count as given: click's "required" would pass)
        extra["default"] = spec.default
    if form.get("flag"):
        names = f"{name}/--no-{name.removeprefix('--')}" if form.get("switch") else name
        flag = {} if form.get("switch") else {"is_flag": True}
        return click.option(names, spec.name, help=form["help"], **flag, **extra)
    return click.option(name, spec.name, type=_command_type(form), help=form["help"], **extra)


def _command_type(form: dict[str, Any]) -> click.ParamType | None:
    """click's type of a declared option of the commands other than ``train`` and ``sweep`` (None: text)."""
    if "choices" in form:
        return click.Choice(form["choices"])
    if "file" in form:
        return click.Path(exists=form["file"] == "existing", dir_okay=False)
    if "folder" in form:
        return click.Path(exists=form["folder"] == "existing", file_okay=False)
    if "minimum" in form:
        return click.IntRange(min=form["minimum"])
    return None
