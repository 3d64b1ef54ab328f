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

import common  # noqa: E402

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
    common.common_arguments(parser, steps=1000, layers=32, width=64, seq_len=256)
    parser.add_argument("--arch", default="gpt2")
    parser.add_argument("--corpus", default="stdlib", choices=["stdlib", "prose"])
    parser.set_defaults(lr=4e-3, batch=4, seeds=3, eval_every=50)
    args = parser.parse_args(argv)
    if args.smoke:
        common.apply_smoke(args)
        args.layers = 3
    start = time.perf_counter()
    corpora = {args.corpus: common.load_corpus(args.corpus, args.vocab, args.seq_len, common.max_chars(args),
                                               args.prose)}  # fmt: skip
    specs = [
        common.base_spec(args, label=label, arch=args.arch, corpus=args.corpus, settings=settings, seed=seed)
        for seed in range(args.seeds)
        for label, settings in STYLES.items()
    ]
    results = common.run_all(specs, corpora, args.workers, args.threads, reuse=args.reuse)
    return write(args, results, time.perf_counter() - start)


def write(args: argparse.Namespace, results: list[dict], wall: float) -> dict:
    name = common.stem("stability", args)
    spec = results[0]["spec"]
    env = common.environment()
    stats = {k[0]: common.summary(v) for k, v in common.group(results, "label").items()}
    pre = stats["pre"]["mean"]
    lines = [
        "# Stability: a deep, narrow model at a high learning rate",
        "",
        f"Written by `benchmarks/{Path(__file__).name}` ({env['date']}; {wall / 60:.1f} min wall on "
        f"{env['cpu_count']} shared CPU cores). {spec['arch']}, {spec['layers']} layers, width {spec['width']}, "
        f"{spec['heads']} heads, sequences of {spec['seq_len']} tokens on {spec['corpus']}, batch {spec['batch']}, "
        f"{spec['steps']} steps, AdamW lr {spec['lr']} ({spec['warmup']} warm-up steps, cosine to 10%), grad clip "
        f"1.0, {len({r['spec']['seed'] for r in results})} seeds (same seeds and batches for every style). GeoNorm: "
        f"the library's defaults ({common.defaults_text()}), and the same with constant decay."
        + common.reuse_note(results),
        "",
        "| style | val loss mean | std | min - max | vs pre | spikes (all seeds) | diverged | max train loss after "
        "warm-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, s in sorted(stats.items(), key=lambda kv: kv[1]["mean"] if kv[1]["mean"] == kv[1]["mean"] else 1e9):
        runs = [r for r in results if r["spec"]["label"] == label]
        peak = max(max(r["losses"][spec["warmup"]:] or [float("nan")]) for r in runs)
        lines.append(
            f"| {label} | {common.fmt(s['mean'])} | {common.fmt(s['std'])} | {common.fmt(s['min'])} - "
            f"{common.fmt(s['max'])} | {s['mean'] - pre:+.3f} | {s['spikes']} "
            f"| {s['diverged']}/{s['n']} | {common.fmt(peak)} |"
        )
    lines += [
        "",
        "Spike: " + common.SPIKE_DEFINITION + ". Diverged: " + common.DIVERGED_DEFINITION + ".",
        "",
        f"![train loss curves]({name}.png)",
        "",
    ]
    out = args.out
    payload = common.write_results(args, name, lines, env, wall, summaries=stats, runs=results)
    members = {k[0]: v for k, v in common.group(results, "label").items()}
    common.plot_panels(out / f"{name}.png", {f"{spec['layers']} layers, width {spec['width']}, lr {spec['lr']}":
                       members}, "Stability: seed-mean train loss", what="train")  # fmt: skip
    print(f"wrote {out / name}.md/.json/.png in {wall / 60:.1f} min")
    return payload


if __name__ == "__main__":
    main()
