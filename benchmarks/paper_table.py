"""The paper's table from phase i's journals (``benchmarks/sweep_study.py --phases i``): the five norm styles on GPT-2
and LLaMA 4 x 128, each tuned on the same rate x warm-up grid rule, chosen on seed 0's validation, reported on test.

For each shape and style: every cell of its grid (seed 0's validation loss at each warm-up share and rate), the cell
chosen (lowest validation), whether it sits at an edge of the grid tried (its rate the lowest or highest tried at its
share, or its share the lowest or highest tried for the style), and the test loss at that cell over the seeds trained
there (mean ± sample sd). Each style against Pre-Norm: the difference of the test means ± its standard error, and
Welch's two-sided p. The reference row is the unigram cross-entropy of the test blocks, computed here: the test
targets (every token of a block but its first, as a model is scored) under the training split's token frequencies,
add-one smoothed: what a model that ignores the context reaches.

Besides the table, what the protocol's account needs and no other page shows: the runs each style's grid took and
the shares it reached; GPT-2's first table, computed over the shares the ladder had before it was raised from 50% to
90% (``FIRST_LADDER_TOP``), with the seeds 1-2 its four baselines ran at their 50% cells; every seeded run outside a
chosen cell; each margin over the seeds that trained only, where a seed stayed at the unigram loss; and how much of
GeoNorm's lead at train's default warm-up the tuned warm-up removes, style by style.

Writes ``paper_table.md`` and ``paper_table.json`` beside the phase folders; a phase not yet run (or partly run) is
shown as far as its journal goes, and a style with fewer than three seeds at its cell says so. The unigram reference
is computed from the study corpus's folder where it is built (``benchmarks/study_corpus.py --layout files``); where
it is not, the reference this script wrote before is kept, and the page says so.

    python benchmarks/paper_table.py [--results benchmarks/results/sweeps]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from sweep_study import (
    I_SHAPES,
    I_WARMUP_LADDER,
    I_WARMUP_START,
    REPOSITORY,
    STEPS,
    STUDY_FILES,
    WARMUP,
    phase_i_options,
)

from hf_geonorm.sweep.grid import read_journal
from hf_geonorm.sweep.welch import welch_test
from hf_geonorm.training.data.pipeline import ArrowBlocks
from hf_geonorm.training.data.prepare import data_request, data_source, training_data

RESULTS = Path(__file__).parent / "results" / "sweeps"
STYLES = {"pre": "Pre-Norm", "post": "Post-Norm", "deepnorm": "DeepNorm", "sandwich": "SandwichNorm", "geo": "GeoNorm"}
SHAPE_NAMES = {"gpt2": "GPT-2 4 x 128", "llama": "LLaMA 4 x 128"}
UNTRAINED = 0.1  # a seed whose test loss is within this of the unigram reference learned nothing of the context
# the top of the warm-up ladder when GPT-2's first full table existed: sweep_study.py's commit 219a2c8 raised it to 0.9
# because every GPT-2 style had chosen 0.5; LLaMA ran after, on the raised ladder
FIRST_LADDER_TOP = {"gpt2": 0.5}


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
    """One shape's table (``table_of``), and for a shape whose ladder was raised, its first table: the same rule
    over the shares the ladder held before (``FIRST_LADDER_TOP``)."""
    runs = shape_runs(results, arch)
    table = table_of(runs)
    if arch in FIRST_LADDER_TOP:
        first = {share: rows for share, rows in runs.items() if share <= FIRST_LADDER_TOP[arch]}
        table["first_table"] = {"top_share": FIRST_LADDER_TOP[arch], **table_of(first)}
    return table


def table_of(runs: dict[float, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each style's row, its margins against Pre-Norm and GeoNorm's against it, the default-share choices, and the
    seeded runs outside every chosen cell."""
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
    return {"runs": sum(len(r) for r in runs.values()), "styles": rows, "default_share": default_share(runs),
            "unshown": unshown_runs(runs, rows)}  # fmt: skip


