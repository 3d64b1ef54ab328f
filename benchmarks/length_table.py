"""Phase j's answer to the length question: ``benchmarks/results/sweeps/length.md`` and ``length.json``, read from
the journals of ``sweep_study.py --phases j`` (one ``hf-geonorm sweep`` a folder: every arm's peak rate and warm-up
share tuned on one rule, chosen on validation, three seeds at its chosen cell, on the whole-file split), with phase
f's figures beside them (warm-up fixed at a tenth of the run, rate only, the earlier split that leaked). LLaMA at 300
steps is phase i's (the same rule, run by a driver over one folder per warm-up share). A folder still running is
shown with what it has. Trains nothing:

    python benchmarks/length_table.py [--results benchmarks/results/sweeps]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from study_margins import margin, runs_of
from sweep_study_tables import length_rows

from hf_geonorm.sweep.grid import read_journal
from hf_geonorm.sweep.reference import NOT_LEARNING, read_held_out
from hf_geonorm.sweep.table import chosen_cells, mean_spread, rate_text

RESULTS = Path(__file__).parent / "results" / "sweeps"
TOKENS_PER_STEP = 16 * 128
SHAPES = {"gpt2": "GPT-2 4 x 128", "llama": "LLaMA 4 x 128"}
# (shape, steps): the folder of its sweep; LLaMA at 300 steps is phase i's folders, one per warm-up share
J_FOLDERS = {("gpt2", 300): "j_gpt2_300", ("llama", 300): "i_llama_w*", ("gpt2", 1200): "j_gpt2_1200",
             ("llama", 1200): "j_llama_1200", ("gpt2", 2400): "j_gpt2_2400"}  # fmt: skip
ARMS = ("pre", "geo", "deepnorm")
NAMES = {"pre": "Pre-Norm", "geo": "GeoNorm", "deepnorm": "DeepNorm"}
SEEDS = 3


def folder_runs(results: Path, folder: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A sweep's runs (phase i's share folders joined, each run with its folder's share) and its unigram reference
    (phase i's: paper_table.json's, of the same test blocks)."""
    if "*" not in folder:
        path = results / folder
        header = read_journal(path / "runs.jsonl")[0] if (path / "runs.jsonl").is_file() else None
        return runs_of(path), read_held_out(path, header)
    runs = []
    for path in sorted(results.glob(folder)):
        share = int(path.name.rsplit("_w", 1)[1]) / 100
        runs += [{**run, "warmup_share": share} for run in runs_of(path)]
    reference = json.loads((results / "paper_table.json").read_text(encoding="utf-8"))["reference"]
    return runs, {"unigram_test": reference["unigram_cross_entropy"]}


def arm_cells(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each arm's chosen cell (the sweep's own rule, ``chosen_cells``) and its test losses there; ``confirmed`` once
    it ran the three seeds."""
    mine = [run for run in runs if run["style"] in ARMS and run.get("alpha") is None]
    arms = {}
    for arm, chosen in chosen_cells(mine).items():
        at = [r for r in mine if r["style"] == arm and (r.get("warmup_share"), r["lr"]) == (chosen.share, chosen.lr)]
        losses = [r["test_loss"] for r in sorted(at, key=lambda r: r["seed"]) if r["test_loss"] is not None]
        mean, spread, _ = mean_spread(losses)
        arms[arm] = {"share": chosen.share, "lr": chosen.lr, "test_losses": losses, "test_mean": mean,
                     "test_spread": spread, "runs": sum(r["style"] == arm for r in mine),
                     "confirmed": len(at) >= SEEDS}  # fmt: skip
    return arms


def length_cells(results: Path) -> list[dict[str, Any]]:
    """Each shape and length with runs: its arms at their chosen cells, and GeoNorm's margins where confirmed."""
    found = []
    for (shape, steps), folder in J_FOLDERS.items():
        runs, reference = folder_runs(results, folder)
        if not runs:
            continue
        arms = arm_cells(runs)
        margins = {}
        for other in ("pre", "deepnorm"):
            if all(a in arms and arms[a]["confirmed"] for a in ("geo", other)):
                margins[other] = {"difference": arms["geo"]["test_mean"] - arms[other]["test_mean"],
                                  "welch": margin(arms["geo"], arms[other])}  # fmt: skip
        found.append({"shape": shape, "steps": steps, "tokens": steps * TOKENS_PER_STEP, "folder": folder,
                      "runs": len(runs), "arms": arms, "margins": margins,
                      "unigram_test": None if reference is None else reference["unigram_test"]})  # fmt: skip
    return found


