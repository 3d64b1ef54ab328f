"""The figure of benchmarks/convert_uptrain.py: held-out perplexity along the uptraining of every arm, one panel per
run (the small model, and SmolLM2 per budget of each recipe)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(path: Path, results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if results.get("small"):
        panels.append(("small LLaMA pretrained here", results["small"]["arms"], results["small"]["original"]))
    for part, name in (("uptrain", "recipe"), ("layerwise", "layer-wise")):
        for steps, budget in sorted((results.get(part) or {}).get("budgets", {}).items(), key=lambda kv: int(kv[0])):
            panels.append((f"SmolLM2-135M, {name}, {steps} steps", budget["arms"], results[part]["original"]))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.5 * max(1, len(panels)), 4.2), squeeze=False)
    for ax, (title, arms, original) in zip(axes[0], panels, strict=False):
        for label, arm in arms.items():
            ax.plot([s for s, _ in arm["evals"]], [v for _, v in arm["evals"]], marker="o", ms=3, label=label)
        ax.axhline(original, color="gray", ls=":", label="original")
        ax.axhline(2 * original, color="red", ls=":", lw=0.8, label="2x original")
        ax.set_yscale("log")
        ax.set_ylim(top=4 * original)
        ax.set(title=title, xlabel="uptraining step", ylabel="held-out perplexity")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
