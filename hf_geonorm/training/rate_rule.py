"""The default peak learning rate of a model trained from scratch, and where it comes from, read from
``rate_rule.json`` beside this file (written by ``benchmarks/rate_rule.py`` from the study's journals). Standard
library only, like ``options``.

In order: the best rate a cell of the study measured at exactly this architecture, style and shape; else, inside
the widths and depths a style's own cells span, the rule fit over them (``c * width^a * depth^b``); beyond them,
what the style's declaration names as its ``rate_source`` (``modeling/norm_styles.py``): Pre-Norm follows GPT-3's
published rates by size, from the largest measured cell up; GeoNorm takes that rate times its measured ratio to
Pre-Norm at the largest cell (an extrapolation); the others fall back to Pre-Norm's rate. Adding a measured cell to
the file's ``cells`` is all it takes for a shape to use it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..modeling.norm_styles import NORM_STYLE_DECLARATIONS, PRE_NORM_RECIPE, RATIO_TO_PRE_NORM

RATE_RULE = Path(__file__).with_name("rate_rule.json")
MEASURED_CELL = "measured cell"
FITTED_RULE = "rule within the fitted range"
PUBLISHED = "published recipe"
EXTRAPOLATED = "extrapolation"
FALLBACK = "fallback (unmeasured)"
UNMEASURED = (PUBLISHED, EXTRAPOLATED, FALLBACK)  # no cell measured this shape and style: sweep before trusting it
FINE_TUNING = "fine-tuning"  # a --model with trained weights: train's fine-tuning default, not this rule's
RATE_GIVEN = "given by --lr"  # no default at all: the run's own
MEASURED_FAMILY = "gpt2"  # an architecture no cell measured takes its cells


@dataclass(frozen=True)
class DefaultRate:
    """A default peak learning rate, which of the cases above gave it (``source``) and the log's account of it."""

    lr: float
    source: str
    why: str

    @property
    def needs_sweep(self) -> bool:
        """Whether no cell measured this shape and style, nor the rule fit between cells: a guess to sweep around."""
        return self.source in UNMEASURED


def non_embedding_parameters(width: int, depth: int) -> int:
    """The size GPT-3's rates are interpolated by: 12 x depth x width^2 (attention 4 width^2 and MLP 8 width^2 a
    layer), the same for GPT-3's shapes and ours whatever the vocabulary."""
    return 12 * depth * width**2


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.3g}B" if parameters >= 1e9 else f"{parameters / 1e6:.3g}M"


def _figures(lr: float) -> float:
    return float(f"{lr:.2g}")


def _span(noun: str, values: list[int]) -> str:
    return f"{noun} {values[0]}" if values[0] == values[-1] else f"{noun}s {values[0]}–{values[-1]}"


def _shape(cell: dict[str, Any]) -> str:
    return f"{cell['layers']} x {cell['width']}"


