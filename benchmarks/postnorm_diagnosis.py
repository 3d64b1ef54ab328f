"""Why Post-Norm and DeepNorm learned nothing beyond the unigram on GPT-2: the candidate causes, one at a time.

In the study's phase h (``sweep_study.py``, ``h_styles``) Post-Norm and DeepNorm on GPT-2 4 x 128 ended at 6.08-6.23
at every rate, where the unigram cross-entropy of the test blocks is 6.225. This script trains small runs through
``hf-geonorm train``'s library function (``run_training``) and changes one thing at a time against the same
baseline, the styles as they were before ``post_embedding_norm`` and DeepNet's Xavier init existed:

- the warm-up: 30% of the run instead of the study's 10% (Post-LN is known to want a long one);
- the embeddings: normalised to RMS 1 per token before the first block (``post_embedding_norm``, as the library now
  does by default for post and deepnorm), or multiplied by sqrt(d) as the original Transformer does;
- DeepNorm's init: DeepNet's Xavier normal (gain beta on the feed-forward, value and output projections, 1 on
  queries and keys; the library's init now) instead of beta times GPT-2's N(0, 0.02);
- LLaMA at the same size as a control (no biases, RMSNorm), with and without the embedding normalisation; and GPT-2
  Pre-Norm as the reference of a model that learns.

The baselines' two parts that the library no longer computes are put back inside this process only: DeepNorm's
former init (``legacy_deepnorm_init``: beta times the stock init, the code before DeepNet's) and the sqrt(d)
scaling of the embeddings (``scaled_embeddings``). Everything else is the library's, at its settings.

Budget (2 CPU cores shared with other work, one training process under ``nice``): shrunk from the study's run (GPT-2
4 x 128, 300 steps of 16 x 128 tokens, a tokenizer of 2048 tokens) to 4 layers x width 64 (2 heads), 200 steps of
8 x 128 tokens and a tokenizer of 512 tokens, so that the whole diagnosis fits about 75 minutes; warm-up 20 steps
(the study's tenth), weight decay 0.1, seed 0, each cell at rates 1e-3 and 4e-3; the data is the Python standard
library's source (``train``'s default corpus: the study corpus of ``study_corpus.py`` is 100 MB to tokenize),
validation and test 32 blocks each. The script computes the unigram
cross-entropy of the validation and test blocks itself (training-split token frequencies, add-one smoothed) as the
level a model that ignores the context reaches; and, from each final model, how much of the state after the first
block all tokens share (``shared``: |mean over tokens| / mean |state|; 1 is every token in the same state).

Each finished run is one line of ``benchmarks/results/postnorm_diagnosis.jsonl`` (a run already there is skipped:
run it again to resume), committed to git every ``--commit-every`` runs; the table is
``benchmarks/results/postnorm_diagnosis.md``.

    nice -n 10 python benchmarks/postnorm_diagnosis.py [--rates 1e-3,4e-3] [--commit-every 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hf_geonorm.modeling import blocks, residual
from hf_geonorm.modeling.deepnet_init import deepnet_beta
from hf_geonorm.modeling.layouts import DEEPNORM_SCALED
from hf_geonorm.training.data.prepare import data_request, data_source, training_data
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.run.trainer import run_training

RESULTS = Path(__file__).parent / "results"
JOURNAL, TABLE = RESULTS / "postnorm_diagnosis.jsonl", RESULTS / "postnorm_diagnosis.md"
LAYERS, WIDTH, STEPS, WARMUP, LONG_WARMUP = 4, 64, 200, 20, 60
BATCH, SEQ_LEN, VOCAB, EVAL_BLOCKS = 8, 128, 512, 32
RATES = (1e-3, 4e-3)
SHARED_BLOCKS = 8  # validation blocks the final model's first-block state is measured on


@dataclass(frozen=True)
class Cell:
    """One arm: ``arch`` at ``style`` with GeoNorm ``settings``, ``warmup`` steps, and the two parts the library
    no longer computes, put back for this cell only (``legacy_init``, ``scale_embeddings``)."""

    name: str
    arch: str
    style: str
    what: str
    settings: dict[str, Any] = field(default_factory=dict)
    warmup: int = WARMUP
    legacy_init: bool = False
    scale_embeddings: bool = False


OFF = {"post_embedding_norm": False}
LONG = f"(b) warm-up {LONG_WARMUP} steps (30%)"
# in the order they train: the baselines and the causes first, so that a run stopped early has answered those
CELLS = (
    Cell("gpt2 post", "gpt2", "post", "baseline (as in phase h)", OFF),
    Cell("gpt2 deepnorm", "gpt2", "deepnorm", "baseline (as in phase h)", OFF, legacy_init=True),
    Cell("gpt2 post embedding norm", "gpt2", "post", "(a) embeddings to RMS 1"),
    Cell("gpt2 deepnorm embedding norm", "gpt2", "deepnorm", "(a) embeddings to RMS 1", legacy_init=True),
    Cell("gpt2 post warm-up 30%", "gpt2", "post", LONG, OFF, warmup=LONG_WARMUP),
    Cell("gpt2 deepnorm warm-up 30%", "gpt2", "deepnorm", LONG, OFF, warmup=LONG_WARMUP, legacy_init=True),
    Cell("gpt2 deepnorm xavier", "gpt2", "deepnorm", "(c) DeepNet's Xavier init", OFF),
    Cell("gpt2 deepnorm xavier + embedding norm", "gpt2", "deepnorm", "(a) + (c): the library's default now"),
    Cell("llama post", "llama", "post", "control: LLaMA, as in phase h", OFF),
    Cell("llama post embedding norm", "llama", "post", "control + (a)"),
    Cell("gpt2 post embeddings x sqrt(d)", "gpt2", "post", "(a) embeddings x sqrt(d)", OFF, scale_embeddings=True),
    Cell("llama deepnorm", "llama", "deepnorm", "control: LLaMA, as in phase h", OFF, legacy_init=True),
    Cell("gpt2 pre", "gpt2", "pre", "reference: Pre-Norm"),
)


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


@contextlib.contextmanager
def cell_parts(cell: Cell) -> Iterator[None]:
    """Put back, for the runs of ``cell`` only, what the library no longer computes."""
    init, enter = blocks.deepnet_init_, residual.GeoNormResidual.enter

    def scaled_embeddings(self: residual.GeoNormResidual, x: torch.Tensor) -> torch.Tensor:
        return x * math.sqrt(x.shape[-1])

    try:
        if cell.legacy_init:
            blocks.deepnet_init_ = legacy_deepnorm_init
        if cell.scale_embeddings:
            residual.GeoNormResidual.enter = scaled_embeddings
        yield
    finally:
        blocks.deepnet_init_, residual.GeoNormResidual.enter = init, enter


def options(cell: Cell, lr: float, output: str, data: str | None, cache: str | None) -> TrainOptions:
    shape = {"num_hidden_layers": LAYERS, "hidden_size": WIDTH, "num_attention_heads": WIDTH // 32,
             "max_position_embeddings": 128}  # fmt: skip
    extra = {"data_cache": cache} if cache else {}
    return TrainOptions(arch=cell.arch, preset=shape, settings={"norm_style": cell.style, **cell.settings}, data=data,
                        vocab_size=VOCAB, max_steps=STEPS, warmup_steps=cell.warmup, lr=lr, weight_decay=0.1,
                        batch_size=BATCH, seq_len=SEQ_LEN, eval_every=STEPS, eval_blocks=EVAL_BLOCKS, logging_steps=50,
                        seed=0, output=output, save_final_only=True, **extra)  # fmt: skip


def unigram_reference(data: str | None, cache: str | None) -> dict[str, float]:
    """The cross-entropy of the validation and test targets (every token of a block but its first, as the model
    is scored) under the training split's token frequencies, add-one smoothed: what a model that ignores the
    context can reach; also the entropy of each split's own frequencies, the least such a model could reach."""
    request = data_request(options(CELLS[0], RATES[0], "unused", data, cache))
    source = data_source(request, lambda line: None)
    split = training_data(source, request, lambda line: None)
    vocab = len(source.tokenizer)

    def counts(blocks_: Any) -> torch.Tensor:
        ids = torch.stack([blocks_[i]["input_ids"] for i in range(len(blocks_))])
        return torch.bincount(ids[:, 1:].reshape(-1), minlength=vocab).double()

    train = counts(split.train) + 1.0
    log_p = (train / train.sum()).log()
    reference = {"vocab": vocab}
    for name in ("val", "test"):
        target = counts(getattr(split, name))
        own = target[target > 0] / target.sum()
        reference[f"{name}_unigram_cross_entropy"] = float(-(target * log_p).sum() / target.sum())
        reference[f"{name}_unigram_entropy"] = float(-(own * own.log()).sum())
    return reference


