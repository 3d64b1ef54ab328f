"""What evaluation costs in a short run of ``hf-geonorm train`` (issue 38: a 20-step SmolLM2 fine-tune spent 342 s of
11 minutes evaluating), before and after the default ``--eval-blocks`` was sized to the run.

Two runs of the 125m preset (GPT-2, 12 layers, width 768) through ``run_training``, as ``train`` runs them, on a
few standard-library source files with a byte-level BPE of ``VOCAB`` tokens trained on them (no download): ``STEPS``
steps of ``BATCH`` blocks of ``SEQ_LEN`` tokens, evaluated at step 0, at the end and on test, as every run is.

- ``before``: ``--eval-blocks 64``, the earlier default for every run;
- ``after``: the default now (``data.prepare.evaluation_size``): the same 64 blocks' worth of documents held out, of
  which 64 are evaluated, or fewer (at least 8) where evaluating all would cost more than a tenth of the run's
  compute.

Reported per run: the blocks evaluated, ``evaluation_seconds`` (every evaluation, from metrics.json), the seconds of
``trainer.train()`` and the evaluation's share of the run; and what the rule gives ``train``'s default run
(tiny, 300 steps x 16 blocks: 64 blocks, unchanged) and the issue's fine-tune (20 steps x 16 blocks).

Writes ``eval_cost.json`` and ``.md`` to ``--out`` (default benchmarks/results); every number in them is measured
or computed by this script. A few minutes on one core.

    python benchmarks/eval_cost.py
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from hf_geonorm.training.data.prepare import evaluation_size, evaluations
from hf_geonorm.training.options import EVAL_BLOCKS, TrainOptions
from hf_geonorm.training.run.trainer import run_training

RESULTS = Path(__file__).parent / "results"
STEPS, BATCH, SEQ_LEN, VOCAB = 4, 2, 64, 512
FILES = 40  # standard-library modules: two validation and two test documents (one in 20 each)


def corpus(folder: Path) -> Path:
    """The ``FILES`` largest top-level modules of the standard library, copied as text files."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = sorted(stdlib.glob("*.py"), key=lambda path: (-path.stat().st_size, path.name))[:FILES]
    folder.mkdir(parents=True, exist_ok=True)
    for module in modules:
        (folder / f"{module.stem}.txt").write_text(module.read_text(encoding="utf-8"), encoding="utf-8")
    return folder


def run(name: str, options: TrainOptions) -> dict[str, Any]:
    """One run through ``run_training``; what its metrics.json says of the evaluation."""
    started = time.perf_counter()
    metrics = run_training(options, log=lambda line: print(f"[{name}] {line}", flush=True))
    seconds = time.perf_counter() - started
    blocks = metrics["evaluated_blocks"]["validation"], metrics["evaluated_blocks"]["test"]
    return {
        "val_blocks": blocks[0],
        "test_blocks": blocks[1],
        "evaluations": evaluations(options),
        "evaluation_seconds": metrics["evaluation_seconds"],
        "train_seconds": metrics["train_seconds"],
        "run_seconds": seconds,
        "evaluation_share": metrics["evaluation_seconds"] / seconds,
        "seconds_per_evaluated_block": metrics["evaluation_seconds"] / (blocks[0] * (evaluations(options) - 1)
                                                                        + blocks[1]),  # fmt: skip
        "tokens_per_second": metrics["tokens_per_second"],
        "final_eval_loss": metrics["final_eval_loss"],
    }


