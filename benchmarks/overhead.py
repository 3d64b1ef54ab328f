"""Training-step time and peak memory of every residual style relative to the stock Pre-Norm model.

For a small GPT-2 and a small LLaMA (sizes where the sublayer matmuls dominate, as in real models) the script
times one training step (forward, loss, backward, AdamW step, zero_grad) of:

    stock        the stock transformers model (Pre-Norm): the reference of every ratio
    pre          the GeoNorm class with norm_style="pre" (the same maths through the plugin's layer)
    post, sandwich, deepnorm
    geo          GeoNorm, default settings, the fused update on (Triton kernel on CUDA in eager mode; its torch
                 twin on CPU and under torch.compile)
    geo_unfused  the same GeoNorm model with the fused update off (``set_fused_enabled(False)``: the composed
                 autograd path)

each eager and under ``torch.compile`` (the whole model; the AdamW step stays eager). All configurations of
one architecture are built up front and timed interleaved, round after round (the order shuffled each round
with a fixed seed), after warm-up, so a change of machine load hits all of them alike; the reported time is
the median over rounds. ``time_ratio`` = the median over rounds of (step time / the stock model's step time
in the same round).

Peak memory:
- CUDA: ``torch.cuda.max_memory_allocated`` over a step (reset before it).
- CPU: torch has no allocator statistics on CPU; one extra (untimed) step per configuration runs under
  ``torch.profiler`` with ``profile_memory=True``, and the live bytes are followed through the step from
  every allocation and free it records (ops' own allocations and the frees between ops, in time order). The
  peak is that high-water mark plus what is resident when the step begins (parameters, AdamW state); the
  step-only high-water mark (activations, gradients, temporaries) is reported beside it.

Writes ``overhead_<device>.json`` and ``.md`` (``overhead_<device>_quick.*`` with ``--quick``) to
``--out`` (default benchmarks/results), after each architecture and mode, so a run cut short keeps what it
measured. Everything in those files is measured by this script.

    python benchmarks/overhead.py                 # CPU, a few minutes on 2 cores
    python benchmarks/overhead.py --quick         # CPU smoke run
    python benchmarks/overhead.py --device cuda   # GPU (bf16 autocast), see benchmarks/gpu_check.sh
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

import hf_geonorm
from hf_geonorm.modeling import fused

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead_tables import CLOCKS, markdown  # noqa: E402

STYLES = ("stock", "pre", "post", "sandwich", "deepnorm", "geo", "geo_unfused")
# width, layers, heads, sequence length, batch, vocabulary. On the CPU two layers keep compile times short; the
# vocabulary is chosen so the output head is about a quarter of the matmul work, as in GPT-2 small (12 layers,
# 50k vocabulary), so the share of the residual updates in a step is a realistic one.
SIZES = {
    ("cpu", False): dict(hidden=512, layers=2, heads=8, seq=256, batch=4, vocab=4096),
    ("cpu", True): dict(hidden=256, layers=2, heads=4, seq=128, batch=4, vocab=2048),
    ("cuda", False): dict(hidden=1024, layers=8, heads=16, seq=1024, batch=8, vocab=32000),
    ("cuda", True): dict(hidden=768, layers=4, heads=12, seq=512, batch=8, vocab=32000),
}


def stock_config(arch: str, size: dict):
    h = size["hidden"]
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=size["vocab"], n_positions=size["seq"], n_embd=h, n_layer=size["layers"],
            n_head=size["heads"], n_inner=4 * h, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
    return LlamaConfig(
        vocab_size=size["vocab"], hidden_size=h, intermediate_size=(8 * h // 3 + 63) // 64 * 64,
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"], num_key_value_heads=size["heads"],
        max_position_embeddings=size["seq"], tie_word_embeddings=False,
    )  # fmt: skip


def build(arch: str, style: str, size: dict, device: str) -> torch.nn.Module:
    """The model of one configuration; every style starts from the same stock weights (seed 0)."""
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs (initialising on the CPU first is slow for GPU sizes)
        model = AutoModelForCausalLM.from_config(stock_config(arch, size), attn_implementation="sdpa")
        if style != "stock":
            model = hf_geonorm.convert(model, norm_style="geo" if style == "geo_unfused" else style)
    # transformers infers the loss from the class name and warns (a graph break) on GPT-2's LMHeadModel
    # naming, stock and GeoNorm alike; naming the loss removes that break from every configuration.
    model.loss_type = "ForCausalLM"
    return model.to(device).train()


class Config:
    def __init__(self, arch: str, style: str, size: dict, device: str, compiled: bool, amp: bool):
        self.style, self.device, self.amp = style, device, amp
        self.model = build(arch, style, size, device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, foreach=True)
        self.forward = torch.compile(self.model) if compiled else self.model
        self.fused = style != "geo_unfused"
        self.wall_times: list[float] = []
        self.cpu_times: list[float] = []
        self.peaks: list[int] = []

    def step(self, ids: torch.Tensor) -> float:
        fused.set_fused_enabled(self.fused)
        try:
            amp = torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else contextlib.nullcontext()
            with amp:
                loss = self.forward(input_ids=ids, labels=ids).loss
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        finally:
            fused.set_fused_enabled(True)
        return float(loss.detach())


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_step(cfg: Config, ids: torch.Tensor) -> None:
    sync(cfg.device)
    if cfg.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    cpu0, t0 = time.thread_time(), time.perf_counter()
    cfg.step(ids)
    sync(cfg.device)
    cfg.wall_times.append(time.perf_counter() - t0)
    cfg.cpu_times.append(time.thread_time() - cpu0)
    if cfg.device == "cuda":
        cfg.peaks.append(torch.cuda.max_memory_allocated())


def resident_bytes(cfg: Config) -> int:
    tensors = list(cfg.model.parameters()) + list(cfg.model.buffers())
    for state in cfg.optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def cpu_peak_bytes(cfg: Config, ids: torch.Tensor) -> tuple[int, int]:
    """(resident at step start + step high-water mark, step high-water mark) from the profiler's records."""
    from torch.profiler import ProfilerActivity, profile

    resident = resident_bytes(cfg)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        cfg.step(ids)
    events = sorted(
        (e.time_range.start, e.self_cpu_memory_usage) for e in prof.events() if e.self_cpu_memory_usage
    )
    live = high = 0
    for _, delta in events:
        live += delta
        high = max(high, live)
    return resident + high, high


