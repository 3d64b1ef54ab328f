"""The paper's table from phase i's journals (``benchmarks/sweep_study.py --phases i``): the five norm styles on GPT-2
and LLaMA 4 x 128, each tuned on the same rate x warm-up grid rule, chosen on seed 0's validation, reported on test.

For each shape and style: every cell of its grid (seed 0's validation loss at each warm-up share and rate), the cell
chosen (lowest validation), whether it sits at an edge of the grid tried (its rate the lowest or highest tried at its
share, or its share the lowest or highest tried for the style), and the test loss at that cell over the seeds trained
there (mean ± sample sd). Each style against Pre-Norm: the difference of the test means ± its standard error, and
Welch's two-sided p. The reference row is the unigram cross-entropy of the test blocks, computed here: the test
targets (every token of a block but its first, as a model is scored) under the training split's token frequencies,
add-one smoothed: what a model that ignores the context reaches.

Writes ``paper_table.md`` and ``paper_table.json`` beside the phase folders; a phase not yet run (or partly run) is
shown as far as its journal goes, and a style with fewer than three seeds at its cell says so.

    python benchmarks/paper_table.py [--results benchmarks/results/sweeps]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from sweep_study import I_SHAPES, I_WARMUP_LADDER, I_WARMUP_START, STEPS, STUDY_FILES, WARMUP, phase_i_options

from hf_geonorm.training.data.pipeline import ArrowBlocks
from hf_geonorm.training.data.prepare import data_request, data_source, training_data
from hf_geonorm.training.sweep.grid import read_journal
from hf_geonorm.training.sweep.welch import welch_test

RESULTS = Path(__file__).parent / "results" / "sweeps"
STYLES = {"pre": "Pre-Norm", "post": "Post-Norm", "deepnorm": "DeepNorm", "sandwich": "SandwichNorm", "geo": "GeoNorm"}
SHAPE_NAMES = {"gpt2": "GPT-2 4 x 128", "llama": "LLaMA 4 x 128"}
UNTRAINED = 0.1  # a seed whose test loss is within this of the unigram reference learned nothing of the context


def unigram_reference(cache: str) -> dict[str, float]:
    """The unigram cross-entropy of the study's test blocks (see the module docstring), from train's own data step
    on phase i's corpus."""
    request = data_request(phase_i_options(cache, "gpt2", 0.1))
    source = data_source(request, lambda line: None)
    split = training_data(source, request, lambda line: None)
    vocab = len(source.tokenizer)
    if isinstance(split.train, ArrowBlocks):
        train = sum(np.bincount(view[:, 1:].reshape(-1), minlength=vocab) for view in split.train.views)
    else:
        train = np.bincount(np.asarray(split.train.blocks)[:, 1:].reshape(-1), minlength=vocab)
    test = np.bincount(np.asarray(split.test.blocks)[:, 1:].reshape(-1), minlength=vocab).astype(np.float64)
    frequencies = (train + 1.0) / (train + 1.0).sum()
    own = test[test > 0] / test.sum()
    return {"unigram_cross_entropy": float(-(test * np.log(frequencies)).sum() / test.sum()),
            "unigram_entropy": float(-(own * np.log(own)).sum()), "test_blocks": len(split.test)}  # fmt: skip


def shape_runs(results: Path, arch: str) -> dict[float, list[dict[str, Any]]]:
    """Phase i's finished runs of ``arch`` by warm-up share (from each folder's journal)."""
    runs: dict[float, list[dict[str, Any]]] = {}
    for folder in sorted(results.glob(f"i_{arch}_w*")):
        if (folder / "runs.jsonl").is_file():
            share = int(folder.name.rsplit("_w", 1)[1]) / 100
            runs[share] = [r for r in read_journal(folder / "runs.jsonl")[1] if r.get("val_loss") is not None]
    return runs