def unshown_runs(runs: dict[float, list[dict[str, Any]]], rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of seeds other than 0 away from their style's chosen cell: counted in the runs, shown in no row."""
    return [{"style": r["style"], "share": share, "lr": r["lr"], "seed": r["seed"], "test": r["test_loss"]}
            for share, rows_at in sorted(runs.items()) for r in rows_at
            if r["seed"] != 0 and (share, r["lr"]) != (rows[r["style"]]["share"], rows[r["style"]]["lr"])]  # fmt: skip


def trained_seed_margins(table: dict[str, Any], unigram: float) -> dict[str, dict[str, Any]]:
    """GeoNorm against each style that has a seed within ``UNTRAINED`` of the unigram reference at its chosen cell,
    over that style's other seeds only (Welch's test as for the table)."""
    geo = table["styles"].get("geo")
    found = {}
    for style, row in table["styles"].items():
        trained = [t for t in row["test"] if t <= unigram - UNTRAINED]
        if geo is None or style == "geo" or len(trained) == len(row["test"]) or not trained:
            continue
        found[style] = {"test": trained, "geo_minus": geo["test_mean"] - statistics.fmean(trained),
                        "geo_welch": margin(geo["test"], trained)}  # fmt: skip
    return found


def warmup_share_of_lead(table: dict[str, Any], trained: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """For each style, GeoNorm's lead at train's default warm-up (seed 0, ``default_share``) against its lead with
    the warm-up tuned (the three-seed means; where a seed learned nothing, also over the seeds that trained): the
    share of the default-warm-up lead the tuning removes, and how many times the tuned lead the default one is.
    Also each style's own gain from the tuning on seed 0's test loss."""
    default, rows = table["default_share"], table["styles"]
    geo = default.get("geo")
    found = {}
    for style, row in rows.items():
        if geo is None or style not in default:
            continue
        seed0 = row["test"][row["seeds"].index(0)] if 0 in row["seeds"] else None
        entry = {"gain_seed0": None if seed0 is None else default[style]["test"] - seed0}
        if style != "geo":
            told, tuned = default[style]["test"] - geo["test"], -row["geo_minus"]
            entry |= {"told": told, "tuned": tuned, "removed": 1 - tuned / told,
                      "overstatement": told / tuned if tuned > 0 else None}  # fmt: skip
            if style in trained:
                tuned_trained = -trained[style]["geo_minus"]
                entry |= {"tuned_trained": tuned_trained, "removed_trained": 1 - tuned_trained / told}
        found[style] = entry
    return found


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


def page(tables: dict[str, dict[str, Any]], reference: dict[str, Any], corpus: dict[str, Any]) -> str:
    unigram = reference["unigram_cross_entropy"]
    cells = {arch: {style: sum(len(grid) for grid in row["grid"].values()) for style, row in table["styles"].items()}
             for arch, table in tables.items()}  # fmt: skip
    counts = [n for per_style in cells.values() for n in per_style.values()]
    lowest = min(float(s) for table in tables.values() for row in table["styles"].values() for s in row["grid"])
    kept = "" if reference.get("computed", True) else (
        " The study corpus's folder was not built when this page was last written: the reference is the one this "
        "script computed from it before.")  # fmt: skip
    lines = [
        "# The paper's table, every style tuned alike (phase i)",
        "",
        "Written by `python benchmarks/paper_table.py` from the journals of `benchmarks/sweep_study.py --phases i`: "
        "a driver of its own that calls the sweep's library function once per style and warm-up share, one sweep "
        "folder per share (`i_ARCH_wNN`); no single `hf-geonorm sweep` command ran this protocol. 300 steps of "
        "16 x 128 tokens on the study corpus as a folder "
        f"of files ([study_corpus_files.json](../study_corpus_files.json): {corpus['files']:,} files of the Python "
        f"source of torch and transformers; validation and test are whole files, near-duplicates of training text "
        f"removed; {corpus['tokens']['train_tokens']:,} training tokens, {reference['test_blocks']} test blocks). "
        "Every style: the same adaptive rule, rate x warm-up share: at the shares "
        f"{' and '.join(f'{s:g}' for s in I_WARMUP_START)} of the run, four rates a factor 2 apart around the "
        "style's centre, extended at an edge (twice at most); while the best share sat at an edge of the shares "
        f"tried, the next share of the ladder {', '.join(f'{s:g}' for s in I_WARMUP_LADDER)} was added, starting "
        "from three rates (half, once and twice the best share's rate) and extended the same way. So the styles "
        f"tried {min(counts)} to {max(counts)} cells each and reached different shares (the table below); the "
        f"lowest share any style tried was {lowest:g}. The ladder's top was {FIRST_LADDER_TOP['gpt2']:g} until "
        "every GPT-2 style had chosen it; it was then raised to "
        f"{I_WARMUP_LADDER[-1]:g} (GPT-2's first table, over the shares up to {FIRST_LADDER_TOP['gpt2']:g}, is "
        "below its full one; LLaMA ran on the raised ladder). Chosen on seed 0's validation over every cell, then "
        "seeds 0-2 at the chosen cell; test loss mean ± sample sd, each seed's loss listed (* within "
        f"{UNTRAINED:g} of the unigram reference: that seed learned nothing of the context). A margin is the "
        "difference of the means ± its standard error, with Welch's two-sided p. "
        "Post-Norm and DeepNorm start GPT-2's position table at zero and DeepNorm draws DeepNet's init (the "
        "library's defaults: docs/training.md, \"Post-Norm on GPT-2\").",
        "",
        f"Unigram reference (computed by the script): **{unigram:.3f}**, the test blocks' cross-entropy under the "
        f"training split's token frequencies (the entropy of their own frequencies: "
        f"{reference['unigram_entropy']:.3f}).{kept}",
    ]
    for arch, table in tables.items():
        lines += ["", f"## {SHAPE_NAMES[arch]} ({table['runs']} runs)", ""]
        lines += style_table(table, unigram)
        lines += ["", "What each style's grid took (seed 0's cells, and the warm-up shares it reached):", "",
                  "| style | cells | shares tried |", "|---|---|---|"]  # fmt: skip
        for style, row in table["styles"].items():
            lines.append(f"| {STYLES[style]} | {cells[arch][style]} | {', '.join(row['grid'])} |")
        trained = trained_seed_margins(table, unigram)
        if trained:
            lines += ["", "Where a seed learned nothing of the context, GeoNorm against that style's seeds that "
                      "trained (the chosen cell's other seeds):", "",
                      "| style | seeds that trained | GeoNorm − them ± SE (p) |", "|---|---|---|"]  # fmt: skip
            for style, entry in trained.items():
                lines.append(f"| {STYLES[style]} | {', '.join(f'{t:.3f}' for t in entry['test'])} | "
                             f"{margin_text(entry['geo_minus'], entry['geo_welch'])} |")  # fmt: skip
        if table["default_share"]:
            lines += default_share_lines(table, warmup_share_of_lead(table, trained))
        if "first_table" in table:
            first = table["first_table"]
            lines += ["", f"GPT-2's first table: the same rule over the shares up to {first['top_share']:g}, the "
                      "ladder's top before it was raised. Its seeds 1-2 at the four baselines' cells are runs of the "
                      "journal that the full table leaves out. GeoNorm − each style, first table → full table: "
                      f"{ladder_moves(first, table, trained)}.", ""]  # fmt: skip
            lines += style_table(first, unigram)
        if table["unshown"]:
            lines += ["", "Seeded runs outside the full table's chosen cells (counted in its runs):", "",
                      "| style | share | rate | seed | test |", "|---|---|---|---|---|"]  # fmt: skip
            lines += [f"| {STYLES[r['style']]} | {r['share']:g} | {r['lr']:g} | {r['seed']} | {r['test']:.3f} |"
                      for r in table["unshown"]]  # fmt: skip
        lines += ["", "Seed 0's validation loss in every cell tried (rows: warm-up share; chosen in bold):", ""]
        for style, row in table["styles"].items():
            rates = sorted({float(rate) for grid in row["grid"].values() for rate in grid})
            lines += [f"{STYLES[style]}:", "", "| share | " + " | ".join(f"{r:g}" for r in rates) + " |",
                      "|---|" + "---|" * len(rates)]  # fmt: skip
            for share, grid in row["grid"].items():
                row_cells = []
                for rate in rates:
                    value = grid.get(f"{rate:g}")
                    chosen = float(share) == row["share"] and rate == row["lr"]
                    text = "–" if value is None else f"{value:.3f}"
                    row_cells.append(f"**{text}**" if chosen else text)
                lines.append(f"| {share} | " + " | ".join(row_cells) + " |")
            lines.append("")
    return "\n".join(lines) + "\n"


def ladder_moves(first: dict[str, Any], full: dict[str, Any], trained: dict[str, dict[str, Any]]) -> str:
    """How GeoNorm's margin over each style moved when the ladder was raised (``full`` against ``first``), in words:
    the first table's margin, the full one's (and over the seeds that trained, where one did not), and which way."""
    moves = []
    for style, row in first["styles"].items():
        if "geo_minus" not in row or style not in full["styles"]:
            continue
        before, after = row["geo_minus"], full["styles"][style]["geo_minus"]
        text = f"{STYLES[style]} {before:+.3f} → {after:+.3f}"
        if style in trained:
            after = trained[style]["geo_minus"]
            text += f" ({after:+.3f} over its seeds that trained)"
        moves.append(text + (", against GeoNorm" if after > before else ", towards GeoNorm"))
    return "; ".join(moves)


def style_table(table: dict[str, Any], unigram: float) -> list[str]:
    """The rows of a table: each style's chosen cell, its seeds, its margins, and the unigram reference row."""
    lines = ["| style | chosen rate | warm-up share | at a grid edge | seeds' test losses | test loss | "
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
    return lines


def default_share_lines(table: dict[str, Any], lead: dict[str, dict[str, Any]]) -> list[str]:
    """The default-warm-up table, with how much of GeoNorm's lead there the tuned warm-up removes."""
    lines = ["", f"At train's default warm-up alone ({WARMUP} of {STEPS} steps), each style's best rate on seed 0's "
             "validation at that share, and seed 0's test loss there (one seed: no standard error). GeoNorm's lead "
             "there against its lead with the warm-up tuned (the table's three-seed margin; † over the seeds that "
             "trained): the share of the lead the tuning removes, and how many times the tuned lead the default "
             "one is (– where the tuned lead is not above zero). The style's own gain: seed 0's test loss at the "
             "default warm-up minus at its chosen cell.", "",
             "| style | rate | validation | test | lead at the default warm-up | lead tuned | removed by the "
             "tuning | overstatement | its own gain from the tuning |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for style, cell in table["default_share"].items():
        entry = lead.get(style, {})
        gain = "–" if entry.get("gain_seed0") is None else f"{entry['gain_seed0']:.3f}"
        if "told" not in entry:
            lines.append(f"| {STYLES[style]} | {cell['lr']:g} | {cell['val']:.3f} | {cell['test']:.3f} | – | – | – "
                         f"| – | {gain} |")  # fmt: skip
            continue
        tuned, removed = f"{entry['tuned']:+.3f}", f"{entry['removed']:.0%}"
        if "tuned_trained" in entry:
            tuned += f" ({entry['tuned_trained']:+.3f}†)"
            removed += f" ({entry['removed_trained']:.0%}†)"
        over = "–" if entry["overstatement"] is None else f"{entry['overstatement']:.2f}x"
        lines.append(f"| {STYLES[style]} | {cell['lr']:g} | {cell['val']:.3f} | {cell['test']:.3f} | "
                     f"{entry['told']:+.3f} | {tuned} | {removed} | {over} | {gain} |")  # fmt: skip
    return lines


def margin_text(difference: float | None, welch: dict[str, float] | None) -> str:
    if difference is None:
        return "–"
    return f"{difference:+.3f}" + ("" if welch is None else f" ± {welch['standard_error']:.3f} ({welch['p']:.2g})")


def all_tables(results: Path, unigram: float) -> dict[str, dict[str, Any]]:
    """Each shape's table with its margins over the seeds that trained and the warm-up's share of the lead."""
    tables = {arch: shape_table(results, arch) for arch in I_SHAPES}
    for table in tables.values():
        table["trained_seed_margins"] = trained_seed_margins(table, unigram)
        table["warmup_share_of_lead"] = warmup_share_of_lead(table, table["trained_seed_margins"])
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--data-cache", default=str(Path("~/.cache/hf-geonorm/study").expanduser()))
    args = parser.parse_args()
    corpus = json.loads(STUDY_FILES.read_text(encoding="utf-8"))
    if (REPOSITORY / corpus["folder"]).is_dir():
        reference = {**unigram_reference(args.data_cache), "computed": True}
    else:  # the corpus is not built here: keep the reference this script computed from it before
        reference = {**json.loads((args.results / "paper_table.json").read_text(encoding="utf-8"))["reference"],
                     "computed": False}  # fmt: skip
        print(f"{REPOSITORY / corpus['folder']} is not built: the unigram reference is the one written before")
    tables = all_tables(args.results, reference["unigram_cross_entropy"])
    (args.results / "paper_table.md").write_text(page(tables, reference, corpus), encoding="utf-8")
    payload = {"reference": reference, "shapes": tables}
    (args.results / "paper_table.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.results / 'paper_table.md'}")


if __name__ == "__main__":
    main()
