"""The learning rate ``hf-geonorm train`` gives a model trained from scratch, at every preset, norm style and
architecture family (GPT-2, LLaMA): the rate, where it comes from (a measured cell, the rule within the fitted
range, GPT-3's published recipe, an extrapolation from it, or Pre-Norm's as a fallback) and GPT-3's rate for the
same shape beside it (Brown et al. 2020, table 2.1); and GeoNorm's best rate over Pre-Norm's at each measured cell,
which the extrapolation beyond the cells rests on. Asks the function ``train`` asks (``default_rate``, on the config
``train`` would build), which reads ``hf_geonorm/training/rate_rule.json`` (``benchmarks/rate_rule.py`` writes it);
trains nothing. Writes ``benchmarks/results/default_rates.json`` and ``default_rates.md``:

    python benchmarks/default_rates.py [--output benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hf_geonorm.modeling.settings import NORM_STYLES
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.presets import PRESETS
from hf_geonorm.training.rate_rule import RATE_RULE
from hf_geonorm.training.run.model import default_rate, planned_config
from hf_geonorm.training.sweep.report import rate_text

RESULTS = Path(__file__).parent / "results"
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
    """GeoNorm's best rate over Pre-Norm's at each shape the rule's cells measured both."""
    cells = json.loads(RATE_RULE.read_text(encoding="utf-8"))["cells"]
    best = {(c["arch"], c["layers"], c["width"], c["style"]): c for c in cells}
    rows = []
    for (arch, layers, width, style), cell in best.items():
        geo = best.get((arch, layers, width, "geo"))
        if style == "pre" and geo is not None:
            rows.append({"arch": arch, "layers": layers, "width": width, "phase": cell["phase"], "steps": cell["steps"],
                         "pre": cell["lr"], "geo": geo["lr"], "ratio": geo["lr"] / cell["lr"]})  # fmt: skip
    return sorted(rows, key=lambda r: (r["arch"], r["layers"] * r["width"] ** 2, r["width"]))


def rule_crossings() -> tuple[list[str], dict[str, float]]:
    """Where each family's fitted GeoNorm rule would meet Pre-Norm's, were the two rules taken beyond the widths their
    cells span (``train`` does not take them there): the measured ratio says nothing beyond those widths. The lines,
    and the width where GeoNorm's rule falls below Pre-Norm's, by family."""
    table = json.loads(RATE_RULE.read_text(encoding="utf-8"))
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
    pre = {(r["preset"], r["arch"]): r["lr"] for r in rates if r["style"] == "pre"}
    lines = [
        "# Default learning rates",
        "",
        "Written by `benchmarks/default_rates.py`: the peak rate `hf-geonorm train` gives a model trained from scratch "
        "without `--lr` (`default_rate` on the config `train` would build), with its source, and GPT-3's rate for "
        "the same shape (Brown et al. 2020, table 2.1). Sources: a *measured cell* (the study's best rate at exactly "
        "that shape), the *rule within the fitted range* (between cells), the *published recipe* (GPT-3's rates by "
        "non-embedding parameters, log-log, from the largest measured cell up), an *extrapolation* (GeoNorm: the "
        "published rate times its measured ratio to Pre-Norm at the largest cell) or a *fallback (unmeasured)* "
        "(Pre-Norm's rate for a style no cell measured at that shape). Every source but the first two is a guess "
        "to sweep around: `train` says so, and `hf-geonorm sweep`'s default grid spans 1/8 to 8 times it.",
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
    lines += ["", "GeoNorm's best rate over Pre-Norm's at each measured cell (the study's phases, seed 0's "
              "validation): the largest cell's ratio is the one the extrapolation uses:", "",
              "| cell | phase | steps | pre | geo | geo / pre |", "|---|---|---|---|---|---|"]  # fmt: skip
    for row in ratios:
        lines.append(f"| {row['arch']} {row['layers']} x {row['width']} | {row['phase']} | {row['steps']} | "
                     f"{rate_text(row['pre'])} | {rate_text(row['geo'])} | {row['ratio']:g} |")  # fmt: skip
    extrapolated = [r for r in rates if r["style"] == "geo" and r["source"] == "extrapolation"]
    held = sorted({f"{r['lr'] / pre[(r['preset'], r['arch'])]:g}" for r in extrapolated})
    crossings, below = rule_crossings()
    against = [arch for arch, width in below.items() if any(r["arch"] == arch and r["width"] >= width
                                                             for r in extrapolated)]  # fmt: skip
    contradicted = (
        ""
        if not against
        else (
            f"; there {' and '.join(against)}'s fitted rules, taken that far, would put GeoNorm's rate below Pre-Norm's"
        )
    )
    lines += ["", "The ratio is measured at these cells only (300 steps). The fitted rules, which `train` uses only "
              "inside the widths their cells span:", "", *crossings, "",
              "Beyond those widths neither rule is used: Pre-Norm gets the published recipe and GeoNorm the "
              f"*extrapolation*, {' or '.join(held)} times it (the largest cell's ratio, held at every larger width, "
              f"which no wider cell measures){contradicted}. Sweep both there."]  # fmt: skip
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
