"""What the benchmark scripts write: summaries over seeds, the text their tables share, the environment, and
the markdown / JSON / PNG writers. Every number in ``benchmarks/results`` is computed by ``run_loop`` and
summarised here."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch


def reuse_note(results: list[dict[str, Any]]) -> str:
    """The sentence a results table carries when some of its runs came from an earlier file (``--reuse``)."""
    sources = sorted({r["reused_from"] for r in results if "reused_from" in r})
    if not sources:
        return ""
    count = sum("reused_from" in r for r in results)
    return (f" {count} of the {len(results)} runs were taken unchanged from an earlier run of this script with the "
            f"same specification ({'; '.join(sources)}; `--reuse`); their tokens/s were measured then.")  # fmt: skip



def group(results: list[dict[str, Any]], *keys: str) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(tuple(r["spec"][k] for k in keys), []).append(r)
    return groups


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, sample std, min and max of the final validation loss over seeds (finite runs only), spikes summed,
    divergences counted, median tokens/s."""
    finals = [r["final_val_loss"] for r in runs if math.isfinite(r["final_val_loss"])]
    return {
        "n": len(runs),
        "mean": statistics.fmean(finals) if finals else float("nan"),
        "std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
        "min": min(finals) if finals else float("nan"),
        "max": max(finals) if finals else float("nan"),
        "spikes": sum(r["spikes"] for r in runs),
        "diverged": sum(bool(r["diverged"]) for r in runs),
        "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
        "seeds": [r["spec"]["seed"] for r in runs],
        "finals": [r["final_val_loss"] for r in runs],
    }


def defaults_text() -> str:
    """The library's GeoNorm defaults, read from ``GeoNormSettings`` (so a table says what was actually run)."""
    from hf_geonorm import GeoNormSettings

    d = GeoNormSettings()
    angle = "none" if d.geo_max_angle is None else f"pi/{math.pi / d.geo_max_angle:g}"
    step = "learnable" if d.geo_learnable_step else "fixed"
    return f"{d.geo_decay} decay, alpha {d.geo_alpha:g}, max angle {angle}, {d.geo_radius} radius, {step} step"


def fmt(value: float, digits: int = 3) -> str:
    return "nan" if not math.isfinite(value) else f"{value:.{digits}f}"


def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_results(args: argparse.Namespace, name: str, lines: list[str], env: dict[str, Any], wall: float,
                  **fields: Any) -> dict[str, Any]:  # fmt: skip
    """Write ``<name>.md`` (the table ``lines``) and ``<name>.json`` (the arguments, environment, wall time and
    ``fields``) to ``args.out``; the JSON payload."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.md").write_text("\n".join(lines), encoding="utf-8")
    payload = {"args": {k: str(v) for k, v in vars(args).items()}, "environment": env, "wall_seconds": wall,
               **fields}  # fmt: skip
    write_json(args.out / f"{name}.json", payload)
    return payload


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")


def smooth(values: list[float], width: int = 10) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v if math.isfinite(v) else float("nan"))
        acc = acc[-width:]
        finite = [a for a in acc if math.isfinite(a)]
        out.append(statistics.fmean(finite) if finite else float("nan"))
    return out


def plot_panels(path: Path, panels: dict[str, dict[str, list[dict[str, Any]]]], title: str,
                what: str = "val", ylim: tuple[float, float] | None = None) -> None:  # fmt: skip
    """One subplot per panel; per member the seed-mean validation curve (``what='val'``) or the seed-mean
    train loss smoothed over 10 steps (``what='train'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, (name, members) in zip(axes.flat, panels.items(), strict=False):
        lowest = math.inf
        for member, runs in members.items():
            style = "-" if "geo" in member else "--"
            if what == "val":
                steps = [s for s, _ in runs[0]["evals"]]
                curves = [[v for _, v in r["evals"]] for r in runs]
            else:
                length = max(len(r["losses"]) for r in runs)
                steps = list(range(1, length + 1))
                curves = [smooth(r["losses"]) + [float("nan")] * (length - len(r["losses"])) for r in runs]
            mean = [statistics.fmean(c[i] for c in curves if i < len(c)) for i in range(len(steps))]
            ax.plot(steps[: len(mean)], mean, style, label=member, linewidth=1.2)
            lowest = min([lowest, *(m for m in mean if math.isfinite(m))])
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss" if what == "val" else "train loss (10-step mean)")
        if ylim:
            ax.set_ylim(*ylim)
        else:
            finals = [statistics.fmean(r["evals"][-1][1] for r in runs) for runs in members.values()]
            finals = [f for f in finals if math.isfinite(f)]
            if finals:
                ax.set_ylim(min(min(finals), lowest) - 0.1, max(finals) + 1.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
