"""The fused GeoNorm update (hf_geonorm/fused.py) against the composed torch path of geometry.py.

- The torch twin (the per-row-scalar forward and backward that the kernels implement, line for line) runs
  everywhere: values and gradients of x and u in float64, float32 and bfloat16, clamped and unclamped rows,
  zero updates, updates parallel to x, a zero state row, the backward reading u or the output; gradcheck and
  double backward in float64.
- The Triton kernels run on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1) where triton is
  installed, and compiled on CUDA where a GPU is present (benchmarks/gpu_check.sh runs this file there).
- The dispatch: which calls are fused, the switch (HF_GEONORM_FUSED / set_fused_enabled), and that the module
  imports without triton (it is copied beside checkpoints as remote code).
No timings are asserted.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_model, token_ids

import hf_geonorm
from hf_geonorm import fused, geonorm_step
from hf_geonorm.geometry import composed_geonorm_step

PI4 = math.pi / 4
WIDTH = 48  # not a power of two: the kernel's masked lanes are exercised
# Triton's interpreter works only when TRITON_INTERPRET=1 is set before triton is first imported (its
# language functions are wrapped at import), so the interpreter tests run in a child pytest started with it.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"
HAS_TRITON = fused.triton_available()
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _fused_on():
    """Every test starts and ends with the fused update on (the default)."""
    fused.set_fused_enabled(True)
    yield
    fused.set_fused_enabled(True)


# ----------------------------------------------------------------------------------------------------------
# inputs: rows chosen so every branch of the step is taken, away from the clamp boundaries
# ----------------------------------------------------------------------------------------------------------
BASES = [0.05, 0.3, 0.6, 1.2, 3.0]  # |t|/|x|: with alpha 1.5 the clamp is active from 0.52; with 0.5 from 0.79
ZERO_X_ROW = 8


def rows(seed: int = 0, width: int = WIDTH, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 [batch, 10, width]: rows with the base angles above (u = t + 0.3 x), a zero update, updates
    2 x and -0.5 x (parallel), a zero state row (a padding token) and a random row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 10, width, generator=g, dtype=torch.float64) * 2.0
    w = torch.randn(batch, 10, width, generator=g, dtype=torch.float64)
    t = w - (w * x).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True) * x
    base = torch.tensor(BASES, dtype=torch.float64)[:, None]
    u = torch.empty_like(x)
    u[:, :5] = t[:, :5] / t[:, :5].norm(dim=-1, keepdim=True) * x[:, :5].norm(dim=-1, keepdim=True) * base
    u[:, :5] += 0.3 * x[:, :5]
    u[:, 5] = 0.0
    u[:, 6] = 2.0 * x[:, 6]  # powers of two: exactly parallel in every dtype
    u[:, 7] = -0.5 * x[:, 7]
    x[:, ZERO_X_ROW] = 0.0
    u[:, ZERO_X_ROW] = 3.0 * w[:, ZERO_X_ROW]
    u[:, 9] = 1.7 * w[:, 9]
    return x, u


def run(fn, x, u, g):
    """fn's output and the gradients of x and u for the output gradient g."""
    x = x.detach().clone().requires_grad_(True)
    u = u.detach().clone().requires_grad_(True)
    out = fn(x, u)
    out.backward(g)
    return out.detach(), x.grad, u.grad


def reference(x, u, g, alpha, max_angle):
    """The composed path in float64 on the (already rounded) inputs: the exact answer for them."""
    out, dx, du = run(lambda a, b: composed_geonorm_step(a, b, alpha, max_angle), x.double(), u.double(), g.double())
    return out, dx, du


