"""Preparing ``hf-geonorm train``'s data (hf_geonorm.training: corpus, tokenizer, token_batches, pipeline) against the
raw ``tokenizers`` tokenizer, on the two shapes of corpus of issue 29, at the sizes of ``--sizes`` (MB of text):

- ``file``: one plain text file of one line a line and no blank line: every non-blank line of the Python standard
  library's ``.py`` files (sorted by path), each file after a header line naming it, repeated with the copy's number
  in the headers until the size is reached;
- ``folder``: many small files: the standard library's ``.py`` files as they are, copied into numbered folders
  until the size is reached.

For each shape and size, each measurement in a child process of its own:

- ``raw``: the tokenizer's ``encode_batch`` on pieces of 20 lines of the same text (no piece across two files),
  1,000 pieces a call, reading each encoding's ids; only the calls are timed, over the first ``--raw-mb`` MB; and
  ``encode_batch_fast`` (no offsets, what the pipeline calls) on the same pieces, timed apart;
- ``given-1`` / ``given-2``: preparation with the tokenizer given, ``--data-workers`` 1 and 2: ``resolve_corpus``
  (listing and hashing the files) and ``prepare_blocks`` (reading the documents, tokenizing, packing, writing and
  checksumming the cache), timed from start to end;
- ``trained-1``: the same with the tokenizer trained on the fly first (``corpus_tokenizer``, its 20 MB sample),
  one process.

Peak memory: ``getrusage``'s peak RSS of the child and of its largest worker; for two processes, the child's
and twice its largest worker's (a bound: it counts the pages a forked worker shares with the child once in each
process, and the peaks need not coincide). Tokenizers run with
``TOKENIZERS_PARALLELISM=false``: one thread per process, so that "per process" means what it says. The given
tokenizer is trained once as train trains one (the first 20 MB of the smallest folder corpus, 2,048 tokens).

Results: ``--out``/data_pipeline.md and .json, the issue's targets marked met or missed
(``data_pipeline_tables.py``). Each measurement is journaled in ``--work``/journal.json as it ends, so a run cut
short resumes at the next one (remove the journal to measure again).

    python benchmarks/data_pipeline.py --sizes 100 1000   # the results file: writes benchmarks/results
    python benchmarks/data_pipeline.py --sizes 20 --work /tmp/bench20 --out /tmp/bench20/results   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_pipeline_tables import markdown, targets  # noqa: E402
from reports import environment, write_json  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SHAPES = ("file", "folder")
JOBS = ("raw", "given-1", "given-2", "trained-1")
SEQ_LEN, VOCAB, EVAL_BLOCKS = 128, 2048, 64
PIECE_LINES, RAW_BATCH = 20, 1000
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def stdlib_sources() -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))


def source_text(path: Path) -> str:
    """A source file's text, NUL bytes dropped (a file that holds one would be taken for binary)."""
    return path.read_text(encoding="utf-8", errors="replace").replace("\0", "")


def make_corpus(shape: str, megabytes: int, work: Path) -> Path:
    """The corpus of ``shape`` of ``megabytes`` MB under ``work``, written once (under a temporary name, then moved
    into place, so that a run cut short never leaves one half written)."""
    path = work / (f"file-{megabytes}MB.txt" if shape == "file" else f"folder-{megabytes}MB")
    if path.exists():
        return path
    partial = path.with_name(path.name + ".partial")
    if partial.is_dir():
        shutil.rmtree(partial)
    partial.unlink(missing_ok=True)
    files, target, written = stdlib_sources(), megabytes * 1_000_000, 0
    copies = ((copy, number, source) for copy in itertools.count(1) for number, source in enumerate(files))
    if shape == "folder":
        partial.mkdir()
    with open(partial, "w", encoding="utf-8") if shape == "file" else contextlib.nullcontext() as out:
        for copy, number, source in copies:
            text = source_text(source)
            if shape == "file":
                lines = "".join(line + "\n" for line in text.splitlines() if line.strip())
                written += out.write(f"# ==== copy {copy}: {source.name} ====\n{lines}")
            elif text.strip():
                folder = partial / f"copy-{copy:03d}"
                folder.mkdir(exist_ok=True)
                written += (folder / f"{number:05d}-{source.name}").write_text(text, encoding="utf-8")
            if written >= target:
                break
    partial.rename(path)
    return path


