"""What proving a 14 GB checkpoint costs: hashing its bytes against the marker's stat-based proof
(``hf_geonorm.files.ownership.file_proof``: size, modification and change times, inode).

Hashing: SHA-256 (``hashlib``) of a file of ``--mib`` MiB of random bytes, read back from the page cache (the
cheapest a hash can be: a checkpoint just written or read is there), ``RUNS`` times; the seconds 14 GB would take at
that rate, once when the checkpoint is written and once more before it is replaced. Proof: the seconds
``mark_folder`` and ``ownership_problem`` take on a folder laid out as a 14 GB checkpoint (three sparse shards of
4.67 GB, which take no disk, an index, config and tokenizer files, optimizer and scheduler state), ``RUNS`` times.

Writes ``marker_proof.json`` and ``.md`` to ``--out`` (default benchmarks/results). Under a minute.

    python benchmarks/marker_proof.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hf_geonorm.files.ownership import mark_folder, ownership_problem

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = 3
CHECKPOINT_BYTES = 14e9
SHARD_BYTES = int(CHECKPOINT_BYTES / 3)
SMALL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
               "tokenizer_config.json", "trainer_state.json", "scheduler.pt", "rng_state.pth",
               "hf_geonorm_run.json", "training_args.bin")  # fmt: skip


def hash_seconds(path: Path) -> float:
    started = time.perf_counter()
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(16 << 20):
            digest.update(chunk)
    return time.perf_counter() - started


def checkpoint_folder(folder: Path) -> None:
    """A folder laid out as a 14 GB checkpoint: sparse shards (no disk taken), small files beside them."""
    folder.mkdir()
    for shard in range(3):
        with open(folder / f"model-0000{shard + 1}-of-00003.safetensors", "wb") as file:
            file.truncate(SHARD_BYTES)
    with open(folder / "optimizer.pt", "wb") as file:
        file.truncate(SHARD_BYTES)
    for name in SMALL_FILES:
        (folder / name).write_text("{}")


def measure(mib: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        data = Path(work) / "data.bin"
        with open(data, "wb") as file:
            for _ in range(mib):
                file.write(os.urandom(1 << 20))
        hash_seconds(data)  # into the page cache
        hashing = [hash_seconds(data) for _ in range(RUNS)]
        data.unlink()
        folder = Path(work) / "checkpoint"
        checkpoint_folder(folder)
        marking, checking = [], []
        for _ in range(RUNS):
            started = time.perf_counter()
            mark_folder(folder, "train")
            marking.append(time.perf_counter() - started)
            started = time.perf_counter()
            problem = ownership_problem(folder)
            checking.append(time.perf_counter() - started)
            assert problem is None, problem
        files = len(os.listdir(folder))
    rate = mib * (1 << 20) / statistics.median(hashing)
    return {
        "hashed_mib": mib, "hash_seconds": hashing, "sha256_bytes_per_second": rate,
        "sha256_seconds_for_14_gb": CHECKPOINT_BYTES / rate, "checkpoint_files": files,
        "checkpoint_bytes_listed": 4 * SHARD_BYTES, "mark_seconds": marking, "check_seconds": checking,
        "cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0], "machine": platform.platform(),
    }  # fmt: skip


def table(payload: dict[str, Any]) -> str:
    check = statistics.median(payload["check_seconds"])
    mark = statistics.median(payload["mark_seconds"])
    return "\n".join([
        "# Proving a 14 GB checkpoint (benchmarks/marker_proof.py)",
        "",
        f"SHA-256 of {payload['hashed_mib']} MiB from the page cache: "
        f"{payload['sha256_bytes_per_second'] / 1e9:.2f} GB/s (median of {len(payload['hash_seconds'])}), so "
        f"{payload['sha256_seconds_for_14_gb']:.0f} s to hash 14 GB, at each save and again before a replacement.",
        "",
        f"The marker's stat-based proof of a checkpoint folder of {payload['checkpoint_files']} files "
        f"({payload['checkpoint_bytes_listed'] / 1e9:.1f} GB listed): recorded in {mark * 1000:.1f} ms, checked in "
        f"{check * 1000:.1f} ms (medians).",
        "",
        f"Machine: {payload['machine']}, {payload['cpus']} CPUs, 1-minute load {payload['load_average_1m']:.1f} "
        "(shared with other jobs).",
    ]) + "\n"  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB hashed to measure the rate.")
    parser.add_argument("--out", type=Path, default=RESULTS, help="Folder the results are written to.")
    args = parser.parse_args(argv)
    payload = measure(args.mib)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "marker_proof.json").write_text(json.dumps(payload, indent=2) + "\n")
    (args.out / "marker_proof.md").write_text(table(payload))
    print(table(payload), end="")


if __name__ == "__main__":
    main()
