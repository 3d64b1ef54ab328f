"""How the best learning rate scales, and the cells ``train``'s default rests on: each arm's best rate in the
study's phases on the study corpus (i: GPT-2 and LLaMA 4 x 128, all five styles, at train's default warm-up of a
tenth of the run; g: GPT-2 at widths 64 and 256 and depths 2 and 8, LLaMA at widths 64 and 256), fit per norm
style and architecture as ``lr* = c * width^a * depth^b`` by least squares in log space.

- An architecture whose cells do not vary depth (LLaMA) borrows GPT-2's depth exponent for the same style; a style
  measured at one shape only (post, sandwich, deepnorm) borrows Pre-Norm's exponents for its architecture and fits
  its own ``c``.
- Each cell is also predicted by the rule fit without it (leave one out): the ratio of prediction to measurement
  says how far the fit describes the cells. Each rule's account counts its cells within 10% of it, fit with them
  and without each; a rule over one cell, or over cells that all measured one rate (a constant), fits them and each
  left out by construction, and is said to, not counted as a prediction.
- Pre-Norm's rule extrapolated to GPT-3's 125M shape (12 layers x 768) is set against the 6e-4 GPT-3 trained it at.

The fit describes; ``train`` does not use it: it takes a cell's rate at the cell's shape and, between a style's
cells, log-log interpolation between them, which passes through every cell by construction (the fit misses some:
``hf_geonorm.training.rate_rule``). Every cell was measured at train's default warm-up (``WARMUP_SHARE``): a
phase at another share is refused, as its best rate is not the one train's default warm-up matches. A best rate
at the edge of its grid is not a measurement of the best (it may lie beyond): such cells are listed and left out.
Beside the cells, each style's best cell at phase i's shapes with the warm-up share tuned with the rate (chosen as
``paper_table.py`` chooses, over every share and rate): not a default (train's warm-up is a tenth of the run), but
part of the basis ``train`` states for a rate extrapolated past the cells. Writes ``benchmarks/results/rate_rule.json``
and ``rate_rule.md`` (the fit and its account), and the measured cells, the tuned-warm-up cells and GPT-3's published
rates to ``hf_geonorm/training/rate_rule.json``, where ``hf-geonorm train`` reads its default
learning rate (``hf_geonorm.training.rate_rule.pretraining_rate``; ``benchmarks/default_rates.py`` tables it at the
presets); trains nothing:

    python benchmarks/rate_rule.py [--results benchmarks/results/sweeps]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from hf_geonorm.sweep.grid import read_journal
from hf_geonorm.sweep.report import at_edge, best_rates, rate_text
from hf_geonorm.training.options import WARMUP_SHARE

RESULTS = Path(__file__).parent / "results"
LIBRARY_RULE = Path(__file__).parents[1] / "hf_geonorm" / "training" / "rate_rule.json"
# phase: (architecture, layers, width); phase i's 4 x 128 cells at train's default warm-up share (i_*_w10)
SHAPES = {"i_gpt2_w10": ("gpt2", 4, 128), "g_width_64": ("gpt2", 4, 64), "g_width_256": ("gpt2", 4, 256),
          "g_depth_2": ("gpt2", 2, 128), "g_depth_8": ("gpt2", 8, 128), "g_llama_64": ("llama", 4, 64),
          "i_llama_w10": ("llama", 4, 128), "g_llama_256": ("llama", 4, 256)}  # fmt: skip
# GPT-3's models: their shapes and peak learning rates (Brown et al. 2020, table 2.1), the rates train follows by size
# beyond the measured cells
GPT3_SOURCE = "GPT-3's peak rates (Brown et al. 2020, table 2.1)"
GPT3 = [{"name": name, "layers": layers, "width": width, "lr": lr} for name, layers, width, lr in (
    ("125M", 12, 768, 6.0e-4), ("350M", 24, 1024, 3.0e-4), ("760M", 24, 1536, 2.5e-4), ("1.3B", 24, 2048, 2.0e-4),
    ("2.7B", 32, 2560, 1.6e-4), ("6.7B", 32, 4096, 1.2e-4), ("13B", 40, 5140, 1.0e-4), ("175B", 96, 12288, 0.6e-4),
)]  # fmt: skip
GPT3_125M = GPT3[0]
# phase i's shapes (architecture: layers, width), whose folders i_ARCH_wNN tuned the warm-up share with the rate
TUNED_WARMUP = {"gpt2": (4, 128), "llama": (4, 128)}


def measured_cells(sweeps: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each style's best rate (chosen on validation) in each phase that has run (a style its journal does not hold
    yet has no cell): the cells, and those left out because the best is at an edge of the grid. A phase whose
    warm-up is not train's default share of its steps is refused."""
    cells, edges = [], []
    for phase, (arch, layers, width) in SHAPES.items():
        path = sweeps / phase / "runs.jsonl"
        if not path.is_file():
            continue
        header, entries = read_journal(path)
        steps, warmup = header["train_options"]["max_steps"], header["train_options"].get("warmup_steps")
        warmup = steps // WARMUP_SHARE if warmup is None else warmup  # None: train's default
        if warmup != steps // WARMUP_SHARE:
            raise SystemExit(
                f"{path}: a warm-up of {warmup} of {steps} steps, not train's default a {WARMUP_SHARE}th of the run "
                f"({steps // WARMUP_SHARE} steps): its best rates are not the ones train's default warm-up uses; "
                "name a phase run at the default warm-up in SHAPES"
            )
        runs = [r for r in entries if r["alpha"] is None and r["seed"] == 0]
        edge = at_edge(runs)
        for style, lr in best_rates(runs).items():
            cell = {"phase": phase, "arch": arch, "style": style, "layers": layers, "width": width, "lr": lr,
                    "steps": steps, "warmup_share": warmup / steps}  # fmt: skip
            (edges if style in edge else cells).append(cell)
    return cells, edges


