"""The data pipeline of ``hf-geonorm train`` (hf_geonorm.training.pipeline) on corpora of about 25, 100 and 400 MB:
tokenization throughput with 1 and 2 processes, peak memory while preparing and while training, time to the first
training step on a first and on a cached second run, and the cache's size on disk.

The corpora need no download: the Python standard library's ``.py`` files (all of them, sorted by path), each after a
header line naming it, concatenated into one text file and repeated (with the copy number in the headers) until the
size is reached. Every measurement runs in a child process of its own, so that its peak RSS (``getrusage``, the
process and its own children) is its alone. Tokenizers run with ``TOKENIZERS_PARALLELISM=false``: one thread per
process, so that "per process" means what it says.

    python benchmarks/data_pipeline.py            # writes benchmarks/results/data_pipeline.md and .json
    python benchmarks/data_pipeline.py --sizes 25 --work /tmp/bench   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SEQ_LEN, VOCAB = 128, 2048
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def make_corpus(path: Path, megabytes: int) -> None:
    """The standard library's source, repeated with numbered headers, up to ``megabytes`` MB, as one text file."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    target, written, copy = megabytes * 1_000_000, 0, 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            copy += 1
            for file in files:
                text = file.read_text(encoding="utf-8", errors="replace")
                written += out.write(f"# ==== copy {copy}: {file.name} ====\n\n{text}\n\n")
                if written >= target:
                    return


CHILD = r"""
import json, resource, sys, time
args = json.loads(sys.argv[1])
start = time.perf_counter()
out = {}
if args["job"] == "prepare":
    from pathlib import Path
    from hf_geonorm.training.corpus import resolve_corpus
    from hf_geonorm.training.tokenizer import fast_tokenizer
    from hf_geonorm.training.pipeline import prepare_blocks
    tokenizer = fast_tokenizer(args["tokenizer"])
    corpus = resolve_corpus(args["data"])
    start = time.perf_counter()
    prepared = prepare_blocks(corpus, tokenizer, args["seq_len"], Path(args["cache"]), 64, args["workers"])
    out = {"tokens": prepared.meta["tokens"], "seconds": time.perf_counter() - start, "meta": prepared.meta,
           "folder": str(prepared.folder)}
else:  # a training run of a tiny model: the wall time of its first step from the start of this process
    from hf_geonorm.training import trainer as trainer_module
    from hf_geonorm.training.options import TrainOptions
    step = trainer_module.CheckedTrainer.training_step
    first = []
    def timed(self, *a, **k):
        if not first:
            first.append(time.time() - args["launched"])
        return step(self, *a, **k)
    trainer_module.CheckedTrainer.training_step = timed
    options = TrainOptions(data=args["data"], data_cache=args["cache"], output=args["output"], max_steps=3,
                           eval_every=1000, seq_len=args["seq_len"], batch_size=8, vocab_size=args["vocab"],
                           data_workers=args["workers"], warmup_steps=0, force=True)
    trainer_module.run_training(options, log=lambda line: print(line, flush=True))
    out = {"first_step_seconds": first[0]}
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
out.update(peak_rss_mb=own, peak_rss_children_mb=children)
print("RESULT " + json.dumps(out), flush=True)
"""