def given_tokenizer(work: Path, megabytes: int) -> Path:
    """The tokenizer of the ``given`` runs, trained once as train trains one: on the first 20 MB of the documents
    of the folder corpus of ``megabytes`` MB."""
    path = work / "tokenizer.json"
    if not path.exists():
        from hf_geonorm.training.data.corpus import resolve_corpus
        from hf_geonorm.training.data.tokenizer import TOKENIZER_SAMPLE_CHARS, train_tokenizer

        sample, chars = [], 0
        for doc in resolve_corpus(str(make_corpus("folder", megabytes, work))).all_documents():
            sample.append(doc)
            chars += len(doc)
            if chars >= TOKENIZER_SAMPLE_CHARS:
                break
        train_tokenizer(sample, VOCAB).backend_tokenizer.save(str(path))
    return path


def line_pieces(files: list[str]) -> Iterator[str]:
    """The files' text in pieces of ``PIECE_LINES`` lines, none across two files."""
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            while piece := "".join(itertools.islice(f, PIECE_LINES)):
                yield piece


def raw_throughput(spec: dict[str, Any]) -> dict[str, Any]:
    """The raw tokenizer's ``encode_batch`` on short pieces of the corpus's text: tokens, characters, seconds."""
    from tokenizers import Tokenizer

    from hf_geonorm.training.data.corpus import resolve_corpus

    tokenizer = Tokenizer.from_file(spec["tokenizer"])
    pieces = line_pieces([path for _, path in resolve_corpus(spec["data"]).shards])
    tokens = chars = fast_tokens = 0
    seconds = cpu_seconds = fast_seconds = 0.0
    while chars < spec["raw_chars"] and (batch := list(itertools.islice(pieces, RAW_BATCH))):
        start, cpu = time.perf_counter(), time.process_time()
        tokens += sum(len(encoding.ids) for encoding in tokenizer.encode_batch(batch, add_special_tokens=False))
        seconds += time.perf_counter() - start
        cpu_seconds += time.process_time() - cpu
        start = time.perf_counter()
        fast_tokens += sum(len(e.ids) for e in tokenizer.encode_batch_fast(batch, add_special_tokens=False))
        fast_seconds += time.perf_counter() - start
        chars += sum(map(len, batch))
    return {"tokens": tokens, "chars": chars, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "fast_tokens_per_second": fast_tokens / fast_seconds}  # fmt: skip


