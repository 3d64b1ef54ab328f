"""What proving a 14 GB checkpoint costs: the SHA-256 the marker records of each file as it is written and checks
again before the file is replaced or removed (``hf_geonorm._plumbing.ownership.file_entry``, ``changed_file``), and the
stat proof checked first (``file_proof``: size, modification and change times, inode).

Hashing: ``file_entry`` of a file of ``--mib`` MiB of random bytes, read back from the page cache (the cheapest a hash
can be: a checkpoint just written or read is there), ``RUNS`` times; from that rate, the seconds 14 GB adds at each
save (hashed as it is recorded), at each rotation (the checkpoint removed is hashed first) and before ``--force``
replaces it. Stat proof: the seconds ``ownership_problem`` takes on a folder laid out as a checkpoint (three shards,
an index, config and tokenizer files, optimizer and scheduler state), ``RUNS`` times; it reads no bytes, so file
sizes do not matter and the shards are 1 MiB (sparse).

Writes ``marker_proof.json`` and ``.md`` to ``--out`` (default benchmarks/results). Under a minute.

    python benchmarks/marker_proof.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hf_geonorm._plumbing.ownership import file_entry, mark_folder, ownership_problem

RESULTS = Path(__file__).resolve().parent / "results"
RUNS = 3
CHECKPOINT_BYTES = 14e9
SHARD_BYTES = 1 << 20
SMALL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
               "tokenizer_config.json", "trainer_state.json", "scheduler.pt", "rng_state.pth",
               "hf_geonorm_run.json", "training_args.bin")  # fmt: skip


def hash_seconds(path: Path) -> float:
    started = time.perf_counter()
    file_entry(path)
    return time.perf_counter() - started


def checkpoint_folder(folder: Path) -> None:
    """A folder laid out as a checkpoint: shards and optimizer state (sparse), small files beside them."""
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
        mark_folder(folder, "train")
        checking = []
        for _ in range(RUNS):
            started = time.perf_counter()
            problem = ownership_problem(folder)
            checking.append(time.perf_counter() - started)
            assert problem is None, problem
        files = len(os.listdir(folder))
    rate = mib * (1 << 20) / statistics.median(hashing)
    return {
        "hashed_mib": mib, "hash_seconds": hashing, "sha256_bytes_per_second": rate,
        "sha256_seconds_for_14_gb": CHECKPOINT_BYTES / rate, "checkpoint_files": files, "check_seconds": checking,
        "cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0], "machine": platform.platform(),
    }  # fmt: skip


def table(payload: dict[str, Any]) -> str:
    check = statistics.median(payload["check_seconds"])
    seconds = payload["sha256_seconds_for_14_gb"]
    return "\n".join([
        "# Proving a 14 GB checkpoint (benchmarks/marker_proof.py)",
        "",
        f"SHA-256 of {payload['hashed_mib']} MiB from the page cache (`file_entry`): "
        f"{payload['sha256_bytes_per_second'] / 1e9:.2f} GB/s (median of {len(payload['hash_seconds'])}), so "
        f"{seconds:.0f} s to hash 14 GB. Added for a 14 GB checkpoint: {seconds:.0f} s at each save (hashed as the "
        f"marker records it), {seconds:.0f} s more at each save that rotates one away (hashed before it is removed), "
        f"{seconds:.0f} s for each checkpoint removed at a run's end, and {seconds:.0f} s before --force replaces or "
        "clears an output holding 14 GB.",
        "",
        f"The stat proof of a checkpoint folder of {payload['checkpoint_files']} files, checked first, before any "
        f"hash: {check * 1000:.1f} ms (median; it reads no bytes, so it takes as long for 14 GB).",
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
