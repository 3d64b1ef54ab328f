"""The fused GeoNorm update (geometry.FusedGeodesicStep, hf_geonorm/modeling/fused.py, triton_kernels.py) against
the composed torch path of geometry.geodesic_step.

- The torch twin (the per-row-scalar forward and backward that the kernels implement, line for line) runs
  everywhere: values and gradients of x and u in float64, float32 and bfloat16, clamped and unclamped rows,
  zero updates, updates parallel to x, a zero state row, the backward reading u or the output; gradcheck and
  double backward in float64.
- The Triton kernels run on CPU tensors through Triton's interpreter (TRITON_INTERPRET=1) where triton is
  installed, and compiled on CUDA where a GPU is present (benchmarks/gpu_check.sh runs this file there).
- The dispatch: which calls are fused, the switch (HF_GEONORM_FUSED / set_fused_enabled), and that the modules
  import without triton (they are copied beside checkpoints as remote code).
- The kernel's first-use check: a kernel that raises or computes wrong values (stubs on CPU) is warned about
  once and replaced by the composed path; the real kernel passes it (interpreter, CUDA).
- Every setting the validator accepts keeps values and gradients finite on every path, for extreme step sizes
  and clamps, zero and tiny states, and huge and tiny updates.
No timings are asserted.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import hf_geonorm
from hf_geonorm import geodesic_step
from hf_geonorm.modeling import fused, geometry
from hf_geonorm.modeling.fused import kept_for_backward
from hf_geonorm.modeling.geometry import FusedGeodesicStep
from hf_geonorm.modeling.remote_code import remote_code_files
from hf_geonorm.modeling.settings import MAX_ALPHA

from support.tiny_models import tiny_model, token_ids

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
    """The composed path (``geometry.geodesic_step`` with ``fused=False``: tangent, clamped angle, exponential map)
    in float64 on the (already rounded) inputs: the exact answer for them."""
    return run(lambda a, b: geodesic_step(a, b, alpha, max_angle, fused=False), x.double(), u.double(), g.double())


def assert_close_rows(actual, expected, dtype, what, per_row=False, noise=None):
    """|actual - expected| <= ulp * |expected| + noise * scale: one unit in the last place of ``dtype`` for the
    final rounding (bf16; the interpreter truncates where a GPU rounds to nearest) plus float32 arithmetic
    noise (1e-12 in float64) relative to the largest |expected| (of the tensor, or of each token with
    ``per_row``); ``expected`` is exact. (hf_geonorm.modeling.fused.check_kernel uses the same bound.)"""
    a, e = actual.double(), expected.double()
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
    assert_close_rows(out, ref_out, dtype, "output")
    assert_close_rows(dx, ref_dx, dtype, "grad x", noise=grad_noise)
    assert_close_rows(du, ref_du, dtype, "grad u", noise=grad_noise)
    # a zero state has no direction: it stays exactly where it is and passes its gradient straight through
    zero = ZERO_X_ROW
    assert torch.equal(out[:, zero], x[:, zero]) and torch.equal(dx[:, zero], g[:, zero])
    assert not du[:, zero].any()
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
    fn = lambda a, b: FusedGeodesicStep.apply(a, b, alpha, max_angle, "torch", keep)  # noqa: E731
    check_against_reference(fn, dtype, alpha, max_angle, grad_noise=output_kept_noise(keep, dtype))



def test_torch_twin_mixed_dtypes_like_autocast():
    """Under autocast the state is float32 and the sublayer's update bfloat16: out and dx keep x's dtype,
    du u's dtype, computed in float32."""
    x64, u64 = rows()
    x, u = x64.float(), u64.bfloat16()
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(6)).float()
    fn = lambda a, b: geodesic_step(a, b, 0.7)  # noqa: E731
    out, dx, du = run(fn, x, u, g)
    assert (out.dtype, dx.dtype, du.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    ref_out, ref_dx, ref_du = reference(x, u, g, 0.7, PI4)
    assert_close_rows(out, ref_out, torch.float32, "output")
    assert_close_rows(dx, ref_dx, torch.float32, "grad x")
    assert_close_rows(du, ref_du, torch.bfloat16, "grad u")


def rows_for_gradcheck():
    x64, u64 = rows(seed=3, width=6, batch=1)
    keep = [0, 1, 2, 3, 4, 9]  # away from the degenerate rows, where finite differences cross branches
    return x64[:, keep].clone().requires_grad_(True), u64[:, keep].clone().requires_grad_(True)


@pytest.mark.parametrize("keep,max_angle", [("output", PI4), ("update", PI4), ("update", None)])
def test_torch_twin_gradcheck(keep, max_angle):
    x, u = rows_for_gradcheck()
    fn = lambda a, b: FusedGeodesicStep.apply(a, b, 1.5, max_angle, "torch", keep)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, u))


