"""One real training step of the larger presets through ``hf-geonorm train`` (``run_training``): that they build,
step and save on this machine, their parameter count and their peak memory.

Each (architecture, preset) runs in a fresh Python process (so that its peak memory is its own): ``train --arch
ARCH --preset PRESET --max-steps 1 --batch-size 1 --seq-len SEQ``, on one standard-library source file with a
byte-level BPE of ``--vocab`` tokens trained on it (no download), no checkpoint (``--eval-every 2``), then the
final evaluation and the final model written. Reported per run:

- ``parameters``: the model as trained (its embedding sized to the tokenizer, padded to 64, tied to the head);
  ``parameters_50304``: the same sizes with GPT-2's padded vocabulary (``hf-geonorm init``'s default), counted on
  the meta device;
- ``step_seconds``: the step alone (forward, backward, clipping and AdamW: ``training_step`` and the optimizer's
  ``step``, timed); ``run_seconds``: all of ``trainer.train()`` (metrics.json's ``train_seconds``), which also
  evaluates and writes a checkpoint at the last step;
- ``peak_memory_gib``: CPU: the process's peak resident memory (``ru_maxrss``: Python, torch, the data, the
  model, its gradients and AdamW state, the evaluation and the save); CUDA: ``torch.cuda.max_memory_allocated``.

Writes ``presets_step.json`` and ``.md`` to ``--out`` (default benchmarks/results); everything in them is measured
by this script.

    python benchmarks/presets_step.py                  # gpt2 and llama at 125m and 350m, a few minutes on CPU
    python benchmarks/presets_step.py --presets 125m   # one preset
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reports  # noqa: E402 - benchmarks/reports.py

DATA = Path(sysconfig.get_paths()["stdlib"]) / "typing.py"


def one_step(arch: str, preset: str, seq_len: int, vocab: int) -> dict[str, Any]:
    """Train ``arch`` at ``preset`` for one step in this process; what ``presets_step.md`` reports of it."""
    from hf_geonorm.conversion.inspection import parameter_count
    from hf_geonorm.training.options import TrainOptions
    from hf_geonorm.training.presets import DEFAULT_VOCAB
    from hf_geonorm.training.run import trainer as trainer_module
    from hf_geonorm.training.run.model import scratch_config
    from hf_geonorm.training.run.trainer import run_training

    step_seconds: list[float] = []

    class TimedTrainer(trainer_module.CheckedTrainer):
        """The run's Trainer, timing each optimizer step (forward, backward, clipping, AdamW) alone."""

        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            start = time.perf_counter()
            loss = super().training_step(*args, **kwargs)
            step_seconds.append(time.perf_counter() - start)
            return loss

        def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
            optimizer = super().create_optimizer(model)
            step = optimizer.step

            def timed(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                result = step(*args, **kwargs)
                step_seconds.append(time.perf_counter() - start)
                return result

            optimizer.step = timed
            return optimizer

    trainer_module.CheckedTrainer = TimedTrainer
    with tempfile.TemporaryDirectory() as tmp:
        options = TrainOptions(arch=arch, preset=preset, data=str(DATA), vocab_size=vocab, seq_len=seq_len,
                               batch_size=1, max_steps=1, eval_every=2, warmup_steps=0,
                               output=f"{tmp}/run")  # fmt: skip
        metrics = run_training(options, log=lambda line: None)
        config = json.loads(Path(f"{tmp}/run/final/config.json").read_text())
    cuda = torch.cuda.is_available()
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "arch": arch,
        "preset": preset,
        "layers": config.get("num_hidden_layers", config.get("n_layer")),
        "width": config.get("hidden_size", config.get("n_embd")),
        "vocab_rows": config["vocab_size"],
        "parameters": metrics["parameters"],
        "parameters_50304": parameter_count(scratch_config(arch, preset, DEFAULT_VOCAB, seq_len, {})),
        "step_seconds": sum(step_seconds),  # forward, backward and AdamW of the one step
        "run_seconds": metrics["train_seconds"],  # trainer.train(): the step, the evaluation at the end, a checkpoint
        "final_eval_loss": metrics["final_eval_loss"],
        "device": "cuda" if cuda else "cpu",
        "peak_memory_gib": peak / 2**30,
        "peak_memory_kind": "torch.cuda.max_memory_allocated" if cuda else "process peak resident memory",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", nargs="+", default=["gpt2", "llama"])
    parser.add_argument("--presets", nargs="+", default=["125m", "350m"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--one", nargs=2, metavar=("ARCH", "PRESET"), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_step(*args.one, args.seq_len, args.vocab)))
        return
    start, runs = time.perf_counter(), []
    for arch in args.archs:
        for preset in args.presets:
            child = [sys.executable, __file__, "--one", arch, preset, "--seq-len", str(args.seq_len), "--vocab",
                     str(args.vocab)]  # fmt: skip
            done = subprocess.run(child, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                sys.exit(f"{arch} {preset} failed:\n{done.stderr[-3000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(runs[-1], flush=True)
    lines = [
        "# One training step of the larger presets (`benchmarks/presets_step.py`)",
        "",
        f"`hf-geonorm train --arch ARCH --preset PRESET --max-steps 1 --batch-size 1 --seq-len {args.seq_len}` on "
        f"{DATA.name} (a {args.vocab}-token BPE trained on it), each in its own process; then the final evaluation "
        "and the final model written. Parameters: as trained (embedding sized to the tokenizer, tied); with "
        "GPT-2's 50304-row vocabulary (`hf-geonorm init`'s default) in the next column.",
        "",
        "| arch | preset | layers | width | parameters | at 50304 rows | step (s) | train() (s) | peak memory (GiB) "
        "| loss |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['arch']} | {r['preset']} | {r['layers']} | {r['width']} | {r['parameters'] / 1e6:.1f}M | "
            f"{r['parameters_50304'] / 1e6:.1f}M | {r['step_seconds']:.1f} | {r['run_seconds']:.1f} | "
            f"{r['peak_memory_gib']:.2f} | "
            f"{reports.fmt(r['final_eval_loss'], 3)} |"
        )
    kind = runs[0]["peak_memory_kind"] if runs else ""
    lines += ["", f"Peak memory: {kind} ({runs[0]['device'] if runs else ''}).", ""]
    reports.write_results(args, "presets_step", lines, reports.environment(), time.perf_counter() - start, runs=runs)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
