"""Shared pieces of the evidence benchmarks (ablation, knobs, stability, convert_uptrain).

- corpora that need no download: the Python standard library's source (``stdlib``) and an English prose corpus
  (``prose``: Debian's ``fortunes`` package, installed with apt-get when missing, or any file/folder given
  with ``--prose``), tokenized with a byte-level BPE trained once per corpus (cached on disk);
- from-scratch models of any supported family at any size, built through the GeoNorm config classes (so
  ``norm_style='deepnorm'`` gets DeepNet's init scaling), dropout off;
- a plain AdamW training loop (warm-up + cosine, gradient clipping 1.0) that records the train loss of every
  step, the validation loss every ``eval_every`` steps, loss spikes and tokens/s;
- a small process pool (one torch thread per worker) to run many such runs side by side;
- markdown / JSON / PNG writers. Every number in ``benchmarks/results`` comes from these functions.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import multiprocessing
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = Path(os.environ.get("HF_GEONORM_BENCH_CACHE", Path.home() / ".cache" / "hf-geonorm-bench"))
FORTUNES = Path("/usr/share/games/fortunes")
GCIDE = Path("/usr/share/dictd/gcide.dict.dz")
SPIKE_FACTOR = 1.5  # a spike: train loss > SPIKE_FACTOR x the median of the previous SPIKE_WINDOW losses
SPIKE_WINDOW = 20
SPIKE_DEFINITION = (
    f"a step after warm-up whose train loss exceeds {SPIKE_FACTOR}x the median of the previous {SPIKE_WINDOW} "
    "steps' train losses, or a non-finite loss"
)
DIVERGED_DEFINITION = "a non-finite loss (the run stops there), or a final validation loss above ln(vocab size)"


# ---- data ----


def fortunes_texts() -> list[str]:
    """Debian's ``fortunes`` corpus (English prose, quotes, jokes), one document per fortune; apt-get installs
    the package when it is missing."""
    if not FORTUNES.is_dir():
        print("installing Debian's fortunes package (English prose corpus) with apt-get", flush=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "fortunes"], check=False, capture_output=True)
    if not FORTUNES.is_dir():
        raise SystemExit(
            f"no prose corpus: {FORTUNES} is missing and `apt-get install fortunes` failed; pass --prose PATH"
        )
    docs: list[str] = []
    for path in sorted(FORTUNES.iterdir()):
        if path.is_file() and not path.suffix and path.name != "ascii-art":  # art is not prose
            text = path.read_text(encoding="utf-8", errors="replace")
            docs.extend(d.strip() for d in text.split("\n%\n") if d.strip())
    random.Random(0).shuffle(docs)  # the validation tail mixes all the collections
    return docs


def dictionary_texts() -> list[str]:
    """The GNU Collaborative International Dictionary of English (Debian's ``dict-gcide``, installed with apt-get
    when missing): definitions with etymologies and quotations, a third kind of text beside code and prose.
    One document per run of entries of about 2,000 characters, shuffled (the file is alphabetical)."""
    if not GCIDE.is_file():
        print("installing Debian's dict-gcide package (dictionary corpus) with apt-get", flush=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "dict-gcide"], check=False, capture_output=True)
    if not GCIDE.is_file():
        raise SystemExit(f"no dictionary corpus: {GCIDE} is missing and `apt-get install dict-gcide` failed")
    with gzip.open(GCIDE, "rt", encoding="utf-8", errors="replace") as f:
        paragraphs = f.read().split("\n\n")
    docs, current = [], ""
    for paragraph in paragraphs[1:]:  # the first paragraph is the file's header
        current += paragraph + "\n\n"
        if len(current) >= 2000:
            docs.append(current.strip())
            current = ""
    random.Random(0).shuffle(docs)
    return docs


def _take(docs: list[str], max_chars: int) -> tuple[list[str], int]:
    out, total = [], 0
    for doc in docs:
        out.append(doc[: max_chars - total])
        total += len(out[-1])
        if total >= max_chars:
            break
    return out, total


def corpus_texts(name: str, max_chars: int, prose: str | None = None) -> tuple[list[str], str]:
    from hf_geonorm.training.data import read_texts

    if name == "stdlib":
        return read_texts(None, max_chars)
    if name == "prose":
        if prose is not None:
            return read_texts(prose, max_chars)
        out, total = _take(fortunes_texts(), max_chars)
        return out, f"Debian fortunes ({len(out)} fortunes, {total} characters)"
    if name == "dict":
        if prose is not None:  # the tests' stand-in: no apt-get
            return read_texts(prose, max_chars)
        out, total = _take(dictionary_texts(), max_chars)
        return out, f"GNU dictionary GCIDE ({len(out)} documents, {total} characters)"
    raise ValueError(f"unknown corpus {name!r}")


@dataclass
class Corpus:
    name: str
    label: str
    train: torch.Tensor
    val: torch.Tensor
    vocab: int


def load_corpus(name: str, vocab_size: int, seq_len: int, max_chars: int, prose: str | None = None) -> Corpus:
    """Token blocks of a corpus, train and validation split; tokenizer and blocks cached on disk."""
    from hf_geonorm.training.data import split_blocks, token_blocks, train_tokenizer

    tag = f"{name}_{vocab_size}_{seq_len}_{max_chars}"
    if prose is not None and name in ("prose", "dict"):
        tag += "_" + hashlib.sha1(os.path.abspath(prose).encode()).hexdigest()[:10]
    cached = CACHE / f"{tag}.pt"
    if cached.exists():
        data = torch.load(cached)
        return Corpus(name, data["label"], data["train"], data["val"], data["vocab"])
    texts, label = corpus_texts(name, max_chars, prose)
    tokenizer = train_tokenizer(texts, vocab_size)
    train, val = split_blocks(token_blocks(tokenizer, texts, seq_len))
    CACHE.mkdir(parents=True, exist_ok=True)
    torch.save({"label": label, "train": train, "val": val, "vocab": len(tokenizer)}, cached)
    return Corpus(name, label, train, val, len(tokenizer))


# ---- models ----


def make_config(arch: str, layers: int, width: int, heads: int, seq_len: int, vocab: int,
                settings: dict[str, Any], preset: str | None = None) -> Any:  # fmt: skip
    """The GeoNorm config of ``arch`` at the given size (or at a paper preset: 125m, 350m, 760m, 1.3b)."""
    from hf_geonorm import config_class_for
    from hf_geonorm.training.presets import PRESETS, fit_token_ids, preset_sizes

    family_config = config_class_for(arch)
    if preset is None:
        sizes = {"num_hidden_layers": layers, "hidden_size": width, "num_attention_heads": heads}
        with mock.patch.dict(PRESETS, {"_bench": sizes}):
            values = preset_sizes(family_config, "_bench", max_length=seq_len)
    else:
        values = preset_sizes(family_config, preset, max_length=seq_len)
    values["vocab_size"] = int(math.ceil(vocab / 64) * 64)
    values["bos_token_id"] = values["eos_token_id"] = 0  # the tokenizer's single special token <|endoftext|>
    # No pad id: LLaMA-style embeddings would give it padding_idx, a zero row that never trains. Token 0 is the
    # documents' separator here, and a zero state is a fixed point of the geodesic step (see the README).
    values["pad_token_id"] = None
    fit_token_ids(values, family_config)
    for name, value in vars(family_config()).items():
        if (name.endswith("pdrop") or name.endswith("dropout")) and isinstance(value, float):
            values[name] = 0.0
    return family_config(**values, **settings)


# ---- one training run ----


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


def lr_at(step: int, spec: RunSpec) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


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
    """Train ``model`` in place for ``spec.steps`` AdamW steps on ``corpus``; the record of the run."""
    device = spec.device
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(spec.seed)
    val_curve_blocks = corpus.val[: spec.eval_blocks]
    eval_fn = eval_fn or (lambda m: eval_loss(m, val_curve_blocks, spec.batch, device))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else _null()
    losses: list[float] = []
    evals: list[tuple[int, float]] = [(0, eval_fn(model))]
    train_seconds, stopped = 0.0, False
    for step in range(spec.steps):
        if step_hook is not None:
            step_hook(step)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, spec)
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
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        train_seconds += time.perf_counter() - start
        if (step + 1) % spec.eval_every == 0 or step + 1 == spec.steps:
            evals.append((step + 1, eval_fn(model)))
    return {"losses": losses, "evals": evals, "train_seconds": train_seconds, "stopped": stopped}


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


_CORPORA: dict[str, Corpus] = {}


def _init_worker(corpora: dict[str, Corpus], threads: int) -> None:
    torch.set_num_threads(threads)
    _CORPORA.update(corpora)


def run_one(spec: RunSpec) -> dict[str, Any]:
    """Build the spec's model from scratch (seeded) and train it; the run's record with its summary numbers."""
    from transformers import AutoModelForCausalLM

    import hf_geonorm  # noqa: F401 - registers the GeoNorm classes

    corpus = _CORPORA[spec.corpus]
    torch.manual_seed(spec.seed)
    config = make_config(spec.arch, spec.layers, spec.width, spec.heads, spec.seq_len, corpus.vocab,
                         spec.settings, spec.preset)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
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


def reuse_note(results: list[dict[str, Any]]) -> str:
    """The sentence a results table carries when some of its runs came from an earlier file (``--reuse``)."""
    sources = sorted({r["reused_from"] for r in results if "reused_from" in r})
    if not sources:
        return ""
    count = sum("reused_from" in r for r in results)
    return (f" {count} of the {len(results)} runs were taken unchanged from an earlier run of this script with the "
            f"same specification ({'; '.join(sources)}; `--reuse`); their tokens/s were measured then.")  # fmt: skip


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


# ---- summaries and writers ----


def run_grid(args: argparse.Namespace, variants: dict[str, dict[str, Any]]) -> tuple[list[dict], dict, float]:
    """Every variant x arch x corpus x seed of ``args`` (the ablation's and the knob sweep's grid): the
    results, the corpora and the wall time in seconds."""
    archs, corpora_names = args.archs.split(","), args.corpora.split(",")
    start = time.perf_counter()
    corpora = {
        name: load_corpus(name, args.vocab, args.seq_len, max_chars(args), args.prose) for name in corpora_names
    }
    specs = [
        base_spec(args, label=label, arch=arch, corpus=corpus, settings=settings, seed=seed)
        for corpus in corpora_names
        for arch in archs
        for seed in range(args.seeds)
        for label, settings in variants.items()
    ]
    results = run_all(specs, corpora, args.workers, args.threads, reuse=args.reuse)
    return results, corpora, time.perf_counter() - start


def group(results: list[dict[str, Any]], *keys: str) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(tuple(r["spec"][k] for k in keys), []).append(r)
    return groups


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean, sample std, min and max of the final validation loss over seeds (finite runs only), spikes summed,
    divergences counted, median tokens/s."""
    finals = [r["final_val_loss"] for r in runs if math.isfinite(r["final_val_loss"])]
    return {
        "n": len(runs),
        "mean": statistics.fmean(finals) if finals else float("nan"),
        "std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
        "min": min(finals) if finals else float("nan"),
        "max": max(finals) if finals else float("nan"),
        "spikes": sum(r["spikes"] for r in runs),
        "diverged": sum(bool(r["diverged"]) for r in runs),
        "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs),
        "seeds": [r["spec"]["seed"] for r in runs],
        "finals": [r["final_val_loss"] for r in runs],
    }


