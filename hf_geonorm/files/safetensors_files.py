"""Reading the safetensors files of a saved model without loading weights: their headers (damage, truncation),
the shards of a folder, and its parameter count."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def safetensors_header(path: Path) -> dict[str, Any]:
    """The header of a safetensors file; ``ValueError`` when the file is not one or is truncated."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100_000_000:
            raise ValueError(f"{path.name} is not a safetensors file")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has no safetensors header")
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    expected = 8 + size + max(ends, default=0)
    actual = path.stat().st_size
    if actual != expected:
        raise ValueError(f"{path.name} is truncated or damaged: {actual} bytes, its header describes {expected}")
    return header


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors files of a saved model (one file, or the shards its index names)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [path / shard for shard in shards]
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def saved_parameter_count(path: str | os.PathLike) -> tuple[int, dict[str, int]] | None:
    """(number of parameters, count per dtype) from the safetensors headers alone, or None without weights.

    Tied weights are stored once, so this is the number of distinct parameters (and buffers saved with them).
    """
    files = weight_files(path)
    if not files:
        return None
    total = 0
    by_dtype: dict[str, int] = {}
    for file in files:
        for name, entry in safetensors_header(file).items():
            if name == "__metadata__":
                continue
            n = math.prod(entry["shape"])
            total += n
            by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + n
    return total, by_dtype