def assert_close_rows(actual, expected, dtype, what, skip_rows=(), per_row=False, noise=None):
    """|actual - expected| <= ulp * |expected| + noise * scale: one unit in the last place of ``dtype`` for the
    final rounding (bf16; the interpreter truncates where a GPU rounds to nearest) plus float32 arithmetic
    noise (1e-12 in float64) relative to the largest |expected| (of the tensor, or of each token with
    ``per_row``); ``expected`` is exact. Rows in ``skip_rows`` are left out."""
    a, e = actual.double(), expected.double()
    keep = [i for i in range(a.shape[-2]) if i not in skip_rows]
    a, e = a[..., keep, :], e[..., keep, :]
    ulp = {torch.float64: 0.0, torch.float32: 0.0, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]
    noise = noise or (1e-12 if dtype == torch.float64 else 2e-6)
    scale = e.abs().amax(dim=-1, keepdim=True) if per_row else e.abs().max()
    bound = ulp * e.abs() + noise * scale + 1e-30
    excess = ((a - e).abs() - bound).max().item()
    assert excess <= 0, f"{what} ({dtype}): off by {excess:.3g} beyond the bound"
    assert torch.isfinite(actual).all()


def output_kept_noise(keep, dtype):
    """Rebuilt from a bfloat16 output (never chosen by default: kept_for_backward keeps u for bf16 states),
    u carries the output's rounding, so the gradients are good to bf16 resolution of their largest entry."""
    return 1e-3 if keep == "output" and dtype == torch.bfloat16 else None


CASES = [(1.5, PI4), (0.5, PI4), (1.5, None), (0.5, None), (0.0, PI4)]
# what the backward keeps besides x: the output needs a clamp <= pi/2 (ValueError otherwise)
KEEP_CASES = [(k, a, m) for k in ("output", "update") for a, m in CASES if not (k == "output" and m is None)]


def check_against_reference(fn, dtype, alpha, max_angle, device="cpu", grad_noise=None):
    x64, u64 = rows()
    x, u = x64.to(device, dtype), u64.to(device, dtype)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(device, dtype)
    out, dx, du = run(fn, x, u, g)
    assert out.dtype == dtype and dx.dtype == dtype and du.dtype == dtype
    ref_out, ref_dx, ref_du = reference(x, u, g, alpha, max_angle)
    # A zero state row: |x| is floored at sqrt(tiny) of the compute dtype, so below float64 it is compared
    # with the composed path in the same dtype (with no clamp it turns by |u|/sqrt(tiny) ~ 1e19 radians:
    # finite but meaningless digits, so only finiteness is checked there).
    skip = (ZERO_X_ROW,) if dtype != torch.float64 or (max_angle is None and alpha > 0) else ()
    assert_close_rows(out, ref_out, dtype, "output", skip)
    assert_close_rows(dx, ref_dx, dtype, "grad x", skip, noise=grad_noise)
    assert_close_rows(du, ref_du, dtype, "grad u", skip, noise=grad_noise)
    assert torch.isfinite(dx).all() and torch.isfinite(du).all()
    assert out[:, ZERO_X_ROW].abs().max().item() < 1e-12  # the sphere of radius 0 is the point 0
    if dtype != torch.float64 and not (max_angle is None and alpha > 0):
        zero_x = lambda t: t[:, ZERO_X_ROW : ZERO_X_ROW + 1]  # noqa: E731
        composed = run(lambda a, b: composed_geonorm_step(a, b, alpha, max_angle), zero_x(x), zero_x(u), zero_x(g))
        for mine, theirs, what in zip((out, dx, du), composed, ("output", "grad x", "grad u"), strict=True):
            assert_close_rows(zero_x(mine), theirs, dtype, f"zero-state row {what}", per_row=True, noise=grad_noise)
    out64 = out.double()
    if alpha == 0.0:
        assert torch.equal(out, x)
    else:  # a zero update and an update parallel to x leave x where it is
        for r in (5, 6, 7):
            assert_close_rows(out64[:, r : r + 1], x.double()[:, r : r + 1], dtype, f"row {r} = x", per_row=True)


