#!/usr/bin/env bash
# GPU checks of issue 6, in one go and under 5 minutes on one modern GPU:
#   0. the Triton kernel's first-use check (the one every process runs before trusting the kernel), for each
#      dtype, clamp and saved tensor at two widths, against the torch twin;
#   0b. the kernels at the shapes of benchmarks/results/kernel_resources.md (2048 tokens x widths 768-16384, bf16
#      and fp32, forward and backward), timed and read back (registers, spills), printed against what that page
#      predicted ahead of time (HBM roofline, the cubin's registers), and Liger's fused add + RMSNorm at the same
#      shapes where liger-kernel is installed (kernel_measured.{txt,json,md} in OUT_DIR);
#   1. tests/test_fused.py on CUDA: the Triton kernel against the composed torch path (float32, bfloat16,
#      model widths, strided rows, a float32 state with a bf16 update), a tiny model's training step with the
#      fused update on and off, and (in a child process) the same kernels through Triton's interpreter;
#   1b. benchmarks/liger_check.py: Liger-Kernel on against off, one training step of a tiny GeoNorm LLaMA per
#      norm style (geo, pre, post) in float32 and bfloat16: loss, gradients and the loss after the step agree
#      within 1e-4 (float32) and 5e-2 (bfloat16), relative (needs liger-kernel: pip install -e ".[liger]");
#      writes liger_check.{txt,json};
#   2. benchmarks/overhead.py --device cuda, eager: every style, GeoNorm with the fused kernel on and off;
#   3. the same compiled (stock, pre, geo, geo_unfused), with whatever time is left;
#   4. benchmarks/sweep_workers.py --gpu: a small sweep on one accelerator against all of them, if time is left.
# Usage: bash benchmarks/gpu_check.sh OUT_DIR      (needs torch with CUDA, triton, and this package installed)
# Writes to OUT_DIR: env.txt, kernel_check.txt, pytest_fused.txt, pytest_fused.xml, overhead_cuda.{json,md},
# overhead_cuda_compiled.{json,md}, sweep_workers_cuda.{json,md,txt}, summary.txt. Each stage has its own time limit; the benchmark writes its
# files after each architecture, so a stage cut short keeps what it measured.
set -uo pipefail

out="${1:?usage: bash benchmarks/gpu_check.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this checkout, installed or not
python="${PYTHON:-python}"
budget=285  # seconds for the whole script
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
    "$python" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'triton', triton.__version__, 'device', torch.cuda.get_device_name())"
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

echo "== 0. the kernel's first-use check (hf_geonorm.modeling.fused.check_kernel) on CUDA"
timeout 90 "$python" - > "$out/kernel_check.txt" 2>&1 <<'PY'
import math

import torch

from hf_geonorm.modeling.fused import check_kernel
from hf_geonorm.modeling.geometry import FusedGeodesicStep

cases = [  # (state dtype, update dtype, max_angle, what the backward keeps)
    (torch.float32, torch.float32, math.pi / 4, "output"),
    (torch.float32, torch.float32, math.pi / 4, "update"),
    (torch.float32, torch.float32, None, "update"),
    (torch.float32, torch.bfloat16, math.pi / 4, "output"),
    (torch.bfloat16, torch.bfloat16, math.pi / 4, "update"),
    (torch.bfloat16, torch.bfloat16, None, "update"),
    (torch.float16, torch.float16, math.pi / 4, "update"),
]
failed = 0
for x_dtype, u_dtype, max_angle, keep in cases:
    for width in (768, 5000):
        problem = check_kernel(FusedGeodesicStep, "cuda", x_dtype, u_dtype, width, max_angle, keep)
        print(x_dtype, u_dtype, width, max_angle, keep, "ok" if problem is None else f"FAILED: {problem}")
        failed += problem is not None
raise SystemExit(1 if failed else 0)
PY
check_rc=$?
cat "$out/kernel_check.txt"

echo "== 0b. the kernels measured against benchmarks/results/kernel_resources.json"
timeout 120 "$python" benchmarks/kernel_resources.py --measure --out "$out" > "$out/kernel_measured.txt" 2>&1
measured_rc=$?
cat "$out/kernel_measured.txt"

echo "== 1. tests/test_fused.py on CUDA"
timeout 150 "$python" -m pytest -q -rs -p no:cacheprovider tests/test_fused.py \
    --junitxml="$out/pytest_fused.xml" > "$out/pytest_fused.txt" 2>&1
tests_rc=$?
tail -n 15 "$out/pytest_fused.txt"

# -- Liger-Kernel (issue 56): Liger on against off, one training step of a tiny GeoNorm LLaMA (benchmarks/liger_check.py)
echo "== 1b. Liger-Kernel on against off, one training step (limit 60s)"
timeout 60 "$python" benchmarks/liger_check.py --out "$out" > "$out/liger_check.txt" 2>&1
liger_rc=$?
cat "$out/liger_check.txt"
# -- end of Liger-Kernel

eager_limit=$(( $(left) > 90 ? 90 : $(left) ))
echo "== 2. overhead benchmark, eager (limit ${eager_limit}s)"
timeout "$eager_limit" "$python" benchmarks/overhead.py --device cuda --modes eager \
    --out "$out" --name overhead_cuda
eager_rc=$?

echo "== 3. overhead benchmark, compiled (limit $(left)s)"
if [ "$(left)" -gt 30 ]; then
    timeout "$(left)" "$python" benchmarks/overhead.py --device cuda --modes compiled \
        --compiled-styles stock,pre,geo,geo_unfused --archs llama,gpt2 --out "$out" --name overhead_cuda_compiled
    compiled_rc=$?
else
    compiled_rc=skipped
fi

echo "== 4. sweep on one accelerator against all of them (limit $(left)s)"
if [ "$(left)" -gt 60 ]; then
    timeout "$(left)" "$python" benchmarks/sweep_workers.py --gpu --out "$out" > "$out/sweep_workers_cuda.txt" 2>&1
    sweep_rc=$?
    tail -n 12 "$out/sweep_workers_cuda.txt"
else
    sweep_rc=skipped
fi

{
    echo "kernel check rc=$check_rc (0 = the kernel agrees with the torch twin in every case)"
    echo "kernels measured against predicted rc=$measured_rc (kernel_measured.md)"
    echo "tests rc=$tests_rc (0 = all passed)"
    echo "liger on/off rc=$liger_rc (0 = loss and gradients agree within tolerance, 2 = no liger-kernel or CUDA)"
    grep -E "passed|failed|error" "$out/pytest_fused.txt" | tail -n 1
    echo "eager benchmark rc=$eager_rc, compiled benchmark rc=$compiled_rc (124 = cut at its time limit)"
    echo "sweep one device against all rc=$sweep_rc"
    echo "seconds: $((SECONDS - start))"
} | tee "$out/summary.txt"
[ "$check_rc" -eq 0 ] && [ "$tests_rc" -eq 0 ]