def fit(cells: list[dict[str, Any]], borrowed: dict[str, float] | None = None) -> dict[str, float]:
    """``c``, ``a`` (width) and ``b`` (depth) of ``log lr = log c + a log width + b log depth`` over ``cells``; an
    exponent the cells do not measure apart from the other (no two cells of other widths at one depth, or of other
    depths at one width: 4 x 64 against 2 x 128 confounds them) is taken from ``borrowed`` (else 0)."""
    borrowed = borrowed or {}
    free = [name for name, key, other in (("a", "width", "layers"), ("b", "layers", "width"))
            if any(len({c[key] for c in cells if c[other] == held}) > 1 for held in {c[other] for c in cells})]
    fixed = {name: borrowed.get(name, 0.0) for name in ("a", "b") if name not in free}
    target = np.array([math.log(c["lr"]) - fixed.get("a", 0.0) * math.log(c["width"])
                       - fixed.get("b", 0.0) * math.log(c["layers"]) for c in cells])  # fmt: skip
    columns = [np.ones(len(cells))] + [np.log([c["width" if n == "a" else "layers"] for c in cells]) for n in free]
    solution = np.linalg.lstsq(np.stack(columns, axis=1), target, rcond=None)[0]
    values = {"c": math.exp(solution[0]), **dict(zip(free, map(float, solution[1:]), strict=True)), **fixed}
    return {"c": values["c"], "a": values["a"], "b": values["b"], "borrowed": sorted(fixed)}


