"""Ablation: every member of the GeoNorm family trained from scratch under identical conditions.

For GPT-2 and LLaMA shapes, on the Python standard library's source and on English prose (Debian's fortunes,
or ``--prose PATH``), each member below is trained with the same initial seed, data order, token budget, lr
and schedule, for ``--seeds`` seeds:

    pre, post, sandwich, deepnorm (built through the GeoNorm config, so DeepNet's init scaling applies),
    geo with harmonic / sqrt / linear / constant decay (the library's defaults otherwise, as
    ``hf_geonorm.GeoNormSettings`` has them when the script runs; the table names them)

Writes ``ablation.md`` (final validation loss mean and spread over seeds, loss spikes, tokens/s),
``ablation.json`` (every run's losses) and ``ablation.png`` (seed-mean validation curves) to ``--out``.

    python benchmarks/ablation.py                       # the committed CPU run (2 cores)
    python benchmarks/ablation.py --scale 125m --seq-len 1024 --steps 20000 --vocab 50304 --max-chars 0 \\
        --batch 32 --lr 6e-4 --warmup 500 --eval-every 500 --workers 1 --threads 8 --prose PATH   # a GPU
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reports  # noqa: E402
import run_loop  # noqa: E402
import studies  # noqa: E402

MEMBERS: dict[str, dict] = {
    "pre": {"norm_style": "pre"},
    "post": {"norm_style": "post"},
    "sandwich": {"norm_style": "sandwich"},
    "deepnorm": {"norm_style": "deepnorm"},
    "geo harmonic": {"norm_style": "geo", "geo_decay": "harmonic"},
    "geo sqrt": {"norm_style": "geo", "geo_decay": "sqrt"},
    "geo linear": {"norm_style": "geo", "geo_decay": "linear"},
    "geo constant": {"norm_style": "geo", "geo_decay": "constant"},
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    studies.common_arguments(parser, steps=200, layers=4, width=64, seq_len=64)
    parser.add_argument("--archs", default="gpt2,llama")
    parser.add_argument("--corpora", default="stdlib,prose")
    args = parser.parse_args(argv)
    if args.smoke:
        studies.apply_smoke(args)
    results, corpora, wall = studies.run_grid(args, MEMBERS)
    return write(args, results, corpora, wall)


def write(args: argparse.Namespace, results: list[dict], corpora: dict, wall: float) -> dict:
    name = studies.stem("ablation", args)
    groups = reports.group(results, "corpus", "arch", "label")
    summaries = {" / ".join(k): reports.summary(v) for k, v in groups.items()}
    spec = results[0]["spec"]
    lines = [
        "# Ablation: the GeoNorm family trained from scratch under identical conditions",
        "",
        f"Written by `benchmarks/{Path(__file__).name}` ({reports.environment()['date']}; {wall / 60:.1f} min wall "
        f"on {reports.environment()['cpu_count']} shared CPU cores). Every member: same initial seed, batches, "
        f"token budget ({spec['steps']} steps x {spec['batch']} x {spec['seq_len']} tokens), AdamW lr "
        f"{spec['lr']} ({spec['warmup']} warm-up steps, cosine to 10%), grad clip 1.0, dropout 0; "
        f"{spec['layers']} layers, width {spec['width']}, {spec['heads']} heads"
        + (f" (preset {spec['preset']})" if spec["preset"] else "")
        + f"; {len({r['spec']['seed'] for r in results})} seeds. GeoNorm members: the library's defaults "
        f"({reports.defaults_text()}) with the decay named."
        + reports.reuse_note(results),
        "",
        "Corpora (byte-level BPE of "
        + ", ".join(f"{c.vocab} tokens for {n}" for n, c in corpora.items())
        + "): "
        + "; ".join(
            f"**{n}** = {c.label}, {len(c.train)} train / {len(c.val)} validation blocks" for n, c in corpora.items()
        )
        + ".",
        "",
    ]
    for (corpus, arch), _ in reports.group(results, "corpus", "arch").items():
        members = {k[2]: v for k, v in groups.items() if k[0] == corpus and k[1] == arch}
        stats = {m: reports.summary(v) for m, v in members.items()}
        best = min(stats, key=lambda m: stats[m]["mean"] if stats[m]["mean"] == stats[m]["mean"] else 1e9)
        pre = stats.get("pre", {}).get("mean", float("nan"))
        lines += [
            f"## {arch} on {corpus}",
            "",
            "| member | val loss mean | std | min - max | vs pre | spikes | diverged | tokens/s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for member, s in sorted(stats.items(), key=lambda kv: kv[1]["mean"]):
            mark = " **(best)**" if member == best else ""
            lines.append(
                f"| {member}{mark} | {reports.fmt(s['mean'])} | {reports.fmt(s['std'])} | {reports.fmt(s['min'])} - "
                f"{reports.fmt(s['max'])} | {s['mean'] - pre:+.3f} | {s['spikes']} | {s['diverged']}/{s['n']} | "
                f"{s['tokens_per_second']:.0f} |"
            )
        lines.append("")
    lines += [
        "Validation loss: mean token cross-entropy on the held-out blocks after the last step; std is the sample "
        "standard deviation over seeds. Spike: " + run_loop.SPIKE_DEFINITION + ". Diverged: "
        + run_loop.DIVERGED_DEFINITION + ". Tokens/s: median over seeds of training tokens / training-step wall "
        "time, measured with runs in parallel on shared, contended CPU cores: noisy, compare only roughly "
        "(benchmarks/overhead.py measures cost properly).",
        "",
        f"![validation curves]({name}.png)",
        "",
    ]
    out = args.out
    payload = reports.write_results(args, name, lines, reports.environment(), wall, summaries=summaries, runs=results)
    panels = {
        f"{arch} on {corpus}": {k[2]: v for k, v in groups.items() if k[0] == corpus and k[1] == arch}
        for (corpus, arch) in reports.group(results, "corpus", "arch")
    }
    reports.plot_panels(out / f"{name}.png", panels, "Ablation: seed-mean validation loss")
    print(f"wrote {out / name}.md/.json/.png in {wall / 60:.1f} min")
    return payload


if __name__ == "__main__":
    main()