@pytest.mark.parametrize("max_angle", [PI4, None])
def test_double_backward(max_angle):
    """Keeping u, second derivatives are the composed path's; keeping the output, asking for them is an
    error that names the switch."""
    x, u = rows_for_gradcheck()
    fn = lambda a, b: FusedGeodesicStep.apply(a, b, 1.5, max_angle, "torch", "update")  # noqa: E731
    assert torch.autograd.gradgradcheck(fn, (x, u))
    if max_angle is not None:
        out = FusedGeodesicStep.apply(x, u, 1.5, max_angle, "torch", "output")
        with pytest.raises(RuntimeError, match="set_fused_enabled"):
            torch.autograd.grad(out.sum(), (x, u), create_graph=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_what_the_backward_keeps(dtype):
    """x, three numbers per row, and the output (float32 state, clamp <= pi/2) or else the update: with the
    output kept, the GeoNorm step keeps no activation beyond what the surrounding layers keep."""
    x, u = (t.to(dtype).requires_grad_(True) for t in rows())
    for max_angle, kept in ((PI4, "output"), (math.pi / 2, "output"), (math.pi, "update"), (None, "update")):
        kept = "update" if dtype == torch.bfloat16 else kept
        assert kept_for_backward(x, max_angle) == kept
        out = FusedGeodesicStep.apply(x, u, 0.7, max_angle, "torch")
        saved_x, saved_v, stats = out.grad_fn.saved_tensors
        assert saved_x.data_ptr() == x.data_ptr()
        assert saved_v.data_ptr() == (out if kept == "output" else u).data_ptr()
        assert stats.shape == (x.numel() // x.shape[-1], 3)
    for max_angle in (None, math.pi):
        with pytest.raises(ValueError, match="max_angle <= pi/2"):
            FusedGeodesicStep.apply(x, u, 0.7, max_angle, "torch", "output")



# ----------------------------------------------------------------------------------------------------------
# the dispatch and the switch
# ----------------------------------------------------------------------------------------------------------
def grad_fn_name(out: torch.Tensor) -> str:
    return type(out.grad_fn).__name__


def test_geodesic_step_dispatch():
    x, u = (t.float().requires_grad_(True) for t in rows())
    assert grad_fn_name(geodesic_step(x, u, 0.7)) == "FusedGeodesicStepBackward"
    assert grad_fn_name(geodesic_step(x, u, 0.7, max_angle=None)) == "FusedGeodesicStepBackward"
    assert grad_fn_name(geodesic_step(x.double(), u.double(), 0.7)) == "FusedGeodesicStepBackward"
    # what the fused Function does not cover takes the composed path
    scale, bias = torch.tensor(1.0, requires_grad=True), torch.tensor(0.0, requires_grad=True)
    for out in (
        geodesic_step(x, u, 0.7, bridge=0.5),
        geodesic_step(x, u, 0.7, max_angle=PI4, step_scale=scale, step_bias=bias),
        geodesic_step(x, u, torch.tensor(0.7)),
        geodesic_step(x, u[..., :1, :], 0.7),  # broadcasting
    ):
        assert grad_fn_name(out) != "FusedGeodesicStepBackward"
    assert fused.fused_backend(x, u) == "torch"  # CPU tensors


def test_switch_turns_the_fused_path_off_and_on(monkeypatch):
    x, u = (t.float().requires_grad_(True) for t in rows())
    fused_out = geodesic_step(x, u, 0.7)
    fused.set_fused_enabled(False)
    assert not fused.fused_enabled()
    plain = geodesic_step(x, u, 0.7)
    assert grad_fn_name(plain) != "FusedGeodesicStepBackward"
    assert torch.equal(plain, geodesic_step(x, u, 0.7, fused=False))
    torch.testing.assert_close(plain, fused_out, atol=1e-5, rtol=0)
    fused.set_fused_enabled(True)
    assert grad_fn_name(geodesic_step(x, u, 0.7)) == "FusedGeodesicStepBackward"
    for value, expected in (("0", False), ("false", False), ("OFF", False), ("1", True), ("", True)):
        monkeypatch.setenv(fused.ENV_VAR, value)
        assert fused._env_enabled() is expected
    monkeypatch.delenv(fused.ENV_VAR)
    assert fused._env_enabled() is True


WITHOUT_TRITON = """
import sys
sys.modules["triton"] = sys.modules["triton.language"] = None  # unimportable, as where it is not installed
import torch
from hf_geonorm import geodesic_step
from hf_geonorm.modeling import fused
assert fused.triton_available() is False
try:
    fused.triton_forward(torch.zeros(1, 4), torch.zeros(1, 4), 0.7, None)
except RuntimeError as error:
    assert "pip install triton" in str(error), error
else:
    raise AssertionError("triton_forward ran without triton")
x, u = torch.randn(5, 48, dtype=torch.float64, requires_grad=True), torch.randn(5, 48, dtype=torch.float64)
out = geodesic_step(x, u, 0.7)
assert type(out.grad_fn).__name__ == "FusedGeodesicStepBackward", out.grad_fn
torch.testing.assert_close(out, geodesic_step(x, u, 0.7, fused=False), atol=1e-12, rtol=0)
print("ok")
"""


def test_modules_import_without_triton_and_are_valid_remote_code():
    """In a process where triton does not import, the fused step runs (torch twin) and the loader says the kernels
    are missing; in every remote-code file triton is imported only inside try (so transformers' remote-code
    import check does not demand it)."""
    child = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)  # fmt: skip
    assert child.returncode == 0 and child.stdout.strip() == "ok", child.stderr[-3000:]
    imports_triton = []
    for source in remote_code_files():
        tree = ast.parse(source.read_text(encoding="utf-8"))
        guarded = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for n in ast.walk(t)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module.split(".")[0]]
            else:
                continue
            if "triton" in names:
                imports_triton.append(source.name)
                assert id(node) in guarded, f"{source.name}: triton must be imported inside try"
    assert set(imports_triton) == {"triton_kernels.py"}


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
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__,
         "-k", "interpreter and not through"],
        cwd=Path(__file__).parent, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900,
    )  # fmt: skip
    tail = (child.stdout + child.stderr)[-4000:]
    assert child.returncode == 0, tail
    assert " passed" in child.stdout, tail


