"""The figure of benchmarks/scaling.py: the best alpha and the best GeoNorm's margin over Pre-Norm on each axis."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaling_grid import ALPHAS, Cell, alpha_label, complete, grid


def plot(path: Path, tables: dict, cells: dict[str, Cell], args: argparse.Namespace) -> None:
    """Best alpha (top) and best GeoNorm minus Pre-Norm (bottom) against tokens, depth and width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_spec = [("budget", "tokens (M)", lambda c: c.steps * args.batch * args.seq_len / 1e6),
                 ("depth", "layers", lambda c: c.layers), ("width", "width", lambda c: c.width)]  # fmt: skip
    middle = grid(args.smoke)["budget"][-1]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5), squeeze=False)
    for col, (axis, xlabel, x_of) in enumerate(axes_spec):
        members = {c.name for c in grid(args.smoke)[axis]} | {middle.name}
        series: dict[str, list[tuple[float, float, float]]] = {}
        for (cname, arch, corpus), table in tables.items():
            if cname in members and complete(table):
                best = min(ALPHAS, key=lambda a, t=table: t[alpha_label(a)])
                margin = table[alpha_label(best)] - table["pre"]
                series.setdefault(f"{arch} / {corpus}", []).append((x_of(cells[cname]), best, margin))
        for label, points in sorted(series.items()):
            points.sort()
            xs = [p[0] for p in points]
            axes[0][col].plot(xs, [p[1] for p in points], "o-", label=label)
            axes[1][col].plot(xs, [p[2] for p in points], "o-", label=label)
        for row_index, ylabel in enumerate(["best alpha (harmonic)", "best GeoNorm - Pre-Norm (val loss)"]):
            ax = axes[row_index][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if row_index == 0:
                ax.set_yscale("log", base=2)
                ax.set_title(f"{axis} axis", fontsize=10)
            else:
                ax.axhline(0.0, color="black", linewidth=0.8)
            if series:
                ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
