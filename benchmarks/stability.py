"""Stability: a deep, narrow model at a high learning rate and a longer sequence, per residual style.

Post-Norm is known to spike and collapse in deep stacks at high learning rates with short warm-up (the paper:
on long runs at long sequence lengths). Every style trains the same deep, narrow model (default 32 layers,
width 64) with the same seeds, batches and schedule for 1000 steps at lr 4e-3 after only 20 warm-up steps, on
``--corpus`` (default: the Python standard library's source) with sequences of 256 tokens (four times the
ablation's 64), 3 seeds. Reports final validation loss, loss spikes and divergences per style.

Writes ``stability.md``, ``stability.json`` and ``stability.png`` (train-loss curves, where spikes show) to
``--out``.

    python benchmarks/stability.py                  # the committed CPU run (2 cores, 1-1.5 hours)
    python benchmarks/stability.py --layers 48 --width 256 --seq-len 2048 --steps 5000 --workers 1 --threads 8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus_data  # noqa: E402
import reports  # noqa: E402
import run_loop  # noqa: E402
import studies  # noqa: E402

STYLES: dict[str, dict] = {
    "pre": {"norm_style": "pre"},
    "post": {"norm_style": "post"},
    "sandwich": {"norm_style": "sandwich"},
    "deepnorm": {"norm_style": "deepnorm"},
    "geo harmonic (defaults)": {"norm_style": "geo"},
    "geo constant": {"norm_style": "geo", "geo_decay": "constant"},
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    studies.common_arguments(parser, steps=1000, layers=32, width=64, seq_len=256)
    parser.add_argument("--arch", default="gpt2")
    parser.add_argument("--corpus", default="stdlib", choices=["stdlib", "prose"])
    parser.set_defaults(lr=4e-3, batch=4, seeds=3, eval_every=50)
    args = parser.parse_args(argv)
    if args.smoke:
        studies.apply_smoke(args)
        args.layers = 3
    start = time.perf_counter()
    corpora = {args.corpus: corpus_data.load_corpus(args.corpus, args.vocab, args.seq_len, studies.max_chars(args),
                                               args.prose)}  # fmt: skip
    specs = [
        studies.base_spec(args, label=label, arch=args.arch, corpus=args.corpus, settings=settings, seed=seed)
        for seed in range(args.seeds)
        for label, settings in STYLES.items()
    ]
    results = run_loop.run_all(specs, corpora, args.workers, args.threads, reuse=args.reuse)
    return write(args, results, time.perf_counter() - start)


def write(args: argparse.Namespace, results: list[dict], wall: float) -> dict:
    name = studies.stem("stability", args)
    spec = results[0]["spec"]
    env = reports.environment()
    stats = {k[0]: reports.summary(v) for k, v in reports.group(results, "label").items()}
    pre = stats["pre"]["mean"]
    lines = [
        "# Stability: a deep, narrow model at a high learning rate",
        "",
        f"Written by `benchmarks/{Path(__file__).name}` ({env['date']}; {wall / 60:.1f} min wall on "
        f"{env['cpu_count']} shared CPU cores). {spec['arch']}, {spec['layers']} layers, width {spec['width']}, "
        f"{spec['heads']} heads, sequences of {spec['seq_len']} tokens on {spec['corpus']}, batch {spec['batch']}, "
        f"{spec['steps']} steps, AdamW lr {spec['lr']} ({spec['warmup']} warm-up steps, cosine to 10%), grad clip "
        f"1.0, {len({r['spec']['seed'] for r in results})} seeds (same seeds and batches for every style). GeoNorm: "
        f"the library's defaults ({reports.defaults_text()}), and the same with constant decay."
        + reports.reuse_note(results),
        "",
        "| style | val loss mean | std | min - max | vs pre | spikes (all seeds) | diverged | max train loss after "
        "warm-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, s in sorted(stats.items(), key=lambda kv: kv[1]["mean"] if kv[1]["mean"] == kv[1]["mean"] else 1e9):
        runs = [r for r in results if r["spec"]["label"] == label]
        peak = max(max(r["losses"][spec["warmup"]:] or [float("nan")]) for r in runs)
        lines.append(
            f"| {label} | {reports.fmt(s['mean'])} | {reports.fmt(s['std'])} | {reports.fmt(s['min'])} - "
            f"{reports.fmt(s['max'])} | {s['mean'] - pre:+.3f} | {s['spikes']} "
            f"| {s['diverged']}/{s['n']} | {reports.fmt(peak)} |"
        )
    lines += [
        "",
        "Spike: " + run_loop.SPIKE_DEFINITION + ". Diverged: " + run_loop.DIVERGED_DEFINITION + ".",
        "",
        f"![train loss curves]({name}.png)",
        "",
    ]
    out = args.out
    payload = reports.write_results(args, name, lines, env, wall, summaries=stats, runs=results)
    members = {k[0]: v for k, v in reports.group(results, "label").items()}
    reports.plot_panels(out / f"{name}.png", {f"{spec['layers']} layers, width {spec['width']}, lr {spec['lr']}":
                       members}, "Stability: seed-mean train loss", what="train")  # fmt: skip
    print(f"wrote {out / name}.md/.json/.png in {wall / 60:.1f} min")
    return payload


if __name__ == "__main__":
    main()
