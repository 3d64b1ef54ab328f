"""The study's results in one page: ``benchmarks/results/sweeps/study.md`` and ``study.json``, read from the phases'
journals (``runs.jsonl``, written by ``hf-geonorm sweep``'s library function in ``benchmarks/sweep_study.py``).

- Every phase with both arms: each arm at its own best rate (chosen on that phase's validation; on ``b_gcide`` the
  rates chosen on fortunes, since the dictionary's validation chooses nothing), test loss over its seeds, and
  GeoNorm's difference ± its standard error with Welch's two-sided p (``hf_geonorm.sweep.welch``).
- GeoNorm's best rate over Pre-Norm's in each of those phases.
- Alpha and rate together (phase d): validation loss per alpha at each rate, each alpha's best rate.
- Alpha 0.5 against alpha 1, seeded (phase e): on the standard library, on the held-out dictionary, and at depth.
- On the study corpus: the five styles (phase h), the length (phase f) and the shapes (phase g), each margin the
  same way; and that these phases held out by the split rule before, with its leak (``split_leak.json``).

A phase still running is shown with the seeds it has. Run it at any time; it trains nothing:

    python benchmarks/sweep_study_tables.py [--results benchmarks/results/sweeps]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from study_margins import MARGIN, arm_at, arm_test_loss, margin, margin_cells, old_split_note, runs_of

from hf_geonorm.sweep.grid import read_journal
from hf_geonorm.sweep.report import best_rates, cells, mean_spread, rate_text

RESULTS = Path(__file__).parent / "results" / "sweeps"
STUDY_CORPUS = Path(__file__).parent / "results" / "study_corpus.json"
PHASES = {
    "a_gpt2": "GPT-2, 4 layers x 128, standard library source",
    "a_llama": "LLaMA, 4 layers x 128, standard library source",
    "b_fortunes": "GPT-2, 4 layers x 128, fortunes (prose)",
    "b_gcide": "GPT-2, 4 layers x 128, GCIDE dictionary (held out: fortunes' rates)",
    "c_depth": "GPT-2, 24 layers x 64, standard library source",
}


def chosen_rates(results: Path, phase: str) -> dict[str, float]:
    """The rates each arm of ``phase`` is reported at: its own validation's best, or fortunes' for the dictionary."""
    source = "b_fortunes" if phase == "b_gcide" else phase
    return best_rates([r for r in runs_of(results / source) if r["alpha"] is None])


def compare(results: Path, phase: str) -> dict[str, Any] | None:
    """Pre-Norm against GeoNorm at their rates on ``phase``'s test split (None while an arm has no run there)."""
    runs = [r for r in runs_of(results / phase) if r["alpha"] is None]
    table, rates = cells(runs), chosen_rates(results, phase)
    if not all(style in rates and rates[style] in table.get(style, {}) for style in ("pre", "geo")):
        return None
    row: dict[str, Any] = {"phase": phase, "what": PHASES[phase]}
    for style in ("pre", "geo"):
        row[style] = arm_at(table[style][rates[style]], rates[style])
    row["geo_minus_pre"] = row["geo"]["test_mean"] - row["pre"]["test_mean"]
    row["welch"] = margin(row["geo"], row["pre"])
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
    alpha 1 minus alpha 0.5 ± its standard error, and Welch's p."""
    runs = runs_of(results / phase)
    table, best = cells(runs), best_rates(runs)
    if not {"geo alpha 0.5", "geo alpha 1"} <= set(table):
        return None
    row: dict[str, Any] = {"phase": phase, "what": ALPHA_CHECKS[phase]}
    for arm in ("geo alpha 0.5", "geo alpha 1"):
        by_rate = {rate_text(lr): mean_spread(cell.val)[0] for lr, cell in table[arm].items()}
        row[arm] = {**arm_at(table[arm][best[arm]], best[arm]), "val_by_rate": by_rate}
    row["one_minus_half"] = row["geo alpha 1"]["test_mean"] - row["geo alpha 0.5"]["test_mean"]
    row["welch"] = margin(row["geo alpha 1"], row["geo alpha 0.5"])
    return row


def phase_link(row: dict[str, Any]) -> str:
    return f"[{row['phase']}]({row['phase']}/sweep.md)"


