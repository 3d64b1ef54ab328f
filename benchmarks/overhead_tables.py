"""The table of benchmarks/overhead.py: each architecture and mode's step time, wall time and peak memory per
style against the stock model's, and the targets they are read against."""

from __future__ import annotations

CLOCKS = {
    "thread": "CPU time of the stepping thread (time.thread_time; with one torch thread the whole step runs on it, "
    "so time the machine spends on other processes does not count)",
    "wall": "wall-clock time (time.perf_counter, after torch.cuda.synchronize on CUDA)",
}
GEONORM_TARGETS = {"cpu_compiled": 1.03, "cuda_fused": 1.02, "memory": 1.02}



def markdown(result: dict) -> str:
    """The Markdown record of one run's ``result`` (what overhead.py writes beside its JSON)."""
    m, a = result["machine"], result["args"]
    lines = [
        f"# GeoNorm overhead: {result['device']}{' (quick)' if a['quick'] else ''}",
        "",
        "Written by `benchmarks/overhead.py`; every number below was measured by that run.",
        "",
        f"- torch {m['torch']}, transformers {m['transformers']}, triton {m['triton']}, "
        f"{m.get('gpu') or m['platform']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads",
        f"- sizes: {result['size']}; {a['repeats']} timed rounds after {a['warmup']} warm-up step(s), interleaved;"
        " times are medians",
        f"- `step ms` / `time`: {CLOCKS[a['clock']]}; `wall ms` / `wall`: wall-clock time, beside it",
        f"- one step: forward + loss + backward + AdamW step{', bf16 autocast' if result['device'] == 'cuda' else ''}",
        f"- peak memory: {result['memory_method']}",
        f"- the fused update of `geo` ran as: {result['fused_backend_geo']}",
        "- `time`: median over rounds of the step time / the stock Pre-Norm model's (`stock`) step time in the same "
        "round and mode; `time (minima)`: fastest step / stock's fastest; `memory`: peak / stock's peak; `geo` has "
        "the fused update on, `geo_unfused` off",
        f"- targets (issue 6): GeoNorm/Pre-Norm step time <= {GEONORM_TARGETS['cpu_compiled']} on CPU compiled, "
        f"<= {GEONORM_TARGETS['cuda_fused']} on GPU fused; peak memory <= {GEONORM_TARGETS['memory']}",
        "",
    ]
    for arch, modes in result["results"].items():
        for mode, block in modes.items():
            lines += [
                f"## {arch}, {mode} (load average before/after: {block['load_average_before']} / "
                f"{block['load_average_after']})",
                "",
                "| style | step ms (median) | IQR | time | time (minima) | wall ms | wall | peak MiB | memory "
                "| first call s |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for name, r in block["rows"].items():
                lines.append(
                    f"| {name} | {r['step_ms']:.1f} | {r['step_ms_iqr'][0]:.1f}-{r['step_ms_iqr'][1]:.1f} | "
                    f"{r['time_ratio']:.3f} | {r['time_ratio_of_minima']:.3f} | {r['wall_ms']:.1f} | "
                    f"{r['wall_ratio']:.3f} | {r['peak_mib']:.1f} | "
                    f"{r['memory_ratio']:.4f} | {r['first_call_s']:.1f} |"
                )
            if result["device"] == "cpu":
                steps = ", ".join(f"{n} {r['step_memory_ratio']:.4f}" for n, r in block["rows"].items())
                lines += ["", f"Step-only memory high-water mark, ratio to stock: {steps}"]
            if "update_op_ms" in block:
                ops = block["update_op_ms"]
                lines += [
                    "",
                    f"One residual update alone, forward + backward on the [batch*seq, hidden] state, per call: "
                    f"x + u {ops['add']:.3f} ms, GeoNorm fused {ops['geo']:.3f} ms, GeoNorm unfused "
                    f"{ops['geo_unfused']:.3f} ms. With {2 * result['size']['layers']} updates per step, the fused "
                    f"GeoNorm step time estimated from these: {block['estimated_geo_time_ratio']:.4f} x stock.",
                ]
            lines.append("")
    return "\n".join(lines)
