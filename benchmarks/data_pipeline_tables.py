"""The targets and tables of benchmarks/data_pipeline.py: issue 29's targets, each marked met or missed with its
measured figure and, for a miss, where the time or the memory went; and the measurements behind them."""

from __future__ import annotations

from typing import Any

THROUGHPUT_RATIO = 0.85  # preparation with one process against the raw tokenizer with one thread
MEMORY_MB = 1500  # peak memory of preparation: 1.5 GB
TWO_PROCESSES_FROM_MB = 100  # two processes faster than one from this size up
SHAPE_NAMES = {"file": "one plain file", "folder": "many small files"}
MEMORY_RUNS = {"given-1": "tokenizer given, 1 process", "given-2": "tokenizer given, 2 processes",
               "trained-1": "tokenizer trained on the fly, 1 process"}  # fmt: skip


def rate(tokens_per_second: float) -> str:
    return f"{tokens_per_second / 1e3:,.0f}k tokens/s"


def cpu_rate(run: dict[str, Any]) -> float:
    """Tokens per second of CPU time (of the process and its workers): what a busy machine changes least."""
    return run["tokens"] / run["cpu_seconds"]


def peak_mb(run: dict[str, Any]) -> float:
    """A run's peak memory: ``getrusage``'s peak RSS of its process, plus each worker's at the largest worker's
    (a bound: the pages a forked worker shares with the process count once in each, and the peaks need not
    coincide)."""
    return run["peak_rss_mb"] + (run["workers"] * run["peak_worker_rss_mb"] if run["workers"] > 1 else 0.0)


def throughput_cause(one: dict[str, Any], raw: dict[str, Any]) -> str:
    """Where a one-process preparation's time went besides the tokenizer, and the tokenizer's own rate there."""
    meta, total = one["meta"], one["seconds"]
    stages = {"hashing the files": one["resolve_seconds"], "the held-out split": meta.get("split_seconds", 0.0),
              "reading the documents": meta["read_seconds"], "packing and writing": meta["pack_seconds"]}  # fmt: skip
    rest = total - sum(stages.values()) - meta["tokenize_seconds"]
    split = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in (*stages.items(), ("the rest", rest)))
    inside = one["tokens"] / meta["tokenize_seconds"]
    return (f"{1 - meta['tokenize_seconds'] / total:.0%} of the {total:.0f} s outside the tokenizer ({split}); "
            f"the tokenizer's calls alone: {rate(inside)}, {inside / raw['tokens_per_second']:.2f}x the raw")


