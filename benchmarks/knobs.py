"""Knobs: GeoNorm's own settings swept at the ablation's scale, against Pre-Norm and the library's defaults.

One setting changes at a time from the library's defaults (``hf_geonorm.GeoNormSettings``: harmonic decay, max
angle pi/4, embedding radius, no learnable step, and its default alpha):

    alpha 0.125 / 0.25 / 0.5 / 1 (the spec's value) / 2 / 4 other than the default; decay sqrt / linear /
    constant; max angle pi/2 / none; radius sqrt_d (default alpha and 8); learnable step

Same model, data, seeds, token budget and lr as ``benchmarks/ablation.py``. Writes ``knobs.md`` (with a
verdict per default: confirmed or overturned, at this scale), ``knobs.json`` and ``knobs.png`` to ``--out``.

    python benchmarks/knobs.py                      # the committed CPU run (2 cores)
    python benchmarks/knobs.py --scale 125m ...     # a GPU, with the options of ablation.py
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reports  # noqa: E402
import run_loop  # noqa: E402
import studies  # noqa: E402

from hf_geonorm.modeling.settings import GeoNormSettings  # noqa: E402

GEO = {"norm_style": "geo"}
DEFAULT_ALPHA = GeoNormSettings().geo_alpha
OTHER_ALPHAS = [a for a in (0.125, 0.25, 0.5, 1.0, 2.0, 4.0) if a != DEFAULT_ALPHA]
VARIANTS: dict[str, dict] = {
    "pre (reference)": {"norm_style": "pre"},
    "geo defaults": dict(GEO),
    **{f"alpha {a:g}": {**GEO, "geo_alpha": a} for a in OTHER_ALPHAS},
    "decay sqrt": {**GEO, "geo_decay": "sqrt"},
    "decay linear": {**GEO, "geo_decay": "linear"},
    "decay constant": {**GEO, "geo_decay": "constant"},
    "max angle pi/2": {**GEO, "geo_max_angle": math.pi / 2},
    "max angle none": {**GEO, "geo_max_angle": None},
    "radius sqrt_d": {**GEO, "geo_radius": "sqrt_d"},
    "radius sqrt_d, alpha 8": {**GEO, "geo_radius": "sqrt_d", "geo_alpha": 8.0},
    "learnable step": {**GEO, "geo_learnable_step": True},
}
# which variants challenge which default
DEFAULTS = {
    f"alpha {DEFAULT_ALPHA:g}": [f"alpha {a:g}" for a in OTHER_ALPHAS],
    "decay harmonic": ["decay sqrt", "decay linear", "decay constant"],
    "max angle pi/4": ["max angle pi/2", "max angle none"],
    "radius embedding": ["radius sqrt_d", "radius sqrt_d, alpha 8"],
    "learnable step off": ["learnable step"],
}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    studies.common_arguments(parser, steps=200, layers=4, width=64, seq_len=64)
    parser.add_argument("--archs", default="gpt2,llama", help="comma-separated model types")
    parser.add_argument("--corpora", default="prose")
    args = parser.parse_args(argv)
    if args.smoke:
        studies.apply_smoke(args)
    results, _, wall = studies.run_grid(args, VARIANTS)
    return write(args, results, wall)


NOISE_FLOOR = 0.01  # differences in validation loss below this are not called a change, whatever the seeds say


def margin(a: dict, b: dict) -> float:
    """The difference in mean validation loss that counts as real: twice the standard error of the difference
    of two seed means (or NOISE_FLOOR, whichever is larger)."""
    n = max(1, min(a["n"], b["n"]))
    return max(2 * math.sqrt((a["std"] ** 2 + b["std"] ** 2) / n), NOISE_FLOOR)


def beating(stats: dict[str, dict], challengers: list[str]) -> list[str]:
    """The challengers whose mean is lower than the defaults' by more than ``margin``."""
    base = stats["geo defaults"]
    return [c for c in challengers if stats[c]["mean"] < base["mean"] - margin(base, stats[c])]


def verdict(stats: dict[str, dict], default: str, challengers: list[str]) -> str:
    """Overturned when some challenger's mean is lower than the defaults' by more than ``margin``."""
    base = stats["geo defaults"]
    beaten = [(c, stats[c]["mean"]) for c in beating(stats, challengers)]
    better = [c for c in challengers if stats[c]["mean"] < base["mean"]]
    if beaten:
        best = min(beaten, key=lambda kv: kv[1])[0]
        return (
            f"**overturned** by {best} ({reports.fmt(stats[best]['mean'])} vs {reports.fmt(base['mean'])}, "
            f"margin {margin(base, stats[best]):.3f})"
        )
    if better:
        return "confirmed within noise (" + ", ".join(
            f"{c} {reports.fmt(stats[c]['mean'])}" for c in better) + " lower by less than the margin)"  # fmt: skip
    return "confirmed (every alternative is worse)"