# ----------------------------------------------------------------------------------------------------------
# the torch twin (CPU, every machine)
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keep,alpha,max_angle", KEEP_CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_torch_twin_matches_the_composed_path(keep, dtype, alpha, max_angle):
    fn = lambda a, b: fused.fused_geonorm_step(a, b, alpha, max_angle, "torch", keep)  # noqa: E731
    check_against_reference(fn, dtype, alpha, max_angle, grad_noise=output_kept_noise(keep, dtype))



def test_torch_twin_mixed_dtypes_like_autocast():
    """Under autocast the state is float32 and the sublayer's update bfloat16: out and dx keep x's dtype,
    du u's dtype, computed in float32."""
    x64, u64 = rows()
    x, u = x64.float(), u64.bfloat16()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(6)).float()
    fn = lambda a, b: geonorm_step(a, b, 0.7)  # noqa: E731
    out, dx, du = run(fn, x, u, g)
    assert (out.dtype, dx.dtype, du.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    ref_out, ref_dx, ref_du = reference(x, u, g, 0.7, PI4)
    skip = (ZERO_X_ROW,)  # |x| floored at float32's sqrt(tiny) here, float64's in the reference
    assert_close_rows(out, ref_out, torch.float32, "output", skip)
    assert_close_rows(dx, ref_dx, torch.float32, "grad x", skip)
    assert_close_rows(du, ref_du, torch.bfloat16, "grad u", skip)


def rows_for_gradcheck():
    x64, u64 = rows(seed=3, width=6, batch=1)
    keep = [0, 1, 2, 3, 4, 9]  # away from the degenerate rows, where finite differences cross branches
    return x64[:, keep].clone().requires_grad_(True), u64[:, keep].clone().requires_grad_(True)


@pytest.mark.parametrize("keep,max_angle", [("output", PI4), ("update", PI4), ("update", None)])
def test_torch_twin_gradcheck(keep, max_angle):
    x, u = rows_for_gradcheck()
    fn = lambda a, b: fused.fused_geonorm_step(a, b, 1.5, max_angle, "torch", keep)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, u))


