"""What the fused GeoNorm kernels cost on each NVIDIA GPU, compiled ahead of time on a machine without one.

Every variant of hf_geonorm/modeling/triton_kernels.py (the forward with and without the clamp; the backward
clamped reading u, unclamped reading u, clamped reading the output) is compiled by Triton's own compiler for
sm_80 (A100), sm_90 (H100, H200) and sm_100 (B200), for each dtype pair the fused step launches it with and
each width of WIDTHS. The arguments are the launch's own (``fused.forward_launch`` /
``backward_launch`` on stand-in tensors) and Triton's own binder specialises them, as a launch does: pointers,
strides and the width divisible by 16 are marked so, which is what lets the loads be 128-bit vectors. Nothing
needs a GPU: Triton ships ptxas and cuobjdump for every target.

Per variant it reads, from the compiler itself:
- registers, stack frame and static shared memory from the cubin (cuobjdump -res-usage), spill stores and loads
  from ptxas's own log (``-v``, which Triton passes), Triton's dynamic shared memory from its metadata, and the
  local arrays the PTX itself declares (a stack frame that holds one is not a spill);
- occupancy from those and the block's threads, as CUDA's occupancy calculator (cuda_occupancy.h, shipped with
  Triton) computes it, against each architecture's limits (LIMITS, with their sources);
- whether the row loads and stores are 128-bit vectors, from the PTX: the masked ``ld.global``/``st.global`` of
  the rows (``.v4.b32`` is 128 bits). Not counted: the forward's three float32 row numbers (masked scalar
  stores), the backward's reads of them (unmasked) and libdevice's sin/cos reduction table (``ld.global.nc``
  without an operand list).

And a roofline: the bytes each kernel moves per token (every read and write once), and the time those bytes take
at H100 SXM and H200 HBM bandwidth for ROOFLINE_TOKENS tokens, next to Liger-Kernel's fused add + RMSNorm (what
a Pre-Norm block fuses at the same place), its bytes counted from its kernel's reads and writes.

Writes kernel_resources.json and .md to --out (default benchmarks/results). tests/modeling/test_kernel_compile.py
compiles the same variants with ``compile_variant`` (a covering subset by default, this whole matrix with --runslow),
and benchmarks/gpu_check.sh measures the roofline's shapes on a GPU against the predictions in the .json.

    python benchmarks/kernel_resources.py            # the whole matrix: a few minutes on one core
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import re
import subprocess
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from hf_geonorm.modeling import fused, triton_kernels

OUT = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Variant:
    """One compiled variant of the kernels: which kernel and the constexprs it is compiled with."""

    name: str
    backward: bool
    clamp: bool
    from_out: bool = False


# Every constexpr combination the launch can ask for (FROM_OUT needs the clamp: the fused step refuses it without).
VARIANTS = (
    Variant("forward", backward=False, clamp=True),
    Variant("forward, no clamp", backward=False, clamp=False),
    Variant("backward", backward=True, clamp=True),
    Variant("backward, no clamp", backward=True, clamp=False),
    Variant("backward from the output", backward=True, clamp=True, from_out=True),
)
# (state dtype, update dtype): fused.KERNEL_DTYPES, and a float32 state with a bfloat16 update (autocast)
DTYPES = {
    "fp32": (torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp16": (torch.float16, torch.float16),
    "fp32 state, bf16 update": (torch.float32, torch.bfloat16),
}
# 768-16384 (fused.MAX_FUSED_WIDTH): one per power-of-two block, and 5000, not a multiple of 16
WIDTHS = (768, 1024, 2048, 4096, 5000, 8192, 16384)
SPILL_FREE_UP_TO = 8192  # widths up to this one must not spill (tests/modeling/test_kernel_compile.py)

# Per-SM limits. Threads, warps, registers and shared memory per SM and per block: the CUDA C++ Programming Guide,
# "Technical Specifications per Compute Capability". Blocks per SM, register and shared-memory allocation units,
# sub-partitions and the shared-memory carveouts: CUDA's occupancy calculator, cuda_occupancy.h
# (triton/backends/nvidia/include/), cudaOccMaxBlocksPerMultiprocessor, cudaOccRegAllocationGranularity,
# cudaOccSMemAllocationGranularity, cudaOccSubPartitionsPerMultiprocessor, cudaOccAlignUpShmemSizeVoltaPlus.
LIMITS = {
    "sm_80": {"gpu": "A100", "arch": 80, "max_warps_per_sm": 64, "max_blocks_per_sm": 32, "max_threads_per_block": 1024,
              "registers_per_sm": 65536, "registers_per_block": 65536, "register_unit": 256, "sub_partitions": 4,
              "shared_per_sm": 164 * 1024, "shared_unit": 128, "reserved_shared_per_block": 1024},
    "sm_90": {"gpu": "H100, H200", "arch": 90, "max_warps_per_sm": 64, "max_blocks_per_sm": 32,
              "max_threads_per_block": 1024, "registers_per_sm": 65536, "registers_per_block": 65536,
              "register_unit": 256, "sub_partitions": 4, "shared_per_sm": 228 * 1024, "shared_unit": 128,
              "reserved_shared_per_block": 1024},
    "sm_100": {"gpu": "B200", "arch": 100, "max_warps_per_sm": 64, "max_blocks_per_sm": 32,
               "max_threads_per_block": 1024, "registers_per_sm": 65536, "registers_per_block": 65536,
               "register_unit": 256, "sub_partitions": 4, "shared_per_sm": 228 * 1024, "shared_unit": 128,
               "reserved_shared_per_block": 1024},
}  # fmt: skip
LIMITS_SOURCE = (
    "CUDA C++ Programming Guide, Technical Specifications per Compute Capability (threads, warps, registers and "
    "shared memory per SM and per block); cuda_occupancy.h as shipped with Triton (blocks per SM, allocation "
    "units, sub-partitions, shared-memory carveouts, and the occupancy formulas)"
)
# HBM bandwidth, bytes per second: NVIDIA's H100 SXM5 and H200 SXM datasheets
HBM = {"H100 SXM": 3.35e12, "H200": 4.8e12}
ROOFLINE_TOKENS = 2048
ROOFLINE_SHAPE = (4096, "bf16")  # the width and dtype the roofline section leads with, at ROOFLINE_TOKENS
STATS_BYTES = 3 * 4  # the three float32 row numbers the forward writes and the backward reads
LIGER_SOURCE = "liger_kernel 0.8.5, ops/fused_add_rms_norm.py, LigerFusedAddRMSNormFunction"


@dataclass
class Resources:
    """What one compiled variant uses (per thread: registers, stack; per block: shared memory) and loads."""

    target: str
    dtype: str
    width: int
    variant: str
    block: int
    warps: int
    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int
    static_shared: int
    dynamic_shared: int
    ptx_local_bytes: int
    row_load_bits: list[int]
    row_store_bits: list[int]
    row_loads_128: bool
    row_stores_128: bool
    blocks_per_sm: int
    occupancy: float
    occupancy_limit: str


def launch_arguments(variant: Variant, state_dtype: torch.dtype, update_dtype: torch.dtype, width: int):
    """The kernel and the arguments and options its launch passes, on one-row CPU stand-ins (freshly allocated,
    so their pointers are aligned as CUDA's allocator aligns them) for the tensors of that width and dtypes."""
    x = torch.empty(1, width, dtype=state_dtype)
    u = torch.empty(1, width, dtype=update_dtype)
    stats = torch.empty(1, 3, dtype=torch.float32)
    if not variant.backward:
        out = torch.empty(1, width, dtype=state_dtype)
        max_angle = math.pi / 4 if variant.clamp else None
        return triton_kernels.geodesic_forward_kernel, fused.forward_launch(x, u, out, stats, 0.5, max_angle)
    v = torch.empty(1, width, dtype=state_dtype) if variant.from_out else u  # the output has the state's dtype
    grad, dx, du = torch.empty_like(x), torch.empty_like(x), torch.empty_like(u)
    max_angle = math.pi / 4 if variant.clamp else None
    launch = fused.backward_launch(x, v, grad, stats, dx, du, 0.5, max_angle, variant.from_out)
    return triton_kernels.geodesic_backward_kernel, launch


def row_access_bits(ptx: str, op: str) -> list[int]:
    """Bits per masked (predicated) ``op`` (ld.global / st.global) of the PTX: the row accesses Triton emits,
    e.g. ``@%p1 ld.global.v4.b32 { ... }`` is 128."""
    pattern = re.compile(rf"@!?%p\d+\s+{re.escape(op)}(?:\.[\w:]+)*?(?:\.v(\d+))?\.b(\d+)\s")
    return [int(vec or 1) * int(bits) for vec, bits in pattern.findall(ptx)]


def occupancy(registers: int, shared: int, warps: int, limits: dict) -> tuple[int, float, str]:
    """(blocks per SM, active warps / maximum warps, what limits it: every limit reached), as cuda_occupancy.h's
    cudaOccMaxActiveBlocksPerMultiprocessor computes it (partitioned global caching off, the default carveout
    rounded up to the configuration that fits the block, as the driver chooses)."""
    by = {"blocks": limits["max_blocks_per_sm"], "warps": limits["max_warps_per_sm"] // warps}
    if warps * 32 > limits["max_threads_per_block"]:
        by["warps"] = 0
    per_warp = math.ceil(registers * 32 / limits["register_unit"]) * limits["register_unit"]
    sub = limits["sub_partitions"]
    if per_warp * math.ceil(warps / sub) * sub > limits["registers_per_block"]:
        by["registers"] = 0
    else:
        by["registers"] = (limits["registers_per_sm"] // sub // per_warp) * sub // warps
    per_block = math.ceil((shared + limits["reserved_shared_per_block"]) / limits["shared_unit"])
    by["shared memory"] = limits["shared_per_sm"] // (per_block * limits["shared_unit"])
    blocks = min(by.values())
    limit = ", ".join(name for name, most in by.items() if most == blocks)
    return blocks, blocks * warps / limits["max_warps_per_sm"], limit


def _resource_usage(cubin: bytes, kernel_name: str) -> dict[str, int]:
    """REG, STACK and SHARED of ``kernel_name`` in the cubin, by cuobjdump -res-usage."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernel.cubin"
        path.write_bytes(cubin)
        command = [triton.knobs.nvidia.cuobjdump.path, "-res-usage", str(path)]
        listing = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    section = listing[listing.index(f"Function {kernel_name}:") :]
    return {key: int(re.search(rf"\b{key}:(\d+)", section).group(1)) for key in ("REG", "STACK", "SHARED")}


def compile_variant(target: str, dtype: str, width: int, variant: Variant, **options) -> Resources:
    """Compile one variant for ``target`` ("sm_90") through Triton's compiler, with the launch's specialisation;
    ``options`` override the launch's compile options (``maxnreg``: tests force a spill). Raises what the
    compiler raises. Compiles even where Triton's cache (TRITON_CACHE_DIR) holds the kernel, to read ptxas's log."""
    with warnings.catch_warnings():  # Triton 3.9 warns that its FP-fusion default will change; launches share it
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
        return _compile_variant(target, dtype, width, variant, options)


def _compile_variant(target: str, dtype: str, width: int, variant: Variant, options: dict) -> Resources:
    limits = LIMITS[target]
    kernel, (arguments, launch_options) = launch_arguments(variant, *DTYPES[dtype], width)
    gpu = GPUTarget("cuda", limits["arch"], 32)
    backend = make_backend(gpu)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, compile_options = binder(*arguments, **launch_options)
    compile_options = {**compile_options, **options}
    parsed, signature, constexprs, attrs = kernel._pack_args(backend, compile_options, bound, specialization,
                                                             compile_options)  # fmt: skip
    log = io.StringIO()
    with triton.knobs.nvidia.scope(), triton.knobs.compilation.scope(), contextlib.redirect_stdout(log):
        triton.knobs.nvidia.dump_ptxas_log = True  # Triton prints ptxas -v's log; it holds the spills
        triton.knobs.compilation.always_compile = True
        compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=gpu,
                                  options=parsed.__dict__)  # fmt: skip
    spills = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log.getvalue())
    usage = _resource_usage(compiled.asm["cubin"], kernel.__name__)
    ptx = compiled.asm["ptx"]
    loads, stores = row_access_bits(ptx, "ld.global"), row_access_bits(ptx, "st.global")
    if not variant.backward:  # the forward's three float32 row numbers are masked stores too: not the rows'
        for _ in range(STATS_BYTES // 4):
            stores.remove(32)
    warps = compiled.metadata.num_warps
    shared = usage["SHARED"] + compiled.metadata.shared
    blocks, occupied, limit = occupancy(usage["REG"], shared, warps, limits)
    return Resources(
        target=target, dtype=dtype, width=width, variant=variant.name, block=launch_options["BLOCK"], warps=warps,
        registers=usage["REG"], stack_frame=usage["STACK"], spill_stores=int(spills.group(2)),
        spill_loads=int(spills.group(3)), static_shared=usage["SHARED"], dynamic_shared=compiled.metadata.shared,
        ptx_local_bytes=sum(int(size) for size in re.findall(r"\.local\b[^\n]*__local_depot\d+\[(\d+)\]", ptx)),
        row_load_bits=loads, row_store_bits=stores, row_loads_128=bool(loads) and set(loads) == {128},
        row_stores_128=bool(stores) and set(stores) == {128}, blocks_per_sm=blocks, occupancy=occupied,
        occupancy_limit=limit,
    )  # fmt: skip


def geonorm_bytes(width: int, state_dtype: torch.dtype, update_dtype: torch.dtype) -> dict[str, int]:
    """Bytes per token. Forward: reads x and u, writes the output (x's dtype) and three float32 row numbers.
    Backward: reads x, what the step kept (the output or u, as ``fused.kept_for_backward`` picks at the
    default clamp), the output gradient and the row numbers, writes dx and du."""
    xb, ub = state_dtype.itemsize * width, update_dtype.itemsize * width
    kept = xb if fused.kept_for_backward(torch.empty(0, dtype=state_dtype), math.pi / 4) == "output" else ub
    return {"forward": xb + ub + xb + STATS_BYTES, "backward": xb + kept + xb + STATS_BYTES + xb + ub}


def liger_bytes(width: int, dtype: torch.dtype) -> dict[str, int]:
    """Bytes per token of Liger's fused add + RMSNorm on the residual stream (LIGER_SOURCE). Forward: reads X and
    R, writes S = X + R, Y and RSTD (float32). Backward: reads dY, dS_out, S and RSTD, writes dX (dR is the same
    tensor). Its weight and dW's per-SM partial sums are per call, not per token: left out."""
    row = dtype.itemsize * width
    return {"forward": 2 * row + 2 * row + 4, "backward": 3 * row + 4 + row}


def roofline(width: int, dtype: str, tokens: int = ROOFLINE_TOKENS) -> dict:
    """Bytes per token and the time their HBM traffic takes, for GeoNorm's kernels and Liger's fused add + RMSNorm
    (same width and the state's dtype), at each HBM bandwidth of HBM."""
    state, update = DTYPES[dtype]
    entry = {"width": width, "dtype": dtype, "tokens": tokens}
    for name, per_token in (("geonorm", geonorm_bytes(width, state, update)), ("liger", liger_bytes(width, state))):
        entry[name] = {"bytes_per_token": per_token, "microseconds": {
            gpu: {way: tokens * bytes_ / bandwidth * 1e6 for way, bytes_ in per_token.items()}
            for gpu, bandwidth in HBM.items()}}  # fmt: skip
    return entry


def ptxas_versions() -> dict[str, str]:
    """The ptxas each target compiles with (Triton picks one per architecture) and its version line."""
    tools = {target: get_ptxas(limits["arch"]) for target, limits in LIMITS.items()}
    return {target: f"{Path(tool.path).name} {tool.version}" for target, tool in tools.items()}


def compile_matrix(targets=tuple(LIMITS), dtypes=tuple(DTYPES), widths=WIDTHS, variants=VARIANTS) -> list[dict]:
    """Every variant for every target, dtype and width; a variant that does not compile is an entry with its
    ``error`` (the message's first line) instead of its resources."""
    entries = []
    for target in targets:
        for dtype in dtypes:
            for width in widths:
                for variant in variants:
                    try:
                        entries.append(asdict(compile_variant(target, dtype, width, variant)))
                    except Exception as error:  # a compile error is a result of this benchmark, not its end
                        message = (str(error).strip().splitlines() or [type(error).__name__])[0]
                        entries.append({"target": target, "dtype": dtype, "width": width, "variant": variant.name,
                                        "error": f"{type(error).__name__}: {message}"})  # fmt: skip
                    print(f"{target} {dtype} {width} {variant.name}: {entries[-1].get('error', 'ok')}", flush=True)
    return entries


def _span(values: list) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}-{high}"


def _percent(values: list[float]) -> str:
    return _span([round(100 * value) for value in values]) + "%"


def headline(payload: dict) -> str:
    """The roofline at ROOFLINE_TOKENS x ROOFLINE_SHAPE: GeoNorm's update next to Liger's fused add + RMSNorm."""
    width, dtype = ROOFLINE_SHAPE
    entry = next(e for e in payload["roofline"] if (e["width"], e["dtype"]) == (width, dtype))

    def times(name: str) -> str:
        part = entry[name]["microseconds"]
        return "; ".join(f"{gpu} {part[gpu]['forward']:.1f} us forward, {part[gpu]['backward']:.1f} us backward"
                         for gpu in HBM)  # fmt: skip

    geonorm, liger = entry["geonorm"]["bytes_per_token"], entry["liger"]["bytes_per_token"]
    return (f"**{entry['tokens']} x {width} {dtype}:** the GeoNorm update moves {geonorm['forward']} bytes per token "
            f"forward and {geonorm['backward']} backward, predicted {times('geonorm')}. Liger's fused add + RMSNorm "
            f"moves {liger['forward']} and {liger['backward']}: {times('liger')}.")  # fmt: skip


def markdown(payload: dict) -> str:
    """The results page: the limits, the roofline, then per target a row per dtype and width."""
    lines = [
        "# The fused GeoNorm kernels on NVIDIA GPUs, compiled ahead of time",
        "",
        f"Written by `benchmarks/kernel_resources.py` (Triton {payload['triton']}, torch {payload['torch']}), without "
        "a GPU: every kernel variant compiled by Triton's compiler for each target with the launch's own "
        "specialisation. Nothing here ran on a GPU; `benchmarks/gpu_check.sh` measures the roofline's shapes on one "
        "and prints them against this page's predictions. "
        + "; ".join(f"{target} uses {version}" for target, version in payload["ptxas"].items()) + ".",
        "",
        f"Variants: {'; '.join(payload['variants'])}. A cell gives the range over the forward's or the backward's "
        "variants. Registers, stack and static shared memory are the cubin's (cuobjdump), spills ptxas's log, "
        "dynamic shared memory Triton's (its reductions and layout conversions). Occupancy: active warps over the "
        "SM's maximum, from registers, shared memory (static, dynamic and the 1 KiB the driver reserves per block) "
        "and the block's warps, by CUDA's occupancy formulas. 128-bit: every masked row load (store) is a 128-bit "
        "vector (`ld.global.v4.b32`); width 5000 is not a multiple of 16, so Triton cannot mark it divisible and the "
        "accesses are scalar.",
        "",
    ]
    stacked = [e for e in payload["kernels"] if e.get("stack_frame")]
    if stacked:
        where = sorted({f"{e['target']} {e['variant'].split(',')[0]}" for e in stacked})
        lines += [f"Stack frames ({', '.join(where)}: {_span([e['stack_frame'] for e in stacked])} bytes) hold the "
                  f"local arrays the PTX itself declares ({_span([e['ptx_local_bytes'] for e in stacked])} bytes, "
                  "`__local_depot`: libdevice's sin/cos argument reduction, its path for large arguments), with "
                  f"{sum(e['spill_stores'] + e['spill_loads'] for e in stacked)} bytes of spills.", ""]  # fmt: skip
    errors = [entry for entry in payload["kernels"] if "error" in entry]
    if errors:
        lines += ["**Compile errors:**", ""] + [
            f"- {e['target']} {e['dtype']} width {e['width']} {e['variant']}: {e['error']}" for e in errors] + [""]
    lines += ["## Roofline", "",
              f"Bytes per token, every read and write once; time = {ROOFLINE_TOKENS} tokens x bytes / HBM bandwidth "
              f"({', '.join(f'{gpu} {bw / 1e12:g} TB/s' for gpu, bw in HBM.items())}). GeoNorm's forward reads x "
              "and u and writes the output and three float32 row numbers; its backward reads x, the output or u "
              "(what the step keeps at the default clamp: the output for a float32 state), the output gradient and "
              "the row numbers and writes dx and du. Liger's fused add + RMSNorm "
              f"({LIGER_SOURCE}), what a Pre-Norm block fuses where GeoNorm's update sits: forward reads x and the "
              "residual, writes their sum, the normed row and a float32 rstd; backward reads dY, the residual "
              "stream's gradient, the sum and rstd and writes dX. It also computes the next RMSNorm, which a GeoNorm "
              f"block runs as its own kernel. {ROOFLINE_SHAPE[1]} here; every dtype in the .json.", "",
              headline(payload), "",
              "| shape | kernel | bytes/token fwd | bytes/token bwd | "
              + " | ".join(f"{gpu} fwd us | {gpu} bwd us" for gpu in HBM) + " |",
              "|---|---|---:|---:|" + "---:|---:|" * len(HBM)]  # fmt: skip
    for entry in [entry for entry in payload["roofline"] if entry["dtype"] == ROOFLINE_SHAPE[1]]:
        for name, label in (("geonorm", "GeoNorm update"), ("liger", "Liger fused add + RMSNorm")):
            part = entry[name]
            times = " | ".join(f"{part['microseconds'][gpu]['forward']:.1f} | "
                               f"{part['microseconds'][gpu]['backward']:.1f}" for gpu in HBM)  # fmt: skip
            shape = f"{entry['tokens']} x {entry['width']} {entry['dtype']}"
            lines.append(f"| {shape} | {label} | {part['bytes_per_token']['forward']} | "
                         f"{part['bytes_per_token']['backward']} | {times} |")  # fmt: skip
    lines += ["", "## Limits", "", f"Source: {payload['limits_source']}.", "",
              "| target | GPU | warps/SM | blocks/SM | registers/SM | register unit (per warp) | shared/SM (KiB) | "
              "reserved shared/block | shared unit |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for target, limits in payload["limits"].items():
        lines.append(f"| {target} | {limits['gpu']} | {limits['max_warps_per_sm']} | {limits['max_blocks_per_sm']} | "
                     f"{limits['registers_per_sm']} | {limits['register_unit']} | {limits['shared_per_sm'] // 1024} | "
                     f"{limits['reserved_shared_per_block']} | {limits['shared_unit']} |")  # fmt: skip
    for target in payload["limits"]:
        lines += ["", f"## {target} ({payload['limits'][target]['gpu']})", "",
                  "| dtype | width | block x warps | registers fwd | registers bwd | stack fwd | stack bwd | "
                  "spills (bytes) | shared (B) | occupancy fwd | occupancy bwd | limited by | 128-bit loads | "
                  "128-bit stores |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]  # fmt: skip
        for dtype in payload["dtypes"]:
            for width in payload["widths"]:
                cell = [e for e in payload["kernels"]
                        if (e["target"], e["dtype"], e["width"]) == (target, dtype, width) and "error" not in e]
                if not cell:
                    continue
                fwd = [e for e in cell if e["variant"].startswith("forward")]
                bwd = [e for e in cell if e["variant"].startswith("backward")]
                spilled = sum(e["spill_stores"] + e["spill_loads"] for e in cell)
                shared = _span([e["static_shared"] + e["dynamic_shared"] for e in cell])
                limits = sorted({e["occupancy_limit"] for e in cell})
                lines.append(
                    f"| {dtype} | {width} | {cell[0]['block']} x {cell[0]['warps']} | "
                    f"{_span([e['registers'] for e in fwd])} | {_span([e['registers'] for e in bwd])} | "
                    f"{_span([e['stack_frame'] for e in fwd])} | {_span([e['stack_frame'] for e in bwd])} | "
                    f"{spilled} | {shared} | {_percent([e['occupancy'] for e in fwd])} | "
                    f"{_percent([e['occupancy'] for e in bwd])} | {', '.join(limits)} | "
                    f"{'yes' if all(e['row_loads_128'] for e in cell) else 'no'} | "
                    f"{'yes' if all(e['row_stores_128'] for e in cell) else 'no'} |"
                )
    return "\n".join(lines) + "\n"


FLUSH_BYTES = 256 * 2**20  # launches timed together touch at least this much: 5x the 50 MiB L2 of an H100/H200


def _launch_microseconds(launches: list) -> tuple[float, str]:
    """Median time of one of ``launches`` (calls on distinct buffers, so that together they overflow the L2 cache and
    each reads HBM) and how it was timed: all of them captured in one CUDA graph and replayed 10 times (no Python
    launch cost in the time), or, where capture fails, launched back to back between CUDA events."""
    for launch in launches:  # compiled and warm
        launch()
    torch.cuda.synchronize()
    try:
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            launches[0]()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for launch in launches:
                launch()
        replay, method = graph.replay, "CUDA graph"
    except Exception:  # a launch that cannot be captured: Python's launch cost stays in the time
        torch.cuda.synchronize()

        def replay():
            for launch in launches:
                launch()

        method = "eager launches"
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(launches))
    return sorted(times)[len(times) // 2], method


def _copies(bytes_per_launch: int) -> int:
    """How many buffer sets the timed launches rotate through: FLUSH_BYTES in all, at least 2."""
    return max(2, math.ceil(FLUSH_BYTES / bytes_per_launch))


def _device_bandwidth(name: str) -> str | None:
    """The HBM entry the device is: "H100 SXM" for an H100 with HBM3 (SXM; the PCIe card has 2 TB/s), "H200"."""
    if "H200" in name:
        return "H200"
    if "H100" in name and ("SXM" in name or "HBM3" in name):
        return "H100 SXM"
    return None


def _geonorm_microseconds(width: int, dtype: str, tokens: int) -> dict:
    """The kernels as the fused step launches them at the defaults (clamped at pi/4; the backward reading the
    output or u as ``fused.kept_for_backward`` picks) at ``tokens`` x ``width``: per direction the variant,
    its time, how it was timed and the launched kernel's registers and spills."""
    state, update = DTYPES[dtype]
    per_token = geonorm_bytes(width, state, update)
    sets = []
    for _ in range(_copies(tokens * per_token["forward"])):
        x = torch.randn(tokens, width, device="cuda", dtype=state)
        u = torch.randn(tokens, width, device="cuda", dtype=update) * 0.1
        out, stats = torch.empty_like(x), torch.empty(tokens, 3, device="cuda", dtype=torch.float32)
        sets.append((x, u, torch.randn_like(x), out, stats, torch.empty_like(x), torch.empty_like(u)))
    from_out = fused.kept_for_backward(sets[0][0], math.pi / 4) == "output"
    grid, kept = (tokens,), 3 if from_out else 1  # the forward's output, or u
    forward = [functools.partial(triton_kernels.geodesic_forward_kernel[grid], *arguments, **options)
               for arguments, options in (fused.forward_launch(x, u, out, stats, 0.5, math.pi / 4)
                                          for x, u, _, out, stats, _, _ in sets)]  # fmt: skip
    backward = [functools.partial(triton_kernels.geodesic_backward_kernel[grid], *arguments, **options)
                for arguments, options in (fused.backward_launch(
                    tensors[0], tensors[kept], tensors[2], tensors[4], tensors[5], tensors[6], 0.5, math.pi / 4,
                    from_out) for tensors in sets)]  # fmt: skip
    variants = {"forward": "forward", "backward": "backward from the output" if from_out else "backward"}
    found = {}
    for way, launches in (("forward", forward), ("backward", backward)):  # the forward first: its row numbers
        compiled = launches[0]()  # Triton's launch returns the compiled kernel: its registers and spills
        microseconds, method = _launch_microseconds(launches)
        found[way] = {"variant": variants[way], "microseconds": microseconds, "timed_by": method,
                      "buffer_sets": len(sets), "registers": compiled.n_regs, "spills": compiled.n_spills}  # fmt: skip
    return found


def _liger_microseconds(width: int, dtype: str, tokens: int) -> dict | str:
    """Liger's fused add + RMSNorm kernels (forward; backward without dW) at the shape, or why not measured."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_backward, fused_add_rms_norm_forward
    except ImportError as missing:
        return f"not measured ({missing}; pip install liger-kernel)"
    state = DTYPES[dtype][0]
    try:
        weight, forward, backward = torch.ones(width, device="cuda", dtype=state), [], []
        for _ in range(_copies(tokens * liger_bytes(width, state)["forward"])):
            x = torch.randn(tokens, width, device="cuda", dtype=state)
            r = torch.randn_like(x)
            y, s, rstd, block, warps, stages, casting = fused_add_rms_norm_forward(x, r, weight, 1e-6, 0.0, "llama")
            forward.append(functools.partial(fused_add_rms_norm_forward, x, r, weight, 1e-6, 0.0, "llama"))
            backward.append(functools.partial(fused_add_rms_norm_backward, torch.randn_like(y), torch.randn_like(s),
                                              s, weight, rstd, 0.0, casting, block, warps, stages, False,
                                              needs_dw=False))  # fmt: skip
        return {way: _launch_microseconds(launches)[0] for way, launches in (("forward", forward),
                                                                             ("backward", backward))}  # fmt: skip
    except Exception as error:  # its internal API changed: say so, measure the rest
        return f"not measured ({type(error).__name__}: {error})"


def _measured_line(row: dict) -> str:
    """One measured row as a line of the script's output."""
    predicted = ", ".join(f"{gpu} {us:.1f} us" for gpu, us in row["predicted_microseconds"].items())
    liger = row["liger_microseconds"]
    return (f"{row['dtype']} {row['tokens']} x {row['width']} {row['variant']}: {row['microseconds']:.1f} us "
            f"({row['bandwidth_tb_s']:.2f} TB/s, {row['timed_by']}), predicted {predicted}; registers "
            f"{row['registers']} (predicted {row['predicted_registers']}), spills {row['spills']} (predicted "
            f"{row['predicted_spills']}); Liger " + (liger if isinstance(liger, str) else f"{liger:.1f} us"))


def measure(predicted_path: Path, out: Path) -> dict:
    """On the CUDA device: each roofline shape (ROOFLINE_TOKENS x every width, bf16 and fp32) through the kernels
    as the fused step launches them, the launched kernels' registers and spills, and Liger's fused add + RMSNorm
    at the same shapes where liger-kernel is installed; printed and written (kernel_measured.json, .md in ``out``)
    next to what ``predicted_path`` (this script's .json) predicts, after each shape."""
    if not torch.cuda.is_available():
        raise SystemExit("--measure needs a CUDA device; without one, run this script without it")
    if not predicted_path.is_file():
        raise SystemExit(f"{predicted_path} is missing: run python benchmarks/kernel_resources.py first")
    predicted = json.loads(predicted_path.read_text(encoding="utf-8"))
    major, minor = torch.cuda.get_device_capability()
    target, name = f"sm_{major}{minor}", torch.cuda.get_device_name()
    resources = {(e["target"], e["dtype"], e["width"], e["variant"]): e
                 for e in predicted["kernels"] if "error" not in e}  # fmt: skip
    rooflines = {(e["dtype"], e["width"]): e for e in predicted["roofline"]}
    tokens, rows = ROOFLINE_TOKENS, []
    payload = {"device": name, "target": target, "hbm": _device_bandwidth(name), "torch": torch.__version__,
               "triton": triton.__version__, "predicted_from": str(predicted_path),
               "predicted_triton": predicted["triton"], "rows": rows}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    for dtype in ("bf16", "fp32"):
        for width in predicted["widths"]:
            roof = rooflines.get((dtype, width), roofline(width, dtype))
            geonorm, liger = _geonorm_microseconds(width, dtype, tokens), _liger_microseconds(width, dtype, tokens)
            for way, got in geonorm.items():
                aot = resources.get((target, dtype, width, got["variant"]))
                rows.append({
                    "dtype": dtype, "width": width, "kernel": way, "tokens": tokens, **got,
                    "bandwidth_tb_s": roof["geonorm"]["bytes_per_token"][way] * tokens / got["microseconds"] / 1e6,
                    "predicted_registers": aot and aot["registers"],
                    "predicted_spills": aot and aot["spill_stores"] + aot["spill_loads"],
                    "predicted_microseconds": {gpu: roof["geonorm"]["microseconds"][gpu][way] for gpu in HBM},
                    "liger_microseconds": liger if isinstance(liger, str) else liger[way],
                    "liger_predicted_microseconds": {gpu: roof["liger"]["microseconds"][gpu][way] for gpu in HBM},
                })  # fmt: skip
                print(_measured_line(rows[-1]), flush=True)
            # after each shape, so that a run cut short keeps what it measured
            (out / "kernel_measured.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
            (out / "kernel_measured.md").write_text(measured_markdown(payload), encoding="utf-8")
    return payload


def measured_markdown(payload: dict) -> str:
    """The measured page: a row per shape and kernel, measured next to predicted."""
    hbm = payload["hbm"]
    gpus = [hbm] if hbm else list(HBM)
    lines = [f"# The fused GeoNorm kernels measured on {payload['device']} ({payload['target']})", "",
             f"Written by `benchmarks/kernel_resources.py --measure` (torch {payload['torch']}, Triton "
             f"{payload['triton']}); predictions from {payload['predicted_from']} (Triton "
             f"{payload['predicted_triton']}). Each time is the median over 10 replays of launches on distinct "
             f"buffers ({FLUSH_BYTES // 2**20} MiB in all, beyond the L2 cache), per launch; 'timed by' says whether "
             "they ran as one CUDA graph or as eager launches (then Python's launch cost is in the time). Predicted: "
             f"the kernel's bytes at {' and '.join(gpus)} HBM bandwidth"
             + ("" if hbm else " (this device is neither: both given, in that order)") + ".", "",
             "| dtype | shape | kernel | measured us | TB/s | timed by | predicted us | registers (predicted) | "
             "spills (predicted) | Liger us | Liger predicted us |",
             "|---|---|---|---:|---:|---|---:|---|---|---:|---:|"]  # fmt: skip
    for row in payload["rows"]:
        predicted = ", ".join(f"{row['predicted_microseconds'][gpu]:.1f}" for gpu in gpus)
        liger_predicted = ", ".join(f"{row['liger_predicted_microseconds'][gpu]:.1f}" for gpu in gpus)
        liger = row["liger_microseconds"]
        lines.append(
            f"| {row['dtype']} | {row['tokens']} x {row['width']} | {row['variant']} | {row['microseconds']:.1f} | "
            f"{row['bandwidth_tb_s']:.2f} | {row['timed_by']} | {predicted} | {row['registers']} "
            f"({row['predicted_registers']}) | {row['spills']} ({row['predicted_spills']}) | "
            f"{liger if isinstance(liger, str) else f'{liger:.1f}'} | {liger_predicted} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for kernel_resources.json and .md")
    parser.add_argument("--measure", action="store_true",
                        help="on a CUDA device: measure the roofline's shapes and write kernel_measured.json and .md "
                        "to --out, next to the predictions of --predicted")  # fmt: skip
    parser.add_argument("--predicted", type=Path, default=OUT / "kernel_resources.json",
                        help="the .json this script wrote without --measure (default: the committed one)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    if args.measure:
        return measure(args.predicted, args.out)
    previous = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:  # a cold cache: every kernel compiled from its source
        os.environ["TRITON_CACHE_DIR"] = cache
        try:
            kernels = compile_matrix()
        finally:
            if previous is None:
                del os.environ["TRITON_CACHE_DIR"]
            else:
                os.environ["TRITON_CACHE_DIR"] = previous
    payload = {
        "triton": triton.__version__, "torch": torch.__version__, "ptxas": ptxas_versions(),
        "variants": [variant.name for variant in VARIANTS], "dtypes": list(DTYPES), "widths": list(WIDTHS),
        "limits": LIMITS, "limits_source": LIMITS_SOURCE, "hbm_bytes_per_second": HBM,
        "roofline": [roofline(width, dtype) for dtype in DTYPES for width in WIDTHS],
        "kernels": kernels,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel_resources.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    (args.out / "kernel_resources.md").write_text(markdown(payload), encoding="utf-8")
    return payload


if __name__ == "__main__":
    main()