def page(
    rows: list[dict[str, Any]], alphas: dict[str, Any] | None, checks: list[dict[str, Any]], again: dict[str, Any]
) -> str:
    lines = [
        "# The study: GeoNorm against a tuned Pre-Norm",
        "",
        "Written by `benchmarks/sweep_study_tables.py` from the phases' journals. Each arm at its own best rate "
        "(chosen on validation, seed 0, six or three rates a factor 2 apart), test loss as mean ± sample standard "
        f"deviation over seeds; 300 steps x 16 x 128 tokens. Negative: GeoNorm lower. {MARGIN} {old_split_note()}",
        "",
        "| phase | model and data | Pre-Norm rate | Pre-Norm test | GeoNorm rate | GeoNorm test | GeoNorm − Pre-Norm "
        "| Welch's p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        pre, geo = row["pre"], row["geo"]
        lines.append(
            f"| {phase_link(row)} | {row['what']} | {rate_text(pre['lr'])} | {arm_test_loss(pre)} | "
            f"{rate_text(geo['lr'])} | {arm_test_loss(geo)} | {margin_cells(row['geo_minus_pre'], row['welch'])} |"
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
            "| phase | shape and data | alpha 0.5: rate, test | alpha 1: rate, test | alpha 1 − alpha 0.5 | "
            "Welch's p |",
            "|---|---|---|---|---|---|",
        ]
        for row in checks:
            half, one = row["geo alpha 0.5"], row["geo alpha 1"]
            lines.append(
                f"| {phase_link(row)} | {row['what']} | {rate_text(half['lr'])}: {arm_test_loss(half)} | "
                f"{rate_text(one['lr'])}: {arm_test_loss(one)} | {margin_cells(row['one_minus_half'], row['welch'])} |"
            )
        for row in checks:
            if max(len(row[arm]["val_by_rate"]) for arm in ("geo alpha 0.5", "geo alpha 1")) > 1:
                grid = "; ".join(
                    f"{arm}: " + ", ".join(f"{lr} {val:.3f}" for lr, val in row[arm]["val_by_rate"].items())
                    for arm in ("geo alpha 0.5", "geo alpha 1")
                )
                lines += ["", f"{row['phase']}, validation loss by rate (mean over the seeds run): {grid}."]
    if again["pairs"]:
        lines += [
            "",
            "## Reruns",
            "",
            f"{len(again['pairs'])} runs of the same cell (options, settings, rate and seed) appear in two phases, "
            f"trained by the code of different sessions; their validation or test losses differ by up to "
            f"{again['largest']:.3f}: phases of different sessions are comparable to that precision.",
        ]
    return "\n".join(lines) + "\n"


STYLE_NAMES = {"pre": "Pre-Norm", "geo": "GeoNorm", "post": "Post-Norm", "sandwich": "SandwichNorm",
               "deepnorm": "DeepNorm"}  # fmt: skip
LENGTH_PHASES = {300: "h_styles", 1200: "f_length_1200", 2400: "f_length_2400"}  # steps: phase
TOKENS_PER_STEP = 16 * 128


def arm_at_best(runs: list[dict[str, Any]], style: str) -> dict[str, Any] | None:
    """One style of a phase at its best rate (chosen on validation): its test loss over the seeds run there, the
    rates it was swept at, and whether every rate diverged (None while the style has no run)."""
    table = cells([r for r in runs if r["alpha"] is None])
    if style not in table:
        return None
    lr = best_rates([r for r in runs if r["alpha"] is None and r["style"] == style])[style]
    diverged = all(v is None for c in table[style].values() for v in c.val)
    rates = [rate_text(r) for r in table[style]]
    return {**arm_at(table[style][lr], lr), "rates": rates, "every_rate_diverged": diverged}


def styles_table(results: Path) -> dict[str, Any] | None:
    """Phase h: each of the five styles at its best rate, and its difference from Pre-Norm ± its standard error."""
    runs = runs_of(results / "h_styles")
    arms = {style: arm for style in STYLE_NAMES if (arm := arm_at_best(runs, style)) is not None}
    if "pre" not in arms:
        return None
    for arm in arms.values():
        if arm["test_mean"] is not None and arms["pre"]["test_mean"] is not None:
            arm["minus_pre"] = arm["test_mean"] - arms["pre"]["test_mean"]
            arm["welch"] = margin(arm, arms["pre"])
    return arms


def length_rows(results: Path) -> list[dict[str, Any]]:
    """Phase f: Pre-Norm against GeoNorm at each length, each at its own best rate there."""
    rows = []
    for steps, phase in LENGTH_PHASES.items():
        runs = runs_of(results / phase)
        arms = {style: arm_at_best(runs, style) for style in ("pre", "geo")}
        if None in arms.values() or None in (arms["pre"]["test_mean"], arms["geo"]["test_mean"]):
            continue
        rows.append({"steps": steps, "tokens": steps * TOKENS_PER_STEP, "phase": phase, **arms,
                     "geo_minus_pre": arms["geo"]["test_mean"] - arms["pre"]["test_mean"],
                     "welch": margin(arms["geo"], arms["pre"])})  # fmt: skip
    return rows


def length_plot(rows: list[dict[str, Any]], path: Path) -> None:
    """GeoNorm's margin on test against the tokens trained, with the standard error of the difference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    tokens = [row["tokens"] / 1e6 for row in rows]
    errors = [0.0 if row["welch"] is None else row["welch"]["standard_error"] for row in rows]
    axis.errorbar(tokens, [row["geo_minus_pre"] for row in rows], yerr=errors, marker="o", capsize=4)
    axis.axhline(0.0, color="grey", linewidth=0.8)
    axis.set_xscale("log")
    axis.set_xticks(tokens, [f"{t:.1f}M" for t in tokens])
    axis.set_xlabel("tokens trained (GPT-2 4 x 128, study corpus)")
    axis.set_ylabel("test loss: GeoNorm − Pre-Norm (nats)")
    axis.set_title("GeoNorm's margin against training length (each arm at its best rate)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


G_PHASES = {"g_width_64": "GPT-2 4 x 64", "h_styles": "GPT-2 4 x 128 (phase h)", "g_width_256": "GPT-2 4 x 256",
            "g_depth_2": "GPT-2 2 x 128", "g_depth_8": "GPT-2 8 x 128", "g_llama_64": "LLaMA 4 x 64",
            "g_llama_128": "LLaMA 4 x 128", "g_llama_256": "LLaMA 4 x 256"}  # fmt: skip


def shape_rows(results: Path) -> list[dict[str, Any]]:
    """Phase g (and phase h's GPT-2 4 x 128): each arm's best rate and test loss per shape."""
    rows = []
    for phase, what in G_PHASES.items():
        runs = runs_of(results / phase)
        arms = {style: arm_at_best(runs, style) for style in ("pre", "geo")}
        if None not in arms.values():
            rows.append({"phase": phase, "what": what, **arms, "welch": margin(arms["geo"], arms["pre"]),
                         "geo_minus_pre": arms["geo"]["test_mean"] - arms["pre"]["test_mean"]})  # fmt: skip
    return rows


def reruns(results: Path) -> dict[str, Any]:
    """Runs of the same cell (options, settings, rate, seed) in two journals, trained at different commits: the
    largest difference of their validation and test losses, which bounds how far phases of different sessions
    are comparable."""
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    pairs = []
    for folder in sorted(p for p in results.iterdir() if (p / "runs.jsonl").is_file()):
        header, runs = read_journal(folder / "runs.jsonl")
        for run in runs:
            if run["val_loss"] is None:
                continue
            key = json.dumps([header["train_options"], run["settings"], run["lr"], run["seed"]], sort_keys=True)
            if key in seen and seen[key][0] != folder.name:
                earlier_phase, earlier = seen[key]
                difference = max(abs(earlier[k] - run[k]) for k in ("val_loss", "test_loss"))
                pairs.append({"runs": [f"{earlier_phase}/{earlier['run']}", f"{folder.name}/{run['run']}"],
                              "largest_difference": difference})  # fmt: skip
            seen.setdefault(key, (folder.name, run))
    return {"pairs": pairs, "largest": max((p["largest_difference"] for p in pairs), default=None)}


def study_page(styles: dict[str, Any] | None, lengths: list[dict[str, Any]], shapes: list[dict[str, Any]]) -> str:
    """The sections of the phases on the study corpus (h, f, g)."""
    corpus = json.loads(STUDY_CORPUS.read_text(encoding="utf-8")) if STUDY_CORPUS.is_file() else None
    lines = ["", "# On the study corpus (phases h, f, g)", ""]
    if corpus:
        tokens = corpus["tokens"]
        lines += [
            f"The study corpus ([study_corpus.json](../study_corpus.json), `benchmarks/study_corpus.py`): the Python "
            f"source of {', '.join(f'{k} {v}' for k, v in corpus['packages'].items())}, {corpus['files']:,} files, "
            f"{corpus['bytes'] / 1e6:.0f} MB, sha256 {corpus['sha256'][:12]}…; {tokens['train_tokens']:,} training "
            f"tokens (the tokenizer, trained on the fly, read training documents only); validation "
            f"{tokens['val_documents']} documents, {tokens['val_tokens']:,} tokens; test {tokens['test_documents']} "
            f"documents, {tokens['test_tokens']:,} tokens ({tokens['val_blocks']} blocks of 128 each). The longest run "
            f"trains on {max(LENGTH_PHASES) * TOKENS_PER_STEP:,} tokens, less than one epoch. "
            f"{old_split_note(short=True)} Warm-up is a tenth of each run; only the peak rate is tuned (warm-up, "
            "clipping, decay and weight decay are the same for every arm).",
        ]
    if styles:
        lines += [
            "",
            "## The five norm styles: phase h, before the Post-Norm fix ([h_styles](h_styles/sweep.md), GPT-2 4 x 128, "
            "300 steps)",
            "",
            "Post-Norm and DeepNorm did not train: at every rate they stayed near the unigram loss, held there by "
            "GPT-2's random position table and, at this width, the short warm-up (the diagnosis: docs/training.md, "
            '"Post-Norm on GPT-2"); these two arms ran before the library\'s fix and have not run since. Warm-up '
            "fixed at a tenth of the run for every style, which is known to be unfair to Post-LN. Only the peak rate "
            "was chosen: six rates a factor 2 apart from 1e-3, the grid extended at an edge, chosen on seed 0's "
            "validation, then seeds 0-2 at the rate chosen. Negative: lower than Pre-Norm; ± and Welch's p as at the "
            "top of the page.",
            "",
            "| style | rates swept | rate chosen | test loss | − Pre-Norm | Welch's p |",
            "|---|---|---|---|---|---|",
        ]
        for style, arm in styles.items():
            if arm["every_rate_diverged"]:
                rates = ", ".join(arm["rates"])
                lines.append(f"| {STYLE_NAMES[style]} | {rates} | diverged at every rate | – | – | – |")
                continue
            versus = "minus_pre" in arm and style != "pre"
            minus = margin_cells(arm["minus_pre"], arm["welch"]) if versus else "– | –"
            lines.append(
                f"| {STYLE_NAMES[style]} | {', '.join(arm['rates'])} | {rate_text(arm['lr'])} | {arm_test_loss(arm)} "
                f"| {minus} |"
            )
    if lengths:
        lines += [
            "",
            "## Length (phase f: GPT-2 4 x 128; 300 steps is phase h)",
            "",
            "Each arm tuned at each length on a factor-2 grid around its best at the length before (extended while "
            "the best is at an edge, chosen on seed 0), then seeded at its best; ± and Welch's p as at the top of the "
            "page.",
            "",
            "| steps | tokens | Pre-Norm rate | Pre-Norm test | GeoNorm rate | GeoNorm test | GeoNorm − Pre-Norm "
            "| Welch's p |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in lengths:
            pre, geo = row["pre"], row["geo"]
            lines.append(
                f"| [{row['steps']}]({row['phase']}/sweep.md) | {row['tokens'] / 1e6:.1f}M | {rate_text(pre['lr'])} "
                f"| {arm_test_loss(pre)} | {rate_text(geo['lr'])} | {arm_test_loss(geo)} | "
                f"{margin_cells(row['geo_minus_pre'], row['welch'])} |"
            )
        lines += ["", "![margin against length](length.png)"]
    if shapes:
        lines += [
            "",
            "## Width and depth (phase g, 300 steps)",
            "",
            "Each arm's best rate per shape (chosen on seed 0's validation on a factor-2 grid around its phase-h "
            "rate, extended at an edge), and its test loss there; ± and Welch's p as at the top of the page.",
            "",
            "| shape | Pre-Norm rate | Pre-Norm test | GeoNorm rate | GeoNorm test | GeoNorm − Pre-Norm | Welch's p |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in shapes:
            pre, geo = row["pre"], row["geo"]
            lines.append(
                f"| [{row['what']}]({row['phase']}/sweep.md) | {rate_text(pre['lr'])} | {arm_test_loss(pre)} | "
                f"{rate_text(geo['lr'])} | {arm_test_loss(geo)} | {margin_cells(row['geo_minus_pre'], row['welch'])} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = [row for phase in PHASES if (row := compare(args.results, phase)) is not None]
    alphas = alpha_grid(args.results)
    checks = [row for phase in ALPHA_CHECKS if (row := alpha_check(args.results, phase)) is not None]
    styles, lengths, shapes = styles_table(args.results), length_rows(args.results), shape_rows(args.results)
    again = reruns(args.results)
    text = page(rows, alphas, checks, again) + study_page(styles, lengths, shapes)
    (args.results / "study.md").write_text(text, encoding="utf-8")
    if lengths:
        length_plot(lengths, args.results / "length.png")
    payload = {"phases": rows, "alpha": alphas, "alpha_checks": checks, "styles": styles, "lengths": lengths,
               "shapes": shapes, "reruns": again}  # fmt: skip
    (args.results / "study.json").write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {args.results / 'study.md'}")


if __name__ == "__main__":
    main()
