"""What a benchmark script writes beside its table: the environment it ran in, and the markdown and JSON
writers (``presets_step.py``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch


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