@torch.no_grad()
def shared_state(model_folder: Path, blocks_: torch.Tensor) -> float:
    """|mean over tokens| / mean |state| of the first block's output on ``blocks_`` (1: every token the same)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_folder).eval()
    state = model(input_ids=blocks_, output_hidden_states=True).hidden_states[1].double()
    state = state.reshape(-1, state.shape[-1])
    return float(state.mean(dim=0).norm() / state.norm(dim=-1).mean())


def validation_blocks(data: str | None, cache: str | None) -> torch.Tensor:
    request = data_request(options(CELLS[0], RATES[0], "unused", data, cache))
    split = training_data(data_source(request, lambda line: None), request, lambda line: None)
    return torch.stack([split.val[i]["input_ids"] for i in range(SHARED_BLOCKS)])


def run_name(cell: Cell, lr: float) -> str:
    return f"{cell.name} lr{lr:g}"


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


def train_one(cell: Cell, lr: float, data: str | None, cache: str | None, probe: torch.Tensor) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="postnorm-diagnosis-") as work, cell_parts(cell):
        output = Path(work) / "run"
        start = time.perf_counter()
        metrics = run_training(options(cell, lr, str(output), data, cache), log=lambda line: None)
        seconds = time.perf_counter() - start
        shared = shared_state(output / "final", probe)
    commit_id = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=RESULTS)
    return {"run": run_name(cell, lr), "cell": cell.name, "arch": cell.arch, "style": cell.style, "lr": lr,
            "what": cell.what, "settings": cell.settings, "warmup_steps": cell.warmup, "legacy_init": cell.legacy_init,
            "scale_embeddings": cell.scale_embeddings, "val_loss": metrics["final_eval_loss"],
            "test_loss": metrics["final_test_loss"], "shared_after_block_1": shared, "seconds": round(seconds, 1),
            "commit": commit_id.stdout.strip()}  # fmt: skip


def table(runs: dict[str, dict[str, Any]], reference: dict[str, float], rates: tuple[float, ...]) -> str:
    unigram = reference["test_unigram_cross_entropy"]
    lines = [
        "# Post-Norm and DeepNorm on GPT-2: the causes of the collapse, one at a time",
        "",
        f"Written by `benchmarks/postnorm_diagnosis.py` (its docstring has the protocol): GPT-2 and LLaMA {LAYERS} "
        f"layers x width {WIDTH}, {STEPS} steps of {BATCH} x {SEQ_LEN} tokens of the Python standard library's "
        f"source (a tokenizer of {VOCAB} tokens, {EVAL_BLOCKS} validation and {EVAL_BLOCKS} test blocks), weight "
        f"decay 0.1, warm-up {WARMUP} steps unless the cell says, seed 0; one process on 2 shared CPU cores. Shrunk "
        "from the study's run (4 x 128, 300 steps of 16 x 128 tokens, 2048 tokens) to fit about 75 minutes.",
        "",
        f"**Unigram reference** (computed by the script): the test blocks' cross-entropy under the training split's "
        f"token frequencies is **{unigram:.3f}** (validation {reference['val_unigram_cross_entropy']:.3f}; the "
        f"entropy of the test blocks' own frequencies {reference['test_unigram_entropy']:.3f}). A run at or above "
        "it has learned nothing of the context.",
        "",
        "| cell | what changes | " + " | ".join(f"test loss at {lr:g}" for lr in rates)
        + " | best test - unigram | shared after block 1 (at the best rate) |",
        "|---|---|" + "---|" * len(rates) + "---|---|",
    ]  # fmt: skip
    for cell in CELLS:
        done = [runs.get(run_name(cell, lr)) for lr in rates]
        if not any(done):
            continue
        losses = ["" if r is None else f"{r['test_loss']:.3f}" for r in done]
        best = min((r for r in done if r is not None), key=lambda r: r["test_loss"])
        lines.append(f"| {cell.name} | {cell.what} | " + " | ".join(losses)
                     + f" | {best['test_loss'] - unigram:+.3f} | {best['shared_after_block_1']:.2f} |")  # fmt: skip
    lines += [
        "",
        f"Shared after block 1: |mean over tokens| / mean |state| of the first block's output on {SHARED_BLOCKS} "
        "validation blocks, "
        "from the final model (1: every token leaves the first block in the same state, so nothing later can tell "
        "the tokens apart). Validation losses are in the journal, `postnorm_diagnosis.jsonl` (one line per run).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    parser.add_argument("--data", default=None, help="the corpus (default: the standard library's source)")
    parser.add_argument("--data-cache", default=None)
    parser.add_argument("--commit-every", type=int, default=4, help="commit the journal every N runs (0: never)")
    args = parser.parse_args()
    rates = tuple(float(r) for r in args.rates.split(","))
    reference = unigram_reference(args.data, args.data_cache)
    print(f"unigram reference: {reference}", flush=True)
    probe = validation_blocks(args.data, args.data_cache)
    runs, trained = read_journal(), 0
    for cell in CELLS:
        for lr in rates:
            if run_name(cell, lr) in runs:
                continue
            entry = train_one(cell, lr, args.data, args.data_cache, probe)
            with JOURNAL.open("a", encoding="utf-8") as journal:
                journal.write(json.dumps(entry) + "\n")
            runs[entry["run"]], trained = entry, trained + 1
            print(f"{entry['run']}: test {entry['test_loss']:.3f}, shared {entry['shared_after_block_1']:.2f}, "
                  f"{entry['seconds']:.0f} s", flush=True)  # fmt: skip
            TABLE.write_text(table(runs, reference, rates), encoding="utf-8")
            if args.commit_every and trained % args.commit_every == 0:
                commit(f"postnorm_diagnosis: {len(runs)} runs journaled")
    TABLE.write_text(table(runs, reference, rates), encoding="utf-8")
    if args.commit_every:
        commit(f"postnorm_diagnosis: {len(runs)} runs journaled, the table written")


if __name__ == "__main__":
    main()