def _largest(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(cells, key=lambda c: (non_embedding_parameters(c["width"], c["layers"]), c["width"]), default=None)


def _measured(cells: list[dict[str, Any]], rules: dict[str, Any], style: str, width: int,
              depth: int) -> DefaultRate | None:  # fmt: skip
    """The cell measured at exactly this shape, else the style's rule where its own cells span the shape and it
    fit an exponent of its own (not only borrowed ones); None beyond them."""
    own = [c for c in cells if c["style"] == style]
    for cell in own:
        if (cell["width"], cell["layers"]) == (width, depth):
            where = f"{cell['arch']} {_shape(cell)} in the study's phase {cell['phase']} ({cell['steps']} steps)"
            return DefaultRate(cell["lr"], MEASURED_CELL, f"{MEASURED_CELL}: {style}'s best rate at {where}")
    rule = rules.get(style)
    if rule is None or not own or {"a", "b"} <= set(rule["borrowed"]):
        return None
    widths, depths = sorted({c["width"] for c in own}), sorted({c["layers"] for c in own})
    if not (widths[0] <= width <= widths[-1] and depths[0] <= depth <= depths[-1]):
        return None
    lr = _figures(rule["c"] * width ** rule["a"] * depth ** rule["b"])
    return DefaultRate(lr, FITTED_RULE, f"{FITTED_RULE}: {style}'s rate rule for {own[0]['arch']} at width {width}, "
                       f"depth {depth}, inside its measured {_span('width', widths)} and {_span('depth', depths)}")


def _published(table: dict[str, Any], pre_cells: list[dict[str, Any]], width: int, depth: int) -> DefaultRate:
    """GPT-3's rate at this size, log-log between its models by non-embedding parameters, anchored below at the
    largest cell Pre-Norm was measured at; held at the first and last points beyond them."""
    anchor = _largest(pre_cells)
    models = [(non_embedding_parameters(m["width"], m["layers"]), m["lr"], f"GPT-3 {m['name']}")
              for m in table["published"]["models"]]  # fmt: skip
    if anchor is not None:
        first = (non_embedding_parameters(anchor["width"], anchor["layers"]), anchor["lr"],
                 f"the largest measured cell, {anchor['arch']} {_shape(anchor)}")  # fmt: skip
        models = [first] + [model for model in models if model[0] > first[0]]
    size = non_embedding_parameters(width, depth)
    above = next((i for i, model in enumerate(models) if size <= model[0]), len(models))
    if above < len(models) and size == models[above][0]:
        lr, how = models[above][1], f"{models[above][2]}'s rate"
    elif above == 0:
        lr, how = models[0][1], f"below {models[0][2]}: its rate"
    elif above == len(models):
        lr, how = models[-1][1], f"above {models[-1][2]}: its rate"
    else:
        (low, low_lr, low_name), (high, high_lr, high_name) = models[above - 1], models[above]
        share = (math.log(size) - math.log(low)) / (math.log(high) - math.log(low))
        lr = math.exp(math.log(low_lr) + share * (math.log(high_lr) - math.log(low_lr)))
        how = f"log-log between {low_name} ({low_lr:g}) and {high_name} ({high_lr:g})"
    return DefaultRate(_figures(lr), PUBLISHED, f"{PUBLISHED}: {table['published']['source']} by size, at "
                       f"{_count(size)} non-embedding parameters (12 x {depth} x {width}^2): {how}")


def _extrapolated(family_cells: list[dict[str, Any]], style: str, pre: DefaultRate) -> DefaultRate | None:
    """Pre-Norm's rate at this shape times ``style``'s best over Pre-Norm's at the largest shape both were measured
    at."""
    own = {(c["width"], c["layers"]): c for c in family_cells if c["style"] == style}
    both = _largest([c for c in family_cells if c["style"] == "pre" and (c["width"], c["layers"]) in own])
    if both is None:
        return None
    best = own[(both["width"], both["layers"])]["lr"]
    ratio, cell = best / both["lr"], f"{both['arch']} {_shape(both)}: {best:g} / {both['lr']:g}"
    return DefaultRate(_figures(ratio * pre.lr), EXTRAPOLATED, f"{EXTRAPOLATED}: {style}'s best rate is {ratio:g} "
                       f"times pre's at the largest measured cell ({cell}), times Pre-Norm's {pre.lr:g} here "
                       f"({pre.why})")  # fmt: skip


def pretraining_rate(arch: str, style: str, width: int, depth: int) -> DefaultRate:
    """The default peak learning rate of a model of ``arch`` and norm ``style`` trained from scratch at ``width``
    (hidden size) and ``depth`` (layers), to two significant figures where it is not a measured cell's; with its
    source and the log's account (an architecture no cell measured takes GPT-2's, as a fallback)."""
    table = json.loads(RATE_RULE.read_text(encoding="utf-8"))
    family = arch if any(c["arch"] == arch for c in table["cells"]) else MEASURED_FAMILY
    cells = [c for c in table["cells"] if c["arch"] == family]
    rules = table["rules"].get(family, {})
    pre = _measured(cells, rules, "pre", width, depth) or _published(
        table, [c for c in cells if c["style"] == "pre"], width, depth
    )
    source = NORM_STYLE_DECLARATIONS[style].rate_source
    chosen = pre if source == PRE_NORM_RECIPE else _measured(cells, rules, style, width, depth)
    if chosen is None and source == RATIO_TO_PRE_NORM:
        chosen = _extrapolated(cells, style, pre)
    if chosen is None:
        chosen = DefaultRate(pre.lr, FALLBACK, f"{FALLBACK}: no cell measured {style} at {family} {depth} x {width}: "
                             f"Pre-Norm's rate ({pre.why})")  # fmt: skip
    if family == arch:
        return chosen
    source = chosen.source if chosen.needs_sweep else FALLBACK  # another architecture's cell is no measurement here
    return DefaultRate(chosen.lr, source, f"{source}: no cell measured {arch}, so {family}'s {chosen.why}")
