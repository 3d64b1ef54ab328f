"""The tables of benchmarks/scaling.py: every axis's cells, the rule's regrets, the chosen setting in every cell and
the final comparison, written with the JSON and the figure (``scaling_plots.py``) from the runs finished so far."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import reports
import studies
from scaling_grid import ALPHAS, Cell, alpha_label, cell_tables, choice_tables, complete, grid, regrets
from scaling_plots import plot


def write(study: Any, pending: list[str], chosen: tuple[float, str] | None) -> dict[str, Any]:
    """The tables, JSON and figure of the ``Study`` (scaling.py) from the runs finished so far; ``pending``: the
    cells still to run, ``chosen``: the rule's setting."""
    args = study.args
    name = studies.stem("scaling", args)
    results = list(study.results.values())
    env = reports.environment()
    wall = time.perf_counter() - study.start
    tables = cell_tables(results)
    cells = {c.name: c for axis in grid(args.smoke).values() for c in axis}
    lines = [
        "# Scaling: the best geo_alpha by token budget, depth and width",
        "",
        f"Written by `benchmarks/scaling.py` ({env['date']}; this invocation {wall / 60:.1f} min wall on "
        f"{env['cpu_count']} shared CPU cores; runs finished earlier are taken from `{study.journal.name}`). "
        f"Shapes: {', '.join(study.archs)}. Tokens per step: {args.batch} x {args.seq_len}. Learning rate fixed per "
        "width: lr = 2e-3 sqrt(128 / width); warm-up over the first tenth of the steps, cosine decay to a tenth; "
        f"AdamW (0.9, 0.95), clip 1.0, 4 heads, BPE vocabulary {args.vocab} per corpus, dropout off, one seed. "
        "Every GeoNorm run: max angle pi/4, embedding radius, fixed step; 'constant' is constant decay at the "
        "cell's best harmonic alpha. Choice corpora: " + ", ".join(args.choice_corpora) + f"; held out: "
        f"{args.heldout} (final comparison only).",
        "",
    ]
    if pending:
        lines += ["**Still to run** (the study is resumable; rerun the same command): " + ", ".join(pending) + ".", ""]
    for axis, axis_cells in grid(args.smoke).items():
        lines += [f"## {axis} axis", "", "| cell | tokens | shape | corpus | pre | "
                  + " | ".join(f"a={a:g}" for a in ALPHAS) + " | constant @best | best alpha | best geo - pre |",
                  "|---|---|---|---|---|" + "---|" * len(ALPHAS) + "---|---|---|"]  # fmt: skip
        middle = grid(args.smoke)["budget"][-1]
        for cell in [*axis_cells, middle] if axis != "budget" else axis_cells:
            for (cname, arch, corpus), table in sorted(tables.items()):
                if cname != cell.name:
                    continue
                lines.append(row(cell, arch, corpus, table, args))
        lines.append("")
    lines += decision_lines(choice_tables(tables, args.smoke), chosen)
    lines += chosen_lines(tables, chosen, args)
    lines += final_lines(results, args, study.final_arm, study.final_cell())
    lines += [f"![best alpha by axis]({name}.png)", ""]
    payload = reports.write_results(args, name, lines, env, wall, pending=pending, chosen=chosen,
                                   cells={k: {"layers": c.layers, "width": c.width, "steps": c.steps}
                                          for k, c in cells.items()},
                                   runs=results)  # fmt: skip
    plot(args.out / f"{name}.png", tables, cells, args)
    return payload

def row(cell: Cell, arch: str, corpus: str, table: dict[str, float], args: argparse.Namespace) -> str:
    tokens = cell.steps * args.batch * args.seq_len
    losses = {a: table.get(alpha_label(a), math.nan) for a in ALPHAS}
    finite = {a: v for a, v in losses.items() if math.isfinite(v)}
    best = min(finite, key=finite.get) if finite else None
    constant = next((v for k, v in table.items() if k.startswith("geo constant")), math.nan)
    pre = table.get("pre", math.nan)
    margin = (min(finite[best], constant if math.isfinite(constant) else math.inf) - pre) if best else math.nan
    cells = " | ".join(("**" + reports.fmt(v) + "**") if a == best else reports.fmt(v) for a, v in losses.items())
    return (f"| {cell.name} | {tokens / 1e6:.2f}M | {arch} | {corpus} | {reports.fmt(pre)} | {cells} | "
            f"{reports.fmt(constant)} | {best if best is not None else '-'} | {margin:+.3f} |")  # fmt: skip

