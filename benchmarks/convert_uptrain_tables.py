"""The tables of benchmarks/convert_uptrain.py, one section per part, from the numbers the parts returned
(``convert_uptrain_parts.py``), written with the JSON and the figure (``convert_uptrain_plots.py``)."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import reports
import studies
from convert_uptrain_parts import COST_BLOCKS, LAYERWISE, SMOL_SEQ
from convert_uptrain_plots import plot


def write(args: argparse.Namespace, results: dict[str, Any], wall: float) -> None:
    """The table (every part present in ``results``), the JSON and the figure, under ``args.out``."""
    name = studies.stem("convert_uptrain", args)
    env = reports.environment()
    lines = [
        "# Converting a pretrained Pre-Norm model to GeoNorm",
        "",
        f"Written by `benchmarks/convert_uptrain.py` ({env['date']}; parts run this time: "
        f"{', '.join(results['ran'])}, {wall / 60:.1f} min wall on {env['cpu_count']} CPU cores). Parts from "
        "earlier runs are kept from the JSON beside this file; each part says its conditions.",
        "",
    ]
    lines += small_lines(results.get("small"))
    lines += anatomy_lines(results.get("anatomy"))
    lines += static_lines(results.get("static"))
    lines += uptrain_lines(results.get("uptrain"))
    lines += layerwise_lines(results.get("layerwise"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.md").write_text("\n".join(lines), encoding="utf-8")
    reports.write_json(args.out / f"{name}.json", {"environment": env, "wall_seconds": wall, **results})
    plot(args.out / f"{name}.png", results)
    print(f"wrote {args.out / name}.md/.json/.png")


def arm_rows(arms: dict[str, Any], reference: str) -> list[str]:
    steps = [s for s, _ in arms[reference]["evals"]]
    lines = ["| arm | " + " | ".join(f"step {s}" for s in steps) + " | worst / original | final vs Pre-Norm |",
             "|---|" + "---|" * (len(steps) + 2)]  # fmt: skip
    for label, arm in arms.items():
        gap = arm["final"] / arms[reference]["final"] - 1
        lines.append(f"| {label} | " + " | ".join(f"{v:.4g}" for _, v in arm["evals"])
                     + f" | {arm['worst_ratio']:.2f}x | {gap:+.1%} |")  # fmt: skip
    return lines

def small_lines(small: dict[str, Any] | None) -> list[str]:
    if not small:
        return ["## A small LLaMA pretrained here", "", "Not run yet (`--parts small`).", ""]
    tokens = small["steps"] * small["batch"] * small["seq_len"]
    return [
        "## A small LLaMA pretrained here",
        "",
        f"A stock transformers `{small['arch']}` model ({small['layers']} layers, width {small['width']}) pretrained "
        f"for {small['pretrain_steps']} steps on {small['corpus']}: perplexity {small['original']:.2f} on "
        f"{small['val_blocks']} held-out blocks; converted with bridge 0, {small['bridge0']:.2f} (asserted equal). "
        f"Uptraining: {small['steps']} steps x {small['batch']} x {small['seq_len']} tokens ({tokens / 1e6:.2f}M "
        f"tokens), lr {small['lr']}, the same batches for every arm; the anneal arms move the bridge 0 -> 1 over "
        f"the first {small['anneal']} steps. \"worst / original\": the highest perplexity on the path over the "
        "original's; \"final vs Pre-Norm\": the final perplexity (bridge 1 for GeoNorm) against continued Pre-Norm.",
        "",
        *arm_rows(small["arms"], "pre (continue)"),
        "",
    ]

def anatomy_lines(anatomy: dict[str, Any] | None) -> list[str]:
    if not anatomy:
        return ["## SmolLM2-135M: where the damage comes from", "", "Not run yet (`--parts anatomy`).", ""]
    rows = anatomy["rows"]
    shown = [r for r in rows if r["layer"] <= 3 or r["layer"] % 5 == 0]
    spread = statistics.median(r["step_q90"] / r["step_q10"] for r in rows)
    binds = statistics.fmean(r["clamp_binds"] for r in rows)
    ratio = statistics.median(r["mass_first"] / r["mass_others"] for r in rows if r["layer"] > len(rows) // 4)
    lines = [
        "## SmolLM2-135M: where the damage comes from",
        "",
        f"{anatomy['gguf']} de-quantised, read as Pre-Norm over {anatomy['calibration_tokens']} tokens of "
        f"{anatomy['text']} (blocks of {SMOL_SEQ}). Per update: the mass s = |h|/sqrt(d) of each block's first "
        "token and the median of the others, their median angles, and the calibrated step size a = "
        "θ_pre |h_0| / |t| (median over the other tokens, with its 10%/90% quantiles). "
        f"Over all {len(rows)} updates the default clamp (pi/4 on |t|/|h_0|) binds for {binds:.0%} of the tokens; "
        f"the step a token needs varies by a median factor of {spread:.2f} between the 10% and 90% quantiles; "
        f"beyond the first quarter of the layers the first token's mass is a median {ratio:.0f}x the others'.",
        "",
        "| layer | update | mass, first token | mass, others | angle, first | angle, others | step a | a 10% | a 90% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['layer']} | {r['sublayer']} | {r['mass_first']:.3g} | {r['mass_others']:.3g} | "
              f"{r['angle_first']:.3g} | {r['angle_others']:.3g} | {r['step']:.3g} | {r['step_q10']:.3g} | "
              f"{r['step_q90']:.3g} |" for r in shown]  # fmt: skip
    return [*lines, "", f"(Layers 1-3 and every fifth layer shown; all {len(rows)} updates are in the JSON.)", ""]

def static_lines(static: dict[str, Any] | None) -> list[str]:
    if not static:
        return ["## SmolLM2-135M converted, no training", "", "Not run yet (`--parts static`).", ""]
    lines = [
        "## SmolLM2-135M converted, no training",
        "",
        f"Perplexity on {static['eval_tokens']} held-out tokens: original {static['original']:.3f}, bridge 0 "
        f"{static['bridge0']:.3f} (asserted equal). Calibrated on {static['calibration_tokens']} other tokens.",
        "",
        "| starting point (bridge 1) | perplexity | / original |",
        "|---|---|---|",
    ]
    lines += [f"| {k} | {v:.4g} | {v / static['original']:.3g}x |" for k, v in static["at_bridge1"].items()]
    lines += ["", "Along the bridge (no training):", "",
              "| bridge | " + " | ".join(str(b) for b in static["recipe_path"]) + " |",
              "|---|" + "---|" * len(static["recipe_path"]),
              "| default settings | " + " | ".join(f"{v:.4g}" for v in static["default_path"].values()) + " |",
              "| recipe | " + " | ".join(f"{v:.4g}" for v in static["recipe_path"].values()) + " |", ""]  # fmt: skip
    return lines

def uptrain_lines(up: dict[str, Any] | None) -> list[str]:
    if not up or not up.get("budgets"):
        return ["## SmolLM2-135M uptrained", "", "Not run yet (`--parts uptrain`).", ""]
    lines = [
        "## SmolLM2-135M uptrained",
        "",
        f"Original perplexity {up['original']:.3f} on the held-out tokens. Each budget: steps of {up['batch']} x "
        f"{SMOL_SEQ} tokens of other fortunes, AdamW with warm-up and cosine decay, the same batches for both arms; "
        "the recipe anneals the bridge 0 -> 1 over the first half of the steps, then trains pure GeoNorm.",
        "",
    ]
    return [*lines, *budget_lines(up["budgets"], "recipe: calibrated, bridge anneal", "recipe")]

def layerwise_lines(lw: dict[str, Any] | None) -> list[str]:
    from hf_geonorm.training.bridge import MIN_COST

    title = "## SmolLM2-135M under the layer-wise recipe"
    if not lw:
        return [title, "", "Not run yet (`--parts layerwise`).", ""]
    original = lw["original"]
    lines = [
        title,
        "",
        f"Converted with calibrated steps and frames, only the final angle clamped at pi/2, the first token on the "
        f"Pre-Norm update; bridge 0 gives {lw['bridge0']:.3f} (original {original:.3f}, asserted equal). The "
        "last-first anneal converts one update at a time from the last, each over a share of the anneal in "
        f"proportion to its bridge cost (measured on {COST_BLOCKS} x {SMOL_SEQ} calibration tokens, at least "
        f"{MIN_COST}): the feed-forward updates of layers 1-3 cost "
        f"{', '.join(f'{c:.3f}' for c in lw['costs'][1:6:2])} nats, the "
        f"largest other {max(lw['costs'][0:6:2] + lw['costs'][6:]):.3f}, median {statistics.median(lw['costs']):.3f};"
        f" the first three layers take {sum(lw['weights'][:6]) / sum(lw['weights']):.0%} of the anneal. With no "
        "training, along the anneal:",
        "",
        "| share of the anneal done | " + " | ".join(lw["path"]) + " |",
        "|---|" + "---|" * len(lw["path"]),
        "| perplexity | " + " | ".join(f"{v:.4g}" for v in lw["path"].values()) + " |",
        "| / original | " + " | ".join(f"{v / original:.3g}x" for v in lw["path"].values()) + " |",
        "",
        f"Uptrained: steps of {lw['batch']} x {SMOL_SEQ} tokens, the anneal over the first three quarters of the "
        "steps, then pure GeoNorm; continued Pre-Norm on the same batches (from the uptrain part where it ran the "
        "same steps).",
        "",
    ]
    return [*lines, *budget_lines(lw["budgets"], LAYERWISE, "layer-wise")]

def budget_lines(budgets: dict[str, Any], arm: str, name: str) -> list[str]:
    """Each budget's arm table, then the trend of ``arm`` against continued Pre-Norm over the budgets."""
    lines, trend = [], []
    for steps, budget in sorted(budgets.items(), key=lambda kv: int(kv[0])):
        arms = budget["arms"]
        lines += [f"### {steps} steps ({budget['tokens'] / 1e6:.2f}M tokens, lr {budget['lr']})", "",
                  *arm_rows(arms, "pre (continue)"), ""]  # fmt: skip
        pre, geo, worst = arms["pre (continue)"]["final"], arms[arm]["final"], arms[arm]["worst_ratio"]
        trend.append(f"| {steps} | {budget['tokens'] / 1e6:.2f}M | {pre:.3f} | {geo:.3f} | {geo / pre - 1:+.1%} | "
                     f"{worst:.2f}x |")  # fmt: skip
    return [*lines, "Trend over budgets:", "", f"| steps | tokens | Pre-Norm | {name} at bridge 1 | gap | worst / "
            "original on the path |", "|---|---|---|---|---|---|", *trend, ""]  # fmt: skip
