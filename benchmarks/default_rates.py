"""The learning rate ``hf-geonorm train`` gives a model trained from scratch, at every preset, norm style and
architecture family (GPT-2, LLaMA): the rate, where it comes from (a measured cell, log-log between measured cells,
GPT-3's published recipe, an extrapolation from it, or Pre-Norm's as a fallback) and GPT-3's rate for the same shape
beside it (Brown et al. 2020, table 2.1); and each non-Pre style's best rate over Pre-Norm's at each cell both were
measured at, which the extrapolation beyond the cells rests on. Asks the function ``train`` asks (``default_rate``,
on the config ``train`` would build), which reads ``hf_geonorm/training/rate_rule.json`` (``benchmarks/rate_rule.py``
writes it, and its fit to ``benchmarks/results/rate_rule.json``, read here for where the fitted rules would cross);
trains nothing. Writes ``benchmarks/results/default_rates.json`` and ``default_rates.md``:

    python benchmarks/default_rates.py [--output benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hf_geonorm.modeling.settings import NORM_STYLES
from hf_geonorm.sweep.options import UNMEASURED_GRID_STEPS
from hf_geonorm.sweep.report import rate_text
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.presets import PRESETS
from hf_geonorm.training.rate_rule import EXTRAPOLATED, RATE_RULE
from hf_geonorm.training.run.model import default_rate, planned_config

RESULTS = Path(__file__).parent / "results"
FIT = RESULTS / "rate_rule.json"  # benchmarks/rate_rule.py's fit over the cells, which train does not use
FAMILIES = ("gpt2", "llama")


def preset_rates() -> list[dict[str, Any]]:
    """One row per preset, family and style: the default rate, its source and account, and GPT-3's rate at that
    shape (None where GPT-3 had no model of it)."""
    published = json.loads(RATE_RULE.read_text(encoding="utf-8"))["published"]["models"]
    gpt3 = {(model["layers"], model["width"]): model for model in published}
    rows = []
    for preset in PRESETS:
        for family in FAMILIES:
            config = planned_config(TrainOptions(arch=family, preset=preset))
            layers, width = config.num_hidden_layers, config.hidden_size
            match = gpt3.get((layers, width))
            same = None if match is None else {"name": match["name"], "lr": match["lr"]}
            for style in NORM_STYLES:
                chosen = default_rate(None, config, style)
                rows.append({"preset": preset, "arch": family, "style": style, "layers": layers, "width": width,
                             "lr": chosen.lr, "source": chosen.source, "why": chosen.why,
                             "gpt3": same})  # fmt: skip
    return rows


def measured_ratios() -> list[dict[str, Any]]:
    """Each non-Pre style's best rate over Pre-Norm's at each shape the library's cells measured both at."""
    cells = json.loads(RATE_RULE.read_text(encoding="utf-8"))["cells"]
    best = {(c["arch"], c["layers"], c["width"], c["style"]): c for c in cells}
    rows = []
    for (arch, layers, width, style), cell in best.items():
        pre = best.get((arch, layers, width, "pre"))
        if style != "pre" and pre is not None:
            rows.append({"arch": arch, "style": style, "layers": layers, "width": width, "phase": cell["phase"],
                         "steps": cell["steps"], "pre": pre["lr"], "lr": cell["lr"],
                         "ratio": cell["lr"] / pre["lr"]})  # fmt: skip
    return sorted(rows, key=lambda r: (r["arch"], NORM_STYLES.index(r["style"]), r["layers"] * r["width"] ** 2,
                                       r["width"]))  # fmt: skip


