"""The fused GeoNorm kernels compile for every NVIDIA GPU the project names (sm_80, sm_90, sm_100), without one.

Each kernel variant goes through Triton's own compiler (benchmarks/kernel_resources.py's ``compile_variant``: the
launch's arguments, specialised by Triton's binder as a launch specialises them, then ptxas from Triton's wheel),
with a cold Triton cache. A variant fails on any compile error, on a register spill at widths up to 8192 (ptxas's
own log), and where the rows' loads and stores are not 128-bit vectors at a width divisible by 16 (the PTX).

Default suite: every variant (forward and backward, every constexpr the launch passes) x every kernel dtype
(fp32, bf16, fp16) x every target, 45 compiles, each at one of the widths 768, 8192 and 16384, assigned in a Latin
square so that every pair of axes meets every width (each variant sees each width on each target and with each
dtype). The compiled kernel depends on the width only through its power-of-two block (and so its warps) and
whether it is divisible by 16, so those three widths are the smallest block, the widest that must not spill and
the widest block. With --runslow: the whole matrix of benchmarks/kernel_resources.py (every width of WIDTHS, the
float32 state with a bf16 update too, 420 compiles, a few minutes). Also: the checks see a spill and a scalar load
when there is one, and the occupancy follows CUDA's calculator on cases worked out here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton.backends.nvidia", reason="needs triton and its NVIDIA backend (pip install triton)")
triton = pytest.importorskip("triton")
if not hasattr(triton, "knobs"):  # the script drives Triton's compiler through its knobs and binder (written for 3.9)
    pytest.skip(f"triton {triton.__version__} predates the compiler API kernel_resources.py drives (3.9 tested)",
                allow_module_level=True)  # fmt: skip
if os.environ.get("TRITON_INTERPRET", "0") == "1":
    pytest.skip("TRITON_INTERPRET=1: Triton's interpreted kernels cannot be compiled", allow_module_level=True)

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_resources.py"
_spec = importlib.util.spec_from_file_location("kernel_resources", SCRIPT)
kernel_resources = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = kernel_resources  # dataclasses look their module up by name
_spec.loader.exec_module(kernel_resources)

TARGETS = tuple(kernel_resources.LIMITS)
KERNEL_DTYPES = ("fp32", "bf16", "fp16")
DEFAULT_WIDTHS = (768, 8192, 16384)


def latin_square(target: str) -> list[tuple[str, int, object]]:
    """(dtype, width, variant) for ``target``: every variant x dtype once, the width rotating with the target,
    dtype and variant indices, so each pair of axes meets all of DEFAULT_WIDTHS."""
    t = TARGETS.index(target)
    variants = list(enumerate(kernel_resources.VARIANTS))
    return [(dtype, DEFAULT_WIDTHS[(t + d + v) % len(DEFAULT_WIDTHS)], variant)
            for d, dtype in enumerate(KERNEL_DTYPES) for v, variant in variants]  # fmt: skip


@pytest.fixture(autouse=True)
def cold_triton_cache(tmp_path, monkeypatch):
    """Triton's cache in the test's own folder: every kernel is compiled from its source, as on a clean CI machine,
    and the user's cache is left alone."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))


def problems(resources) -> list[str]:
    """What is wrong with one compiled variant: a spill at a width up to SPILL_FREE_UP_TO, or row loads or
    stores that are not all 128-bit vectors at a width divisible by 16."""
    found = []
    where = f"{resources.target} {resources.dtype} width {resources.width} {resources.variant}"
    if resources.width <= kernel_resources.SPILL_FREE_UP_TO and resources.spill_stores + resources.spill_loads:
        found.append(f"{where}: spills {resources.spill_stores} bytes, reloads {resources.spill_loads}")
    if resources.width % 16 == 0 and not (resources.row_loads_128 and resources.row_stores_128):
        found.append(f"{where}: row loads {resources.row_load_bits}, stores {resources.row_store_bits} bits")
    return found


@pytest.mark.parametrize("target", TARGETS)
def test_every_kernel_variant_compiles_for_the_target_without_spills(target):
    square = latin_square(target)
    assert {width for _, width, _ in square} == set(DEFAULT_WIDTHS)
    found = []
    for dtype, width, variant in square:
        resources = kernel_resources.compile_variant(target, dtype, width, variant)
        assert resources.registers > 0 and resources.warps > 0
        found += problems(resources)
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_the_whole_matrix_compiles_without_spills_up_to_8192():
    entries = kernel_resources.compile_matrix()
    assert len(entries) == len(TARGETS) * len(kernel_resources.DTYPES) * len(kernel_resources.WIDTHS) * len(
        kernel_resources.VARIANTS)  # fmt: skip
    errors = [f"{e['target']} {e['dtype']} {e['width']} {e['variant']}: {e['error']}" for e in entries if "error" in e]
    assert not errors, "\n".join(errors)
    found = [problem for e in entries for problem in problems(kernel_resources.Resources(**e))]
    assert not found, "\n".join(found)