@pytest.mark.parametrize("kernel_device", KERNEL_DEVICES, indirect=True)
@pytest.mark.parametrize("keep,alpha,max_angle", KEEP_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_matches_the_composed_path(kernel_device, keep, dtype, alpha, max_angle):
    fn = lambda a, b: FusedGeodesicStep.apply(a, b, alpha, max_angle, "triton", keep)  # noqa: E731
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
    out, dx, du = run(lambda a, b: FusedGeodesicStep.apply(a, b, 0.7, PI4, "triton"), x, u, g)
    assert (out.dtype, dx.dtype, du.dtype) == (torch.float32, torch.float32, torch.bfloat16)
    ref_out, ref_dx, ref_du = reference(x, u, g, 0.7, PI4)
    assert_close_rows(out, ref_out, torch.float32, "output")
    assert_close_rows(dx, ref_dx, torch.float32, "grad x")
    assert_close_rows(du, ref_du, torch.bfloat16, "grad u")


@pytest.mark.skipif(not (HAS_TRITON and HAS_CUDA and not INTERPRETING), reason="needs CUDA and triton")
@pytest.mark.parametrize("width", [768, 4096, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kernel_at_model_widths(width, dtype):
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(4, 512, width, generator=g) * 3).to("cuda", dtype)
    u = torch.randn(4, 512, width, generator=g).to("cuda", dtype)
    grad = torch.randn(4, 512, width, generator=g).to("cuda", dtype)
    assert fused.fused_backend(x, u) == "triton"
    out, dx, du = run(lambda a, b: geodesic_step(a, b, 0.5), x, u, grad)
    failure = fused.kernel_failure()
    assert failure is None, failure  # the first-use check passed: the kernel ran
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
    assert fused.kernel_failure() is None, fused.kernel_failure()
    (loss_f, grads_f), (loss_u, grads_u) = results
    torch.testing.assert_close(loss_f, loss_u, atol=1e-5, rtol=1e-5)
    for name, grad in grads_f.items():
        torch.testing.assert_close(grad, grads_u[name], atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------
# the kernel's first-use check: stubs in place of the kernel on CPU, and the real kernel
# ----------------------------------------------------------------------------------------------------------
@pytest.fixture
def kernel_stub(monkeypatch):
    """A fresh first-use check, with the Triton backend chosen for CPU tensors and the kernel replaced by the
    torch twin, faulty as the test says (``kernel_stub(fault)``); returns the list of kernel calls."""
    monkeypatch.setattr(fused, "_KERNEL_CHECKS", {})
    monkeypatch.setattr(fused, "_kernel_failure", None)
    monkeypatch.setattr(geometry, "fused_backend", lambda x, u=None: "triton")
    calls = []

    def install(fault=None):
        def forward(x2, u2, alpha, max_angle):
            calls.append("forward")
            if fault == "raises":
                raise RuntimeError("no kernel image is available for execution on the device")
            out, stats = geometry.torch_forward(x2, u2, alpha, max_angle)
            return (out * 1.001 if fault == "wrong output" else out), stats

        def backward(*args):
            calls.append("backward")
            dx, du = geometry.torch_backward(*args)
            return dx, (du * 1.01 if fault == "wrong gradient" else du)

        monkeypatch.setattr(geometry, "triton_forward", forward)
        monkeypatch.setattr(geometry, "triton_backward", backward)
        return calls

    return install


@pytest.mark.parametrize(
    "fault,says",
    [("raises", "raised RuntimeError"), ("wrong output", "the output differs"), ("wrong gradient", "grad u differs")],
)
def test_a_faulty_kernel_is_warned_about_once_and_replaced_by_the_composed_path(kernel_stub, fault, says):
    calls = kernel_stub(fault)
    x, u = (t.float().requires_grad_(True) for t in rows())
    with pytest.warns(RuntimeWarning, match="HF_GEONORM_FUSED") as record:
        out = geodesic_step(x, u, 0.7)
    messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and says in messages[0] and "composed torch path" in messages[0], messages
    assert says in fused.kernel_failure()  # what benchmarks/overhead.py reports as the backend that ran
    assert grad_fn_name(out) != "FusedGeodesicStepBackward"
    assert torch.equal(out, geodesic_step(x, u, 0.7, fused=False))
    calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        for dtype, max_angle in ((torch.float32, PI4), (torch.bfloat16, None), (torch.float32, None)):
            xd, ud = (t.detach().to(dtype).requires_grad_(True) for t in (x, u))
            out = geodesic_step(xd, ud, 0.7, max_angle=max_angle)
            out.float().sum().backward()
            assert grad_fn_name(out) != "FusedGeodesicStepBackward"
            assert torch.equal(out, geodesic_step(xd, ud, 0.7, max_angle=max_angle, fused=False))
    assert calls == []  # the kernel is not used again in this process


def test_a_correct_kernel_passes_the_check_once_per_device_dtype_and_variant(kernel_stub):
    """The check runs the kernel forward and backward once, then the kernel computes the call; the caller's
    random state, grad mode and inference mode are left alone."""
    calls = kernel_stub()
    x, u = (t.float() for t in rows())
    rng = torch.random.get_rng_state()
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("error")
        out = geodesic_step(x, u, 0.7)
        assert torch.is_inference_mode_enabled() and not torch.is_grad_enabled()
    assert calls == ["forward", "backward", "forward"]
    assert torch.equal(torch.random.get_rng_state(), rng)
    assert out.is_inference()
    xg, ug = x.clone().requires_grad_(True), u.clone().requires_grad_(True)
    out = geodesic_step(xg, ug, 0.7)
    assert grad_fn_name(out) == "FusedGeodesicStepBackward"
    out.sum().backward()
    assert calls == ["forward", "backward", "forward", "forward", "backward"]  # no second check
    geodesic_step(x.bfloat16(), u.bfloat16(), 0.7)  # another dtype: checked once more
    geodesic_step(x, u, 0.7, max_angle=None)  # another kernel variant (no clamp, keeps u): checked too
    assert calls[5:] == ["forward", "backward", "forward"] * 2
    assert fused._KERNEL_CHECKS == {
        ("cpu", torch.float32, torch.float32, False, "output"): None,
        ("cpu", torch.bfloat16, torch.bfloat16, False, "update"): None,
        ("cpu", torch.float32, torch.float32, True, "update"): None,
    }


CHECK_CASES = [  # state dtype, update dtype, max_angle, what the backward keeps
    (torch.float32, torch.float32, PI4, "output"),
    (torch.float32, torch.float32, None, "update"),
    (torch.bfloat16, torch.bfloat16, PI4, "update"),
    (torch.float32, torch.bfloat16, PI4, "output"),
]


@pytest.mark.parametrize("kernel_device", KERNEL_DEVICES, indirect=True)
@pytest.mark.parametrize("x_dtype,u_dtype,max_angle,keep", CHECK_CASES)
def test_the_real_kernel_passes_its_first_use_check(kernel_device, x_dtype, u_dtype, max_angle, keep):
    assert fused.check_kernel(FusedGeodesicStep, kernel_device, x_dtype, u_dtype, WIDTH, max_angle, keep) is None


# ----------------------------------------------------------------------------------------------------------
# every accepted setting keeps values and gradients finite
# ----------------------------------------------------------------------------------------------------------
EXTREME_ALPHAS = [0.0, 1e-6, 0.25, 1.0, 37.0, 1e3, MAX_ALPHA]
EXTREME_MAX_ANGLES = [None, 1e-6, 0.1, PI4, math.pi / 2, math.pi]


def extreme_rows(width: int = WIDTH, n: int = 40) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 [1, n, width] states, updates and output gradients at the edges of what a model feeds the step:
    states exactly 0, below the norm floor (1e-30 .. 1e-13), just above it, and up to 1e4; updates 0 and from
    1e-4 to 1e4; updates parallel and antiparallel to x (u = -x: x + u = 0); the rest log-uniform random."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, width, generator=g, dtype=torch.float64)
    u = torch.randn(n, width, generator=g, dtype=torch.float64)
    x_scale = 10 ** (torch.rand(n, 1, generator=g, dtype=torch.float64) * 16 - 12)
    u_scale = 10 ** (torch.rand(n, 1, generator=g, dtype=torch.float64) * 8 - 4)
    special = [(0.0, 1.0), (1e-30, 1.0), (1e-18, 1e3), (1e-15, 1.0), (1e-13, 1e-4), (2e-12, 1e4), (1e4, 1e-4)]
    special += [(1e4, 0.0), (1.0, 0.0)]
    for i, (xs, us) in enumerate(special):
        x_scale[i], u_scale[i] = xs, us
    x, u = x * x_scale, u * u_scale
    u[9], u[10], u[11] = 2.0 * x[9], -x[10], -0.5 * x[11]
    grad = torch.randn(n, width, generator=g, dtype=torch.float64)
    return x[None], u[None], grad[None]


def scale_and_bias():
    return {"step_scale": torch.tensor(1.3, requires_grad=True), "step_bias": torch.tensor(0.1, requires_grad=True)}


EXTREME_PATHS = {
    "composed": lambda x, u, a, m: geodesic_step(x, u, a, max_angle=m, fused=False),
    "composed, bridge 0.5": lambda x, u, a, m: geodesic_step(x, u, a, max_angle=m, bridge=0.5, fused=False),
    "composed, learnable step": (
        lambda x, u, a, m: geodesic_step(x, u, a, max_angle=m, **scale_and_bias(), fused=False)
    ),
    "twin keeping u": lambda x, u, a, m: FusedGeodesicStep.apply(x, u, a, m, "torch", "update"),
    "twin keeping the output": lambda x, u, a, m: FusedGeodesicStep.apply(x, u, a, m, "torch", "output"),
    "kernel": lambda x, u, a, m: FusedGeodesicStep.apply(x, u, a, m, "triton", kept_for_backward(x, m)),
}


def non_finite_settings(path: str, dtype, alphas, max_angles, device="cpu") -> list:
    """The (alpha, max_angle) pairs for which ``path`` gives a non-finite output or gradient on extreme_rows."""
    x64, u64, g64 = extreme_rows()
    x, u, g = x64.to(device, dtype), u64.to(device, dtype), g64.to(device, dtype)
    step = EXTREME_PATHS[path]
    failures = []
    for alpha, max_angle in itertools.product(alphas, max_angles):
        if path == "twin keeping the output" and (max_angle is None or max_angle > math.pi / 2):
            continue  # keeping the output needs a clamp <= pi/2 (never chosen otherwise)
        out, dx, du = run(functools.partial(step, a=alpha, m=max_angle), x, u, g)
        if not all(torch.isfinite(t).all() for t in (out, dx, du)):
            failures.append((alpha, max_angle))
    return failures


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", [p for p in EXTREME_PATHS if p != "kernel"])
def test_every_accepted_setting_keeps_the_step_finite(path, dtype):
    """alpha from 0 to MAX_ALPHA, max_angle from 1e-6 to pi and none, on zero, tiny and huge states and
    updates: value and gradients finite on the composed path (also with the bridge and the learnable step)
    and the fused twin."""
    failures = non_finite_settings(path, dtype, EXTREME_ALPHAS, EXTREME_MAX_ANGLES)
    assert not failures, f"non-finite for (alpha, max_angle) in {failures}"


@pytest.mark.parametrize("kernel_device", KERNEL_DEVICES, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_accepted_setting_keeps_the_kernel_finite(kernel_device, dtype):
    failures = non_finite_settings("kernel", dtype, [0.0, 1.0, MAX_ALPHA], [None, 1e-6, PI4], kernel_device)
    assert not failures, f"non-finite for (alpha, max_angle) in {failures}"


@pytest.mark.parametrize("fused_on", [True, False])
def test_a_zero_token_with_no_clamp_and_the_largest_alpha_trains_finite(fused_on):
    """A token whose embedding row is zero, no clamp, alpha 1 and MAX_ALPHA: a LLaMA-shaped model's loss and
    every gradient stay finite (the zero state used to turn into a tiny one that overflowed the backward)."""
    fused.set_fused_enabled(fused_on)
    for alpha in (1.0, MAX_ALPHA):
        model = hf_geonorm.convert(tiny_model("llama"), geo_alpha=alpha, geo_max_angle=None).train()
        with torch.no_grad():
            model.get_input_embeddings().weight[5] = 0.0
        ids = token_ids()
        ids[:, 3] = 5
        loss = model(ids, labels=ids).loss
        loss.backward()
        assert torch.isfinite(loss)
        for name, param in model.named_parameters():
            assert param.grad is None or torch.isfinite(param.grad).all(), (alpha, name)
