"""What the benchmark scripts share: their command line (``common_arguments``), the smoke scale of the tests,
a run's specification from the arguments, and the grid of variants x architectures x corpora x seeds that the
ablation and the knob sweep run."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from corpus_data import load_corpus
from run_loop import RunSpec, run_all

RESULTS = Path(__file__).resolve().parent / "results"


def run_grid(args: argparse.Namespace, variants: dict[str, dict[str, Any]]) -> tuple[list[dict], dict, float]:
    """Every variant x arch x corpus x seed of ``args`` (the ablation's and the knob sweep's grid): the
    results, the corpora and the wall time in seconds."""
    archs, corpora_names = args.archs.split(","), args.corpora.split(",")
    start = time.perf_counter()
    corpora = {
        name: load_corpus(name, args.vocab, args.seq_len, max_chars(args), args.prose) for name in corpora_names
    }
    specs = [
        base_spec(args, label=label, arch=arch, corpus=corpus, settings=settings, seed=seed)
        for corpus in corpora_names
        for arch in archs
        for seed in range(args.seeds)
        for label, settings in variants.items()
    ]
    results = run_all(specs, corpora, args.workers, args.threads, reuse=args.reuse)
    return results, corpora, time.perf_counter() - start


def common_arguments(parser: argparse.ArgumentParser, steps: int, layers: int, width: int, seq_len: int) -> None:
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--prose", default=None, help="a prose file/folder instead of Debian's fortunes")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--width", type=int, default=width)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=seq_len)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--max-chars", type=int, default=2_000_000)
    parser.add_argument("--workers", type=int, default=2, help="parallel runs (processes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument(
        "--scale", default=None, choices=["125m", "350m", "760m", "1.3b"],
        help="the paper's model sizes (hf_geonorm.training.presets) on CUDA with bf16 autocast: overrides "
        "--layers/--width/--heads; use with --seq-len 1024+ --steps 10000+ --vocab 50304 --max-chars 0 (all) on a GPU",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="a minuscule run for the tests (seconds)")
    parser.add_argument(
        "--reuse", type=Path, default=None, metavar="JSON",
        help="an earlier results JSON of this script: runs whose specification is identical are taken from it "
        "instead of being repeated (e.g. to add an architecture to a sweep)",
    )  # fmt: skip


def apply_smoke(args: argparse.Namespace) -> None:
    """The tests' scale: tiny models, tiny corpora, a few steps, in-process, results named *_smoke."""
    args.seeds, args.steps, args.layers, args.width, args.heads = 1, 4, 2, 16, 2
    args.seq_len, args.batch, args.warmup, args.eval_every = 16, 2, 1, 2
    args.vocab, args.max_chars, args.workers = 300, 12_000, 1


def base_spec(args: argparse.Namespace, **overrides: Any) -> RunSpec:
    values = dict(
        layers=args.layers, width=args.width, heads=args.heads, seq_len=args.seq_len, batch=args.batch,
        steps=args.steps, lr=args.lr, warmup=args.warmup, eval_every=args.eval_every,
    )  # fmt: skip
    if args.scale:
        values.update(preset=args.scale, device="cuda" if torch.cuda.is_available() else "cpu", eval_blocks=64)
    values.update(overrides)
    return RunSpec(**values)


def stem(name: str, args: argparse.Namespace) -> str:
    return f"{name}_smoke" if args.smoke else (f"{name}_{args.scale}" if args.scale else name)


def max_chars(args: argparse.Namespace) -> int:
    return args.max_chars if args.max_chars > 0 else 10**12
