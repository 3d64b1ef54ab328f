"""How a field of an options dataclass declares its command-line option, and the limits the command line and the
API check alike: ``option`` (the declaration), ``refusal`` (why a value is outside the declared limits, in the
words both give) and ``OptionError`` (a value refused before any work).

Below every package that has options rather than under ``training``: every command's options are declared with it
(``TrainOptions``, ``SweepOptions``, ``ConversionOptions``, the command line's own).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import Field, fields
from typing import Any


class OptionError(ValueError):
    """An option's value is refused before any work (the command line's usage error, exit 2); the message names
    the option and the limit."""


# A field's TrainingArguments counterpart: the argument (or arguments) its value is passed as, or a function of the
# options that gives the arguments, for a value Trainer takes in another form.
TrainerCounterpart = str | tuple[str, ...] | Callable[[Any], dict[str, Any]] | None


def option(help: str, *, trainer: TrainerCounterpart = None, sweep_key: bool = True,
           used_if: Callable[[Any], bool] | None = None, **form: Any) -> dict[str, Any]:  # fmt: skip
    """A field's declaration: its command-line option (``help`` and ``form``), its ``TrainingArguments``
    counterpart (``trainer``), whether the runs of a sweep must share its value (``sweep_key``: False for what does
    not change what a run computes) and, for a field that a run uses only in some cases, ``used_if`` (a test of
    the options; ``metrics.json`` records the field only then).

    ``form`` may hold the limits ``minimum``, ``maximum``, ``min_open``, ``max_open`` (a number range) and
    ``choices``; ``metavar``, ``folder`` ("existing": a folder that must exist; "any": a folder path), ``file`` (the
    same for a file), ``flag`` (an on/off switch; ``switch``: with its ``--no-`` form), ``required``, ``envvar``,
    ``show_default`` (the default as click states it, for the options of the commands other than ``train`` and
    ``sweep``), ``settings_follow`` (the GeoNorm settings' options come after this one), ``flag_values`` (switches
    that set the field to a value: ``{"--bf16": "bf16"}``), ``name`` (the option, when not the field's name),
    ``items`` (a comma-separated list of that type; with ``none``, the word none gives an empty one), ``pair`` (two
    values of that type), ``optional_value`` (the value of the option given without one: ``--extend``),
    ``sweep=False`` (an option of ``train`` that ``sweep`` does not take), ``replaces`` (the GeoNorm setting a
    sweep option sets, whose own option ``sweep`` therefore does not offer) and ``default_text`` (the default as the
    help states it, for a default that is computed)."""
    return {"option": {"help": help, **form}, "trainer": trainer, "sweep_key": sweep_key, "used_if": used_if}


def option_name(spec: Field) -> str:
    """The command-line option of a field, as messages name it (a field set by switches: its own name)."""
    form = spec.metadata.get("option", {})
    return spec.name if "flag_values" in form else form.get("name", "--" + spec.name.replace("_", "-"))


def range_text(form: dict[str, Any]) -> str:
    """A declared number range in words: ``>= 2``, ``> 0``, ``in [0, 1)``."""
    low, high = form.get("minimum"), form.get("maximum")
    if high is None:
        return f"{'>' if form.get('min_open') else '>='} {low:g}"
    if low is None:
        return f"{'<' if form.get('max_open') else '<='} {high:g}"
    return f"in {'(' if form.get('min_open') else '['}{low:g}, {high:g}{')' if form.get('max_open') else ']'}"


def refusal(spec: Field, value: Any) -> str | None:
    """Why ``value`` is outside the limits field ``spec`` declares (its ``choices`` or number range), or None: the
    message that ``validate`` raises and the command line gives for the same value. None is every field's
    "unset"."""
    form = spec.metadata.get("option", {})
    name = option_name(spec)
    if value is None:
        return None
    if "choices" in form:
        if isinstance(value, Mapping) and "dict" in str(spec.type):  # the API's other form (e.g. a preset's sizes)
            return None
        choices = ", ".join(form["choices"])
        return None if value in form["choices"] else f"{name} must be one of {choices}; got {value!r}"
    if "minimum" not in form and "maximum" not in form:
        return None
    whole = spec.type.split("|")[0].strip() == "int"
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return f"{name} must be {kind} {range_text(form)}; got {value!r}"
    value = value if whole else float(value)  # as the command line reads it: 1 is 1.0
    if not math.isfinite(value):
        return f"{name}: {value} is not a finite number"
    low, high = form.get("minimum"), form.get("maximum")
    below = low is not None and (value <= low if form.get("min_open") else value < low)
    above = high is not None and (value >= high if form.get("max_open") else value > high)
    return f"{name} must be {kind} {range_text(form)}; got {value!r}" if below or above else None


def refuse_out_of_limits(options: Any) -> None:
    """``OptionError`` for the first field of ``options`` outside its declared limits (``refusal``)."""
    for spec in fields(options):
        problem = refusal(spec, getattr(options, spec.name))
        if problem is not None:
            raise OptionError(problem)
