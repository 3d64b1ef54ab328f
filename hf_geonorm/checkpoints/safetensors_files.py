"""Reading the safetensors files of a saved model without loading weights: their headers (damage, truncation),
the shards of a folder, and its parameter count."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

# Bytes per value of the safetensors dtypes (those of safetensors 0.8), and the sub-byte ones, which are not
# size-checked here; any other dtype is one the safetensors library refuses.
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1, "C64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1,
    "BOOL": 1,
}  # fmt: skip
SUB_BYTE_DTYPES = ("F4", "F6_E2M3", "F6_E3M2")


def safetensors_header(path: Path) -> dict[str, Any]:
    """The header of a safetensors file; ``ValueError`` when the file is not one, is truncated, or its header
    describes tensors its bytes cannot hold (a shape claiming more values than its offsets leave room for, offsets
    that overlap or leave gaps): the checks the safetensors library makes before it reads a tensor."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100_000_000:
            raise ValueError(f"{path.name} is not a safetensors file")
        try:
            header = json.loads(f.read(size))
        except RecursionError:
            raise ValueError(f"{path.name} is damaged: its header nests deeper than a JSON reader follows") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has no safetensors header")
    spans = sorted(_tensor_span(path, name, entry) for name, entry in header.items() if name != "__metadata__")
    position = 0
    for begin, end, name in spans:
        if begin != position:
            raise ValueError(f"{path.name} is damaged: the bytes of tensor {name} do not follow the tensor before it")
        position = end
    expected = 8 + size + position
    actual = path.stat().st_size
    if actual != expected:
        raise ValueError(f"{path.name} is truncated or damaged: {actual} bytes, its header describes {expected}")
    return header


def _tensor_span(path: Path, name: str, entry: Any) -> tuple[int, int, str]:
    """(begin, end, name) of a tensor's bytes, checked against its shape and dtype."""
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"{path.name} is damaged: the header entry of tensor {name} is malformed") from None
    numbers = [begin, end, *shape] if isinstance(shape, list) else None
    if numbers is None or not all(type(n) is int and n >= 0 for n in numbers) or begin > end:
        raise ValueError(f"{path.name} is damaged: tensor {name} has a malformed shape or offsets")
    if dtype not in DTYPE_BYTES and dtype not in SUB_BYTE_DTYPES:
        raise ValueError(f"{path.name} is damaged: tensor {name} has dtype {json.dumps(dtype)[:40]}, which is not a "
                         "safetensors dtype")  # fmt: skip
    if dtype in DTYPE_BYTES and math.prod(shape) * DTYPE_BYTES[dtype] != end - begin:
        raise ValueError(
            f"{path.name} is damaged: tensor {name} of shape {shape} ({dtype}) needs "
            f"{math.prod(shape) * DTYPE_BYTES[dtype]:,} bytes, its header gives it {end - begin:,}"
        )
    return begin, end, name


class WeightPathError(ValueError):
    """A safetensors index names a weight file outside its model's folder."""


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors files of a saved model (one file, or the shards its index names). ``WeightPathError``
    when the index names a file outside the folder (``shard_path``)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [shard_path(path, shard) for shard in shards]
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def shard_path(folder: Path, shard: Any) -> Path:
    """The file ``folder/shard`` that an index names; ``WeightPathError`` unless it lies in ``folder``: a relative
    name without ``..``, and no symbolic link along it that leads out (but for the links of a Hub cache snapshot,
    ``snapshots/REV/NAME``, into that repository's ``blobs``). Weights from elsewhere would be loaded, and copied
    into a conversion, as if they were the model's."""
    if not isinstance(shard, str) or not shard:
        raise TypeError(f"a weight file name must be a string, not {shard!r}")
    name = PurePosixPath(shard)
    outside = f"model.safetensors.index.json names the weight file {shard!r}, outside {folder}"
    if name.is_absolute() or PureWindowsPath(shard).is_absolute() or ".." in name.parts or "\\" in shard:
        raise WeightPathError(f"{outside}: weight files must lie in the model's folder; fix or download the index")
    file = folder / name
    root = folder.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":
        allowed.append(root.parent.parent / "blobs")
    target = file.resolve()
    if not any(target.is_relative_to(place) for place in allowed):
        raise WeightPathError(
            f"{outside} through a symbolic link (to {target}): weight files must lie in the model's folder"
        )
    return file


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
