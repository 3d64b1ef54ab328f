"""The click options of every command, generated from the dataclasses that declare them (the only ``click.option``
calls of the command line), as transformers' ``HfArgumentParser`` generates its arguments: each field with ``help``
in its metadata is one option, named after the field, with the field's default; its type gives the form of the
value (``hf_geonorm._plumbing.declarations`` lists the types and the few metadata keys), and a value outside the field's
limits is refused in the words the library's ``validate`` uses (``limit_problem``).

"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection
from typing import Any, get_args, get_origin, get_type_hints

import click
from click.core import ParameterSource

from hf_geonorm._plumbing import declarations
from hf_geonorm.modeling.settings import GeoNormSettings, Radians

NO_CLAMP = "none"


class Checked(click.ParamType):
    """A value read by ``read``, refused when it is outside its field's declared choices or limits with the message
    the library's ``validate`` gives for the same value (``limit_problem``)."""

    def __init__(self, read: click.ParamType, field: dataclasses.Field, hint: Any) -> None:
        self.read, self.field, self.hint, self.name = read, field, hint, read.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        value = self.read.convert(value, param, ctx)
        problem = declarations.limit_problem(self.field, self.hint, value)
        if problem is not None:
            self.fail(problem, param, ctx)
        return value


class CommaList(click.ParamType):
    """A comma-separated list of values of one type (``2e-3,4e-3``), or ``none`` for an empty one."""

    def __init__(self, item: type) -> None:
        self.item, self.name = item, f"{item.__name__},..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        if str(value).strip().lower() == "none":
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


class NumberOrList(click.ParamType):
    """A number, or a comma-separated list of numbers (one per layer or per update): ``float | list[float]``."""

    name = "number|list"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float, list)):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        if len(parts) > 1 and not all(parts):
            self.fail(f"{value!r} has an empty item; give numbers separated by single commas (e.g. 1,0.5,0.33)", param,
                      ctx)  # fmt: skip
        try:
            numbers = [float(part) for part in parts]
        except ValueError:
            self.fail(
                f"{value!r} is not a number or a comma-separated list of numbers (e.g. 1.0 or 1,0.5,0.33)", param, ctx
            )
        return numbers if len(numbers) > 1 else numbers[0]


class Angle(click.ParamType):
    """Radians in (0, pi], written as a number, ``pi``, ``pi/N``, or ``none`` for no clamp (``Radians``)."""

    name = "angle"

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
        if not 0 < angle <= math.pi:
            self.fail(f"the max angle must be in (0, pi] radians, or 'none'; got {value}", param, ctx)
        return angle


def angle_text(radians: float) -> str:
    """An angle as the help writes it: ``pi/4``, ``pi``."""
    fraction = math.pi / radians
    return "pi" if fraction == 1 else f"pi/{fraction:g}"


def value_type(field: dataclasses.Field, hint: Any) -> tuple[Any, dict[str, Any]]:
    """click's type of a field's value, read from its type hint, and the form it gives the option (the number of
    values, the choices as ``--help`` names them)."""
    kinds = declarations.members(hint)
    origin, args = get_origin(kinds[0]), get_args(kinds[0])
    path = field.metadata.get("path")
    choices = declarations.choices_of(hint)
    extra: dict[str, Any] = {}
    if choices is not None:
        read, extra["metavar"] = click.STRING, f"[{'|'.join(choices)}]"
    elif kinds[0] is Radians:
        read = Angle()
    elif list in map(get_origin, kinds):
        read = NumberOrList()
    elif origin is tuple and args[-1] is Ellipsis:
        read = CommaList(args[0])
    elif origin is tuple:
        read, extra["nargs"] = click.types.convert_type(args[0]), len(args)
    elif path is not None:
        # what a path that need not exist yet is (a file where a folder goes) is the library's to say, in its words
        read = click.Path(exists=path.startswith("existing"), file_okay=path != "existing folder",
                          dir_okay=path != "existing file")  # fmt: skip
    else:
        read = click.types.convert_type(kinds[0])
    if choices is not None or any(key in field.metadata for key in declarations.LIMITS):
        read = Checked(read, field, hint)
    return read, extra


def default_text(field: dataclasses.Field, hint: Any) -> str | None:
    """A field's default as its help states it: ``default_text`` where it is declared, ``pi/4`` for an angle, a
    comma list for a tuple, on/off for a switch, else the value; None for no default."""
    if "default_text" in field.metadata:
        return field.metadata["default_text"]
    factory = field.default_factory
    default = factory() if factory is not dataclasses.MISSING else field.default
    if default is None or default is dataclasses.MISSING:
        return None
    if isinstance(default, bool):
        return "on" if default else "off"
    if Radians in declarations.members(hint):
        return angle_text(default)
    return ",".join(map(str, default)) if isinstance(default, tuple) else str(default)