def test_the_checks_see_a_spill_and_scalar_accesses():
    """Capped at 32 registers the backward at width 8192 spills, and at width 5000 (not divisible by 16) the row
    accesses are scalar: ``problems`` reports both."""
    backward = kernel_resources.VARIANTS[2]
    capped = kernel_resources.compile_variant("sm_90", "fp32", 8192, backward, maxnreg=32)
    assert capped.registers <= 32 and capped.spill_stores > 0 and capped.spill_loads > 0
    assert any("spills" in problem for problem in problems(capped))
    odd = kernel_resources.compile_variant("sm_90", "bf16", 5000, kernel_resources.VARIANTS[0])
    assert set(odd.row_load_bits) == {16} and not odd.row_loads_128 and not odd.row_stores_128
    odd.width = 5008  # the same accesses at a width divisible by 16 would be a problem
    assert any("row loads" in problem for problem in problems(odd))


@pytest.mark.parametrize(
    "registers, shared, warps, target, blocks, limit",
    [
        # 38 registers: 38 x 32 = 1216, allocated 1280 per warp; 16384 per sub-partition / 1280 = 12 warps, x 4
        # sub-partitions = 48 warps = 12 blocks of 4 warps: 75%
        (38, 16, 4, "sm_80", 12, "registers"),
        # 32 registers: 1024 per warp, 16 warps per sub-partition = 64 warps per SM = 8 blocks of 8 warps: the
        # warp slots bind as well (64 / 8 = 8)
        (32, 16, 8, "sm_90", 8, "warps, registers"),
        # 16 registers, 1 warp: 64 warps would fit, but 32 blocks per SM at most
        (16, 0, 1, "sm_100", 32, "blocks"),
        # 128 registers x 16 warps: 4096 per warp, 4 per sub-partition, 16 warps = 1 block: 25%
        (128, 64, 16, "sm_90", 1, "registers"),
        # 129 registers x 16 warps: 4352 per warp, x 16 > 65536 per block: does not launch
        (129, 64, 16, "sm_90", 0, "registers"),
        # 100 KiB of shared memory + 1 KiB reserved: 164 KiB per SM holds one block on an A100
        (32, 100 * 1024, 4, "sm_80", 1, "shared memory"),
    ],
)
def test_occupancy_follows_cudas_calculator(registers, shared, warps, target, blocks, limit):
    got_blocks, occupancy, got_limit = kernel_resources.occupancy(registers, shared, warps,
                                                                  kernel_resources.LIMITS[target])  # fmt: skip
    assert (got_blocks, got_limit) == (blocks, limit)
    assert occupancy == blocks * warps / 64


def test_roofline_counts_every_read_and_write_once():
    """2048 tokens x 4096 bf16: GeoNorm's forward reads x, u and writes the output (3 rows of 8192 bytes) and 12
    bytes of row numbers; its backward reads x, u, the gradient and the row numbers and writes dx, du. Liger's
    forward reads 2 rows and writes 2 and a float32; its backward reads 3 rows and a float32 and writes 1."""
    row = 4096 * 2
    entry = kernel_resources.roofline(4096, "bf16", tokens=2048)
    assert entry["geonorm"]["bytes_per_token"] == {"forward": 3 * row + 12, "backward": 5 * row + 12}
    assert entry["liger"]["bytes_per_token"] == {"forward": 4 * row + 4, "backward": 4 * row + 4}
    seconds = entry["geonorm"]["microseconds"]["H100 SXM"]["forward"] / 1e6
    assert seconds == pytest.approx(2048 * (3 * row + 12) / 3.35e12)
    # a float32 state with a bf16 update: the backward reads the float32 output the step keeps, not u
    mixed = kernel_resources.roofline(4096, "fp32 state, bf16 update")["geonorm"]["bytes_per_token"]
    assert mixed == {"forward": 4096 * (4 + 2 + 4) + 12, "backward": 4096 * (4 + 4 + 4 + 4 + 2) + 12}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_measuring_without_a_gpu_says_what_it_needs(tmp_path):
    with pytest.raises(SystemExit, match="--measure needs a CUDA device"):
        kernel_resources.main(["--measure", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_row_accesses_are_read_from_the_ptx():
    """Masked accesses count, with their width (vector count x element bits); unmasked ones (the backward's row
    numbers, libdevice's tables) do not."""
    ptx = """
        @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd5 + 0 ];
        @!%p2 ld.global.L1::evict_last.v2.b64 { %rd1, %rd2 }, [ %rd6 + 0 ];
        @%p3 ld.global.b16 { %rs1 }, [ %rd13 + 0 ];
        ld.global.b32 { %r85 }, [ %rd11 + 0 ];
        ld.global.nc.b32 	%r237, [%rd21];
        @%p4 st.global.v4.b32 [ %rd36 + 0 ], { %r306, %r307, %r308, %r309 };
    """
    assert kernel_resources.row_access_bits(ptx, "ld.global") == [128, 128, 16]
    assert kernel_resources.row_access_bits(ptx, "st.global") == [128]
