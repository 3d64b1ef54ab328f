"""The running of benchmarks/convert_uptrain.py: the arms (the converted starting points and their anneals), the
uptraining of every arm on the same batches, and each part (small, anatomy, static, uptrain, layerwise); the
tables (``convert_uptrain_tables.py``) and the figure (``convert_uptrain_plots.py``) read what they return."""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path
from typing import Any

import corpus_data
import run_loop
import studies
import torch

LAYERWISE = "layer-wise recipe: frames, final clamp pi/2, last-first anneal"
GROWTH = "the same, shares by growth (first version)"
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
