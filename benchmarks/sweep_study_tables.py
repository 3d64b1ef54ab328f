"""The study's results in one page: ``benchmarks/results/sweeps/study.md`` and ``study.json``, read from the phases'
journals (``runs.jsonl``, written by ``hf-geonorm sweep``'s library function in ``benchmarks/sweep_study.py``).

- Every phase with both arms: each arm at its own best rate (chosen on that phase's validation; on ``b_gcide`` the
  rates chosen on fortunes, since the dictionary is held out from every choice), test loss over its seeds, and
  GeoNorm's difference against the larger seed spread.
- The best rates by shape (phase a's 4 layers x width 128 against phase c's 24 x 64): the data for a rate rule.
- Alpha and rate together (phase d): validation loss per alpha at each rate, each alpha's best rate.
- Alpha 0.5 against alpha 1, seeded (phase e): on the standard library, on the held-out dictionary, and at depth.

A phase still running is shown with the seeds it has. Run it at any time; it trains nothing:

    python benchmarks/sweep_study_tables.py [--results benchmarks/results/sweeps]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hf_geonorm.training.sweep import read_journal
from hf_geonorm.training.sweep_report import best_rates, cells, mean_spread, rate_text

RESULTS = Path(__file__).parent / "results" / "sweeps"
PHASES = {
    "a_gpt2": "GPT-2, 4 layers x 128, standard library source",
    "a_llama": "LLaMA, 4 layers x 128, standard library source",
    "b_fortunes": "GPT-2, 4 layers x 128, fortunes (prose)",
    "b_gcide": "GPT-2, 4 layers x 128, GCIDE dictionary (held out: fortunes' rates)",
    "c_depth": "GPT-2, 24 layers x 64, standard library source",
}


def runs_of(folder: Path) -> list[dict[str, Any]]:
    return read_journal(folder / "runs.jsonl")[1] if (folder / "runs.jsonl").is_file() else []


def chosen_rates(results: Path, phase: str) -> dict[str, float]:
    """The rates each arm of ``phase`` is reported at: its own validation's best, or fortunes' for the dictionary."""
    source = "b_fortunes" if phase == "b_gcide" else phase
    return best_rates([r for r in runs_of(results / source) if r["alpha"] is None])


def in_spreads(difference: float, *arms: dict[str, Any]) -> float | None:
    """``difference`` in units of the larger seed spread of ``arms`` (None where no arm has more than one seed)."""
    spreads = [arm["test_spread"] for arm in arms if arm["test_spread"] is not None]
    return abs(difference) / max(spreads) if spreads else None


def compare(results: Path, phase: str) -> dict[str, Any] | None:
    """Pre-Norm against GeoNorm at their rates on ``phase``'s test split (None while an arm has no run there)."""
    runs = [r for r in runs_of(results / phase) if r["alpha"] is None]
    table, rates = cells(runs), chosen_rates(results, phase)
    if not all(style in rates and rates[style] in table.get(style, {}) for style in ("pre", "geo")):
        return None
    row: dict[str, Any] = {"phase": phase, "what": PHASES[phase]}
    for style in ("pre", "geo"):
        cell = table[style][rates[style]]
        mean, spread, n = mean_spread(cell.test)
        row[style] = {"lr": rates[style], "test_mean": mean, "test_spread": spread, "seeds": n,
                      "diverged": len(cell.test) - n}  # fmt: skip
    row["geo_minus_pre"] = row["geo"]["test_mean"] - row["pre"]["test_mean"]
    row["in_spreads"] = in_spreads(row["geo_minus_pre"], row["pre"], row["geo"])
    return row


def alpha_grid(results: Path) -> dict[str, Any] | None:
    """Phase d: the validation loss of each alpha at each rate (seed 0), each alpha's best rate and its test loss."""
    runs = runs_of(results / "d_alpha")
    if not runs:
        return None
    table, best = cells(runs), best_rates(runs)
    grid = {arm: {rate_text(lr): mean_spread(cell.val)[0] for lr, cell in rates.items()}
            for arm, rates in table.items()}  # fmt: skip
    bests = {arm: {"lr": best[arm], "val": mean_spread(table[arm][best[arm]].val)[0],
                   "test": mean_spread(table[arm][best[arm]].test)[0]} for arm in table}  # fmt: skip
    return {"runs": len(runs), "val_loss": grid, "best": bests, "best_alpha": min(bests, key=lambda a: bests[a]["val"])}


ALPHA_CHECKS = {
    "e_alpha_stdlib": "4 layers x 128, standard library source, 8e-3",
    "e_alpha_gcide": "4 layers x 128, GCIDE dictionary (held out), 8e-3",
    "e_alpha_depth": "24 layers x 64, standard library source, each alpha's best rate",
}


def alpha_check(results: Path, phase: str) -> dict[str, Any] | None:
    """Phase e on one shape or corpus: each alpha at its best rate (chosen on validation), test loss over its seeds;
    alpha 1 minus alpha 0.5 and that difference in units of the larger seed spread."""
    runs = runs_of(results / phase)
    table, best = cells(runs), best_rates(runs)
    if not {"geo alpha 0.5", "geo alpha 1"} <= set(table):
        return None
    row: dict[str, Any] = {"phase": phase, "what": ALPHA_CHECKS[phase]}
    for arm in ("geo alpha 0.5", "geo alpha 1"):
        mean, spread, n = mean_spread(table[arm][best[arm]].test)
        by_rate = {rate_text(lr): mean_spread(cell.val)[0] for lr, cell in table[arm].items()}
        row[arm] = {"lr": best[arm], "test_mean": mean, "test_spread": spread, "seeds": n, "val_by_rate": by_rate}
    row["one_minus_half"] = row["geo alpha 1"]["test_mean"] - row["geo alpha 0.5"]["test_mean"]
    row["in_spreads"] = in_spreads(row["one_minus_half"], row["geo alpha 0.5"], row["geo alpha 1"])
    return row


