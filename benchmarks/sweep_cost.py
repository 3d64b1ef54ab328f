"""What `hf-geonorm sweep`'s default protocol costs (issue 54), measured without training: its walk
(``protocol.walk``, the code the sweep runs) replayed on phase i's journals, which hold a fuller rate x warm-up grid
(GPT-2 and LLaMA 4 x 128, 300 steps, five styles; ``benchmarks/results/sweeps/i_ARCH_wNN``) with each run's time.

The replay assumes:

- a run of the walk is the journaled run of the same style, warm-up share, rate and seed, with its losses and its
  ``train_seconds`` (the walk's decisions are then those the sweep would take on those results);
- each arm starts from phase i's centre for its style (``sweep_study.I_CENTRES``: half, once and twice it), where
  phase i's grid began, since the sweep's own default rate for a style (``train``'s) may lie outside that grid;
- a cell the walk needs that phase i never ran stops the arm's replay: the arm is reported as not replayed, with the
  cell, rather than guessed;
- the time of a run is its ``train_seconds`` (the evaluations and the model's save included; the sweep's own
  setup, a second or two, left out), the same for every protocol compared.

It compares the default with the full grid (every run phase i journaled for that arm) and with the sweep's default
before issue 54 (five rates around the style's centre, a quarter to four times, at one warm-up, one seed; its time:
five runs at the mean time of the default's runs), per arm and for two styles (pre and geo), in runs and in hours.
Writes ``results/sweep_cost.json`` and ``.md``.

    python benchmarks/sweep_cost.py
"""

from __future__ import annotations

import json
from pathlib import Path

from sweep_study import I_CENTRES, I_SHAPES

from hf_geonorm.sweep.journal import read_journal
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.sweep.protocol import walk
from hf_geonorm.sweep.table import rate_text, share_text

RESULTS = Path(__file__).parent / "results"
SWEEPS = RESULTS / "sweeps"
EARLIER_DEFAULT = (0.25, 0.5, 1.0, 2.0, 4.0)  # the sweep's grid before issue 54: five rates at one warm-up, seed 0


def cell_key(style: str, share: float | None, lr: float, seed: int) -> tuple:
    return (style, share, float(f"{lr:.12g}"), seed)


def journaled(arch: str) -> dict[tuple, dict]:
    """Every run of phase i on ``arch``, keyed by style, warm-up share, rate and seed."""
    runs = {}
    for folder in sorted(SWEEPS.glob(f"i_{arch}_w*")):
        share = int(folder.name.rsplit("_w", 1)[1]) / 100
        for entry in read_journal(folder / "runs.jsonl")[1]:
            runs[cell_key(entry["style"], share, entry["lr"], entry["seed"])] = {**entry, "warmup_share": share}
    return runs


def replay(arch: str, style: str, runs: dict[tuple, dict]) -> dict:
    """The default walk of one arm over phase i's runs: its runs, their time, its chosen cell; or where it stopped."""
    sweep = SweepOptions(styles=(style,)).resolved()
    centre = I_CENTRES[style]
    grids = {style: (centre / 2, centre, centre * 2)}
    entries: list[dict] = []
    chosen = None
    while (found := walk(sweep, grids, entries)).due:
        task = found.due[0]
        entry = runs.get(cell_key(style, task.run.warmup_share, task.run.lr, task.run.seed))
        if entry is None:
            return {"replayed": False, "missing": f"warm-up {share_text(task.run.warmup_share)} lr "
                                                  f"{rate_text(task.run.lr)} seed {task.run.seed}",
                    "runs": len(entries)}  # fmt: skip
        entries.append(entry)
        if task.role == "confirmation":
            chosen = {"warmup_share": task.run.warmup_share, "lr": task.run.lr}
    full = [e for e in runs.values() if e["style"] == style]
    run_hours = sum(e["train_seconds"] for e in entries) / len(entries) / 3600
    return {
        "replayed": True,
        "runs": len(entries),
        "hours": sum(e["train_seconds"] for e in entries) / 3600,
        "shares": sorted({e["warmup_share"] for e in entries}),
        "rates": sorted({e["lr"] for e in entries}),
        "chosen": chosen,
        "full_grid_runs": len(full),
        "full_grid_hours": sum(e["train_seconds"] or 0.0 for e in full) / 3600,
        "earlier_default_runs": len(EARLIER_DEFAULT),
        "earlier_default_hours": len(EARLIER_DEFAULT) * run_hours,  # its runs at the replayed runs' mean time
    }