def field_options(field: dataclasses.Field, hint: Any, overrides: bool, show_defaults: bool) -> list[Callable]:
    """The click options of one field (several for a field set by switches, ``--bf16``). With ``overrides`` the
    option is None unless given, and a switch has its ``--no-`` form."""
    help_text, name, kinds = field.metadata["help"], declarations.option_name(field), declarations.members(hint)
    default: Any = field.default if field.default_factory is dataclasses.MISSING else field.default_factory
    if "flags" in field.metadata:
        return [click.option(flag, field.name, flag_value=value, multiple=True, callback=_one_switch(default),
                             help=f"{help_text} ({flag}: {value})")  # fmt: skip
                for flag, value in field.metadata["flags"].items()]  # fmt: skip
    switch = bool in kinds and (overrides or default is True)
    stated = default_text(field, hint) if show_defaults and (switch or bool not in kinds) else None
    if any(key in field.metadata for key in declarations.LIMITS):
        help_text += f" [{declarations.range_text(field.metadata)}]"
    if stated is not None:
        help_text += f" [default: {stated}]"
    extra = {key: field.metadata[key] for key in ("metavar", "envvar") if key in field.metadata}
    if overrides:
        extra["default"] = None
    else:
        extra |= {"required": True} if default is dataclasses.MISSING else {"default": default}
    if bool in kinds:
        names = f"{name}/--no-{name.removeprefix('--')}" if switch else name
        return [click.option(names, field.name, is_flag=True, help=help_text, **extra)]
    read, form = value_type(field, hint)
    return [click.option(name, field.name, type=read, help=help_text, **{**form, **extra})]


def _one_switch(default: Any) -> Callable:
    """The callback of the switches that set one field (``--bf16``, ``--fp16``), which click collects as a tuple:
    the field's default when none is given; two that differ are refused (click would keep the last without a word)."""

    def one_value(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if len(set(value)) > 1:
            flags = [opt for other in ctx.command.params if other.name == param.name for opt in other.opts]
            raise click.UsageError(f"{' and '.join(flags)} exclude each other: give one", ctx)
        return value[0] if value else default

    return one_value


def options_from(*declared: type, leave_out: Collection[str] = (), overrides: bool = False,
                 show_defaults: bool = True) -> Callable:  # fmt: skip
    """Decorate a command with one option per field of the dataclasses ``declared`` that has help, in their order
    (``leave_out``: the fields the command does not take). An option has its field's default, and its help states
    it, unless ``overrides``: then every option is None unless given, as the GeoNorm settings are (a value given
    overrides a model's own), and ``show_defaults`` False leaves the defaults out of the help (commands that run a
    model with its own settings)."""
    made = []
    for declaration in declared:
        hints = get_type_hints(declaration)
        for field in dataclasses.fields(declaration):
            if "help" in field.metadata and field.name not in leave_out:
                made += field_options(field, hints[field.name], overrides, show_defaults)

    def decorate(func: Callable) -> Callable:
        for option in reversed(made):
            func = option(func)
        return func

    return decorate


def given(names: Collection[str]) -> set[str]:
    """The options among ``names`` that the user gave, rather than left at their defaults."""
    ctx = click.get_current_context()
    return {name for name in names if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT}


SETTING_OPTIONS = {field.name: declarations.option_name(field) for field in dataclasses.fields(GeoNormSettings)
                   if "help" in field.metadata}  # fmt: skip  # field -> option
settings_options = options_from(GeoNormSettings, overrides=True)
# the commands that run a model as it is unless told to convert it in memory: the model's own settings apply
preview_settings_options = options_from(GeoNormSettings, overrides=True, show_defaults=False)


def pop_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove the setting options from a command's kwargs; return the given ones as GeoNormSettings fields."""
    given_settings = {}
    for setting in SETTING_OPTIONS:
        value = kwargs.pop(setting, None)
        if value is not None:
            given_settings[setting] = None if value == NO_CLAMP else value
    return given_settings


def option_words(message: str) -> str:
    """Name the command-line options in a library message about settings (and the dtype)."""
    for setting, option in SETTING_OPTIONS.items():
        message = re.sub(rf"\b{setting}\b", option, message)
    return message.replace("use dtype ", "use --dtype ")
