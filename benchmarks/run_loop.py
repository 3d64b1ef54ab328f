"""One from-scratch benchmark run and many side by side.

A run builds its model with the library's from-scratch recipe (``hf_geonorm.training.model.scratch_config``: the
config ``hf-geonorm train --arch`` and ``hf-geonorm init`` build, dropout off; the GeoNorm config classes give
``norm_style='deepnorm'`` DeepNet's init scaling) and trains it with the library's optimizer and schedule
(``hf_geonorm.training.optim``: what ``hf-geonorm train`` trains with), recording the train loss of every step, the
validation loss every ``eval_every`` steps, loss spikes and tokens/s. ``run_all`` runs many in a process pool (one
torch thread per worker), appends each finished run to a journal, and takes runs of the same specification from
an earlier journal or results JSON instead of repeating them.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from corpus_data import Corpus
from transformers import AutoModelForCausalLM

from hf_geonorm.training.model import padded_vocab, scratch_config
from hf_geonorm.training.optim import clip_gradients, make_optimizer, make_scheduler

SPIKE_FACTOR = 1.5  # a spike: train loss > SPIKE_FACTOR x the median of the previous SPIKE_WINDOW losses
SPIKE_WINDOW = 20
SPIKE_DEFINITION = (
    f"a step after warm-up whose train loss exceeds {SPIKE_FACTOR}x the median of the previous {SPIKE_WINDOW} "
    "steps' train losses, or a non-finite loss"
)
DIVERGED_DEFINITION = "a non-finite loss (the run stops there), or a final validation loss above ln(vocab size)"
EOT_ID = 0  # the one special token of hf_geonorm.training.tokenizer.train_tokenizer, <|endoftext|>, joins documents


@dataclass
class RunSpec:
    """One from-scratch run. ``settings`` are GeoNorm settings (norm_style=..., geo_*=...)."""

    label: str
    arch: str = "gpt2"
    corpus: str = "stdlib"
    settings: dict[str, Any] = field(default_factory=dict)
    layers: int = 4
    width: int = 128
    heads: int = 4
    seq_len: int = 128
    batch: int = 16
    steps: int = 200
    lr: float = 2e-3
    warmup: int = 20
    seed: int = 0
    eval_every: int = 25
    eval_blocks: int = 16  # validation blocks used for the curve; the final loss uses all of them
    preset: str | None = None
    device: str = "cpu"


def spec_config(spec: RunSpec, vocab: int) -> Any:
    """The GeoNorm config of ``spec``'s model for a tokenizer of ``vocab`` tokens: the library's from-scratch
    recipe at the spec's sizes (or its paper preset: 125m, 350m, 760m, 1.3b) and ``seq_len`` positions."""
    sizes = spec.preset or {"num_hidden_layers": spec.layers, "hidden_size": spec.width,
                            "num_attention_heads": spec.heads}  # fmt: skip
    # the family's own embedding tying, as every run in the journals was built (LLaMA's head is untied)
    return scratch_config(spec.arch, sizes, padded_vocab(vocab), spec.seq_len, spec.settings,
                          bos_token_id=EOT_ID, eos_token_id=EOT_ID, tie_embeddings=None)  # fmt: skip


@torch.no_grad()
def eval_loss(model: torch.nn.Module, blocks: torch.Tensor, batch: int, device: str | None = None) -> float:
    """Mean token cross-entropy over ``blocks`` (every block has the same length, so block means average)."""
    device = device or next(model.parameters()).device
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(blocks), batch):
        x = blocks[i : i + batch].to(device)
        total += model(input_ids=x, labels=x).loss.float().item() * len(x)
        n += len(x)
    model.train()
    return total / n


def count_spikes(losses: list[float], warmup: int) -> int:
    spikes = 0
    for i, value in enumerate(losses):
        if not math.isfinite(value):
            spikes += 1
        elif i >= max(warmup, SPIKE_WINDOW):
            window = [v for v in losses[i - SPIKE_WINDOW : i] if math.isfinite(v)]
            if window and value > SPIKE_FACTOR * statistics.median(window):
                spikes += 1
    return spikes


def train_steps(model: torch.nn.Module, spec: RunSpec, corpus: Corpus, step_hook: Any = None,
                eval_fn: Any = None) -> dict[str, Any]:  # fmt: skip
    """Train ``model`` in place for ``spec.steps`` steps on ``corpus`` with the library's optimizer, schedule and
    clipping (``hf_geonorm.training.optim``, weight decay 0); the record of the run."""
    device = spec.device
    model.to(device).train()
    optimizer = make_optimizer(model, spec.lr)
    scheduler = make_scheduler(optimizer, spec.warmup, spec.steps)
    generator = torch.Generator().manual_seed(spec.seed)
    val_curve_blocks = corpus.val[: spec.eval_blocks]
    eval_fn = eval_fn or (lambda m: eval_loss(m, val_curve_blocks, spec.batch, device))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else contextlib.nullcontext()
    losses: list[float] = []
    evals: list[tuple[int, float]] = [(0, eval_fn(model))]
    train_seconds, stopped = 0.0, False
    for step in range(spec.steps):
        if step_hook is not None:
            step_hook(step)
        x = corpus.train[torch.randint(len(corpus.train), (spec.batch,), generator=generator)].to(device)
        start = time.perf_counter()
        with autocast:
            loss = model(input_ids=x, labels=x).loss
        value = loss.float().item()
        losses.append(value)
        if not math.isfinite(value):
            stopped = True
            train_seconds += time.perf_counter() - start
            break
        loss.backward()
        clip_gradients(model)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        train_seconds += time.perf_counter() - start
        if (step + 1) % spec.eval_every == 0 or step + 1 == spec.steps:
            evals.append((step + 1, eval_fn(model)))
    return {"losses": losses, "evals": evals, "train_seconds": train_seconds, "stopped": stopped}