def phase_i_choice(style: str, runs: dict[tuple, dict]) -> dict:
    """Phase i's chosen cell: the lowest seed-0 validation loss over every cell it ran (the lower share, then rate)."""
    cells = [e for e in runs.values() if e["style"] == style and e["seed"] == 0 and e["val_loss"] is not None]
    best = min(cells, key=lambda e: (e["val_loss"], e["warmup_share"], e["lr"]))
    return {"warmup_share": best["warmup_share"], "lr": best["lr"]}


def table(record: dict) -> str:
    lines = [
        "# What the sweep's default protocol costs",
        "",
        "Written by `benchmarks/sweep_cost.py` (its docstring states what the replay assumes): the default walk "
        "(`hf-geonorm sweep` with no tuning option: rate x warm-up, extended at an edge, three seeds at the chosen "
        "cell) replayed on phase i's journals, each arm starting at phase i's centre. Runs and hours (the runs' "
        "`train_seconds`, as journaled) against the full grid phase i ran for that arm, and against the sweep's "
        "default before issue 54 (five rates at one warm-up, one seed).",
        "",
        "| shape | style | default: runs | hours | shares | chosen (phase i's) | full grid: runs | hours | "
        "default / full (runs) | before: runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arch, arms in record["arms"].items():
        for style, arm in arms.items():
            if not arm["replayed"]:
                lines.append(f"| {arch} | {style} | not replayed: phase i never ran {arm['missing']} (after "
                             f"{arm['runs']} runs) | | | | | | | |")  # fmt: skip
                continue
            chosen = arm["chosen"] or {}
            theirs = arm["phase_i_choice"]
            cell = lambda c: f"{share_text(c['warmup_share'])} {rate_text(c['lr'])}" if c else "none"  # noqa: E731
            lines.append(
                f"| {arch} | {style} | {arm['runs']} | {arm['hours']:.2f} | "
                f"{', '.join(map(share_text, arm['shares']))} | {cell(chosen)} ({cell(theirs)}) | "
                f"{arm['full_grid_runs']} | {arm['full_grid_hours']:.2f} | "
                f"{arm['runs'] / arm['full_grid_runs']:.2f} | {arm['earlier_default_runs']} |"
            )
    lines += ["", "Two styles (pre and geo), per shape:", ""]
    for arch, pair in record["two_styles"].items():
        lines.append(
            f"- {arch}: the default {pair['runs']} runs ({pair['hours']:.2f} h), {pair['runs_vs_earlier']:.1f}x the "
            f"earlier default's {pair['earlier_runs']} runs in runs and {pair['hours_vs_earlier']:.1f}x in time (its "
            f"runs at the mean time of the default's); the full grid {pair['full_grid_runs']} runs "
            f"({pair['full_grid_hours']:.2f} h)"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    record: dict = {"assumes": __doc__.split("The replay assumes:")[1].split("It compares")[0].strip(), "arms": {},
                    "two_styles": {}}  # fmt: skip
    for arch in I_SHAPES:
        runs = journaled(arch)
        record["arms"][arch] = {}
        for style in I_CENTRES:
            arm = replay(arch, style, runs)
            arm["phase_i_choice"] = phase_i_choice(style, runs)
            record["arms"][arch][style] = arm
        pair = [record["arms"][arch][style] for style in ("pre", "geo")]
        if all(arm["replayed"] for arm in pair):
            earlier_runs = sum(arm["earlier_default_runs"] for arm in pair)
            earlier_hours = sum(arm["earlier_default_hours"] for arm in pair)
            record["two_styles"][arch] = {
                "runs": sum(arm["runs"] for arm in pair), "hours": sum(arm["hours"] for arm in pair),
                "earlier_runs": earlier_runs, "earlier_hours": earlier_hours,
                "runs_vs_earlier": sum(arm["runs"] for arm in pair) / earlier_runs,
                "hours_vs_earlier": sum(arm["hours"] for arm in pair) / earlier_hours,
                "full_grid_runs": sum(arm["full_grid_runs"] for arm in pair),
                "full_grid_hours": sum(arm["full_grid_hours"] for arm in pair),
            }  # fmt: skip
    (RESULTS / "sweep_cost.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (RESULTS / "sweep_cost.md").write_text(table(record), encoding="utf-8")
    print(table(record))


if __name__ == "__main__":
    main()