def child(**args: object) -> dict:
    """Run one measurement in a fresh process; its result line."""
    args["launched"] = time.time()
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, env=ENV)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{args['job']} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def measure(size: int, work: Path, tokenizer: str) -> dict:
    data = work / f"corpus-{size}MB.txt"
    if not data.exists():
        make_corpus(data, size)
    row: dict = {"megabytes": size, "file_mb": data.stat().st_size / 1e6}
    for workers in (1, 2):
        cache = work / f"cache-{size}-{workers}"
        shutil.rmtree(cache, ignore_errors=True)
        prepared = child(job="prepare", data=str(data), tokenizer=tokenizer, seq_len=SEQ_LEN, cache=str(cache),
                         workers=workers)  # fmt: skip
        prepared["tokens_per_second"] = prepared["tokens"] / prepared["seconds"]
        prepared["map_tokens_per_second"] = prepared["tokens"] / prepared["meta"]["tokenize_seconds"]
        prepared["cache_mb"] = folder_mb(Path(prepared["folder"]))
        row[f"prepare_{workers}"] = prepared
        shutil.rmtree(cache)
    cache = work / f"cache-{size}-train"
    shutil.rmtree(cache, ignore_errors=True)
    runs = [child(job="train", data=str(data), cache=str(cache), output=str(work / f"run-{size}"), seq_len=SEQ_LEN,
                  vocab=VOCAB, workers=2) for _ in range(2)]  # fmt: skip
    row["first_run"], row["cached_run"] = runs
    shutil.rmtree(cache)
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = (
        "| corpus | tokens | 1 process tok/s: map / all | 2 processes tok/s: map / all | "
        "peak RSS prepare (1 / 2 proc, main+workers) | peak RSS training (cached run) | first step: first run | "
        "first step: cached run | speed-up | cache on disk |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        one, two, first, cached = r["prepare_1"], r["prepare_2"], r["first_run"], r["cached_run"]
        lines.append(
            f"| {r['file_mb']:.0f} MB | {one['tokens'] / 1e6:.1f} M | "
            f"{one['map_tokens_per_second'] / 1e6:.2f} M / "
            f"{one['tokens_per_second'] / 1e6:.2f} M | {two['map_tokens_per_second'] / 1e6:.2f} M / "
            f"{two['tokens_per_second'] / 1e6:.2f} M | {one['peak_rss_mb']:.0f} / {two['peak_rss_mb']:.0f}+"
            f"{two['peak_rss_children_mb']:.0f} MB | {cached['peak_rss_mb']:.0f} MB | "
            f"{first['first_step_seconds']:.1f} s | {cached['first_step_seconds']:.1f} s | "
            f"{first['first_step_seconds'] / cached['first_step_seconds']:.1f}x | {one['cache_mb']:.0f} MB |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[25, 100, 400], help="corpus sizes in MB")
    parser.add_argument("--work", type=Path, default=Path("/tmp/hf-geonorm-data-bench"), help="corpora and caches")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    smallest = args.work / f"corpus-{min(args.sizes)}MB.txt"
    if not smallest.exists():
        make_corpus(smallest, min(args.sizes))
    tokenizer = args.work / "tokenizer.json"  # one tokenizer for every measurement: trained as train does
    if not tokenizer.exists():
        from hf_geonorm.training.corpus import resolve_corpus
        from hf_geonorm.training.tokenizer import TOKENIZER_SAMPLE_CHARS, train_tokenizer

        sample, chars = [], 0
        for doc in resolve_corpus(str(smallest)).all_documents():
            sample.append(doc)
            chars += len(doc)
            if chars >= TOKENIZER_SAMPLE_CHARS:
                break
        train_tokenizer(sample, VOCAB).backend_tokenizer.save(str(tokenizer))
    start = time.perf_counter()
    rows = [measure(size, args.work, str(tokenizer)) for size in args.sizes]
    payload = {"seq_len": SEQ_LEN, "vocab": VOCAB, "cpus": os.cpu_count(), "seconds": time.perf_counter() - start,
               "rows": rows}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "data_pipeline.json").write_text(json.dumps(payload, indent=1))
    (args.out / "data_pipeline.md").write_text(
        "# Data pipeline: tokenization, memory, time to the first step\n\n"
        f"`python benchmarks/data_pipeline.py` on {os.cpu_count()} CPUs, {payload['seconds'] / 60:.0f} minutes. "
        "Corpora: the Python standard library's `.py` files concatenated (each after a header line) and repeated "
        f"to size. Byte-level BPE of {VOCAB} tokens, blocks of {SEQ_LEN}; one tokenizer thread per process.\n\n"
        "- 1 / 2 processes: map: the `Dataset.map` tokenization alone; all: `prepare_blocks` from start to end (read "
        "the file into documents, tokenize, pack, write the Arrow cache);\n"
        "- peak RSS training: the cached run (tiny model, 3 steps of 8 blocks) from start to end;\n"
        "- first step: wall time from process start to the first training step; the first run trains the "
        "tokenizer (20 MB sample) and builds the cache with 2 processes, the second finds both cached.\n\n"
        + table(rows)
    )
    print(table(rows))


if __name__ == "__main__":
    main()