def update_op_costs(size: dict, args, compiled: bool) -> dict:
    """Forward + backward of one residual update alone on a [batch*seq, hidden] state, per call in ms: the
    Pre-Norm add x + u, the GeoNorm step with the fused update (default) and without (composed path). A
    low-noise view of what the updates add to a step (the step-level ratios above carry the machine's noise).
    On CUDA the state is float32 and the update bfloat16, as under autocast."""
    from hf_geonorm import geodesic_step

    device, rows = args.device, size["batch"] * size["seq"]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, size["hidden"], generator=g).to(device).requires_grad_(True)
    u_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    u = (0.3 * torch.randn(rows, size["hidden"], generator=g)).to(device, u_dtype).requires_grad_(True)
    grad = torch.randn(rows, size["hidden"], generator=g).to(device)
    ops = {"add": lambda a, b: a + b, "geo": lambda a, b: geodesic_step(a, b, 0.5)}
    funcs = {"add": ops["add"], "geo": ops["geo"], "geo_unfused": ops["geo"]}
    if compiled:
        funcs = {name: torch.compile(fn, fullgraph=True) for name, fn in funcs.items()}
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name in funcs}
    for rep in range(33):
        for name, fn in funcs.items():
            fused.set_fused_enabled(name != "geo_unfused")
            if name == "geo_unfused" and compiled and rep == 0:
                torch._dynamo.reset()  # the switch is read while tracing
            x.grad = u.grad = None
            sync(device)
            t0 = clock()
            fn(x, u).backward(grad)
            sync(device)
            if rep >= 3:  # warm-up (and compilation)
                times[name].append(clock() - t0)
            fused.set_fused_enabled(True)
    return {name: round(1e3 * statistics.median(v), 4) for name, v in times.items()}


