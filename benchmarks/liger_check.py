"""Liger-Kernel on against off on a GeoNorm LLaMA, one training step on a CUDA device (run by gpu_check.sh).

Liger's kernels run on GPUs only, so tests/training/test_liger.py checks on CPU which modules Liger swaps; this checks
the numbers: for each norm style and dtype, two copies of a tiny GeoNorm LLaMA (same weights, same batch), the second
patched by ``_apply_liger_kernel_to_instance`` as Trainer's ``use_liger_kernel=True`` patches it (RMSNorm, SwiGLU,
RoPE, fused linear cross-entropy), and compares the loss, every gradient, and the loss after one SGD step taken with
those gradients. A difference is relative: to the loss, or to the largest gradient entry of the same tensor. The
reference copies run before Liger is imported, as Liger's patches also replace attributes of transformers' modules.

Usage: python benchmarks/liger_check.py --out OUT_DIR   (writes OUT_DIR/liger_check.json; exit 1 beyond
tolerance, 2 without CUDA or liger-kernel)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

import hf_geonorm

STYLES = ("geo", "pre", "post")
# relative tolerance by dtype: float32 leaves only the order of summation; bfloat16 rounds each kernel's output
TOLERANCES = {"float32": 1e-4, "bfloat16": 5e-2}
LEARNING_RATE = 1e-2
SIZES = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
BATCH, LENGTH = 4, 128


def tiny_geonorm_llama(style: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """The same tiny GeoNorm LLaMA at every call with these arguments (seeded init on CPU, then moved)."""
    torch.manual_seed(0)
    config = hf_geonorm.GeoNormLlamaConfig(norm_style=style, **SIZES)
    return hf_geonorm.GeoNormLlamaForCausalLM(config).to(device=device, dtype=dtype).train()


def one_step(model: torch.nn.Module, batch: torch.Tensor) -> dict:
    """Loss, gradients (by parameter name) and the loss after one SGD step with them."""
    named = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
    loss = model(input_ids=batch, labels=batch).loss
    grads = torch.autograd.grad(loss, [param for _, param in named])
    with torch.no_grad():
        for (_, param), grad in zip(named, grads, strict=True):
            param.sub_(LEARNING_RATE * grad)
        after = model(input_ids=batch, labels=batch).loss
    return {"loss": loss.item(), "grads": {name: g.float() for (name, _), g in zip(named, grads, strict=True)},
            "loss_after": after.item()}  # fmt: skip


def compare(reference: dict, patched: dict) -> dict:
    """The relative differences of loss, gradients (the worst tensor) and the loss after the step."""
    worst, worst_name = 0.0, None
    for name, grad in reference["grads"].items():
        scale = grad.abs().max().item() or 1.0
        difference = (patched["grads"][name] - grad).abs().max().item() / scale
        if difference > worst:
            worst, worst_name = difference, name
    return {
        "loss": reference["loss"],
        "loss_difference": abs(patched["loss"] - reference["loss"]) / abs(reference["loss"]),
        "grad_difference": worst,
        "worst_grad": worst_name,
        "loss_after_difference": abs(patched["loss_after"] - reference["loss_after"]) / abs(reference["loss_after"]),
    }


def liger_swapped(model: torch.nn.Module) -> int:
    """How many modules of ``model`` Liger replaced (its printed class names) or gave their own forward."""
    return sum(module._get_name().startswith("Liger") or "forward" in vars(module) for module in model.modules())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("liger_check.py needs a CUDA device: Liger-Kernel's kernels run on GPUs only", file=sys.stderr)
        return 2
    if importlib.util.find_spec("liger_kernel") is None:
        print("liger_check.py needs liger-kernel: pip install -e '.[liger]'", file=sys.stderr)
        return 2
    generator = torch.Generator().manual_seed(1)
    batch = torch.randint(0, SIZES["vocab_size"], (BATCH, LENGTH), generator=generator).to("cuda")
    cases = [(style, dtype) for style in STYLES for dtype in TOLERANCES]
    models = {case: (tiny_geonorm_llama(case[0], getattr(torch, case[1]), "cuda"),
                     tiny_geonorm_llama(case[0], getattr(torch, case[1]), "cuda")) for case in cases}  # fmt: skip
    references = {case: one_step(reference, batch) for case, (reference, _) in models.items()}

    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    rows = []
    for (style, dtype), (_, patched) in models.items():
        _apply_liger_kernel_to_instance(model=patched)
        row = {
            "norm_style": style,
            "dtype": dtype,
            "tolerance": TOLERANCES[dtype],
            "liger_swapped": liger_swapped(patched),
            **compare(references[style, dtype], one_step(patched, batch)),
        }
        row["ok"] = row["liger_swapped"] > 0 and all(
            row[key] <= row["tolerance"] for key in ("loss_difference", "grad_difference", "loss_after_difference")
        )
        rows.append(row)
        print(f"{style:5} {dtype:9} swapped {row['liger_swapped']:3}  loss {row['loss']:.5f}  "
              f"d_loss {row['loss_difference']:.2e}  d_grad {row['grad_difference']:.2e} ({row['worst_grad']})  "
              f"d_loss_after {row['loss_after_difference']:.2e}  tol {row['tolerance']:.0e}  "
              f"{'ok' if row['ok'] else 'FAILED'}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    (args.out / "liger_check.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1) + "\n")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
