"""How a dataclass declares its command-line options, and the one check of their limits.

Every command's options are plain dataclasses (``TrainOptions``, ``SweepOptions``, ``EngineOptions``,
``ConversionOptions``, ``GeoNormSettings``, the command line's own), in the manner of transformers'
``HfArgumentParser``: a field whose metadata has ``help`` is an option, and its type says the form of the value:
``bool`` a switch, ``Literal[...]`` the choices, ``tuple[int, ...]`` a comma list, ``tuple[float, float]`` two values,
``float | list[float]`` a number or a comma list. The command line generates the click options from them
(``cli/options.py``). The metadata's other keys, the whole vocabulary:

- ``ge``, ``gt``, ``le``, ``lt``: the limits of a number (of each number of a list), checked by ``limit_problem``;
- ``name``: the option, when it is not the field's name with dashes (``--alpha`` for ``geo_alpha``);
- ``metavar``: the value's name in ``--help``;
- ``default_text``: the default as ``--help`` states it, where the value is worked out when the job runs;
- ``path``: ``"file"``, ``"folder"``, ``"existing file"`` or ``"existing folder"``;
- ``flags``: switches that each set the field to a value, instead of one option that takes it (``--bf16``);
- ``envvar``: an environment variable that gives the value.
"""

from __future__ import annotations

import math
import types
from dataclasses import Field, fields
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints


class OptionError(ValueError):
    """An option's value is refused before any work (the command line's usage error, exit 2); the message names
    the option and the limit."""


LIMITS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def option_name(field: Field) -> str:
    """The command-line option of a field, as messages name it (a field set by switches: its own name)."""
    if "flags" in field.metadata:
        return field.name
    return field.metadata.get("name", "--" + field.name.replace("_", "-"))


def members(hint: Any) -> list[Any]:
    """The types a field's type hint allows, but None: ``int | None`` -> ``[int]``."""
    allowed = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    return [member for member in allowed if member is not type(None)]


def choices_of(hint: Any) -> tuple[Any, ...] | None:
    """The choices of a ``Literal`` in the hint, or None."""
    return next((get_args(member) for member in members(hint) if get_origin(member) is Literal), None)


def range_text(metadata: Any) -> str:
    """A declared number range in words: ``>= 2``, ``> 0``, ``in [0, 1)``."""
    low = next((key for key in ("ge", "gt") if key in metadata), None)
    high = next((key for key in ("le", "lt") if key in metadata), None)
    number = {key: f"{metadata[key]:g}" if isinstance(metadata[key], float) else str(metadata[key])
              for key in (low, high) if key is not None}  # fmt: skip
    if low is None or high is None:
        key = low or high
        return f"{LIMITS[key]} {number[key]}"
    opening, closing = "(" if low == "gt" else "[", ")" if high == "lt" else "]"
    return f"in {opening}{number[low]}, {number[high]}{closing}"


def limit_problem(field: Field, hint: Any, value: Any) -> str | None:
    """Why ``value`` is outside what ``field`` declares (its ``Literal`` choices, its number range), or None: the
    message that ``validate`` raises and the command line gives for the same value. None is every field's "unset";
    a list is checked number by number."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return next(filter(None, (limit_problem(field, hint, item) for item in value)), None)
    name = option_name(field)
    choices = choices_of(hint)
    if choices is not None and not isinstance(value, dict):  # a dict: the API's other form (a preset's sizes)
        if value in choices:
            return None
        return f"{name} must be one of {', '.join(choices)}; {value!r} is not one of them"
    if not any(key in field.metadata for key in LIMITS):
        return None
    whole = int in members(hint)
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return f"{name} must be {kind} {range_text(field.metadata)}; got {value!r}"
    value = value if whole else float(value)  # as the command line reads it: 1 is 1.0
    if not math.isfinite(value):
        return f"{name}: {value} is not a finite number"
    limits = field.metadata
    inside = (value >= limits.get("ge", -math.inf) and value > limits.get("gt", -math.inf)
              and value <= limits.get("le", math.inf) and value < limits.get("lt", math.inf))  # fmt: skip
    return None if inside else f"{name} must be {kind} {range_text(limits)}; got {value!r}"


def check_limits(options: Any) -> None:
    """``OptionError`` for the first field of the dataclass ``options`` outside its declared limits."""
    hints = get_type_hints(type(options))
    for field in fields(options):
        problem = limit_problem(field, hints[field.name], getattr(options, field.name))
        if problem is not None:
            raise OptionError(problem)
