"""The default peak learning rate of a model trained from scratch: the rate rule fit by ``benchmarks/rate_rule.py``
over the study's measured best rates, read from ``rate_rule.json`` beside this file. Standard library only, like
``options``."""

from __future__ import annotations

import json
from pathlib import Path

RATE_RULE = Path(__file__).with_name("rate_rule.json")


def _span(noun: str, values: list[int]) -> str:
    return f"{noun} {values[0]}" if values[0] == values[-1] else f"{noun}s {values[0]}–{values[-1]}"


def pretraining_rate(arch: str, style: str, width: int, depth: int) -> tuple[float, str]:
    """The default peak learning rate of a model of ``arch`` and norm ``style`` trained from scratch at ``width``
    (hidden size) and ``depth`` (layers): ``c * width^a * depth^b`` of the rule measured for that architecture and
    style (GPT-2's for an architecture not measured, Pre-Norm's for a style not measured), to two significant
    figures; and where it comes from, for the log."""
    table = json.loads(RATE_RULE.read_text(encoding="utf-8"))
    rule_arch = arch if arch in table["rules"] else "gpt2"
    rules = table["rules"][rule_arch]
    rule_style = style if style in rules else "pre"
    rule = rules[rule_style]
    lr = float(f"{rule['c'] * width ** rule['a'] * depth ** rule['b']:.2g}")
    widths, depths = table["measured"][rule_arch]["widths"], table["measured"][rule_arch]["depths"]
    span = f"{_span('width', widths)} and {_span('depth', depths)}"
    inside = widths[0] <= width <= widths[-1] and depths[0] <= depth <= depths[-1]
    where = f"inside the measured {span}" if inside else f"extrapolated beyond the measured {span}"
    notes = [f"{arch} not measured: {rule_arch}'s rule"] if rule_arch != arch else []
    notes += [f"{style} not measured: {rule_style}'s rule"] if rule_style != style else []
    unfit = [name for name in ("a", "b") if name in rule["borrowed"] and rule[name] == 0]
    if unfit:
        notes.append("the same rate at every " + " and ".join({"a": "width", "b": "depth"}[n] for n in unfit)
                     + " (not measured yet)")  # fmt: skip
    why = f"{rule_style}'s rate rule for {rule_arch} at width {width}, depth {depth}, {where}"
    return lr, why + "".join(f"; {note}" for note in notes)