def style_row(runs: dict[float, list[dict[str, Any]]], style: str) -> dict[str, Any] | None:
    """One style's grid, chosen cell, edges and seeded test losses."""
    cells = {(share, r["lr"]): r for share, rows in runs.items() for r in rows if r["style"] == style
             and r["seed"] == 0}  # fmt: skip
    if not cells:
        return None
    share, lr = min(cells, key=lambda cell: cells[cell]["val_loss"])
    rates_at_share = sorted(rate for s, rate in cells if s == share)
    shares = sorted({s for s, _ in cells})
    at_edge = {"lowest rate": lr == rates_at_share[0], "highest rate": lr == rates_at_share[-1],
               "lowest warm-up": share == shares[0] and len(shares) > 1,
               "highest warm-up": share == shares[-1] and len(shares) > 1}  # fmt: skip
    edges = [what for what, edge in at_edge.items() if edge]
    seeded = sorted((r for r in runs[share] if r["style"] == style and r["lr"] == lr), key=lambda r: r["seed"])
    tests = [r["test_loss"] for r in seeded]
    return {
        "grid": {f"{s:g}": {f"{rate:g}": cells[(s, rate)]["val_loss"] for s2, rate in sorted(cells) if s2 == s}
                 for s in shares},  # fmt: skip
        "share": share, "lr": lr, "edges": edges, "seeds": [r["seed"] for r in seeded], "test": tests,
        "test_mean": statistics.fmean(tests), "test_sd": statistics.stdev(tests) if len(tests) > 1 else None,
        "val_seed0": cells[(share, lr)]["val_loss"],
    }  # fmt: skip


def shape_table(results: Path, arch: str) -> dict[str, Any]:
    runs = shape_runs(results, arch)
    rows = {style: row for style in STYLES if (row := style_row(runs, style)) is not None}
    pre = rows.get("pre")
    for style, row in rows.items():
        if pre is None or style == "pre":
            continue
        row["minus_pre"] = row["test_mean"] - pre["test_mean"]
        row["welch"] = margin(row["test"], pre["test"])
    geo = rows.get("geo")
    for style, row in rows.items():
        if geo is not None and style != "geo":
            row["geo_minus"] = geo["test_mean"] - row["test_mean"]
            row["geo_welch"] = margin(geo["test"], row["test"])
    return {"runs": sum(len(r) for r in runs.values()), "styles": rows, "default_share": default_share(runs)}


def margin(first: list[float], second: list[float]) -> dict[str, float] | None:
    """Welch's test of two seeded cells' test losses (None where either has one seed)."""
    test = welch_test(first, second)
    return None if test is None else {"standard_error": test.standard_error, "p": test.p, "df": test.df}


