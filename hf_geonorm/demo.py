"""A two-minute demonstration on CPU with no download: ``python -m hf_geonorm.demo``.

It builds a tiny GPT-2 on the bytes of the Python standard library's own source, shows that GeoNorm with
``geo_bridge=0`` reproduces the Pre-Norm model exactly, then trains Pre-Norm and GeoNorm side by side on the
same batches and prints their validation losses.
"""

from __future__ import annotations

import argparse
import math
import sysconfig
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from .geometry import step_sizes
from .patching import convert


def stdlib_bytes(limit: int = 2_000_000) -> torch.Tensor:
    """The first ``limit`` bytes of the standard library's .py files, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    return torch.tensor(list(b"".join(chunks)[:limit]), dtype=torch.long)


def batches(data: torch.Tensor, seq_len: int, batch_size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=g)
        yield torch.stack([data[s : s + seq_len] for s in starts])


@torch.no_grad()
def validation_loss(model, data: torch.Tensor, seq_len: int) -> float:
    model.eval()
    windows = data[: (len(data) // seq_len) * seq_len].view(-1, seq_len)[:32]
    loss = model(windows, labels=windows).loss.item()
    model.train()
    return loss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    data = stdlib_bytes()
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    seq_len, batch_size = 64, 16
    config = GPT2Config(vocab_size=256, n_positions=seq_len, n_embd=128, n_layer=4, n_head=4, bos_token_id=0,
                        eos_token_id=0)  # fmt: skip
    prenorm = GPT2LMHeadModel(config).eval()
    print(f"data: {len(data):,} bytes of the standard library's source; model: GPT-2, 4 layers, width 128")

    ids = val[: 4 * seq_len].view(4, seq_len)
    with torch.no_grad():
        bridged = convert(prenorm, norm_style="geo", geo_bridge=0.0)
        diff = (bridged(ids).logits - prenorm(ids).logits).abs().max().item()
    print(f"GeoNorm with geo_bridge=0 vs the Pre-Norm model: max |logit difference| = {diff:.2e}")
    print("GeoNorm step sizes a_k (harmonic, a=1):", ", ".join(f"{a:.3f}" for a in step_sizes("harmonic", 1.0, 4)))

    runs = {"pre-norm": convert(prenorm, norm_style="pre"), "geonorm": convert(prenorm, norm_style="geo")}
    for name, model in runs.items():
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
        stream = batches(train, seq_len, batch_size, seed=args.seed)
        start = time.perf_counter()
        for step in range(1, args.steps + 1):
            lr = 2e-3 * min(1.0, step / 20) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
            for group in optimizer.param_groups:
                group["lr"] = lr
            x = next(stream)
            loss = model(x, labels=x).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 50 == 0 or step == args.steps:
                val_loss = validation_loss(model, val, seq_len)
                print(f"  {name:9s} step {step:4d}  train {loss.item():.3f}  val {val_loss:.3f}")
        print(f"  {name:9s} {time.perf_counter() - start:.1f}s")
    final = {name: validation_loss(model, val, seq_len) for name, model in runs.items()}
    print("final validation loss: " + ", ".join(f"{k} {v:.3f}" for k, v in final.items()))


if __name__ == "__main__":
    main()