def targets(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target at each shape and size measured: what, where, the figure, met (True, False, or None where the
    target does not apply) and, for a miss, its cause."""
    rows, runs = [], payload["measurements"]
    for size in payload["args"]["sizes"]:
        for shape in payload["args"]["shapes"]:
            got = {job: runs.get(f"{shape}-{size}-{job}") for job in ("raw", *MEMORY_RUNS)}
            where = {"corpus": f"{SHAPE_NAMES[shape]}, {size} MB", "shape": shape, "megabytes": size}
            raw, one, two = got["raw"], got["given-1"], got["given-2"]
            if raw and one:
                ratio = one["tokens_per_second"] / raw["tokens_per_second"]
                met = ratio >= THROUGHPUT_RATIO
                rows.append({**where, "target": f"throughput at least {THROUGHPUT_RATIO}x the raw tokenizer's "
                             "(1 process, 1 thread)", "value": ratio, "met": met,
                             "measured": f"{ratio:.2f}x ({rate(one['tokens_per_second'])} against "
                             f"{rate(raw['tokens_per_second'])})",
                             "cause": "" if met else throughput_cause(one, raw)})  # fmt: skip
            for job, label in MEMORY_RUNS.items():
                if got[job] is None:
                    continue
                run, peak = got[job], peak_mb(got[job])
                each = f" ({run['peak_rss_mb']:,.0f} + {run['workers']} x {run['peak_worker_rss_mb']:,.0f})"
                rows.append({**where, "target": f"peak memory of preparation under 1.5 GB, {label}", "value": peak,
                             "met": peak < MEMORY_MB, "cause": "",
                             "measured": f"{peak:,.0f} MB{each if run['workers'] > 1 else ''}"})  # fmt: skip
            if one and two:
                speed = two["tokens_per_second"] / one["tokens_per_second"]
                met = speed > 1 if size >= TWO_PROCESSES_FROM_MB else None
                load = (f"{len(payload['cpus'])} CPUs; load average {two['load_before']:.1f} before the 2-process "
                        f"run, {two['load_after']:.1f} after")  # fmt: skip
                rows.append({**where, "target": "2 processes faster than 1", "value": speed, "met": met,
                             "measured": f"{speed:.2f}x ({rate(two['tokens_per_second'])} against "
                             f"{rate(one['tokens_per_second'])})", "cause": load if met is False else ""})  # fmt: skip
    return rows


def mark(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: f"not a target below {TWO_PROCESSES_FROM_MB} MB"}[met]


def measurement_row(runs: dict[str, Any], shape: str, size: int) -> str:
    got = {job: runs.get(f"{shape}-{size}-{job}") for job in ("raw", *MEMORY_RUNS)}
    if None in got.values():
        return f"| {SHAPE_NAMES[shape]}, {size} MB | not measured yet |" + " |" * 13
    raw, one, two, trained = got.values()
    meta = one["meta"]
    split = " / ".join(f"{seconds:.1f}" for seconds in (one["resolve_seconds"], meta.get("split_seconds", 0.0),
                                                          meta["read_seconds"], meta["tokenize_seconds"],
                                                          meta["pack_seconds"]))  # fmt: skip
    return (
        f"| {SHAPE_NAMES[shape]}, {size} MB | {meta['documents']:,} | {one['tokens'] / 1e6:,.1f} M | "
        f"{rate(raw['tokens_per_second'])} ({raw['chars'] / 1e6:.0f} MB) | {rate(raw['fast_tokens_per_second'])} | "
        f"{rate(one['tokens_per_second'])} | {one['tokens_per_second'] / raw['fast_tokens_per_second']:.2f}x | "
        f"{rate(two['tokens_per_second'])} | {cpu_rate(one) / cpu_rate(raw):.2f}x | "
        f"{rate(trained['tokens_per_second'])} "
        f"({trained['tokenizer_seconds']:.0f} s training) | {one['seconds']:.1f} s: {split} | "
        f"{one['peak_rss_mb']:,.0f} MB | {two['peak_rss_mb']:,.0f} + {two['peak_worker_rss_mb']:,.0f} MB | "
        f"{trained['peak_rss_mb']:,.0f} MB | {one['cache_mb']:,.0f} MB |"
    )


def markdown(payload: dict[str, Any]) -> str:
    """The Markdown record of a run: how it was measured, the targets, the measurements."""
    args, env = payload["args"], payload["environment"]
    sizes = " ".join(map(str, args["sizes"]))
    loads = [run[key] for run in payload["measurements"].values() for key in ("load_before", "load_after")]
    cpus = len(payload["cpus"])
    lines = [
        "# Data pipeline: preparation against the raw tokenizer",
        "",
        f"Written by `python benchmarks/data_pipeline.py --sizes {sizes}` ({env['date']}, {cpus} CPU"
        f"{'s' if cpus > 1 else ''}, tokenizers {payload['tokenizers']}, {payload['wall_seconds'] / 60:.0f} minutes "
        f"of measurements, the machine's load average from {min(loads, default=0):.1f} to "
        f"{max(loads, default=0):.1f}); every figure below is that run's.",
        "",
        "- corpora: *one plain file*: every non-blank line of the Python standard library's `.py` files, one line a "
        "line, no blank line, repeated to size; *many small files*: those files as they are, copied to size;",
        f"- raw: the `tokenizers` tokenizer's `encode_batch` on pieces of {payload['piece_lines']} lines of the same "
        f"text, {payload['raw_batch']:,} pieces a call, each encoding's ids read; the calls alone timed, over the "
        f"first {args['raw_mb']} MB (the targets' measure); raw, no offsets: `encode_batch_fast` on the same pieces, "
        "the call the pipeline makes (it needs no character offsets), to show what the pipeline adds;",
        "- 1 / 2 processes: preparation with the tokenizer given (byte-level BPE of "
        f"{payload['vocab']:,} tokens trained as train trains one), `--data-workers` 1 and 2, timed from start to "
        f"end: hashing the files, reading the documents, tokenizing, packing blocks of {payload['seq_len']}, "
        "writing and checksumming the cache; trained: the same with the tokenizer trained on the fly first (its 20 "
        "MB sample), one process;",
        "- one tokenizer thread per process (`TOKENIZERS_PARALLELISM=false`); peak memory: `getrusage`'s peak RSS "
        "of the process; for two processes, of the process plus twice that of its largest worker (a bound: it "
        "counts the pages a forked worker shares with the process in each, and the peaks need not coincide);",
        "- on CPU time: the same ratio with the CPU time of the process and its workers (the raw calls' own) for the "
        "wall clock, which a busy machine changes least.",
        "",
        "## Targets",
        "",
        "| target | corpus | measured | | cause of a miss |",
        "|---|---|---|---|---|",
        *(f"| {t['target']} | {t['corpus']} | {t['measured']} | {mark(t['met'])} | {t['cause']} |"
          for t in payload["targets"]),  # fmt: skip
        "",
        "## Measurements",
        "",
        "| corpus | documents | tokens | raw | raw, no offsets | 1 process | 1 process / raw, no offsets | "
        "2 processes | 1 process / raw, on CPU time | trained, 1 process | 1 process: seconds, hash / held-out split / "
        "read / tokenize / pack | peak RSS, 1 process | 2 processes: process + largest worker | trained: peak RSS | "
        "cache |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(measurement_row(payload["measurements"], shape, size) for size in args["sizes"] for shape in args["shapes"]),
        "",
    ]
    return "\n".join(lines)
