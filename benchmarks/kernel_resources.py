"""What the fused GeoNorm kernels cost on each NVIDIA GPU, compiled ahead of time on a machine without one.

Every variant of hf_geonorm/modeling/triton_kernels.py (the forward with and without the clamp; the backward
clamped reading u, unclamped reading u, clamped reading the output) is compiled by Triton's own compiler for
sm_80 (A100), sm_90 (H100, H200) and sm_100 (B200), for each dtype pair the fused step launches it with and
each width of WIDTHS. The arguments are the launch's own (``triton_kernels.forward_launch`` /
``backward_launch`` on stand-in tensors) and Triton's own binder specialises them, as a launch does: pointers,
strides and the width divisible by 16 are marked so, which is what lets the loads be 128-bit vectors. Nothing
needs a GPU: Triton ships ptxas and cuobjdump for every target.

Per variant it reads, from the compiler itself:
- registers, stack frame and static shared memory from the cubin (cuobjdump -res-usage), spill stores and loads
  from ptxas's own log (``-v``, which Triton passes), Triton's dynamic shared memory from its metadata;
- occupancy from those and the block's threads, as CUDA's occupancy calculator (cuda_occupancy.h, shipped with
  Triton) computes it, against each architecture's limits (LIMITS, with their sources);
- whether the row loads and stores are 128-bit vectors, from the PTX: the masked ``ld.global``/``st.global`` of
  the rows (``.v4.b32`` is 128 bits; the backward's three per-row statistics are unmasked scalars, and the
  ``ld.global.nc`` without an operand list are libdevice's sin/cos reduction table, neither counted).

And a roofline: the bytes each kernel moves per token (every read and write once), and the time those bytes take
at H100 SXM and H200 HBM bandwidth for ROOFLINE_TOKENS tokens, next to Liger-Kernel's fused add + RMSNorm (what
a Pre-Norm block fuses at the same place), its bytes counted from its kernel's reads and writes.

Writes kernel_resources.json and .md to --out (default benchmarks/results). tests/test_kernel_compile.py compiles
the same variants with ``compile_variant`` (a covering subset by default, this whole matrix with --runslow), and
benchmarks/gpu_check.sh measures the roofline's shapes on a GPU against the predictions in the .json.

    python benchmarks/kernel_resources.py            # the whole matrix: a few minutes on one core
"""

from __future__ import annotations

import argparse
import contextlib
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

from hf_geonorm.modeling import triton_kernels

OUT = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Variant:
    """One compiled variant of the kernels: which kernel and the constexprs it is compiled with."""

    name: str
    backward: bool
    clamp: bool
    from_out: bool = False


