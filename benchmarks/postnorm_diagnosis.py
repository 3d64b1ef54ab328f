"""Why Post-Norm and DeepNorm learned little beyond the unigram on GPT-2: the candidate causes, one at a time.

In the study's phase h (``sweep_study.py``, ``h_styles``) Post-Norm and DeepNorm on GPT-2 4 x 128 ended at 6.08-6.23
at every rate, where the unigram cross-entropy of the test blocks is 6.225; on LLaMA they trained (an earlier
ablation, ``results/history/ablation.md``). This script trains runs through ``hf-geonorm train``'s library function
(``run_training``) and changes one thing at a time against one baseline, the styles as phase h ran them (learned
positions drawn at random, DeepNorm's former init):

- (a) what the first block reads: the embeddings normalised to RMS 1 per token (a token-independent part could
  outweigh GPT-2's small embeddings); every bias of the model held at zero (Adam moves biases fast);
- (b) the warm-up: 30% of the run instead of the study's 10%;
- (c) DeepNorm's init: DeepNet's Xavier normal (the library's init now) instead of beta times GPT-2's N(0, 0.02);
- (d) GPT-2's learned position table started at zero instead of N(0, 0.02) (``post_zero_positions``, the library's
  default now for post and deepnorm);
- combinations of (b), (c) and (d), and controls: LLaMA (no position table), GPT-2 Pre-Norm with and without the
  random table.

What the library no longer computes, or never did, is put back inside this process only, per cell: DeepNorm's former
init (``legacy_deepnorm_init``), the normalised embeddings, the biases held at zero and Pre-Norm's position table at
zero (``cell_parts``). The rest is the library's, at its settings.

Two shapes. ``small`` (every cell, at rates 1e-3 and 2e-3): GPT-2 and LLaMA 4 layers x width 64 (2 heads), 200 steps
of 8 x 128 tokens, a tokenizer of 512 tokens, 32 validation and 32 test blocks: shrunk from the study's run so that
the diagnosis fits about 75 minutes on 2 CPU cores shared with other work (one training process, under ``nice``).
``study`` (the baselines, the fixes and their combinations, at 5e-4, 1e-3 and 2e-3): the study's model and run, GPT-2
4 x 128, 300 steps of 16 x 128 tokens, a tokenizer of 2048 tokens, 64 evaluation blocks. Both: warm-up a tenth of
the run unless a cell says, weight decay 0.1, seed 0, the Python standard library's source (``train``'s default
corpus; the study corpus of ``study_corpus.py`` is 100 MB to tokenize here).

The script computes the unigram cross-entropy of the test blocks itself (the training split's token frequencies,
add-one smoothed): the level of a model that ignores the context. From each final model, on 8 validation blocks, it
measures the state after the first block: the share of its variance that position alone explains (the part that is
the same for every token at a position) and how much all tokens share (|mean over tokens| / mean |state|; 1: every
token in the same state).

Each finished run is one line of ``benchmarks/results/postnorm_diagnosis.jsonl`` (a run already there is skipped:
run it again to resume), committed to git every ``--commit-every`` runs; the table is
``benchmarks/results/postnorm_diagnosis.md``.

    nice -n 10 python benchmarks/postnorm_diagnosis.py [--shapes small,study] [--commit-every 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hf_geonorm.modeling import blocks, model_mixins, residual
from hf_geonorm.modeling.fresh_init import deepnet_beta, zero_positions_
from hf_geonorm.modeling.geometry import entry_rescale
from hf_geonorm.modeling.layouts import DEEPNORM_SCALED
from hf_geonorm.training.data.prepare import data_request, data_source, training_data
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.run.trainer import run_training

RESULTS = Path(__file__).parent / "results"
JOURNAL, TABLE = RESULTS / "postnorm_diagnosis.jsonl", RESULTS / "postnorm_diagnosis.md"
PROBE_BLOCKS = 8  # validation blocks the final model's first-block state is measured on


@dataclass(frozen=True)
class Shape:
    """A model size and run: layers x width (heads of 32), steps of batch x seq_len tokens, the tokenizer's size
    (None: ``train``'s default, 2048), the evaluation blocks, and the rates every cell runs at."""

    name: str
    layers: int
    width: int
    steps: int
    batch: int
    vocab: int | None
    eval_blocks: int
    rates: tuple[float, ...]
    seq_len: int = 128

    @property
    def warmup(self) -> int:
        return self.steps // 10

    def describe(self) -> str:
        vocab = self.vocab or 2048
        return (f"{self.layers} layers x width {self.width}, {self.steps} steps of {self.batch} x {self.seq_len} "
                f"tokens, a tokenizer of {vocab} tokens, {self.eval_blocks} validation and test blocks")  # fmt: skip


SHAPES = {
    "small": Shape("small", 4, 64, 200, 8, 512, 32, (1e-3, 2e-3)),
    "study": Shape("study", 4, 128, 300, 16, None, 64, (5e-4, 1e-3, 2e-3)),
}


@dataclass(frozen=True)
class Cell:
    """One arm: ``arch`` at ``style`` with GeoNorm ``settings``; the warm-up as a share of the run; the parts put in
    for this cell only: DeepNorm's former init, the embeddings normalised to RMS 1, every bias held at zero, the
    position table zeroed whatever the style (for Pre-Norm, which the library leaves stock); and the shapes it runs
    at."""

    name: str
    arch: str
    style: str
    what: str
    settings: dict[str, Any] = field(default_factory=dict)
    warmup_share: float = 0.1
    legacy_init: bool = False
    normalised_embeddings: bool = False
    no_biases: bool = False
    zero_positions: bool = False
    shapes: tuple[str, ...] = ("small",)


RANDOM = {"post_zero_positions": False}  # the position table as phase h drew it
BASELINE = "baseline (as in phase h)"
BOTH, LONG = ("small", "study"), 0.3
CELLS = (
    Cell("gpt2 post", "gpt2", "post", BASELINE, RANDOM, shapes=BOTH),
    Cell("gpt2 deepnorm", "gpt2", "deepnorm", BASELINE, RANDOM, legacy_init=True, shapes=BOTH),
    Cell("gpt2 post, embeddings at RMS 1", "gpt2", "post", "(a) the first block reads normalised embeddings", RANDOM,
         normalised_embeddings=True),
    Cell("gpt2 post, no biases", "gpt2", "post", "(a) every bias held at zero", RANDOM, no_biases=True),
    Cell("gpt2 post, warm-up 30%", "gpt2", "post", "(b) warm-up 30% of the run", RANDOM, warmup_share=LONG,
         shapes=BOTH),
    Cell("gpt2 deepnorm, warm-up 30%", "gpt2", "deepnorm", "(b) warm-up 30% of the run", RANDOM, warmup_share=LONG,
         legacy_init=True),
    Cell("gpt2 deepnorm, Xavier init", "gpt2", "deepnorm", "(c) DeepNet's Xavier init", RANDOM),
    Cell("gpt2 post, positions from zero", "gpt2", "post", "(d) position table starts at zero (the library now)",
         shapes=BOTH),
    Cell("gpt2 deepnorm, positions from zero", "gpt2", "deepnorm", "(d) position table starts at zero",
         legacy_init=True),
    Cell("gpt2 deepnorm, Xavier + positions from zero", "gpt2", "deepnorm", "(c) + (d): the library now",
         shapes=BOTH),
    Cell("gpt2 post, positions from zero, warm-up 30%", "gpt2", "post", "(d) + (b)", warmup_share=LONG, shapes=BOTH),
    Cell("gpt2 deepnorm, Xavier + positions from zero, warm-up 30%", "gpt2", "deepnorm", "(c) + (d) + (b)",
         warmup_share=LONG, shapes=BOTH),
    Cell("llama post", "llama", "post", "control: no position table"),
    Cell("llama deepnorm", "llama", "deepnorm", "control: no position table", legacy_init=True),
    Cell("gpt2 pre", "gpt2", "pre", "reference: Pre-Norm (the stock model)", shapes=BOTH),
    Cell("gpt2 pre, positions from zero", "gpt2", "pre", "reference: Pre-Norm, position table at zero (by hand)",
         zero_positions=True),
)  # fmt: skip


def legacy_deepnorm_init(layer: torch.nn.Module, layout: Any, num_layers: int, config: Any) -> None:
    """DeepNorm's init before DeepNet's Xavier init: the stock init's feed-forward, value and output projections
    multiplied by beta."""
    beta = deepnet_beta(num_layers)
    with torch.no_grad():
        for name, param in getattr(layer, layout.mlp).named_parameters():
            if name.endswith("weight") and param.dim() >= 2:
                param.mul_(beta)
        attn = getattr(layer, layout.attn)
        for name, param in attn.named_parameters():
            if DEEPNORM_SCALED.search(name):
                param.mul_(beta)
        if layout.fused_values is not None:
            layout.fused_values(attn, config).mul_(beta)


def normalised_entry(self: residual.GeoNormResidual, x: torch.Tensor) -> torch.Tensor:
    """The first block reads each token's state at RMS 1 (norm sqrt(d))."""
    return entry_rescale(x, "sqrt_d") if self.layer_index == 0 else x


@contextlib.contextmanager
def cell_parts(cell: Cell) -> Iterator[None]:
    """Put in, for the runs of ``cell`` only, the parts the library does not compute (``Cell``)."""
    init, enter, patch = blocks.deepnet_init_, residual.GeoNormResidual.enter, model_mixins.patch_base_model

    def patch_and_change(base_model: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        patch(base_model, *args, **kwargs)
        if cell.zero_positions:
            zero_positions_(base_model)
        if cell.no_biases:
            with torch.no_grad():
                for name, param in base_model.named_parameters():
                    if name.endswith("bias"):
                        param.zero_()
                        param.requires_grad_(False)  # Trainer's optimizer takes only trainable parameters

    try:
        if cell.legacy_init:
            blocks.deepnet_init_ = legacy_deepnorm_init
        if cell.normalised_embeddings:
            residual.GeoNormResidual.enter = normalised_entry
        if cell.no_biases or cell.zero_positions:
            model_mixins.patch_base_model = patch_and_change
        yield
    finally:
        blocks.deepnet_init_, residual.GeoNormResidual.enter, model_mixins.patch_base_model = init, enter, patch


def options(shape: Shape, cell: Cell, lr: float, output: str, data: str | None, cache: str | None) -> TrainOptions:
    sizes = {"num_hidden_layers": shape.layers, "hidden_size": shape.width, "num_attention_heads": shape.width // 32,
             "max_position_embeddings": shape.seq_len}  # fmt: skip
    extra = {"data_cache": cache} if cache else {}
    return TrainOptions(arch=cell.arch, preset=sizes, settings={"norm_style": cell.style, **cell.settings}, data=data,
                        vocab_size=shape.vocab, max_steps=shape.steps, lr=lr, weight_decay=0.1, seed=0,
                        warmup_steps=round(shape.steps * cell.warmup_share), batch_size=shape.batch,
                        seq_len=shape.seq_len, eval_every=shape.steps, eval_blocks=shape.eval_blocks,
                        logging_steps=50, output=output, **extra)  # fmt: skip


def evaluation_data(shape: Shape, data: str | None, cache: str | None) -> tuple[dict[str, float], torch.Tensor]:
    """The unigram reference of ``shape``'s data, and its first validation blocks (to probe the final models).

    The reference is the cross-entropy of the test targets (every token of a block but its first, as the model is
    scored) under the training split's token frequencies, add-one smoothed: what a model that ignores the context
    reaches; beside it the entropy of the test blocks' own frequencies, the least such a model could reach."""
    request = data_request(options(shape, CELLS[0], shape.rates[0], "unused", data, cache))
    source = data_source(request, lambda line: None)
    split = training_data(source, request, lambda line: None)
    vocab = len(source.tokenizer)

    def counts(blocks_: Any) -> torch.Tensor:
        ids = torch.stack([blocks_[i]["input_ids"] for i in range(len(blocks_))])
        return torch.bincount(ids[:, 1:].reshape(-1), minlength=vocab).double()

    train, test = counts(split.train) + 1.0, counts(split.test)
    own = test[test > 0] / test.sum()
    reference = {"unigram_cross_entropy": float(-(test * (train / train.sum()).log()).sum() / test.sum()),
                 "unigram_entropy": float(-(own * own.log()).sum())}  # fmt: skip
    return reference, torch.stack([split.val[i]["input_ids"] for i in range(PROBE_BLOCKS)])


@torch.no_grad()
def first_block_state(model_folder: Path, probe: torch.Tensor) -> dict[str, float]:
    """Of the state after the first block on ``probe``: the share of its variance that position alone explains
    (the variance of its mean over the blocks at each position), and |mean over tokens| / mean |state|."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_folder).eval()
    state = model(input_ids=probe, output_hidden_states=True).hidden_states[1].double()
    flat = state.reshape(-1, state.shape[-1])
    centred = flat - flat.mean(dim=0)
    by_position = state.mean(dim=0) - flat.mean(dim=0)
    return {"position_share": float(by_position.pow(2).sum() * state.shape[0] / centred.pow(2).sum()),
            "shared": float(flat.mean(dim=0).norm() / flat.norm(dim=-1).mean())}  # fmt: skip


def run_name(shape: Shape, cell: Cell, lr: float) -> str:
    return f"{shape.name}: {cell.name} lr{lr:g}"


def read_journal() -> dict[str, dict[str, Any]]:
    if not JOURNAL.is_file():
        return {}
    lines = [json.loads(line) for line in JOURNAL.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {entry["run"]: entry for entry in lines if "run" in entry}


def commit(message: str) -> None:
    """Commit the journal and the table alone (other staged or changed files are left as they are)."""
    paths = [str(p) for p in (JOURNAL, TABLE) if p.is_file()]
    done = subprocess.run(["git", "add", "--", *paths], capture_output=True, text=True, cwd=RESULTS)
    if done.returncode == 0:
        done = subprocess.run(["git", "commit", "-q", "-m", message, "--", *paths], capture_output=True, text=True,
                              cwd=RESULTS)  # fmt: skip
    if done.returncode != 0:
        print(f"(the journal is not committed: {done.stderr.strip() or done.stdout.strip()})", flush=True)


def train_one(shape: Shape, cell: Cell, lr: float, data: str | None, cache: str | None,
              probe: torch.Tensor) -> dict[str, Any]:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="postnorm-diagnosis-") as work, cell_parts(cell):
        output = Path(work) / "run"
        start = time.perf_counter()
        metrics = run_training(options(shape, cell, lr, str(output), data, cache), log=lambda line: None)
        seconds = time.perf_counter() - start
        state = first_block_state(output / "final", probe)
    commit_id = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=RESULTS)
    return {"run": run_name(shape, cell, lr), "shape": shape.name, "cell": cell.name, "arch": cell.arch,
            "style": cell.style, "lr": lr, "what": cell.what, "settings": cell.settings,
            "warmup_steps": round(shape.steps * cell.warmup_share), "legacy_init": cell.legacy_init,
            "normalised_embeddings": cell.normalised_embeddings, "no_biases": cell.no_biases,
            "zero_positions_by_hand": cell.zero_positions,
            "val_loss": metrics["final_eval_loss"], "test_loss": metrics["final_test_loss"], **state,
            "seconds": round(seconds, 1), "commit": commit_id.stdout.strip()}  # fmt: skip


def shape_table(shape: Shape, runs: dict[str, dict[str, Any]], reference: dict[str, float]) -> list[str]:
    unigram = reference["unigram_cross_entropy"]
    lines = [
        f"## {shape.name}: {shape.describe()}",
        "",
        f"Unigram reference (computed by the script): the test blocks' cross-entropy under the training split's token "
        f"frequencies is **{unigram:.3f}** (the entropy of their own frequencies {reference['unigram_entropy']:.3f}).",
        "",
        "| cell | what changes | " + " | ".join(f"test loss at {lr:g}" for lr in shape.rates)
        + " | best - unigram | position share after block 1 | shared after block 1 |",
        "|---|---|" + "---:|" * len(shape.rates) + "---:|---:|---:|",
    ]  # fmt: skip
    for cell in CELLS:
        done = [runs.get(run_name(shape, cell, lr)) for lr in shape.rates]
        if shape.name not in cell.shapes or not any(done):
            continue
        losses = ["" if r is None else f"{r['test_loss']:.3f}" for r in done]
        best = min((r for r in done if r is not None), key=lambda r: r["test_loss"])
        lines.append(f"| {cell.name} | {cell.what} | " + " | ".join(losses) + f" | {best['test_loss'] - unigram:+.3f} "
                     f"| {best['position_share']:.2f} | {best['shared']:.2f} |")  # fmt: skip
    return lines + [""]


def table(runs: dict[str, dict[str, Any]], references: dict[str, dict[str, float]]) -> str:
    lines = [
        "# Post-Norm and DeepNorm on GPT-2: the causes of the collapse, one at a time",
        "",
        "Written by `benchmarks/postnorm_diagnosis.py` (its docstring has the protocol): `hf-geonorm train`'s library "
        "function, the Python standard library's source, weight decay 0.1, warm-up a tenth of the run unless the "
        "cell says, seed 0, one process on 2 CPU cores shared with other work. The baseline is each style as the "
        "study's phase h trained it (GPT-2's position table drawn at random, DeepNorm's former init).",
        "",
    ]  # fmt: skip
    for name, reference in references.items():
        lines += shape_table(SHAPES[name], runs, reference)
    lines += [
        "The last two columns are measured on the final model (at the best rate) on 8 validation blocks: the share "
        "of the variance of the state after the first block that position alone explains (its mean over the blocks "
        "at each position), and |mean over all tokens| / mean |state| (1: every token leaves the first block in the "
        "same state). Validation losses are in the journal, `postnorm_diagnosis.jsonl` (one line per run).",
        "",
    ]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="small,study", help="the shapes to train, a comma list of small, study "
                        "(the table shows every shape's journaled runs)")
    parser.add_argument("--data", default=None, help="the corpus (default: the standard library's source)")
    parser.add_argument("--data-cache", default=None)
    parser.add_argument("--commit-every", type=int, default=4, help="commit the journal every N runs (0: never)")
    args = parser.parse_args()
    runs, trained, references, probes = read_journal(), 0, {}, {}
    for shape in SHAPES.values():  # every shape's table, also of the shapes not trained this time
        references[shape.name], probes[shape.name] = evaluation_data(shape, args.data, args.data_cache)
        print(f"{shape.name}: unigram reference {references[shape.name]}", flush=True)
    for shape in (SHAPES[name] for name in args.shapes.split(",")):
        probe = probes[shape.name]
        for cell in (c for c in CELLS if shape.name in c.shapes):
            for lr in shape.rates:
                if run_name(shape, cell, lr) in runs:
                    continue
                entry = train_one(shape, cell, lr, args.data, args.data_cache, probe)
                with JOURNAL.open("a", encoding="utf-8") as journal:
                    journal.write(json.dumps(entry) + "\n")
                runs[entry["run"]], trained = entry, trained + 1
                print(f"{entry['run']}: test {entry['test_loss']:.3f}, position share {entry['position_share']:.2f}, "
                      f"{entry['seconds']:.0f} s", flush=True)  # fmt: skip
                TABLE.write_text(table(runs, references), encoding="utf-8")
                if args.commit_every and trained % args.commit_every == 0:
                    commit(f"postnorm_diagnosis: {len(runs)} runs journaled")
    TABLE.write_text(table(runs, references), encoding="utf-8")
    if args.commit_every:
        commit(f"postnorm_diagnosis: {len(runs)} runs journaled, the table written")


if __name__ == "__main__":
    main()