def default_share(runs: dict[float, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Each style's best rate at train's default warm-up share (a tenth of the run), chosen on seed 0's validation
    at that share alone, with seed 0's test loss: what a comparison at train's default warm-up sees."""
    share = WARMUP / STEPS
    found = {}
    for style in STYLES:
        cells = [r for r in runs.get(share, []) if r["style"] == style and r["seed"] == 0]
        if cells:
            best = min(cells, key=lambda r: r["val_loss"])
            found[style] = {"lr": best["lr"], "val": best["val_loss"], "test": best["test_loss"]}
    return found


def page(tables: dict[str, dict[str, Any]], reference: dict[str, float], corpus: dict[str, Any]) -> str:
    unigram = reference["unigram_cross_entropy"]
    lines = [
        "# The paper's table, every style tuned alike (phase i)",
        "",
        "Written by `python benchmarks/paper_table.py` from the journals of `benchmarks/sweep_study.py --phases i` "
        "(folders `i_ARCH_wNN`, one per warm-up share). 300 steps of 16 x 128 tokens on the study corpus as a folder "
        f"of files ([study_corpus_files.json](../study_corpus_files.json): {corpus['files']:,} files of the Python "
        f"source of torch and transformers; validation and test are whole files, near-duplicates of training text "
        f"removed; {corpus['tokens']['train_tokens']:,} training tokens, {reference['test_blocks']} test blocks). "
        "Every style: the same grid rule, rate x warm-up share (four rates a factor 2 apart around the style's "
        f"centre, extended at an edge, at warm-up shares {' and '.join(f'{s:g}' for s in I_WARMUP_START)} of the "
        f"run, extended along {', '.join(f'{s:g}' for s in I_WARMUP_LADDER)} while the best share is at an edge; "
        f"{I_WARMUP_LADDER[-1]:g} is the ladder's top), chosen on seed 0's validation, then seeds 0-2 at the chosen "
        "cell; test loss mean ± sample sd, each seed's loss listed (* within "
        f"{UNTRAINED:g} of the unigram reference: that seed learned nothing of the context). A margin is the "
        "difference of the means ± its standard error, with Welch's two-sided p. "
        "Post-Norm and DeepNorm start GPT-2's position table at zero and DeepNorm draws DeepNet's init (the "
        "library's defaults: docs/training.md, \"Post-Norm on GPT-2\").",
        "",
        f"Unigram reference (computed by the script): **{unigram:.3f}**, the test blocks' cross-entropy under the "
        f"training split's token frequencies (the entropy of their own frequencies: "
        f"{reference['unigram_entropy']:.3f}).",
    ]
    for arch, table in tables.items():
        lines += ["", f"## {SHAPE_NAMES[arch]} ({table['runs']} runs)", "",
                  "| style | chosen rate | warm-up share | at a grid edge | seeds' test losses | test loss | "
                  "− Pre-Norm ± SE (p) | GeoNorm − it ± SE (p) | − unigram |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for style, row in table["styles"].items():
            sd = "" if row["test_sd"] is None else f" ± {row['test_sd']:.3f}"
            seeds = ", ".join(f"{t:.3f}" + ("*" if t > unigram - UNTRAINED else "") for t in row["test"])
            lines.append(
                f"| {STYLES[style]} | {row['lr']:g} | {row['share']:g} | {', '.join(row['edges']) or 'no'} | "
                f"{seeds} | {row['test_mean']:.3f}{sd} | {margin_text(row.get('minus_pre'), row.get('welch'))} | "
                f"{margin_text(row.get('geo_minus'), row.get('geo_welch'))} | {row['test_mean'] - unigram:+.3f} |"
            )
        lines.append(f"| unigram (reference) | – | – | – | – | {unigram:.3f} | – | – | 0 |")
        if table["default_share"]:
            lines += ["", f"At train's default warm-up alone ({WARMUP} of {STEPS} steps), each style's best rate on "
                      "seed 0's validation at that share, and seed 0's test loss there (one seed: no standard error):",
                      "", "| style | rate | validation | test | − GeoNorm |", "|---|---|---|---|---|"]  # fmt: skip
            geo = table["default_share"].get("geo")
            for style, cell in table["default_share"].items():
                behind = "–" if geo is None or style == "geo" else f"{cell['test'] - geo['test']:+.3f}"
                lines.append(f"| {STYLES[style]} | {cell['lr']:g} | {cell['val']:.3f} | {cell['test']:.3f} | "
                             f"{behind} |")  # fmt: skip
        lines += ["", "Seed 0's validation loss in every cell tried (rows: warm-up share; chosen in bold):", ""]
        for style, row in table["styles"].items():
            rates = sorted({float(rate) for grid in row["grid"].values() for rate in grid})
            lines += [f"{STYLES[style]}:", "", "| share | " + " | ".join(f"{r:g}" for r in rates) + " |",
                      "|---|" + "---|" * len(rates)]  # fmt: skip
            for share, grid in row["grid"].items():
                cells = []
                for rate in rates:
                    value = grid.get(f"{rate:g}")
                    chosen = float(share) == row["share"] and rate == row["lr"]
                    text = "–" if value is None else f"{value:.3f}"
                    cells.append(f"**{text}**" if chosen else text)
                lines.append(f"| {share} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def margin_text(difference: float | None, welch: dict[str, float] | None) -> str:
    if difference is None:
        return "–"
    return f"{difference:+.3f}" + ("" if welch is None else f" ± {welch['standard_error']:.3f} ({welch['p']:.2g})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--data-cache", default=str(Path("~/.cache/hf-geonorm/study").expanduser()))
    args = parser.parse_args()
    corpus = json.loads(STUDY_FILES.read_text(encoding="utf-8"))
    reference = unigram_reference(args.data_cache)
    tables = {arch: shape_table(args.results, arch) for arch in I_SHAPES}
    (args.results / "paper_table.md").write_text(page(tables, reference, corpus), encoding="utf-8")
    payload = {"reference": reference, "shapes": tables}
    (args.results / "paper_table.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.results / 'paper_table.md'}")


if __name__ == "__main__":
    main()
