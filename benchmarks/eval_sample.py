"""Is the held-out sample large enough? The sampling error of the study's validation and test losses against the
spread over seeds.

For each phase given, the final models of Pre-Norm and GeoNorm at their best rates (seed 0) are evaluated again,
block by block, on the phase's validation and test blocks (``train``'s own data step, from the journal's options).
The mean of the blocks' losses is checked against the journal's loss (the same number, computed a second way).
The blocks are grouped into runs of ``CLUSTER`` consecutive blocks (about 1,000 tokens: a document or two, since a
document's blocks are not independent), and the standard error over those groups is the sampling error:

- of each arm's loss, against that arm's seed spread;
- of GeoNorm's margin (the per-group difference of the two models on the same text), against the margin's
  standard error over seeds.

Where the sampling error is well below the seed spread, more held-out text would not change a conclusion. Writes
``benchmarks/results/eval_sample.json`` and ``eval_sample.md``; trains nothing:

    python benchmarks/eval_sample.py [--phases h_styles,...] [--results benchmarks/results/sweeps]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

import hf_geonorm  # noqa: F401  (registers the GeoNorm classes)
from hf_geonorm.sweep.grid import read_journal
from hf_geonorm.sweep.journal import header_options
from hf_geonorm.sweep.report import best_rates, cells, mean_spread
from hf_geonorm.training.data.prepare import data_request, data_source, training_data
from hf_geonorm.training.options import TrainOptions

RESULTS = Path(__file__).parent / "results"
CLUSTER = 8  # consecutive blocks of 128 tokens per group
BATCH = 32


def block_losses(model: Any, blocks: torch.Tensor) -> torch.Tensor:
    """The mean next-token loss of each block (its 127 predictions), as Trainer's evaluation averages them."""
    losses = []
    with torch.no_grad():
        for start in range(0, len(blocks), BATCH):
            ids = blocks[start : start + BATCH]
            logits = model(input_ids=ids).logits.float()
            token = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
            losses.append(token.mean(dim=1))
    return torch.cat(losses)


def grouped_error(values: torch.Tensor) -> float:
    """The standard error of the mean of ``values`` over groups of ``CLUSTER`` consecutive ones."""
    groups = values[: len(values) // CLUSTER * CLUSTER].view(-1, CLUSTER).mean(dim=1).tolist()
    return statistics.stdev(groups) / len(groups) ** 0.5


def phase_record(sweeps: Path, phase: str, cache: str) -> dict[str, Any]:
    header, runs = read_journal(sweeps / phase / "runs.jsonl")
    known = {f.name for f in fields(TrainOptions)}
    options = TrainOptions(**{k: v for k, v in header_options(header).items() if k in known}, data_cache=cache)
    request = replace(data_request(options), evaluated_blocks=None)  # every held-out block, as the runs held out
    data = training_data(data_source(request, lambda _: None), request, lambda _: None)
    plain = [r for r in runs if r["alpha"] is None]
    best, table = best_rates(plain), cells(plain)
    record: dict[str, Any] = {"phase": phase}
    losses = {}
    for style in ("pre", "geo"):
        (entry,) = [r for r in plain if r["style"] == style and r["lr"] == best[style] and r["seed"] == 0]
        model = AutoModelForCausalLM.from_pretrained(sweeps / phase / entry["model"]).eval()  # relative: the sweep's
        _, seed_spread, seeds = mean_spread(table[style][best[style]].test)
        arm = {"lr": best[style], "seed_spread_test": seed_spread, "seeds": seeds}
        for split, dataset in (("val", data.val), ("test", data.test)):
            per_block = block_losses(model, dataset.blocks)
            losses[(style, split)] = per_block
            arm[f"{split}_loss_again"] = per_block.mean().item()
            arm[f"{split}_loss_journal"] = entry[f"{split}_loss"]
            arm[f"{split}_sampling_error"] = grouped_error(per_block)
        record[style] = arm
    for split in ("val", "test"):
        difference = losses[("geo", split)] - losses[("pre", split)]
        record[f"{split}_margin_sampling_error"] = grouped_error(difference)
    pre, geo = record["pre"], record["geo"]
    if pre["seed_spread_test"] is not None and geo["seed_spread_test"] is not None:
        record["margin_seed_error"] = (pre["seed_spread_test"] ** 2 / pre["seeds"]
                                       + geo["seed_spread_test"] ** 2 / geo["seeds"]) ** 0.5  # fmt: skip
    record["blocks"] = {"val": len(data.val), "test": len(data.test), "cluster": CLUSTER}
    return record


def page(records: list[dict[str, Any]]) -> str:
    lines = [
        "# The held-out sample against the seed spread",
        "",
        f"Written by `benchmarks/eval_sample.py`. Sampling error: the standard error over groups of {CLUSTER} "
        "consecutive blocks of the per-block test loss (each arm's seed-0 model at its best rate), and of the "
        "per-group difference GeoNorm − Pre-Norm on the same text. 'again': the mean of the blocks recomputed here, "
        "against the journal's.",
        "",
        "| phase | arm | test loss again / journal | sampling error | seed spread (n) |",
        "|---|---|---|---|---|",
    ]
    for record in records:
        for style in ("pre", "geo"):
            arm = record[style]
            spread = "–" if arm["seed_spread_test"] is None else f"{arm['seed_spread_test']:.4f}"
            lines.append(
                f"| {record['phase']} | {style} | {arm['test_loss_again']:.4f} / {arm['test_loss_journal']:.4f} | "
                f"{arm['test_sampling_error']:.4f} | {spread} ({arm['seeds']}) |"
            )
    lines += ["", "| phase | margin: sampling error (test) | margin: standard error over seeds |", "|---|---|---|"]
    for record in records:
        seeds = record.get("margin_seed_error")
        lines.append(f"| {record['phase']} | {record['test_margin_sampling_error']:.4f} | "
                     f"{'–' if seeds is None else f'{seeds:.4f}'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS / "sweeps")
    parser.add_argument("--phases", default="h_styles")
    parser.add_argument("--data-cache", default=str(Path("~/.cache/hf-geonorm/study").expanduser()))
    args = parser.parse_args()
    records = [phase_record(args.results, phase, args.data_cache) for phase in args.phases.split(",")]
    for record in records:
        for style in ("pre", "geo"):
            for split in ("val", "test"):
                again, journal = record[style][f"{split}_loss_again"], record[style][f"{split}_loss_journal"]
                if abs(again - journal) > 1e-3:
                    raise SystemExit(f"{record['phase']} {style} {split}: {again:.5f} here, {journal:.5f} journaled")
    (RESULTS / "eval_sample.json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    (RESULTS / "eval_sample.md").write_text(page(records), encoding="utf-8")
    print(page(records))


if __name__ == "__main__":
    main()