def extrapolation_ratios(ratios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ratio the extrapolation takes for each family and style: the one at the largest shape (by non-embedding
    parameters, then width) both were measured at."""
    largest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in ratios:
        key, size = (row["arch"], row["style"]), (row["layers"] * row["width"] ** 2, row["width"])
        if key not in largest or size > (largest[key]["layers"] * largest[key]["width"] ** 2, largest[key]["width"]):
            largest[key] = row
    return list(largest.values())


def extrapolation_basis(row: dict[str, Any], ratios: list[dict[str, Any]], tuned: dict[tuple[str, str], str]) -> str:
    """The line of one style's extrapolation: the ratio it holds, its ratio at every cell of the style by width, and
    the ratio with the warm-up tuned."""
    key = (row["arch"], row["style"])
    cells = sorted((c for c in ratios if (c["arch"], c["style"]) == key), key=lambda c: (c["width"], c["layers"]))
    every = ", ".join(f"{c['ratio']:g} at {c['layers']} x {c['width']}" for c in cells)
    return (f"- {row['arch']} {row['style']}: {row['ratio']:g}, at {row['layers']} x {row['width']} ({row['phase']}); "
            f"over its {len(cells)} cell{'s' if len(cells) > 1 else ''}: {every}; with the warm-up tuned: "
            f"{tuned.get(key, '–')}")  # fmt: skip


def tuned_ratios() -> dict[tuple[str, str], str]:
    """Each non-Pre style's best rate over Pre-Norm's where the study tuned the warm-up share with the rate (the
    library's ``tuned_warmup_cells``, phase i), in words by family and style."""
    cells = json.loads(RATE_RULE.read_text(encoding="utf-8")).get("tuned_warmup_cells", [])
    pre = {(c["arch"], c["layers"], c["width"]): c for c in cells if c["style"] == "pre"}
    found = {}
    for cell in cells:
        base = pre.get((cell["arch"], cell["layers"], cell["width"]))
        if cell["style"] != "pre" and base is not None:
            found[(cell["arch"], cell["style"])] = (
                f"{cell['lr'] / base['lr']:g} at {cell['layers']} x {cell['width']} ({rate_text(cell['lr'])} at a "
                f"{cell['warmup_share']:.0%} warm-up against {rate_text(base['lr'])} at {base['warmup_share']:.0%})")
    return found


def rule_crossings() -> tuple[list[str], dict[str, float]]:
    """Where each family's fitted GeoNorm rule would meet Pre-Norm's, were the two rules taken beyond the widths their
    cells span (``train`` uses no fitted rule): the measured ratio says nothing beyond those widths. The lines,
    and the width where GeoNorm's rule falls below Pre-Norm's, by family."""
    table = json.loads(FIT.read_text(encoding="utf-8"))
    lines, below = [], {}
    for arch, rules in table["rules"].items():
        if not {"pre", "geo"} <= set(rules):
            continue
        pre, geo = rules["pre"], rules["geo"]
        own = [c for c in table["cells"] if c["arch"] == arch]
        widths, depths = sorted({c["width"] for c in own}), [c["layers"] for c in own]
        depth = max(set(depths), key=depths.count)  # the depth the width cells share
        ratio = geo["c"] / pre["c"] * depth ** (geo["b"] - pre["b"])  # GeoNorm's rule over Pre-Norm's at width 1
        slope = geo["a"] - pre["a"]
        rules_text = (f"GeoNorm's {geo['c']:.4g} x width^{round(geo['a'], 2) + 0.0:.2f} against Pre-Norm's "
                      f"{pre['c']:.4g} x width^{round(pre['a'], 2) + 0.0:.2f}, at depth {depth}")  # fmt: skip
        if abs(slope) < 1e-6:
            where = f"they never meet: GeoNorm's is {ratio:.3g} times Pre-Norm's at every width"
        else:
            side = "below it beyond" if slope < 0 else "above it beyond"
            where = f"GeoNorm's meets Pre-Norm's at width {ratio ** (-1 / slope):.0f} and is {side}"
            if slope < 0:
                below[arch] = ratio ** (-1 / slope)
        lines.append(f"- {arch}: {rules_text}, measured at widths {widths[0]}-{widths[-1]}: taken beyond them, {where}")
    return lines, below


def page(rates: list[dict[str, Any]], ratios: list[dict[str, Any]]) -> str:
    lines = [
        "# Default learning rates",
        "",
        "Written by `benchmarks/default_rates.py`: the peak rate `hf-geonorm train` gives a model trained from scratch "
        "without `--lr` (`default_rate` on the config `train` would build), with its source, and GPT-3's rate for "
        "the same shape (Brown et al. 2020, table 2.1). Sources: a *measured cell* (the study's best rate at exactly "
        "that shape), *between measured cells* (inside the widths and depths a style's own cells span: log-log "
        "interpolation between its neighbouring cells, along width and along depth, combined through the cell where "
        "the two lines cross; it passes through every cell by construction), the *published recipe* (Pre-Norm: "
        "GPT-3's rates by non-embedding parameters, log-log, from the largest measured cell up), an *extrapolation* "
        "(every other style: Pre-Norm's rate there times the style's best over Pre-Norm's at the largest shape both "
        "were measured at) or a *fallback (unmeasured)* (Pre-Norm's rate, for a style no cell measured beside "
        "Pre-Norm). Every source but the first two is a guess to sweep around: `train` says so, and `hf-geonorm "
        f"sweep`'s default starting rates span 1/{2**UNMEASURED_GRID_STEPS} to {2**UNMEASURED_GRID_STEPS} times it "
        "(its walk extends them while the best is at an edge).",
        "",
        "| preset | layers x width | family | " + " | ".join(NORM_STYLES) + " | GPT-3 |",
        "|---|---|---|" + "---|" * len(NORM_STYLES) + "---|",
    ]
    for preset in PRESETS:
        for family in FAMILIES:
            row = {r["style"]: r for r in rates if (r["preset"], r["arch"]) == (preset, family)}
            first = row[NORM_STYLES[0]]
            gpt3 = "–" if first["gpt3"] is None else f"{rate_text(first['gpt3']['lr'])} ({first['gpt3']['name']})"
            styles = " | ".join(f"{rate_text(row[s]['lr'])}, {row[s]['source']}" for s in NORM_STYLES)
            lines.append(f"| {preset} | {first['layers']} x {first['width']} | {family} | {styles} | {gpt3} |")
    steps = ", ".join(str(s) for s in sorted({row["steps"] for row in ratios}))
    lines += ["", f"Each style's best rate over Pre-Norm's at each cell the study measured both at ({steps} steps, "
              "seed 0's validation):", "",
              "| cell | style | phase | pre | style's best | ratio |", "|---|---|---|---|---|---|"]  # fmt: skip
    for row in ratios:
        lines.append(f"| {row['arch']} {row['layers']} x {row['width']} | {row['style']} | {row['phase']} | "
                     f"{rate_text(row['pre'])} | {rate_text(row['lr'])} | {row['ratio']:g} |")  # fmt: skip
    used = extrapolation_ratios(ratios)
    measured = {(row["arch"], row["style"]) for row in used}
    unmeasured = [f"{family} {style}" for family in FAMILIES for style in NORM_STYLES
                  if style != "pre" and (family, style) not in measured]  # fmt: skip
    tuned = tuned_ratios()
    lines += ["", "Past the cells there were two ways to go: every style at Pre-Norm's published rate, or each style's "
              "measured ratio to Pre-Norm held. `train` takes the second, and states its basis in the log and on the "
              "card, each such rate marked \"not measured at this size: sweep first\". The ratio each style's "
              "*extrapolation* takes beyond its cells (the largest cell's, held at every larger shape, which no "
              "larger cell measures), what it rests on (each cell's best chosen on seed 0's validation at a warm-up "
              "of a tenth of the run; the ratio at every cell of the style, by width), and the ratio where the study "
              "tuned the warm-up with the rate (phase i):", "",
              *(extrapolation_basis(row, ratios, tuned) for row in used)]
    if unmeasured:
        lines += [f"- no cell beside Pre-Norm's yet, so Pre-Norm's rate (*fallback*): {', '.join(unmeasured)}"]
    crossings, below = rule_crossings()
    extrapolated = [r for r in rates if r["style"] == "geo" and r["source"] == EXTRAPOLATED]
    against = [arch for arch, width in below.items() if any(r["arch"] == arch and r["width"] >= width
                                                             for r in extrapolated)]  # fmt: skip
    contradicted = "".join(f" There {arch}'s fitted rules, taken that far, would put GeoNorm's rate below Pre-Norm's."
                           for arch in against)  # fmt: skip
    lines += ["", "The ratios are measured at these cells only. The power laws `benchmarks/rate_rule.py` fits over "
              "the cells ([rate_rule.md](rate_rule.md)), which `train` does not use, taken beyond the widths their "
              "cells span:", "", *crossings, "",
              "Beyond the cells GeoNorm gets the *extrapolation*, Pre-Norm's published rate times its ratio."
              f"{contradicted} Sweep there."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    rates, ratios = preset_rates(), measured_ratios()
    record = {"written_by": "benchmarks/default_rates.py", "rates": rates, "measured_ratios": ratios}
    (args.output / "default_rates.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (args.output / "default_rates.md").write_text(page(rates, ratios), encoding="utf-8")
    print(page(rates, ratios))


if __name__ == "__main__":
    main()