def defaults_text() -> str:
    """The library's GeoNorm defaults, read from ``GeoNormSettings`` (so a table says what was actually run)."""
    from hf_geonorm import GeoNormSettings

    d = GeoNormSettings()
    angle = "none" if d.geo_max_angle is None else f"pi/{math.pi / d.geo_max_angle:g}"
    step = "learnable" if d.geo_learnable_step else "fixed"
    return f"{d.geo_decay} decay, alpha {d.geo_alpha:g}, max angle {angle}, {d.geo_radius} radius, {step} step"


def fmt(value: float, digits: int = 3) -> str:
    return "nan" if not math.isfinite(value) else f"{value:.{digits}f}"


def environment() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def write_results(args: argparse.Namespace, name: str, lines: list[str], env: dict[str, Any], wall: float,
                  **fields: Any) -> dict[str, Any]:  # fmt: skip
    """Write ``<name>.md`` (the table ``lines``) and ``<name>.json`` (the arguments, environment, wall time and
    ``fields``) to ``args.out``; the JSON payload."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.md").write_text("\n".join(lines), encoding="utf-8")
    payload = {"args": {k: str(v) for k, v in vars(args).items()}, "environment": env, "wall_seconds": wall,
               **fields}  # fmt: skip
    write_json(args.out / f"{name}.json", payload)
    return payload


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")


def smooth(values: list[float], width: int = 10) -> list[float]:
    out, acc = [], []
    for v in values:
        acc.append(v if math.isfinite(v) else float("nan"))
        acc = acc[-width:]
        finite = [a for a in acc if math.isfinite(a)]
        out.append(statistics.fmean(finite) if finite else float("nan"))
    return out


def plot_panels(path: Path, panels: dict[str, dict[str, list[dict[str, Any]]]], title: str,
                what: str = "val", ylim: tuple[float, float] | None = None) -> None:  # fmt: skip
    """One subplot per panel; per member the seed-mean validation curve (``what='val'``) or the seed-mean
    train loss smoothed over 10 steps (``what='train'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.2 * rows), squeeze=False)
    for ax, (name, members) in zip(axes.flat, panels.items(), strict=False):
        lowest = math.inf
        for member, runs in members.items():
            style = "-" if "geo" in member else "--"
            if what == "val":
                steps = [s for s, _ in runs[0]["evals"]]
                curves = [[v for _, v in r["evals"]] for r in runs]
            else:
                length = max(len(r["losses"]) for r in runs)
                steps = list(range(1, length + 1))
                curves = [smooth(r["losses"]) + [float("nan")] * (length - len(r["losses"])) for r in runs]
            mean = [statistics.fmean(c[i] for c in curves if i < len(c)) for i in range(len(steps))]
            ax.plot(steps[: len(mean)], mean, style, label=member, linewidth=1.2)
            lowest = min([lowest, *(m for m in mean if math.isfinite(m))])
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss" if what == "val" else "train loss (10-step mean)")
        if ylim:
            ax.set_ylim(*ylim)
        else:
            finals = [statistics.fmean(r["evals"][-1][1] for r in runs) for runs in members.values()]
            finals = [f for f in finals if math.isfinite(f)]
            if finals:
                ax.set_ylim(min(min(finals), lowest) - 0.1, max(finals) + 1.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def common_arguments(parser: argparse.ArgumentParser, steps: int, layers: int, width: int, seq_len: int) -> None:
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--prose", default=None, help="a prose file/folder instead of Debian's fortunes")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--layers", type=int, default=layers)
    parser.add_argument("--width", type=int, default=width)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=seq_len)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--max-chars", type=int, default=2_000_000)
    parser.add_argument("--workers", type=int, default=2, help="parallel runs (processes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument(
        "--scale", default=None, choices=["125m", "350m", "760m", "1.3b"],
        help="the paper's model sizes (hf_geonorm.training.presets) on CUDA with bf16 autocast: overrides "
        "--layers/--width/--heads; use with --seq-len 1024+ --steps 10000+ --vocab 50304 --max-chars 0 (all) on a GPU",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="a minuscule run for the tests (seconds)")
    parser.add_argument(
        "--reuse", type=Path, default=None, metavar="JSON",
        help="an earlier results JSON of this script: runs whose specification is identical are taken from it "
        "instead of being repeated (e.g. to add an architecture to a sweep)",
    )  # fmt: skip


def apply_smoke(args: argparse.Namespace) -> None:
    """The tests' scale: tiny models, tiny corpora, a few steps, in-process, results named *_smoke."""
    args.seeds, args.steps, args.layers, args.width, args.heads = 1, 4, 2, 16, 2
    args.seq_len, args.batch, args.warmup, args.eval_every = 16, 2, 1, 2
    args.vocab, args.max_chars, args.workers = 300, 12_000, 1


def base_spec(args: argparse.Namespace, **overrides: Any) -> RunSpec:
    values = dict(
        layers=args.layers, width=args.width, heads=args.heads, seq_len=args.seq_len, batch=args.batch,
        steps=args.steps, lr=args.lr, warmup=args.warmup, eval_every=args.eval_every,
    )  # fmt: skip
    if args.scale:
        values.update(preset=args.scale, device="cuda" if torch.cuda.is_available() else "cpu", eval_blocks=64)
    values.update(overrides)
    return RunSpec(**values)


def stem(name: str, args: argparse.Namespace) -> str:
    return f"{name}_smoke" if args.smoke else (f"{name}_{args.scale}" if args.scale else name)


def max_chars(args: argparse.Namespace) -> int:
    return args.max_chars if args.max_chars > 0 else 10**12