def cpu_time() -> float:
    """The CPU time of this process and of its children that ended."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def preparation(spec: dict[str, Any]) -> dict[str, Any]:
    """What ``hf-geonorm train`` does before its model: the corpus resolved (its files hashed), the tokenizer given
    or trained on the fly, the blocks built into an empty cache."""
    from hf_geonorm.training.data.corpus import resolve_corpus
    from hf_geonorm.training.data.pipeline import prepare_blocks
    from hf_geonorm.training.data.tokenizer import corpus_tokenizer, fast_tokenizer
    from hf_geonorm.training.options import HELD_OUT_RULE

    cache = Path(spec["cache"])
    start, cpu = time.perf_counter(), cpu_time()
    corpus = resolve_corpus(spec["data"])
    resolved = time.perf_counter()
    if spec["tokenizer"] is not None:
        tokenizer = fast_tokenizer(spec["tokenizer"])
    else:
        tokenizer = corpus_tokenizer(corpus, VOCAB, cache, True, lambda line: None, HELD_OUT_RULE)
    ready = time.perf_counter()
    prepared = prepare_blocks(corpus, tokenizer, SEQ_LEN, cache, EVAL_BLOCKS, spec["workers"])
    end = time.perf_counter()
    return {
        "seconds": end - start, "cpu_seconds": cpu_time() - cpu, "resolve_seconds": resolved - start,
        "tokenizer_seconds": ready - resolved,
        "build_seconds": end - ready, "meta": {k: v for k, v in prepared.meta.items() if k != "files"},
        "tokens": prepared.meta["tokens"], "cache_mb": sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
        / 1e6,
    }  # fmt: skip


def child(spec: dict[str, Any]) -> None:
    """One measurement, in this process: its result and its peak RSS (and its largest worker's) on one line."""
    import resource

    out = raw_throughput(spec) if spec["job"] == "raw" else preparation(spec)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6
    out["peak_worker_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e6
    print("RESULT " + json.dumps(out), flush=True)


def measure(job: str, data: Path, tokenizer: Path, work: Path, raw_mb: int) -> dict[str, Any]:
    """Run ``job`` on ``data`` in a child process of its own; its result, with the machine's load average before
    and after."""
    cache = work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    spec = {"job": job, "data": str(data), "cache": str(cache), "raw_chars": raw_mb * 1_000_000,
            "tokenizer": None if job.startswith("trained") else str(tokenizer),
            "workers": int(job.partition("-")[2] or 1)}  # fmt: skip
    load, started = os.getloadavg()[0], time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          env=ENV)  # fmt: skip
    shutil.rmtree(cache, ignore_errors=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{job} on {data} failed:\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    result.update(workers=spec["workers"], wall_seconds=time.perf_counter() - started, load_before=load,
                  load_after=os.getloadavg()[0], tokens_per_second=result["tokens"] / result["seconds"])  # fmt: skip
    return result


def write(args: argparse.Namespace, journal: dict[str, Any], wall: float) -> None:
    import tokenizers

    payload = {
        "args": {"sizes": args.sizes, "shapes": args.shapes, "raw_mb": args.raw_mb}, "environment": environment(),
        "tokenizers": tokenizers.__version__,
        "cpus": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "seq_len": SEQ_LEN, "vocab": VOCAB, "piece_lines": PIECE_LINES, "raw_batch": RAW_BATCH,
        "wall_seconds": wall, "measurements": journal,
    }  # fmt: skip
    payload["targets"] = targets(payload)
    write_json(args.out / "data_pipeline.json", payload)
    (args.out / "data_pipeline.md").write_text(markdown(payload), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000], help="corpus sizes in MB")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--raw-mb", type=int, default=100, help="the raw tokenizer reads at most this much text")
    parser.add_argument("--work", type=Path, default=Path("/tmp/hf-geonorm-data-pipeline"), help="corpora, journal")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(json.loads(args.child))
    args.work.mkdir(parents=True, exist_ok=True)
    journal_path = args.work / "journal.json"
    journal = json.loads(journal_path.read_text()) if journal_path.exists() else {}
    tokenizer = given_tokenizer(args.work, min(args.sizes))
    start = time.perf_counter() - sum(m["wall_seconds"] for m in journal.values())
    for size, shape in itertools.product(args.sizes, args.shapes):
        data = make_corpus(shape, size, args.work)
        for job in JOBS:
            key = f"{shape}-{size}-{job}"
            if key in journal:
                continue
            print(f"{key} ...", flush=True)
            journal[key] = {"shape": shape, "megabytes": size, "job": job,
                            **measure(job, data, tokenizer, args.work, args.raw_mb)}  # fmt: skip
            journal_path.write_text(json.dumps(journal, indent=1))
            print(f"{key}: {journal[key]['tokens_per_second'] / 1e3:.0f}k tokens/s, peak RSS "
                  f"{journal[key]['peak_rss_mb']:.0f} MB", flush=True)  # fmt: skip
            write(args, journal, time.perf_counter() - start)
    write(args, journal, time.perf_counter() - start)
    print((args.out / "data_pipeline.md").read_text())


if __name__ == "__main__":
    main()