@pytest.mark.parametrize("max_angle", [PI4, None])
def test_double_backward(max_angle):
    """Keeping u, second derivatives are the composed path's; keeping the output, asking for them is an
    error that names the switch."""
    x, u = rows_for_gradcheck()
    fn = lambda a, b: fused.fused_geonorm_step(a, b, 1.5, max_angle, "torch", "update")  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, (x, u))
    if max_angle is not None:
        out = fused.fused_geonorm_step(x, u, 1.5, max_angle, "torch", "output")
        with pytest.raises(RuntimeError, match="set_fused_enabled"):
            torch.autograd.grad(out.sum(), (x, u), create_graph=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_what_the_backward_keeps(dtype):
    """x, three numbers per row, and the output (float32 state, clamp <= pi/2) or else the update: with the
    output kept, the GeoNorm step keeps no activation beyond what the surrounding layers keep."""
    x, u = (t.to(dtype).requires_grad_(True) for t in rows())
    for max_angle, kept in ((PI4, "output"), (math.pi / 2, "output"), (math.pi, "update"), (None, "update")):
        kept = "update" if dtype == torch.bfloat16 else kept
        assert fused.kept_for_backward(x, max_angle) == kept
        out = fused.fused_geonorm_step(x, u, 0.7, max_angle, "torch")
        saved_x, saved_v, stats = out.grad_fn.saved_tensors
        assert saved_x.data_ptr() == x.data_ptr()
        assert saved_v.data_ptr() == (out if kept == "output" else u).data_ptr()
        assert stats.shape == (x.numel() // x.shape[-1], 3)
    for max_angle in (None, math.pi):
        with pytest.raises(ValueError, match="max_angle <= pi/2"):
            fused.fused_geonorm_step(x, u, 0.7, max_angle, "torch", "output")



# ----------------------------------------------------------------------------------------------------------
# the dispatch and the switch
# ----------------------------------------------------------------------------------------------------------
def grad_fn_name(out: torch.Tensor) -> str:
    return type(out.grad_fn).__name__


def test_geonorm_step_dispatch():
    x, u = (t.float().requires_grad_(True) for t in rows())
    assert grad_fn_name(geonorm_step(x, u, 0.7)) == "FusedGeoNormStepBackward"
    assert grad_fn_name(geonorm_step(x, u, 0.7, None)) == "FusedGeoNormStepBackward"
    assert grad_fn_name(geonorm_step(x.double(), u.double(), 0.7)) == "FusedGeoNormStepBackward"
    # what the fused Function does not cover takes the composed path
    scale, bias = torch.tensor(1.0, requires_grad=True), torch.tensor(0.0, requires_grad=True)
    for out in (
        geonorm_step(x, u, 0.7, bridge=0.5),
        geonorm_step(x, u, 0.7, PI4, 1.0, scale, bias),
        geonorm_step(x, u, torch.tensor(0.7)),
        geonorm_step(x, u[..., :1, :], 0.7),  # broadcasting
    ):
        assert grad_fn_name(out) != "FusedGeoNormStepBackward"
    assert fused.fused_backend(x, u) == "torch"  # CPU tensors


def test_switch_turns_the_fused_path_off_and_on(monkeypatch):
    x, u = (t.float().requires_grad_(True) for t in rows())
    fused_out = geonorm_step(x, u, 0.7)
    fused.set_fused_enabled(False)
    assert not fused.fused_enabled()
    plain = geonorm_step(x, u, 0.7)
    assert grad_fn_name(plain) != "FusedGeoNormStepBackward"
    assert torch.equal(plain, composed_geonorm_step(x, u, 0.7))
    torch.testing.assert_close(plain, fused_out, atol=1e-5, rtol=0)
    fused.set_fused_enabled(True)
    assert grad_fn_name(geonorm_step(x, u, 0.7)) == "FusedGeoNormStepBackward"
    for value, expected in (("0", False), ("false", False), ("OFF", False), ("1", True), ("", True)):
        monkeypatch.setenv(fused.ENV_VAR, value)
        assert fused._env_enabled() is expected
    monkeypatch.delenv(fused.ENV_VAR)
    assert fused._env_enabled() is True


def test_module_imports_without_triton_and_is_valid_remote_code(monkeypatch):
    """Loaded fresh with triton unimportable, the module works (torch twin) and says triton is missing; its
    imports are torch and the standard library, triton only inside try (so transformers' remote-code import
    check does not demand it)."""
    path = Path(fused.__file__)
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("fused_without_triton", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.triton_available() is False
    x, u = rows()
    out = module.fused_geonorm_step(x.float(), u.float(), 0.7, PI4)
    torch.testing.assert_close(out, composed_geonorm_step(x.float(), u.float(), 0.7), atol=1e-5, rtol=0)

    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for n in ast.walk(t)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." if node.level else node.module.split(".")[0]]
        else:
            continue
        for name in names:
            if name == "triton":
                assert id(node) in guarded, "triton must be imported inside try"
            else:
                assert name in {"__future__", "contextlib", "math", "os", "torch", "."}, f"unexpected import {name}"


# ----------------------------------------------------------------------------------------------------------
# the Triton kernels: through the interpreter on CPU, compiled on CUDA
# ----------------------------------------------------------------------------------------------------------
KERNEL_DEVICES = [
    pytest.param(
        "interpreter",
        marks=pytest.mark.skipif(
            not (HAS_TRITON and INTERPRETING),
            reason="runs in the TRITON_INTERPRET=1 child of test_triton_kernels_through_the_interpreter",
        ),
    ),
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(
            not (HAS_TRITON and HAS_CUDA and not INTERPRETING), reason="needs CUDA and triton (not interpreted)"
        ),
    ),
]


@pytest.fixture
def kernel_device(request):
    return "cpu" if request.param == "interpreter" else "cuda"


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (pip install triton)")
@pytest.mark.skipif(INTERPRETING, reason="this is the child")
def test_triton_kernels_through_the_interpreter():
    """Run this file's interpreter tests in a child pytest with TRITON_INTERPRET=1 set from the start."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "interpreter and not through"],
        cwd=Path(__file__).parent, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900,
    )  # fmt: skip
    tail = (child.stdout + child.stderr)[-4000:]
    assert child.returncode == 0, tail
    assert " passed" in child.stdout, tail


@pytest.mark.parametrize("kernel_device", KERNEL_DEVICES, indirect=True)
@pytest.mark.parametrize("keep,alpha,max_angle", KEEP_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_matches_the_composed_path(kernel_device, keep, dtype, alpha, max_angle):
    fn = lambda a, b: fused.fused_geonorm_step(a, b, alpha, max_angle, "triton", keep)  # noqa: E731
    check_against_reference(fn, dtype, alpha, max_angle, kernel_device, output_kept_noise(keep, dtype))


@pytest.mark.parametrize("kernel_device", KERNEL_DEVICES, indirect=True)
def test_triton_kernel_strided_rows_and_mixed_dtypes(kernel_device):
    """Rows that are slices of a wider tensor (row stride != width) and a float32 state with a bf16 update."""
    x64, u64 = rows(seed=7)
    wide = torch.zeros(x64.shape[:-1] + (2 * WIDTH,), dtype=torch.float64)
    wide[..., :WIDTH] = x64
    x = wide.to(kernel_device, torch.float32)[..., :WIDTH]
    assert not x.is_contiguous()
    u = u64.to(kernel_device, torch.bfloat16)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(8)).to(kernel_device)
    out, dx, du = run(lambda a, b: fused.fused_geonorm_step(a, b, 0.7, PI4, "triton"), x, u, g)
    assert (out.dtype, dx.dtype, du.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    ref_out, ref_dx, ref_du = reference(x, u, g, 0.7, PI4)
    skip = (ZERO_X_ROW,)  # |x| floored at float32's sqrt(tiny) here, float64's in the reference
    assert_close_rows(out, ref_out, torch.float32, "output", skip)
    assert_close_rows(dx, ref_dx, torch.float32, "grad x", skip)
    assert_close_rows(du, ref_du, torch.bfloat16, "grad u", skip)


@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA and not INTERPRETING), reason="needs CUDA and triton")
@pytest.mark.parametrize("width", [768, 4096, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kernel_at_model_widths(width, dtype):
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(4, 512, width, generator=g) * 3).to("cuda", dtype)
    u = torch.randn(4, 512, width, generator=g).to("cuda", dtype)
    grad = torch.randn(4, 512, width, generator=g).to("cuda", dtype)
    assert fused.fused_backend(x, u) == "triton"
    out, dx, du = run(lambda a, b: geonorm_step(a, b, 0.5), x, u, grad)
    ref_out, ref_dx, ref_du = reference(x, u, grad, 0.5, PI4)
    assert_close_rows(out, ref_out, dtype, "output")
    assert_close_rows(dx, ref_dx, dtype, "grad x")
    assert_close_rows(du, ref_du, dtype, "grad u")


@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA and not INTERPRETING), reason="needs CUDA and triton")
@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_cuda_model_training_step_fused_equals_unfused(model_type):
    """A tiny GeoNorm model on CUDA: loss and every gradient agree with the fused kernel on and off."""
    model = hf_geonorm.convert(tiny_model(model_type)).train().cuda()
    ids = token_ids().cuda()
    results = []
    for enabled in (True, False):
        fused.set_fused_enabled(enabled)
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    fused.set_fused_enabled(True)
    (loss_f, grads_f), (loss_u, grads_u) = results
    torch.testing.assert_close(loss_f, loss_u, atol=1e-5, rtol=1e-5)
    for name, grad in grads_f.items():
        torch.testing.assert_close(grad, grads_u[name], atol=1e-5, rtol=1e-4)