def arm_test_loss(arm: dict[str, Any]) -> str:
    """An arm's test loss: mean ± spread (n=seeds)."""
    spread = "" if arm["test_spread"] is None else f" ± {arm['test_spread']:.3f}"
    return f"{arm['test_mean']:.3f}{spread} (n={arm['seeds']})"


def phase_cells(row: dict[str, Any]) -> tuple[str, str]:
    """A row's first cell (the phase, linked to its report) and last (the difference in seed spreads)."""
    spreads = "–" if row["in_spreads"] is None else f"{row['in_spreads']:.1f}"
    return f"[{row['phase']}]({row['phase']}/sweep.md)", spreads


def page(rows: list[dict[str, Any]], alphas: dict[str, Any] | None, checks: list[dict[str, Any]]) -> str:
    lines = [
        "# The study: GeoNorm against a tuned Pre-Norm",
        "",
        "Written by `benchmarks/sweep_study_tables.py` from the phases' journals. Each arm at its own best rate "
        "(chosen on validation, seed 0, six or three rates a factor 2 apart), test loss as mean ± sample standard "
        "deviation over seeds; 300 steps x 16 x 128 tokens. Negative: GeoNorm lower. 'spreads': the difference in "
        "units of the larger seed spread.",
        "",
        "| phase | model and data | Pre-Norm rate | Pre-Norm test | GeoNorm rate | GeoNorm test | GeoNorm − Pre-Norm "
        "| spreads |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        pre, geo = row["pre"], row["geo"]
        phase, spreads = phase_cells(row)
        lines.append(
            f"| {phase} | {row['what']} | {rate_text(pre['lr'])} | {arm_test_loss(pre)} | {rate_text(geo['lr'])} | "
            f"{arm_test_loss(geo)} | {row['geo_minus_pre']:+.3f} | {spreads} |"
        )
    ratios = [f"{row['phase']}: {row['geo']['lr'] / row['pre']['lr']:g}x" for row in rows]
    lines += ["", "GeoNorm's best rate over Pre-Norm's: " + ", ".join(ratios) + "."]
    if alphas:
        rates = sorted({lr for grid in alphas["val_loss"].values() for lr in grid}, key=float)
        lines += [
            "",
            f"## Alpha and rate together ([d_alpha](d_alpha/sweep.md), {alphas['runs']} runs, seed 0)",
            "",
            "Validation loss; **bold**: each alpha's best rate.",
            "",
            "| arm | " + " | ".join(rates) + " | best rate: test |",
            "|---|" + "---|" * (len(rates) + 1),
        ]
        for arm, grid in alphas["val_loss"].items():
            best = alphas["best"][arm]
            row = [(f"**{grid[r]:.3f}**" if r == rate_text(best["lr"]) else f"{grid[r]:.3f}") if r in grid else "–"
                   for r in rates]  # fmt: skip
            lines.append(f"| {arm} | " + " | ".join(row) + f" | {rate_text(best['lr'])}: {best['test']:.3f} |")
        lines += ["", f"Lowest validation loss at its own best rate: {alphas['best_alpha']}."]
    if checks:
        lines += [
            "",
            "## Alpha 0.5 against alpha 1, seeded (phase e)",
            "",
            "Test loss over seeds at each alpha's rate (on depth: each alpha's best rate, chosen on seed 0's "
            "validation among half, once and twice phase c's, the grid extended while the best is at an edge). "
            "Negative: alpha 1 lower.",
            "",
            "| phase | shape and data | alpha 0.5: rate, test | alpha 1: rate, test | alpha 1 − alpha 0.5 | spreads |",
            "|---|---|---|---|---|---|",
        ]
        for row in checks:
            half, one = row["geo alpha 0.5"], row["geo alpha 1"]
            phase, spreads = phase_cells(row)
            lines.append(
                f"| {phase} | {row['what']} | {rate_text(half['lr'])}: {arm_test_loss(half)} | {rate_text(one['lr'])}: "
                f"{arm_test_loss(one)} | {row['one_minus_half']:+.3f} | {spreads} |"
            )
        for row in checks:
            if max(len(row[arm]["val_by_rate"]) for arm in ("geo alpha 0.5", "geo alpha 1")) > 1:
                grid = "; ".join(
                    f"{arm}: " + ", ".join(f"{lr} {val:.3f}" for lr, val in row[arm]["val_by_rate"].items())
                    for arm in ("geo alpha 0.5", "geo alpha 1")
                )
                lines += ["", f"{row['phase']}, validation loss by rate (mean over the seeds run): {grid}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = [row for phase in PHASES if (row := compare(args.results, phase)) is not None]
    alphas = alpha_grid(args.results)
    checks = [row for phase in ALPHA_CHECKS if (row := alpha_check(args.results, phase)) is not None]
    (args.results / "study.md").write_text(page(rows, alphas, checks), encoding="utf-8")
    payload = {"phases": rows, "alpha": alphas, "alpha_checks": checks}
    (args.results / "study.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {args.results / 'study.md'}")


if __name__ == "__main__":
    main()