def machine() -> dict:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def run_arch(arch: str, styles: list[str], size: dict, args, compiled: bool) -> dict:
    device = args.device
    torch._dynamo.reset()
    configs = {s: Config(arch, s, size, device, compiled, args.device == "cuda") for s in styles}
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, size["vocab"], (size["batch"], size["seq"]), generator=g).to(device)
    losses, compile_s = {}, {}
    for name, cfg in configs.items():  # warm-up (the first compiled call compiles)
        t0 = time.perf_counter()
        losses[name] = cfg.step(ids)
        compile_s[name] = round(time.perf_counter() - t0, 2)
        for _ in range(args.warmup - 1):
            cfg.step(ids)
    order = list(configs)
    rng = random.Random(0)
    load_before = load_average()
    for _ in range(args.repeats):
        rng.shuffle(order)
        for name in order:
            timed_step(configs[name], ids)
    load_after = load_average()
    if device == "cpu":
        for cfg in configs.values():
            total, step_only = cpu_peak_bytes(cfg, ids)
            cfg.peaks, cfg.step_peaks = [total], [step_only]
    ref = configs.get("stock") or next(iter(configs.values()))
    clock = (lambda c: c.cpu_times) if args.clock == "thread" else (lambda c: c.wall_times)
    ref_time, ref_peak = statistics.median(clock(ref)), max(ref.peaks)
    rows = {}
    for name, cfg in configs.items():
        times = clock(cfg)
        t, wall, peak = statistics.median(times), statistics.median(cfg.wall_times), max(cfg.peaks)
        q = statistics.quantiles(times, n=4) if len(times) >= 2 else [t, t, t]
        # each round times every configuration once: the ratio is the median of the per-round ratios
        paired = statistics.median(a / b for a, b in zip(times, clock(ref), strict=True))
        paired_wall = statistics.median(a / b for a, b in zip(cfg.wall_times, ref.wall_times, strict=True))
        row = {
            "step_ms": round(1e3 * t, 3),
            "step_ms_iqr": [round(1e3 * q[0], 3), round(1e3 * q[2], 3)],
            "step_ms_min": round(1e3 * min(times), 3),
            "time_ratio": round(paired, 4),
            "time_ratio_of_medians": round(t / ref_time, 4),
            "time_ratio_of_minima": round(min(times) / min(clock(ref)), 4),
            "wall_ms": round(1e3 * wall, 3),
            "wall_ratio": round(paired_wall, 4),
            "peak_mib": round(peak / 2**20, 2),
            "memory_ratio": round(peak / ref_peak, 4),
            "first_call_s": compile_s[name],
            "first_loss": round(losses[name], 4),
        }
        if device == "cpu":
            ref_step = max(ref.step_peaks)
            row["step_peak_mib"] = round(max(cfg.step_peaks) / 2**20, 2)
            row["step_memory_ratio"] = round(max(cfg.step_peaks) / ref_step, 4)
        rows[name] = row
    return {"rows": rows, "load_average_before": load_before, "load_average_after": load_after}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="smaller models, fewer rounds")
    parser.add_argument("--archs", default="gpt2,llama")
    parser.add_argument("--styles", default=",".join(STYLES))
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument(
        "--compiled-styles",
        default=None,
        help="styles to compile (default: --styles but pre; quick: stock,geo,geo_unfused)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 11, quick 3; cuda 20/10)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps per configuration (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: cpu 1)")
    parser.add_argument(
        "--clock", choices=tuple(CLOCKS), default=None, help="what `time` measures (default: cpu thread, cuda wall)"
    )
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--name", default=None, help="file stem (default overhead_<device>[_quick])")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA device")
    gpu = args.device == "cuda"
    args.threads = args.threads or (None if gpu else 1)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.clock = args.clock or ("wall" if gpu else "thread")
    args.repeats = args.repeats or ((10 if args.quick else 20) if gpu else (3 if args.quick else 11))
    args.warmup = args.warmup or (3 if gpu else 2)
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 512
    size = SIZES[(args.device, args.quick)]
    styles = [s for s in args.styles.split(",") if s]
    if "stock" not in styles:
        styles.insert(0, "stock")
    # compiled: "pre" (the same maths as "stock" through the plugin's layer) only when asked, compiles are slow
    default_compiled = "stock,geo,geo_unfused" if args.quick else ",".join(s for s in styles if s != "pre")
    compiled_styles = [s for s in (args.compiled_styles or default_compiled).split(",") if s]
    if "stock" not in compiled_styles:
        compiled_styles.insert(0, "stock")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"overhead_{args.device}{'_quick' if args.quick else ''}"
    result = {
        "device": args.device,
        "machine": machine(),
        "args": vars(args),
        "size": size,
        "memory_method": (
            "torch.cuda.max_memory_allocated over one step"
            if gpu
            else "torch.profiler(profile_memory=True) allocation records over one extra step: high-water mark of "
            "live bytes + parameters/buffers/AdamW state resident at the step start"
        ),
        "fused_backend_geo": None,
        "results": {},
    }
    if gpu:
        probe = torch.zeros(2, size["hidden"], device="cuda")
        result["fused_backend_geo"] = {"eager": fused.fused_backend(probe, probe), "compiled": "torch (traced)"}
    else:
        result["fused_backend_geo"] = {"eager": "torch", "compiled": "torch (traced)"}
    started = time.perf_counter()
    for mode in [m for m in args.modes.split(",") if m]:  # every architecture eager first: a run cut short
        for arch in [a for a in args.archs.split(",") if a]:  # by a time limit still has them
            chosen = styles if mode == "eager" else compiled_styles
            t0 = time.perf_counter()
            block = run_arch(arch, chosen, size, args, compiled=mode == "compiled")
            block["seconds"] = round(time.perf_counter() - t0, 1)
            result["results"].setdefault(arch, {})[mode] = block
            failure = fused.kernel_failure()
            if failure is not None:  # the kernel fell back: what ran is the composed path
                result["fused_backend_geo"]["eager"] = f"composed (kernel check failed: {failure})"
            result["seconds"] = round(time.perf_counter() - started, 1)
            (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
            (out / f"{stem}.md").write_text(markdown(result), encoding="utf-8")
            if "geo" in block["rows"] and "stock" in block["rows"]:
                block["update_op_ms"] = update_op_costs(size, args, compiled=mode == "compiled")
                extra = block["update_op_ms"]["geo"] - block["update_op_ms"]["add"]
                block["estimated_geo_time_ratio"] = round(
                    1 + 2 * size["layers"] * extra / block["rows"]["stock"]["step_ms"], 4
                )
                (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
                (out / f"{stem}.md").write_text(markdown(result), encoding="utf-8")
            geo = block["rows"].get("geo", {})
            summary = f"geo time {geo.get('time_ratio')} memory {geo.get('memory_ratio')}"
            print(f"{arch} {mode}: {block['seconds']}s; {summary}", flush=True)
    print(f"wrote {out / stem}.json and .md in {result['seconds']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