_CORPORA: dict[str, Corpus] = {}


def _init_worker(corpora: dict[str, Corpus], threads: int) -> None:
    torch.set_num_threads(threads)
    _CORPORA.update(corpora)


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Build the spec's model from scratch (seeded) and train it; the run's record with its summary numbers."""
    corpus = _CORPORA[spec.corpus]
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(spec_config(spec, corpus.vocab))
    record = train_steps(model, spec, corpus)
    final = float("nan") if record["stopped"] else eval_loss(model, corpus.val, spec.batch, spec.device)
    tokens = len(record["losses"]) * spec.batch * spec.seq_len
    diverged = record["stopped"] or not math.isfinite(final) or final > math.log(corpus.vocab)
    return {
        "spec": asdict(spec),
        "resolved_settings": resolved_settings(spec.settings),
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_val_loss": final,
        "spikes": count_spikes(record["losses"], spec.warmup),
        "diverged": diverged,
        "tokens_per_second": tokens / max(record["train_seconds"], 1e-9),
        **record,
    }


def previous_runs(path: Path | None, specs: list[RunSpec]) -> dict[int, dict[str, Any]]:
    """Runs of an earlier results JSON (``--reuse``) whose spec equals one of ``specs`` field for field, with
    the same settings after the library's defaults are filled in (a changed default is a different run), by the
    index of that spec: those runs are not repeated. Each reused record is marked with the file it came from."""
    if path is None or not Path(path).exists():
        return {}
    if Path(path).suffix == ".jsonl":  # a journal: one finished run a line (``run_all(journal=...)``)
        runs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        source = f"{Path(path).name}: the journal of earlier runs of this script"
    else:
        payload = json.loads(Path(path).read_text())
        runs = payload["runs"]
        source = (f"{Path(path).name}: written {payload['environment']['date']}, "
                  f"{payload['wall_seconds'] / 60:.1f} min wall")  # fmt: skip
    stored = {_run_key(r["spec"], r.get("resolved_settings")): r for r in runs if "resolved_settings" in r}
    found = {}
    for i, spec in enumerate(specs):
        run = stored.get(_run_key(asdict(spec), resolved_settings(spec.settings)))
        if run is not None:
            found[i] = {**run, "reused_from": run.get("reused_from", source)}
    return found


def resolved_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Every GeoNorm setting a run used: ``settings`` with the library's current defaults filled in."""
    from hf_geonorm import GeoNormSettings

    return asdict(GeoNormSettings(**settings))


def _run_key(spec: dict[str, Any], resolved: dict[str, Any] | None) -> str:
    return json.dumps({"spec": spec, "resolved_settings": resolved}, sort_keys=True)



def run_all(specs: list[RunSpec], corpora: dict[str, Corpus], workers: int, threads: int,
            log: Any = print, reuse: Path | None = None,
            journal: Path | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Run every spec; ``workers`` > 1 uses a spawn process pool with ``threads`` torch threads each. Specs
    found in ``reuse`` (an earlier results JSON or journal) are taken from there instead of being run again.
    With ``journal``, each finished run is appended to that JSONL file at once (a cut-short study keeps it)."""
    start = time.perf_counter()
    all_specs, reused = specs, previous_runs(reuse, specs)
    results: list[dict[str, Any]] = list(reused.values())
    if reused:
        log(f"reusing {len(reused)} of {len(specs)} runs from {reuse}")
    specs = [spec for i, spec in enumerate(specs) if i not in reused]

    def note(result: dict[str, Any]) -> None:
        results.append(result)
        if journal is not None:
            journal.parent.mkdir(parents=True, exist_ok=True)
            with open(journal, "a", encoding="utf-8") as f:
                f.write(json.dumps(result, default=str) + "\n")
        s = result["spec"]
        log(
            f"[{len(results)}/{len(all_specs)} {time.perf_counter() - start:.0f}s] {s['arch']} {s['corpus']} "
            f"{s['label']} seed {s['seed']}: val {result['final_val_loss']:.4f}, spikes {result['spikes']}, "
            f"{result['tokens_per_second']:.0f} tok/s"
        )

    if workers <= 1:
        _init_worker(corpora, threads)
        for spec in specs:
            note(run_one(spec))
    else:
        context = multiprocessing.get_context("spawn")
        with context.Pool(workers, initializer=_init_worker, initargs=(corpora, threads)) as pool:
            for result in pool.imap_unordered(run_one, specs):
                note(result)
    key = {(s.label, s.arch, s.corpus, s.seed): i for i, s in enumerate(all_specs)}
    results.sort(key=lambda r: key[(r["spec"]["label"], r["spec"]["arch"], r["spec"]["corpus"], r["spec"]["seed"])])
    return results