def decision_lines(tables: dict, chosen: tuple[float, str] | None) -> list[str]:
    reg = regrets(tables)
    n = len(next(iter(reg.values()), []))
    lines = [
        "## The rule",
        "",
        f"Mean regret of each fixed alpha (harmonic decay) over the {n} complete cells of the budget and depth axes "
        "(shape x corpus x cell; regret = its validation loss minus the best harmonic alpha's in that cell; the "
        "width axis is left out: it checks the choice):",
        "",
        "| alpha | mean regret | worst regret | cells where it is best |",
        "|---|---|---|---|",
    ]
    for a, values in reg.items():
        if values:
            wins = sum(1 for t in tables.values() if complete(t)
                       and min(ALPHAS, key=lambda b, t=t: t[alpha_label(b)]) == a)  # fmt: skip
            lines.append(f"| {a:g} | {statistics.fmean(values):.3f} | {max(values):.3f} | {wins} |")
    if chosen is not None:
        lines += [
            "",
            f"Rule: the alpha with the lowest mean regret over every complete cell, with harmonic decay unless "
            f"constant decay at a cell's best alpha beats harmonic in most cells: **alpha {chosen[0]:g}, "
            f"{chosen[1]} decay**.",
        ]
    return lines + [""]

def chosen_lines(tables: dict, chosen: tuple[float, str] | None, args: argparse.Namespace) -> list[str]:
    """The chosen setting against Pre-Norm and against the cell's best alpha in every complete cell (one seed):
    where it wins and where it loses; the width axis is marked as a check."""
    if chosen is None:
        return []
    arm = alpha_label(*chosen)
    widths = {c.name for c in grid(args.smoke)["width"]}
    lines = [f"## {arm} in every cell (one seed)", "",
             "| cell | tokens | shape | corpus | pre | chosen | chosen - pre | regret | |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    cells = {c.name: c for axis in grid(args.smoke).values() for c in axis}

    def order(item: tuple) -> tuple:
        cell = cells[item[0][0]]
        return cell.steps, cell.layers, cell.width, item[0][1:]

    for (cname, arch, corpus), table in sorted(tables.items(), key=order):
        if not complete(table) or arm not in table:
            continue
        best = min(table[alpha_label(a)] for a in ALPHAS)
        tokens = cells[cname].steps * args.batch * args.seq_len
        lines.append(f"| {cname} | {tokens / 1e6:.2f}M | {arch} | {corpus} | {reports.fmt(table['pre'])} | "
                     f"{reports.fmt(table[arm])} | {table[arm] - table['pre']:+.3f} | {table[arm] - best:.3f} | "
                     f"{'check (width)' if cname in widths else ''} |")  # fmt: skip
    return lines + [""]

def final_lines(results: list[dict[str, Any]], args: argparse.Namespace, arm: str | None, cell: Cell) -> list[str]:
    if arm is None:
        return []
    lines = [f"## Final comparison: {arm} against Pre-Norm ({cell.name}, {args.seeds} seeds)", "",
             "| corpus | shape | pre mean +- std | chosen mean +- std | chosen - pre | margin (2 SE) | verdict |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for corpus in [*args.choice_corpora, args.heldout]:
        for arch in args.archs.split(","):
            arms = {label: [r for r in results if r["spec"]["label"] == f"{cell.name} | {label}"
                            and r["spec"]["arch"] == arch and r["spec"]["corpus"] == corpus]
                    for label in ("pre", arm)}  # fmt: skip
            if not all(arms.values()):
                continue
            p, g = reports.summary(arms["pre"]), reports.summary(arms[arm])
            margin = 2 * math.sqrt((p["std"] ** 2 + g["std"] ** 2) / max(1, min(p["n"], g["n"])))
            diff = g["mean"] - p["mean"]
            verdict = "GeoNorm better" if diff < -margin else ("Pre-Norm better" if diff > margin else "within noise")
            tag = " (held out)" if corpus == args.heldout else ""
            lines.append(f"| {corpus}{tag} | {arch} | {reports.fmt(p['mean'])} +- {reports.fmt(p['std'])} | "
                         f"{reports.fmt(g['mean'])} +- {reports.fmt(g['std'])} | {diff:+.3f} | {margin:.3f} | "
                         f"{verdict} |")  # fmt: skip
    return lines + [""]
