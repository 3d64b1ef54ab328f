"""The default peak learning rate of a model trained from scratch, and where it comes from, read from
``rate_rule.json`` beside this file (written by ``benchmarks/rate_rule.py`` from the study's journals). Standard
library only, like ``options``.

In order: the best rate a cell of the study measured at exactly this architecture, style and shape; else, inside
the widths and depths a style's own cells span, log-log interpolation between its neighbouring cells, which passes
through every cell by construction (no fitted rule: a power law fit over the cells missed some of them); beyond
them, what the style's declaration names as its ``rate_source`` (``modeling/norm_styles.py``): Pre-Norm follows
GPT-3's published rates by size, from the largest measured cell up; every other style takes Pre-Norm's rate times
its own best over Pre-Norm's at the largest shape both were measured at (an extrapolation: that one ratio held at
every size, its account naming the ratio at every cell both were measured at, and what it became where the study
tuned the warm-up with the rate), or Pre-Norm's rate where no cell measured it beside Pre-Norm (a fallback). Every
rate past the cells says "not measured at this size: sweep first". Adding a measured cell to the file's ``cells`` is
all it takes for a shape to use it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..modeling.norm_styles import NORM_STYLE_DECLARATIONS, PRE_NORM_RECIPE

RATE_RULE = Path(__file__).with_name("rate_rule.json")
MEASURED_CELL = "measured cell"
BETWEEN = "between measured cells"
PUBLISHED = "published recipe"
EXTRAPOLATED = "extrapolation"
FALLBACK = "fallback (unmeasured)"
UNMEASURED = (PUBLISHED, EXTRAPOLATED, FALLBACK)  # no cell measured this shape and style: sweep before trusting it
SWEEP_FIRST = "not measured at this size: sweep first"  # what the log and the card say of an UNMEASURED rate
FINE_TUNING = "fine-tuning"  # a --model with trained weights: train's fine-tuning default, not this rule's
RATE_GIVEN = "given by --lr"  # no default at all: the run's own
# the rate source of a sweep's run (``TrainOptions.lr_source``): the sweep gave it, not the user's --lr
SWEEP_RATE = "set by hf-geonorm sweep: one rate of its grid for this style (the sweep's report names the rate it chose)"
MEASURED_FAMILY = "gpt2"  # an architecture no cell measured takes its cells


@dataclass(frozen=True)
class DefaultRate:
    """A default peak learning rate, which of the cases above gave it (``source``) and the log's account of it."""

    lr: float
    source: str
    why: str

    @property
    def needs_sweep(self) -> bool:
        """Whether the rate is neither a measured cell's nor between the style's cells: a guess to sweep around."""
        return self.source in UNMEASURED


def non_embedding_parameters(width: int, depth: int) -> int:
    """The size GPT-3's rates are interpolated by: 12 x depth x width^2 (attention 4 width^2 and MLP 8 width^2 a
    layer), the same for GPT-3's shapes and ours whatever the vocabulary."""
    return 12 * depth * width**2


def _count(parameters: int) -> str:
    return f"{parameters / 1e9:.3g}B" if parameters >= 1e9 else f"{parameters / 1e6:.3g}M"


def _figures(lr: float) -> float:
    return float(f"{lr:.2g}")


def _shape(cell: dict[str, Any]) -> str:
    return f"{cell['layers']} x {cell['width']}"