def across_architectures(summaries: dict[str, dict[str, dict]]) -> list[str]:
    """Each variant's mean validation loss averaged over every (corpus, architecture) panel, beside its loss
    relative to the defaults in each panel: a default must hold across architectures, not in one."""
    panels = list(summaries)
    rows = []
    for label in summaries[panels[0]]:
        deltas = [summaries[p][label]["mean"] - summaries[p]["geo defaults"]["mean"] for p in panels]
        rows.append((sum(summaries[p][label]["mean"] for p in panels) / len(panels), label, deltas))
    lines = [
        "## Across architectures",
        "",
        "| variant | mean over panels | " + " | ".join(f"vs geo defaults, {p}" for p in panels) + " |",
        "|---|---|" + "---|" * len(panels),
    ]
    for mean, label, deltas in sorted(rows):
        lines.append(f"| {label} | {reports.fmt(mean)} | " + " | ".join(f"{d:+.3f}" for d in deltas) + " |")
    lines += [
        "",
        "Decision rule for the library's defaults: a default is replaced only by an alternative that beats it by "
        "more than the margin in every panel (every architecture), so that no architecture's users pay for "
        "another's gain.",
        "",
        "| default | overturned in | decision |",
        "|---|---|---|",
    ]
    for default, challengers in DEFAULTS.items():
        beaten_in = [p for p in panels if beating(summaries[p], challengers)]
        everywhere = set.intersection(*(set(beating(summaries[p], challengers)) for p in panels))
        if everywhere:
            best = min(everywhere, key=lambda c: sum(summaries[p][c]["mean"] for p in panels))
            decision = f"**change to {best}**"
        else:
            decision = "keep"
        lines.append(f"| {default} | {', '.join(beaten_in) or 'none'} | {decision} |")
    return lines + [""]


def write(args: argparse.Namespace, results: list[dict], wall: float) -> dict:
    name = studies.stem("knobs", args)
    spec = results[0]["spec"]
    env = reports.environment()
    lines = [
        "# Knobs: GeoNorm's own settings at the ablation's scale",
        "",
        f"Written by `benchmarks/{Path(__file__).name}` ({env['date']}; {wall / 60:.1f} min wall on "
        f"{env['cpu_count']} shared CPU cores). One setting changed at a time from the library's defaults "
        f"({reports.defaults_text()}). Same conditions for every "
        f"variant: {spec['layers']} layers, width {spec['width']}, {spec['steps']} steps x {spec['batch']} x "
        f"{spec['seq_len']} tokens, AdamW lr {spec['lr']}, {len({r['spec']['seed'] for r in results})} seeds."
        + reports.reuse_note(results),
        "",
    ]
    summaries = {}
    for (corpus, arch), runs in reports.group(results, "corpus", "arch").items():
        stats = {k[0]: reports.summary(v) for k, v in reports.group(runs, "label").items()}
        summaries[f"{corpus} / {arch}"] = stats
        base = stats["geo defaults"]["mean"]
        pre = stats["pre (reference)"]["mean"]
        lines += [
            f"## {arch} on {corpus}",
            "",
            "| variant | val loss mean | std | vs geo defaults | vs pre | spikes | diverged |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, s in sorted(stats.items(), key=lambda kv: kv[1]["mean"]):
            lines.append(
                f"| {label} | {reports.fmt(s['mean'])} | {reports.fmt(s['std'])} | {s['mean'] - base:+.3f} | "
                f"{s['mean'] - pre:+.3f} | {s['spikes']} | {s['diverged']}/{s['n']} |"
            )
        lines += ["", "| default | verdict at this scale |", "|---|---|"]
        for default, challengers in DEFAULTS.items():
            lines.append(f"| {default} | {verdict(stats, default, challengers)} |")
        lines.append(
            f"| geo defaults vs Pre-Norm | {'GeoNorm lower' if base < pre else 'Pre-Norm lower'} by "
            f"{abs(base - pre):.3f} (margin {margin(stats['geo defaults'], stats['pre (reference)']):.3f}) |"
        )
        lines.append("")
    if len(summaries) > 1:
        lines += across_architectures(summaries)
    lines += [
        "Verdict rule: a default is overturned when an alternative's mean validation loss is lower by more than "
        f"the margin, twice the standard error of the difference of the two seed means (at least {NOISE_FLOOR}); "
        "otherwise confirmed (within noise when some alternative is lower by less). This is one small scale and "
        "a short budget: a verdict here is evidence, not proof. "
        "Spike: " + run_loop.SPIKE_DEFINITION + ".",
        "",
        f"![validation curves]({name}.png)",
        "",
    ]
    out = args.out
    payload = reports.write_results(args, name, lines, env, wall, summaries=summaries, runs=results)
    panels = {
        f"{arch} on {corpus}": {k[0]: v for k, v in reports.group(runs, "label").items()}
        for (corpus, arch), runs in reports.group(results, "corpus", "arch").items()
    }
    reports.plot_panels(out / f"{name}.png", panels, "Knobs: seed-mean validation loss")
    print(f"wrote {out / name}.md/.json/.png in {wall / 60:.1f} min")
    return payload


if __name__ == "__main__":
    main()