# Every constexpr combination the launch can ask for (FROM_OUT needs the clamp: step_autograd refuses it without).
VARIANTS = (
    Variant("forward", backward=False, clamp=True),
    Variant("forward, no clamp", backward=False, clamp=False),
    Variant("backward", backward=True, clamp=True),
    Variant("backward, no clamp", backward=True, clamp=False),
    Variant("backward from the output", backward=True, clamp=True, from_out=True),
)
# (state dtype, update dtype): step_autograd.KERNEL_DTYPES, and a float32 state with a bfloat16 update (autocast)
DTYPES = {
    "fp32": (torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp16": (torch.float16, torch.float16),
    "fp32 state, bf16 update": (torch.float32, torch.bfloat16),
}
# 768-16384 (step_autograd.MAX_FUSED_WIDTH): one per power-of-two block, and 5000, not a multiple of 16
WIDTHS = (768, 1024, 2048, 4096, 5000, 8192, 16384)
SPILL_FREE_UP_TO = 8192  # widths up to this one must not spill (tests/test_kernel_compile.py)

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
ROOFLINE_SHAPE = (2048, 4096, "bf16")  # the shape the results page leads with
STATS_BYTES = 3 * 4  # the three float32 row numbers the forward writes and the backward reads
LIGER_SOURCE = "liger_kernel 0.8.5, ops/fused_add_rms_norm.py (LigerFusedAddRMSNormFunction)"


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
        return triton_kernels._geonorm_fwd_kernel, triton_kernels.forward_launch(x, u, out, stats, 0.5, max_angle)
    v = torch.empty(1, width, dtype=state_dtype) if variant.from_out else u  # the output has the state's dtype
    grad, dx, du = torch.empty_like(x), torch.empty_like(x), torch.empty_like(u)
    max_angle = math.pi / 4 if variant.clamp else None
    launch = triton_kernels.backward_launch(x, v, grad, stats, dx, du, 0.5, max_angle, variant.from_out)
    return triton_kernels._geonorm_bwd_kernel, launch


def row_access_bits(ptx: str, op: str) -> list[int]:
    """Bits per masked (predicated) ``op`` (ld.global / st.global) of the PTX: the row accesses Triton emits,
    e.g. ``@%p1 ld.global.v4.b32 { ... }`` is 128."""
    pattern = re.compile(rf"@%p\d+\s+{re.escape(op)}(?:\.\w+)*?(?:\.v(\d+))?\.b(\d+)\s")
    return [int(vec or 1) * int(bits) for vec, bits in pattern.findall(ptx)]


def occupancy(registers: int, shared: int, warps: int, limits: dict) -> tuple[int, float, str]:
    """(blocks per SM, active warps / maximum warps, what limits it: every limit reached), as cuda_occupancy.h's
    cudaOccMaxActiveBlocksPerMultiprocessor computes it (partitioned global caching off, the default carveout
    rounded up to the configuration that fits the block, as the driver chooses)."""
    by = {"blocks": limits["max_blocks_per_sm"], "warps": limits["max_warps_per_sm"] // warps}
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
        row_load_bits=loads, row_store_bits=stores, row_loads_128=bool(loads) and set(loads) == {128},
        row_stores_128=bool(stores) and set(stores) == {128}, blocks_per_sm=blocks, occupancy=occupied,
        occupancy_limit=limit,
    )  # fmt: skip


def geonorm_bytes(width: int, state_dtype: torch.dtype, update_dtype: torch.dtype) -> dict[str, int]:
    """Bytes per token. Forward: reads x and u, writes the output (x's dtype) and three float32 row numbers.
    Backward (reading u; reading the output instead moves as many bytes): reads x, u, the output gradient and
    the row numbers, writes dx and du."""
    xb, ub = state_dtype.itemsize * width, update_dtype.itemsize * width
    return {"forward": xb + ub + xb + STATS_BYTES, "backward": xb + ub + xb + STATS_BYTES + xb + ub}


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
        f"Variants: {', '.join(payload['variants'])}. A cell gives the range over the forward's or the backward's "
        "variants. Registers, stack and static shared memory are the cubin's (cuobjdump), spills ptxas's log, "
        "dynamic shared memory Triton's (its reductions). Occupancy: active warps over the SM's maximum, from "
        "registers, shared memory (static, dynamic and the 1 KiB the driver reserves per block) and the block's "
        "warps, by CUDA's occupancy formulas. 128-bit: every masked row load (store) is a 128-bit vector "
        "(`ld.global.v4.b32`); width 5000 is not a multiple of 16, so Triton cannot mark it divisible and the "
        "accesses are scalar.",
        "",
    ]
    errors = [entry for entry in payload["kernels"] if "error" in entry]
    if errors:
        lines += ["**Compile errors:**", ""] + [
            f"- {e['target']} {e['dtype']} width {e['width']} {e['variant']}: {e['error']}" for e in errors] + [""]
    lines += ["## Roofline", "",
              f"Bytes per token, every read and write once; time = {ROOFLINE_TOKENS} tokens x bytes / HBM bandwidth "
              f"({', '.join(f'{gpu} {bw / 1e12:g} TB/s' for gpu, bw in HBM.items())}). GeoNorm's forward reads x "
              "and u and writes the output and three float32 row numbers; its backward reads x, u (or the output), "
              "the output gradient and the row numbers and writes dx and du. Liger's fused add + RMSNorm "
              f"({LIGER_SOURCE}), what a Pre-Norm block fuses where GeoNorm's update sits: forward reads x and the "
              "residual, writes their sum, the normed row and a float32 rstd; backward reads dY, the residual "
              "stream's gradient, the sum and rstd and writes dX. It also computes the next RMSNorm, which a GeoNorm "
              f"block runs as its own kernel. {ROOFLINE_SHAPE[2]} here; every dtype in the .json.", "",
              "| shape | kernel | bytes/token fwd | bytes/token bwd | "
              + " | ".join(f"{gpu} fwd us | {gpu} bwd us" for gpu in HBM) + " |",
              "|---|---|---:|---:|" + "---:|---:|" * len(HBM)]  # fmt: skip
    for entry in [entry for entry in payload["roofline"] if entry["dtype"] == ROOFLINE_SHAPE[2]]:
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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder for kernel_resources.json and .md")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter's kernels cannot be compiled")
    with tempfile.TemporaryDirectory() as cache:  # a cold cache: every kernel compiled from its source
        os.environ["TRITON_CACHE_DIR"] = cache
        kernels = compile_matrix()
    payload = {
        "triton": triton.__version__, "torch": torch.__version__, "ptxas": ptxas_versions(),
        "variants": [variant.name for variant in VARIANTS], "dtypes": list(DTYPES), "widths": list(WIDTHS),
        "limits": LIMITS, "limits_source": LIMITS_SOURCE, "hbm_bytes_per_second": HBM,
        "roofline": [roofline(width, dtype) for dtype in DTYPES for width in WIDTHS],
        "roofline_shape": {"tokens": ROOFLINE_SHAPE[0], "width": ROOFLINE_SHAPE[1], "dtype": ROOFLINE_SHAPE[2]},
        "kernels": kernels,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel_resources.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    (args.out / "kernel_resources.md").write_text(markdown(payload), encoding="utf-8")
    return payload


if __name__ == "__main__":
    main()
