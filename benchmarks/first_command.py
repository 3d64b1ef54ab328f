"""How long the README's first command takes once installed: ``hf-geonorm train`` with no options (the embedded
default: a tiny GeoNorm GPT-2 on the standard library's source, its tokenizer trained on the fly), run as a user
runs it, by the installed console script in an empty working folder with a fresh ``HOME`` (so no cache helps it).

Recorded for each ``--threads`` setting (``default``: torch's own choice, one thread a core, as a user who sets
nothing gets; a number: ``OMP_NUM_THREADS``), one after the other: the wall time of the whole command (imports,
tokenizer, data, 300 steps, evaluation, saving), what its ``metrics.json`` says (steps, final validation and test
loss, training and evaluation seconds), the folder it wrote, and how busy the machine was (the load average before
and after, and ``--busy``: what else ran, in words). The README quotes the wall times from ``first_command.json``.

Writes ``first_command.json`` and ``.md`` to ``--out`` (default benchmarks/results). About 20 minutes on a two-core
machine whose other core trains.

    python benchmarks/first_command.py --threads default,1 --busy "phase j of the study training on the other core"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reports import environment, write_results  # noqa: E402

RESULTS = Path(__file__).parent / "results"
OUTPUT = "geonorm-run"  # train's default --output


def clock(seconds: float) -> str:
    """``m:ss``, as the README writes a duration."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--threads", default="default", help="comma-separated: default (torch's) or a number")
    parser.add_argument("--busy", default="nothing else", help="what else the machine ran meanwhile, in words")
    args = parser.parse_args()
    command = shutil.which("hf-geonorm", path=str(Path(sys.executable).parent)) or shutil.which("hf-geonorm")
    if command is None:
        sys.exit("first_command.py: no hf-geonorm command beside this Python or on PATH: pip install -e '.[train]'")
    started = time.monotonic()
    rows = [timed(command, threads) for threads in args.threads.split(",")]
    lines = [
        "# The README's first command, timed",
        "",
        "`hf-geonorm train` with no options, by the installed console script, in an empty folder with a fresh HOME, "
        f"once for each thread setting, one after the other; meanwhile: {args.busy} (written by "
        "`benchmarks/first_command.py`).",
        "",
        "| threads | wall time | steps | training s | evaluation s | validation loss | test loss | load before / after "
        f"| {OUTPUT}/ holds |",
        "|---|---|---|---|---|---|---|---|---|",
        *(f"| {row['threads']} | {row['clock']} ({row['wall_seconds']:.0f} s) | {row['steps']} | "
          f"{row['training_seconds']:.0f} | {row['evaluation_seconds']:.0f} | {row['final_eval_loss']:.4f} | "
          f"{row['final_test_loss']:.4f} | {row['load_before']:.2f} / {row['load_after']:.2f} | "
          f"{', '.join(row['written'])} |" for row in rows),
        "",
    ]  # fmt: skip
    write_results(args, "first_command", lines, environment(), time.monotonic() - started, busy=args.busy, rows=rows)
    print("\n".join(lines))


def timed(command: str, threads: str) -> dict[str, Any]:
    """One run of ``hf-geonorm train`` in a fresh folder and HOME, ``OMP_NUM_THREADS`` set unless ``default``."""
    with tempfile.TemporaryDirectory(prefix="first-command-") as tmp:
        home, work = Path(tmp, "home"), Path(tmp, "work")
        home.mkdir()
        work.mkdir()
        env = {**os.environ, "HOME": str(home), "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1"}
        env.pop("OMP_NUM_THREADS", None)
        if threads != "default":
            env["OMP_NUM_THREADS"] = threads
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        done = subprocess.run([command, "train"], cwd=work, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        load_after = os.getloadavg()[0]
        if done.returncode != 0:
            sys.exit(f"first_command.py: hf-geonorm train exited {done.returncode}: {done.stderr.strip()[-2000:]}")
        metrics = json.loads((work / OUTPUT / "metrics.json").read_text(encoding="utf-8"))
        written = sorted(path.name for path in (work / OUTPUT).iterdir())
    if threads == "default":
        threads = f"default ({os.cpu_count()} cores)"
    kept = ("steps", "training_seconds", "evaluation_seconds", "final_eval_loss", "final_test_loss")
    return {"threads": threads, "wall_seconds": wall, "clock": clock(wall), "load_before": load_before,
            "load_after": load_after, "written": written, **{key: metrics[key] for key in kept}}  # fmt: skip


if __name__ == "__main__":
    main()