def fit_rules(cells: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """A rule per architecture and style: GPT-2 first (its depth exponents are borrowed by an architecture measured
    at one depth), Pre-Norm first within each (its exponents are borrowed by a style measured at one shape)."""
    rules: dict[str, dict[str, dict[str, float]]] = {}
    archs = sorted({c["arch"] for c in cells}, key=lambda a: (a != "gpt2", a))
    for arch in archs:
        styles = sorted({c["style"] for c in cells if c["arch"] == arch}, key=lambda s: (s != "pre", s))
        for style in styles:
            own = [c for c in cells if c["arch"] == arch and c["style"] == style]
            donors = [rules.get("gpt2", {}).get(style), rules.get(arch, {}).get("pre")]
            borrowed = next((d for d in donors if d is not None), None)
            rules.setdefault(arch, {})[style] = fit(own, borrowed)
    return rules


def rate(rule: dict[str, float], width: int, layers: int) -> float:
    return rule["c"] * width ** rule["a"] * layers ** rule["b"]


def leave_one_out(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cell predicted by the rules fit on the other cells: predicted over measured (1: exact)."""
    rows = []
    for index, cell in enumerate(cells):
        rules = fit_rules(cells[:index] + cells[index + 1 :])
        rule = rules.get(cell["arch"], {}).get(cell["style"])
        if rule is None:
            continue
        predicted = rate(rule, cell["width"], cell["layers"])
        rows.append({**cell, "predicted": predicted, "ratio": predicted / cell["lr"]})
    return rows


NEAR = 1.1  # a rule "fits" a cell where it gives the cell's rate within this factor either way


def near(ratio: float) -> bool:
    return 1 / NEAR <= ratio <= NEAR


def account(arch: str, style: str, rule: dict[str, Any], cells: list[dict[str, Any]],
            held_out: list[dict[str, Any]]) -> str:  # fmt: skip
    """What a rule is and how many of its cells it fits: a rule over one cell, or a constant over cells that all
    measured one rate, fits them (and each left out) by construction, and says so."""
    own = [c for c in cells if (c["arch"], c["style"]) == (arch, style)]
    widths, depths = sorted({c["width"] for c in own}), sorted({c["layers"] for c in own})
    span = ", ".join(f"{noun} {values[0]}" if len(values) == 1 else f"{noun}s {values[0]}-{values[-1]}"
                     for noun, values in (("width", widths), ("depth", depths)))  # fmt: skip
    if len(own) == 1:
        cell = own[0]
        return (f"- {arch} {style}: one cell ({cell['layers']} x {cell['width']}, {rate_text(cell['lr'])}): the rule "
                f"is that rate, with the exponents {', '.join(rule['borrowed'])} borrowed; it fits its one cell by "
                "construction and predicts no other")  # fmt: skip
    if len({c["lr"] for c in own}) == 1:
        return (f"- {arch} {style}: a constant {rate_text(own[0]['lr'])}: its {len(own)} cells ({span}) all measured "
                "that rate, so it fits each of them, and each left out, by construction: the best rate did not move "
                "over these shapes, which says nothing of how it moves beyond them")  # fmt: skip
    inside = sum(near(rate(rule, c["width"], c["layers"]) / c["lr"]) for c in own)
    out = [row for row in held_out if (row["arch"], row["style"]) == (arch, style)]
    ratios = ", ".join(f"{row['ratio']:.2f}" for row in out)
    return (f"- {arch} {style}: {rule['c']:.4g} x width^{rule['a']:.3f} x depth^{rule['b']:.3f} over {len(own)} cells "
            f"({span}): {inside} of {len(own)} within 10% of the rule fit over them; "
            f"{sum(near(row['ratio']) for row in out)} of {len(out)} within 10% when left out of the fit (predicted "
            f"over measured: {ratios})")  # fmt: skip


def report(cells: list[dict[str, Any]], edges: list[dict[str, Any]]) -> dict[str, Any]:
    rules = fit_rules(cells)
    held_out = leave_one_out(cells)
    record: dict[str, Any] = {"cells": cells, "left_out_at_edge": edges, "rules": rules, "leave_one_out": held_out}
    if "pre" in rules.get("gpt2", {}):
        predicted = rate(rules["gpt2"]["pre"], GPT3_125M["width"], GPT3_125M["layers"])
        record["gpt3_125m"] = {**GPT3_125M, "pre_rule": predicted, "ratio": predicted / GPT3_125M["lr"]}
    return record


def tuned_warmup_cells(sweeps: Path) -> list[dict[str, Any]]:
    """Each style's best cell at phase i's shapes (``TUNED_WARMUP``: every ``i_ARCH_wNN`` folder, one per warm-up
    share) over every share and rate: the lowest seed-0 validation loss, as the paper's table chooses."""
    cells = []
    for arch, (layers, width) in TUNED_WARMUP.items():
        runs = [(int(folder.name.rsplit("_w", 1)[1]) / 100, run) for folder in sorted(sweeps.glob(f"i_{arch}_w*"))
                if (folder / "runs.jsonl").is_file() for run in read_journal(folder / "runs.jsonl")[1]
                if run["seed"] == 0 and run["alpha"] is None and run.get("val_loss") is not None]  # fmt: skip
        for style in dict.fromkeys(run["style"] for _, run in runs):
            share, best = min(((s, r) for s, r in runs if r["style"] == style), key=lambda item: item[1]["val_loss"])
            cells.append({"phase": f"i_{arch}_w*", "arch": arch, "style": style, "layers": layers, "width": width,
                          "lr": best["lr"], "warmup_share": share})  # fmt: skip
    return cells


def library_rule(record: dict[str, Any]) -> dict[str, Any]:
    """What ``train`` reads: the measured cells (each the default at its own shape, and between a style's cells the
    log-log interpolation between them), the tuned-warm-up cells (the basis an extrapolation states) and GPT-3's
    rates (beyond the cells); not the fit."""
    return {"written_by": f"benchmarks/rate_rule.py (from benchmarks/results/sweeps: {', '.join(SHAPES)}; tuned "
                          f"warm-up: {', '.join(f'i_{arch}_w*' for arch in TUNED_WARMUP)})",
            "cells": record["cells"], "tuned_warmup_cells": record["tuned_warmup_cells"],
            "published": {"source": GPT3_SOURCE, "models": GPT3}}  # fmt: skip


def page(record: dict[str, Any]) -> str:
    lines = [
        "# The learning-rate rule",
        "",
        f"Written by `benchmarks/rate_rule.py` from the study's journals ({', '.join(SHAPES)}: seed 0's "
        f"validation, each at a warm-up of a {WARMUP_SHARE}th of its steps, train's default): "
        "`lr* = c * width^a * depth^b` per architecture and style, fit in log space. The fit describes how the best "
        "rate moves over the cells; `train` does not use it: it takes each cell's rate at the cell's shape and, "
        "between a style's cells, log-log interpolation between the neighbouring cells, which passes through every "
        "cell by construction ([default_rates.md](default_rates.md)).",
        "",
        "| architecture | style | c | a (width) | b (depth) | borrowed |",
        "|---|---|---|---|---|---|",
    ]
    for arch, styles in record["rules"].items():
        for style, rule in styles.items():
            lines.append(f"| {arch} | {style} | {rule['c']:.4g} | {rule['a']:+.3f} | {rule['b']:+.3f} | "
                         f"{', '.join(rule['borrowed']) or '–'} |")  # fmt: skip
    lines += ["", "What each rule is, and how many of its cells it fits:", ""]
    lines += [account(arch, style, rule, record["cells"], record["leave_one_out"])
              for arch, styles in record["rules"].items() for style, rule in styles.items()]  # fmt: skip
    lines += ["", "| cell | style | measured | predicted without it | ratio |", "|---|---|---|---|---|"]
    for row in record["leave_one_out"]:
        lines.append(f"| {row['arch']} {row['layers']} x {row['width']} | {row['style']} | {rate_text(row['lr'])} | "
                     f"{row['predicted']:.2e} | {row['ratio']:.2f} |")  # fmt: skip
    if record["left_out_at_edge"]:
        edges = ", ".join(f"{c['phase']} {c['style']} ({rate_text(c['lr'])})" for c in record["left_out_at_edge"])
        lines += ["", f"Left out, the best at an edge of its grid: {edges}."]
    tuned = record.get("tuned_warmup_cells", [])
    if tuned:
        pre = {(c["arch"], c["layers"], c["width"]): c["lr"] for c in tuned if c["style"] == "pre"}
        lines += ["", "With the warm-up share tuned with the rate (phase i, every `i_ARCH_wNN` folder; seed 0's "
                  "validation over every share and rate): not a default, but the basis `train` states beside a rate "
                  "it extrapolates. Each style's best, and its ratio to Pre-Norm's:", "",
                  "| cell | style | rate | warm-up share | over Pre-Norm |", "|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {c['arch']} {c['layers']} x {c['width']} | {c['style']} | {rate_text(c['lr'])} | "
                  f"{c['warmup_share']:g} | {c['lr'] / pre[(c['arch'], c['layers'], c['width'])]:g} |"
                  for c in tuned]  # fmt: skip
    if "gpt3_125m" in record:
        check = record["gpt3_125m"]
        lines += ["", f"Pre-Norm's rule at GPT-3's 125M shape (12 x 768): {check['pre_rule']:.2e}, against the "
                  f"{check['lr']:g} GPT-3 trained it at ({check['ratio']:.2f}x): beyond the cells `train` follows "
                  "GPT-3's rates by size instead ([default_rates.md](default_rates.md))."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS / "sweeps")
    args = parser.parse_args()
    cells, edges = measured_cells(args.results)
    if not cells:
        raise SystemExit(f"no journal of {', '.join(SHAPES)} under {args.results}: run benchmarks/sweep_study.py first")
    record = {**report(cells, edges), "tuned_warmup_cells": tuned_warmup_cells(args.results)}
    (RESULTS / "rate_rule.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (RESULTS / "rate_rule.md").write_text(page(record), encoding="utf-8")
    LIBRARY_RULE.write_text(json.dumps(library_rule(record), indent=1) + "\n", encoding="utf-8")
    print(page(record))


if __name__ == "__main__":
    main()