def _largest(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    return max(cells, key=lambda c: (non_embedding_parameters(c["width"], c["layers"]), c["width"]), default=None)


def _cell(cells: list[dict[str, Any]], style: str, width: int, depth: int) -> DefaultRate | None:
    """The cell of ``style`` measured at exactly this shape: its best rate; None where none was."""
    for cell in cells:
        if (cell["style"], cell["width"], cell["layers"]) == (style, width, depth):
            where = f"{cell['arch']} {_shape(cell)} in the study's phase {cell['phase']} ({cell['steps']} steps)"
            return DefaultRate(cell["lr"], MEASURED_CELL, f"{MEASURED_CELL}: {style}'s best rate at {where}")
    return None


def _along(line: list[dict[str, Any]], size: str, at: int) -> tuple[float, str] | None:
    """The log rate at ``at`` log-log between the two neighbouring cells of ``line`` along ``size`` ("width" or
    "layers"), and which cells those were; None outside the sizes the line spans."""
    points = sorted(line, key=lambda c: c[size])
    if not points or not points[0][size] <= at <= points[-1][size]:
        return None
    noun = "width" if size == "width" else "depth"
    high = next(i for i, cell in enumerate(points) if at <= cell[size])
    if points[high][size] == at:
        return math.log(points[high]["lr"]), f"{noun} {at} at {_shape(points[high])} ({points[high]['lr']:g})"
    low, high_cell = points[high - 1], points[high]
    share = (math.log(at) - math.log(low[size])) / (math.log(high_cell[size]) - math.log(low[size]))
    log_lr = math.log(low["lr"]) + share * (math.log(high_cell["lr"]) - math.log(low["lr"]))
    return log_lr, f"{noun} {at} between {_shape(low)} ({low['lr']:g}) and {_shape(high_cell)} ({high_cell['lr']:g})"


def _between(cells: list[dict[str, Any]], style: str, width: int, depth: int) -> DefaultRate | None:
    """Inside the widths and depths ``style``'s own cells span, log-log between its neighbouring measured cells:
    along width among the cells at the centre's depth, along depth among those at the centre's width, combined
    through the centre (the cell whose row and column hold the most cells: phase g's cross meets at 4 x 128), so
    ``log r(w, d) = log r_w(w) + log r_d(d) - log r(centre)``. At a cell it gives the cell's rate exactly, by
    construction: it measures nothing and predicts nothing, it only fills the shapes between cells. None beyond
    them."""
    own = [c for c in cells if c["style"] == style]
    if not own:
        return None
    centre = max(own, key=lambda c: sum(o["width"] == c["width"] or o["layers"] == c["layers"] for o in own))
    row = _along([c for c in own if c["layers"] == centre["layers"]], "width", width)
    column = _along([c for c in own if c["width"] == centre["width"]], "layers", depth)
    if row is None or column is None:
        return None
    lr = _figures(math.exp(row[0] + column[0] - math.log(centre["lr"])))
    moved = [line[1] for line, off in ((row, width != centre["width"]), (column, depth != centre["layers"])) if off]
    steps = "; ".join(moved)
    through = f", combined through {_shape(centre)} ({centre['lr']:g})" if len(moved) == 2 else ""
    return DefaultRate(lr, BETWEEN, f"{BETWEEN}: {style}'s best rates on {centre['arch']} {depth} x {width}, "
                       f"log-log between its neighbouring cells: {steps}{through}")  # fmt: skip


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


def _extrapolated(
    family_cells: list[dict[str, Any]], tuned: list[dict[str, Any]], style: str, pre: DefaultRate
) -> DefaultRate | None:
    """Pre-Norm's rate at this shape times ``style``'s best over Pre-Norm's at the largest shape both were measured
    at; its account states the basis: how each cell's best was chosen, the ratio at every shape both were measured
    at (``family_cells``), and at the shapes where the warm-up was tuned with the rate (``tuned``)."""
    own = {(c["width"], c["layers"]): c for c in family_cells if c["style"] == style}
    pres = [c for c in family_cells if c["style"] == "pre" and (c["width"], c["layers"]) in own]
    both = _largest(pres)
    if both is None:
        return None
    best = own[(both["width"], both["layers"])]["lr"]
    ratio, cell = best / both["lr"], f"{both['arch']} {_shape(both)}: {best:g} / {both['lr']:g}"
    every = ", ".join(f"{own[(c['width'], c['layers'])]['lr'] / c['lr']:g} at {_shape(c)}"
                      for c in sorted(pres, key=lambda c: (c["width"], c["layers"])))  # fmt: skip
    tuned_pre = {(c["width"], c["layers"]): c for c in tuned if c["style"] == "pre"}
    tuned_ratios = ", ".join(
        f"{c['lr'] / tuned_pre[(c['width'], c['layers'])]['lr']:g} at {_shape(c)} ({c['lr']:g} at a "
        f"{c['warmup_share']:.0%} warm-up / {tuned_pre[(c['width'], c['layers'])]['lr']:g} at "
        f"{tuned_pre[(c['width'], c['layers'])]['warmup_share']:.0%})"
        for c in tuned if c["style"] == style and (c["width"], c["layers"]) in tuned_pre
    )
    basis = (f"each best chosen on seed 0's validation at a warm-up of a tenth of the run; {style} over pre at every "
             f"shape both were measured at: {every}")  # fmt: skip
    if tuned_ratios:
        basis += f"; with the warm-up tuned with the rate: {tuned_ratios}"
    return DefaultRate(_figures(ratio * pre.lr), EXTRAPOLATED, f"{EXTRAPOLATED}: {style}'s best rate is {ratio:g} "
                       f"times pre's at the largest shape both were measured at ({cell}), held at every size, times "
                       f"Pre-Norm's {pre.lr:g} here ({pre.why}); the basis: {basis}")  # fmt: skip


def pretraining_rate(arch: str, style: str, width: int, depth: int) -> DefaultRate:
    """The default peak learning rate of a model of ``arch`` and norm ``style`` trained from scratch at ``width``
    (hidden size) and ``depth`` (layers), to two significant figures where it is not a measured cell's; with its
    source and the log's account (an architecture no cell measured takes GPT-2's, as a fallback)."""
    table = json.loads(RATE_RULE.read_text(encoding="utf-8"))
    family = arch if any(c["arch"] == arch for c in table["cells"]) else MEASURED_FAMILY
    cells = [c for c in table["cells"] if c["arch"] == family]

    def own_cells(of: str) -> DefaultRate | None:
        return _cell(cells, of, width, depth) or _between(cells, of, width, depth)

    pre = own_cells("pre") or _published(table, [c for c in cells if c["style"] == "pre"], width, depth)
    if NORM_STYLE_DECLARATIONS[style].rate_source == PRE_NORM_RECIPE:
        chosen: DefaultRate | None = pre
    else:
        tuned = [c for c in table.get("tuned_warmup_cells", []) if c["arch"] == family]
        chosen = own_cells(style) or _extrapolated(cells, tuned, style, pre)
    if chosen is None:
        chosen = DefaultRate(pre.lr, FALLBACK, f"{FALLBACK}: no {family} cell measured {style} beside Pre-Norm: "
                             f"Pre-Norm's rate ({pre.why})")  # fmt: skip
    if family != arch:
        source = chosen.source if chosen.needs_sweep else FALLBACK  # another architecture's cell measures nothing here
        chosen = DefaultRate(chosen.lr, source, f"{source}: no cell measured {arch}, so {family}'s {chosen.why}")
    return replace(chosen, why=f"{chosen.why}; {SWEEP_FIRST}") if chosen.needs_sweep else chosen