def table(payload: dict[str, Any]) -> str:
    rows = [
        "# The cost of evaluation in a short run (benchmarks/eval_cost.py)",
        "",
        f"`hf-geonorm train --preset 125m --max-steps {STEPS} --batch-size {BATCH} --seq-len {SEQ_LEN}` on {FILES} "
        f"standard-library modules (a BPE of {VOCAB} tokens), {payload['threads']} torch thread(s); evaluated at "
        "step 0, at the end and on test.",
        "",
        "| run | --eval-blocks | blocks evaluated (validation, test) | evaluation s | run s | evaluation share | "
        "s per evaluated block |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in payload["runs"].items():
        given = {"before": "64 (the earlier default)", "after": "default (sized to the run)",
                 "batch 16": "16, at --batch-size 16 (1 step)"}[name]  # fmt: skip
        rows.append(
            f"| {name} | {given} | {row['val_blocks']}, {row['test_blocks']} | {row['evaluation_seconds']:.1f} | "
            f"{row['run_seconds']:.1f} | {row['evaluation_share']:.0%} | {row['seconds_per_evaluated_block']:.2f} |"
        )
    before, after, batched = (payload["runs"][name] for name in ("before", "after", "batch 16"))
    read = {name: row["val_blocks"] * (row["evaluations"] - 1) + row["test_blocks"]
            for name, row in payload["runs"].items()}  # fmt: skip
    rows += [
        "",
        f"Blocks evaluated in all: {read['before']} before, {read['after']} after "
        f"({read['before'] / read['after']:.0f}x fewer); evaluation time {before['evaluation_seconds']:.1f} s and "
        f"{after['evaluation_seconds']:.1f} s "
        f"({before['evaluation_seconds'] / after['evaluation_seconds']:.1f}x less). The blocks are evaluated in "
        "batches of --batch-size, with no padding (every block is --seq-len tokens) and no loop per block; a block "
        f"costs {after['seconds_per_evaluated_block']:.2f} s at batch {BATCH} and "
        f"{batched['seconds_per_evaluated_block']:.2f} s at batch 16 (the load of a shared machine moves both): what "
        "a short run's evaluation costs is the number of blocks.",
        "",
        "The default elsewhere (the rule, not a measurement):",
        "",
        "| run | evaluations | blocks evaluated by default | evaluation compute / training compute |",
        "|---|---|---|---|",
    ]
    for name, row in payload["rule"].items():
        rows.append(f"| {name} | {row['evaluations']} | {row['eval_blocks']} | {row['compute_share']:.1%} |")
    return "\n".join(rows) + "\n"


def rule(options: TrainOptions) -> dict[str, Any]:
    """The blocks a run evaluates by default and its evaluations' compute against its training's (a forward pass per
    evaluated block against three per trained block: the ratio the default keeps at a tenth at most)."""
    chosen = evaluation_size(options)
    trained = options.max_steps * options.batch_size * options.gradient_accumulation_steps
    count = evaluations(options)
    return {"evaluations": count, "eval_blocks": chosen,
            "compute_share": count * chosen / (3 * trained)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="eval-cost-") as work:
        work = Path(work)
        base = TrainOptions(
            preset="125m", data=str(corpus(work / "data")), data_cache=str(work / "cache"), vocab_size=VOCAB,
            seq_len=SEQ_LEN, batch_size=BATCH, max_steps=STEPS, warmup_steps=1, lr=6e-4, logging_steps=1,
        )  # fmt: skip
        runs = {
            "before": run("before", replace(base, eval_blocks=EVAL_BLOCKS, output=str(work / "before"))),
            "after": run("after", replace(base, output=str(work / "after"))),
            # the batch: one step of 16 blocks, 16 blocks evaluated in one batch each time
            "batch 16": run("batch 16", replace(base, batch_size=16, max_steps=1, eval_blocks=16,
                                                output=str(work / "batch16"))),
        }  # fmt: skip
    payload = {
        "preset": "125m", "arch": "gpt2", "steps": STEPS, "batch_size": BATCH, "seq_len": SEQ_LEN, "vocab": VOCAB,
        "threads": torch.get_num_threads(), "runs": runs,
        "rule": {
            "train's default run (tiny, 300 steps x 16)": rule(TrainOptions()),
            "the issue's fine-tune (20 steps x 16)": rule(TrainOptions(max_steps=20)),
            "this benchmark's run": rule(base),
        },
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "eval_cost.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (args.out / "eval_cost.md").write_text(table(payload), encoding="utf-8")
    print(table(payload))


if __name__ == "__main__":
    main()