def margin_text(found: dict[str, Any] | None) -> str:
    if found is None:
        return "–"
    welch = found["welch"]
    if welch is None:
        return f"{found['difference']:+.3f} (no spread)"
    p = "< 0.001" if welch["p"] < 0.001 else f"{welch['p']:.3f}"
    return f"{found['difference']:+.3f} ± {welch['standard_error']:.3f} (p {p})"


def page(cells: list[dict[str, Any]], earlier: list[dict[str, Any]]) -> str:
    lines = [
        "# Length with the warm-up tuned (phase j)",
        "",
        "Not tuned, the same for every arm and length: the optimizer (AdamW, betas 0.9/0.95, weight decay 0.1, "
        "gradients clipped to norm 1), the schedule's shape (linear warm-up, cosine decay to a tenth), the batch "
        "(16 x 128 tokens), the model (4 layers of width 128) and the corpus (the study corpus, whole files held out). "
        "Tuned for every arm on one rule, chosen on seed 0's validation: the peak rate and the warm-up share "
        "(`hf-geonorm sweep`'s default); then seeds 0-2 at the chosen cell, compared on test. Margins: GeoNorm's mean "
        "test loss minus the other's, ± its standard error, "
        f"Welch's two-sided p (negative: GeoNorm lower). * a seed within {NOT_LEARNING} of the unigram test loss (the "
        "held-out tokens at their training frequencies): it learned nothing of the context.",
        "",
        "| shape | steps | tokens | folder | runs | arm | warm-up | rate | test loss of each seed | mean ± sd |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        link = cell["folder"] if "*" in cell["folder"] else f"[{cell['folder']}]({cell['folder']}/sweep.md)"
        idle = float("inf") if cell["unigram_test"] is None else cell["unigram_test"] - NOT_LEARNING
        for arm, found in cell["arms"].items():
            seeds = ", ".join(f"{v:.3f}{'*' if v > idle else ''}" for v in found["test_losses"])
            state = "" if found["confirmed"] else " (running: not confirmed)"
            spread = "" if found["test_spread"] is None else f" ± {found['test_spread']:.3f}"
            lines.append(f"| {SHAPES[cell['shape']]} | {cell['steps']} | {cell['tokens'] / 1e6:.1f}M | {link} | "
                         f"{cell['runs']} | {NAMES[arm]}{state} | {found['share']:.0%} | {rate_text(found['lr'])} | "
                         f"{seeds} | {found['test_mean']:.3f}{spread} |")  # fmt: skip
    phase_f = {row["steps"]: row for row in earlier}
    lines += [
        "",
        "## GeoNorm's margins",
        "",
        "Beside them, phase f's GPT-2 margin over Pre-Norm: warm-up fixed at a tenth, the earlier split (pieces of "
        "files held out whose other pieces trained), rate only.",
        "",
        "| shape | steps | GeoNorm − Pre-Norm | GeoNorm − DeepNorm | unigram test loss | phase f: GeoNorm − Pre-Norm |",
        "|---|---|---|---|---|---|",
    ]
    for cell in cells:
        earlier_row = phase_f.get(cell["steps"]) if cell["shape"] == "gpt2" else None
        before = "–" if earlier_row is None else margin_text({"difference": earlier_row["geo_minus_pre"],
                                                               "welch": earlier_row["welch"]})  # fmt: skip
        unigram = "–" if cell["unigram_test"] is None else f"{cell['unigram_test']:.3f}"
        lines.append(f"| {SHAPES[cell['shape']]} | {cell['steps']} | {margin_text(cell['margins'].get('pre'))} | "
                     f"{margin_text(cell['margins'].get('deepnorm'))} | {unigram} | {before} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    cells, earlier = length_cells(args.results), length_rows(args.results)
    (args.results / "length.md").write_text(page(cells, earlier), encoding="utf-8")
    (args.results / "length.json").write_text(json.dumps({"phase_j": cells, "phase_f": earlier}, indent=1) + "\n")
    print(f"wrote {args.results / 'length.md'}")


if __name__ == "__main__":
    main()
