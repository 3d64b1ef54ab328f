"""Tests of hf_geonorm.geometry against formulas written out here from hf_geonorm/modeling/method.md (numpy, float64).

Nothing below copies a number produced by the code under test: every expected value is computed by the
reference functions ``ref_*`` in this file, straight from the specification.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_geonorm import (
    GeoNormSettings,
    entry_rescale,
    exp_map,
    geodesic_step,
    prenorm_angle,
    step_sizes,
    tangent,
)
from hf_geonorm.modeling.geometry import NORM_FLOOR, geonorm_angle
from hf_geonorm.modeling.settings import MAX_ALPHA

PI4 = math.pi / 4
D = 16


# ----------------------------------------------------------------------------------------------------------
# Independent reference formulas (numpy float64), one token per row along the last axis.
# ----------------------------------------------------------------------------------------------------------
def nnorm(a):
    return np.linalg.norm(a, axis=-1, keepdims=True)


def ndot(a, b):
    return np.sum(a * b, axis=-1, keepdims=True)


def ref_tangent(x, u):
    return u - ndot(u, x) / ndot(x, x) * x


def ref_exp_map(x, v):
    nx, nv = nnorm(x), nnorm(v)
    th = nv / nx
    return np.cos(th) * x + nx * np.sin(th) * v / nv


def ref_geodesic_update(x, u, a):
    """exp_map(x, a t), the turn stopping at the antipode (pi, geometry.MAX_TURN)."""
    t = ref_tangent(x, u)
    angle = a * nnorm(t) / nnorm(x)
    return ref_exp_map(x, a * t * np.minimum(1.0, np.pi / np.maximum(angle, 1e-300)))


def ref_geo_angle(base, a, max_angle, c=1.0, b=0.0):
    if max_angle is None:
        return np.minimum(a * (c * base + b), np.pi)
    return np.minimum(a * (c * np.minimum(base, max_angle) + b), max_angle)


def ref_geonorm_step(x, u, a, max_angle=PI4, lam=1.0, c=1.0, b=0.0):
    """hf_geonorm/modeling/method.md, "The bridge": theta = (1-lam) theta_pre + lam theta_geo, radius
    (1-lam)|x+u| + lam|x|."""
    t = ref_tangent(x, u)
    nx, nt = nnorm(x), nnorm(t)
    theta_geo = ref_geo_angle(nt / nx, a, max_angle, c, b)
    theta_pre = np.arctan2(nt, nx + ndot(u, x) / nx)
    theta = (1 - lam) * theta_pre + lam * theta_geo
    radius = (1 - lam) * nnorm(x + u) + lam * nx
    return radius * (np.cos(theta) * x / nx + np.sin(theta) * t / nt)


def ref_projection(x, y):
    """The Euclidean projection of y onto the sphere of radius |x|: |x| y / |y|."""
    return nnorm(x) * y / nnorm(y)


def angle_between(a, b):
    """acos of the cosine between a and b, per row."""
    cos = ndot(a, b) / (nnorm(a) * nnorm(b))
    return np.arccos(np.clip(cos, -1.0, 1.0))[..., 0]


def rand(shape, seed, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape) * scale


def T(a, dtype=torch.float64, grad=False):
    t = torch.tensor(a, dtype=dtype)
    return t.requires_grad_(grad) if grad else t


def N(t):
    return t.detach().to(torch.float64).numpy()


def controlled(bases, seed, d=D, along=0.3, x_scale=2.0):
    """Rows x_i and u_i with |tangent(x_i, u_i)| / |x_i| = bases[i] exactly and u_i = t_i + along x_i."""
    rng = np.random.default_rng(seed)
    n = len(bases)
    x = rng.standard_normal((n, d)) * x_scale
    w = rng.standard_normal((n, d))
    t = ref_tangent(x, w)
    t = t / nnorm(t) * nnorm(x) * np.asarray(bases, dtype=np.float64)[:, None]
    return x, t + along * x


def close(actual, expected, tol):
    np.testing.assert_allclose(N(actual) if isinstance(actual, torch.Tensor) else actual, expected, rtol=0, atol=tol)


# ----------------------------------------------------------------------------------------------------------
# tangent, exp_map, geodesic_update against the formulas
# ----------------------------------------------------------------------------------------------------------
SHAPE = (3, 5, D)


def test_tangent_formula_and_orthogonality():
    x, u = rand(SHAPE, 1), rand(SHAPE, 2)
    t = tangent(T(x), T(u))
    assert t.dtype == torch.float64 and t.shape == SHAPE
    close(t, ref_tangent(x, u), 1e-9)
    close(ndot(N(t), x), np.zeros(SHAPE[:-1] + (1,)), 1e-9)


@pytest.mark.parametrize("v_scale", [0.01, 1.0, 5.0])
def test_exp_map_formula_and_norm(v_scale):
    # includes angles well beyond pi (v_scale 5 on |x| ~ 4: |v|/|x| up to ~ 10)
    x = rand(SHAPE, 3)
    v = ref_tangent(x, rand(SHAPE, 4, v_scale))
    out = exp_map(T(x), T(v))
    close(out, ref_exp_map(x, v), 1e-9)
    close(nnorm(N(out)), nnorm(x), 1e-9)
    # the formula is defined for a non-tangent v as well
    w = rand(SHAPE, 5, v_scale)
    close(exp_map(T(x), T(w)), ref_exp_map(x, w), 1e-9)


def test_geodesic_update_formula_float_alpha():
    x, u = rand(SHAPE, 6), rand(SHAPE, 7)
    for a in (0.0, 0.3, 1.0, 2.5):
        out = geodesic_step(T(x), T(u), a, max_angle=None)
        expected = x if a == 0.0 else ref_geodesic_update(x, u, a)
        close(out, expected, 1e-9)
        close(nnorm(N(out)), nnorm(x), 1e-9)


def test_geodesic_update_formula_tensor_alpha_broadcasts():
    x, u = rand(SHAPE, 8), rand(SHAPE, 9)
    a = np.abs(rand((3, 5, 1), 10))
    out = geodesic_step(T(x), T(u), T(a), max_angle=None)
    close(out, ref_geodesic_update(x, u, a), 1e-9)
    # one alpha per batch row, broadcasting over tokens
    a2 = np.abs(rand((3, 1, 1), 11))
    close(geodesic_step(T(x), T(u), T(a2), max_angle=None), ref_geodesic_update(x, u, a2), 1e-9)


def test_geodesic_update_rotation_angle():
    x, u = rand((64, D), 12), rand((64, D), 13, 0.5)
    a = 0.7
    out = N(geodesic_step(T(x), T(u), a, max_angle=None))
    expected = a * nnorm(ref_tangent(x, u))[..., 0] / nnorm(x)[..., 0]
    assert expected.max() < math.pi
    np.testing.assert_allclose(angle_between(x, out), expected, rtol=0, atol=1e-7)


def _step_errors(x, u, alphas):
    return np.array(
        [np.max(nnorm(N(geodesic_step(T(x), T(u), a, max_angle=None)) - ref_projection(x, x + a * u)) / nnorm(x))
         for a in alphas]
    )


def test_small_steps_agree_with_projection_to_second_order_for_tangent_update():
    x = rand((8, D), 14)
    u = ref_tangent(x, rand((8, D), 15))
    errs = _step_errors(x, u, [0.02, 0.01, 0.005])
    ratios = errs[:-1] / errs[1:]
    assert np.all((ratios > 6) & (ratios < 10)), ratios


def test_small_steps_agree_with_projection_to_first_order_for_general_update():
    x = rand((8, D), 16)
    u = ref_tangent(x, rand((8, D), 17)) + 0.5 * x  # a radial part the projection throws away
    errs = _step_errors(x, u, [0.02, 0.01, 0.005])
    ratios = errs[:-1] / errs[1:]
    assert np.all((ratios > 3) & (ratios < 5)), ratios
    assert errs[-1] < 0.01  # they do agree to first order


# ----------------------------------------------------------------------------------------------------------
# gradcheck (float64)
# ----------------------------------------------------------------------------------------------------------
def test_gradcheck_tangent_exp_map_geodesic_update():
    x, u = T(rand((2, 3, 6), 20), grad=True), T(rand((2, 3, 6), 21), grad=True)
    a = T(np.abs(rand((2, 3, 1), 22)) + 0.1, grad=True)
    assert torch.autograd.gradcheck(tangent, (x, u))
    assert torch.autograd.gradcheck(exp_map, (x, u))
    assert torch.autograd.gradcheck(lambda x_, u_: geodesic_step(x_, u_, 0.7, max_angle=None), (x, u))
    assert torch.autograd.gradcheck(lambda x_, u_, a_: geodesic_step(x_, u_, a_, max_angle=None), (x, u, a))


# rows with base angles 0.3 (no clamp), 0.6 (only alpha*base > pi/4 at alpha 1.5) and 3.0 (base clamped)
@pytest.mark.parametrize("max_angle", [PI4, None])
@pytest.mark.parametrize("bridge", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("learnable", [False, True])
def test_gradcheck_geonorm_step(max_angle, bridge, learnable):
    xs, us = controlled([0.3, 0.6, 3.0, 0.45], seed=23)
    x, u = T(xs, grad=True), T(us, grad=True)
    if learnable:
        c, b = T(1.2, grad=True), T(0.05, grad=True)

        def fn(x_, u_, c_, b_):
            return geodesic_step(x_, u_, 1.5, max_angle=max_angle, bridge=bridge, step_scale=c_, step_bias=b_)

        assert torch.autograd.gradcheck(fn, (x, u, c, b))
    else:
        fn = lambda x_, u_: geodesic_step(x_, u_, 1.5, max_angle=max_angle, bridge=bridge)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (x, u))


# ----------------------------------------------------------------------------------------------------------
# step sizes
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_layers", [1, 7, 24])
def test_step_sizes_formulas(num_layers):
    a = 0.8
    ks = np.arange(1, num_layers + 1)
    expected = {
        "harmonic": a / ks,
        "sqrt": a / np.sqrt(ks),
        "linear": a * (num_layers + 1 - ks) / num_layers,
        "constant": np.full(num_layers, a),
    }
    for decay, exp in expected.items():
        got = step_sizes(decay, a, num_layers)
        assert isinstance(got, list) and len(got) == num_layers
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=0)
    lin = step_sizes("linear", a, num_layers)
    assert lin[0] == pytest.approx(a) and lin[-1] == pytest.approx(a / num_layers) and min(lin) > 0


@pytest.mark.parametrize("decay", ["harmonic", "sqrt", "linear", "constant"])
def test_step_sizes_list_taken_as_is(decay):
    values = [0.9, 0.25, 1.5, 0.0]
    assert step_sizes(decay, values, 4) == values
    assert step_sizes(decay, tuple(values), 4) == values


def test_step_sizes_errors_name_valid_values():
    with pytest.raises(ValueError, match=r"harmonic.*sqrt.*linear.*constant"):
        step_sizes("cosine", 1.0, 4)
    with pytest.raises(ValueError, match=r"one value per layer \(4\).*3"):
        step_sizes("harmonic", [1.0, 0.5, 0.2], 4)
    with pytest.raises(ValueError, match="positive integer"):
        step_sizes("harmonic", 1.0, 0)


# ----------------------------------------------------------------------------------------------------------
# numerical safety: degenerate updates return x with finite gradients
# ----------------------------------------------------------------------------------------------------------
VARIANTS = {
    # name: (fn(x, u, a, c, b), bridge lam) -- lam None means "pure GeoNorm step, returns x"
    "geodesic_update": (lambda x, u, a, c, b: geodesic_step(x, u, a, max_angle=None), 1.0),
    "step_default_clamp": (lambda x, u, a, c, b: geodesic_step(x, u, a), 1.0),
    "step_no_clamp": (lambda x, u, a, c, b: geodesic_step(x, u, a, max_angle=None), 1.0),
    "step_learnable": (
        lambda x, u, a, c, b: geodesic_step(x, u, a, max_angle=PI4, step_scale=c, step_bias=b),
        1.0,
    ),
    "step_learnable_no_clamp": (
        lambda x, u, a, c, b: geodesic_step(x, u, a, max_angle=None, step_scale=c, step_bias=b),
        1.0,
    ),
    "step_bridge0": (lambda x, u, a, c, b: geodesic_step(x, u, a, bridge=0.0), 0.0),
    "step_bridge05": (lambda x, u, a, c, b: geodesic_step(x, u, a, bridge=0.5), 0.5),
    "step_bridge05_learnable": (
        lambda x, u, a, c, b: geodesic_step(x, u, a, max_angle=PI4, bridge=0.5, step_scale=c, step_bias=b),
        0.5,
    ),
    "step_bridge1": (lambda x, u, a, c, b: geodesic_step(x, u, a, bridge=1.0), 1.0),
}


def _run_with_grads(fn, x_np, u_np, a, c_val=1.3, b_val=0.0, dtype=torch.float64):
    x, u = T(x_np, dtype, grad=True), T(u_np, dtype, grad=True)
    c, b = T(c_val, grad=True), T(b_val, grad=True)
    out = fn(x, u, a, c, b)
    weights = torch.tensor(rand(out.shape, 99), dtype=out.dtype)
    (out * weights).sum().backward()
    for name, g in (("x", x.grad), ("u", u.grad)):
        assert g is not None and torch.isfinite(g).all(), f"non-finite grad of {name}"
    for name, g in (("scale", c.grad), ("bias", b.grad)):
        assert g is None or torch.isfinite(g).all(), f"non-finite grad of {name}"
    assert torch.isfinite(out).all()
    return N(out)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_zero_update_returns_x(variant):
    fn, _ = VARIANTS[variant]
    x = rand((4, D), 30)
    out = _run_with_grads(fn, x, np.zeros_like(x), 0.7, b_val=0.2)
    close(out, x, 1e-12)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("s", [2.5, -0.5, 1.0])
def test_parallel_update(variant, s):
    fn, lam = VARIANTS[variant]
    x = rand((4, D), 31)
    out = _run_with_grads(fn, x, s * x, 0.7)
    # no tangent part: no rotation; the radius is (1-lam)|x+u| + lam|x| = ((1-lam)|1+s| + lam)|x|
    close(out, ((1 - lam) * abs(1 + s) + lam) * x, 1e-12)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_zero_alpha(variant):
    fn, lam = VARIANTS[variant]
    x, u = rand((4, D), 32), rand((4, D), 33)
    out = _run_with_grads(fn, x, u, 0.0)
    expected = x if lam == 1.0 else ref_geonorm_step(x, u, 0.0, PI4, lam, 1.3, 0.0)
    close(out, expected, 1e-12)


ZERO_ROW_FNS = {
    "tangent": lambda x, u: tangent(x, u),
    "exp_map": lambda x, u: exp_map(x, u),
    "geodesic_update": lambda x, u: geodesic_step(x, u, 1.0, max_angle=None),
    "step_default": lambda x, u: geodesic_step(x, u, 0.5),
    "step_no_clamp": lambda x, u: geodesic_step(x, u, 2.0, max_angle=None),
    "step_learnable": lambda x, u: geodesic_step(
        x, u, 0.5, max_angle=PI4, step_scale=torch.tensor(1.3), step_bias=torch.tensor(0.1)
    ),
    "step_bridge0": lambda x, u: geodesic_step(x, u, 0.5, bridge=0.0),
    "step_bridge05": lambda x, u: geodesic_step(x, u, 0.5, bridge=0.5),
    "entry_sqrt_d": lambda x, u: entry_rescale(x, "sqrt_d", 1.0),
    "entry_sqrt_d_half": lambda x, u: entry_rescale(x, "sqrt_d", 0.5),
    "prenorm_angle": lambda x, u: prenorm_angle(x, u),
}


@pytest.mark.parametrize("name", list(ZERO_ROW_FNS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_zero_x_row_gives_no_nan(name, dtype):
    """A padding token whose state is exactly zero (large updates, so |u|/tiny would overflow)."""
    x_np = rand((3, D), 34)
    x_np[0] = 0.0
    u_np = rand((3, D), 35, 3.0)
    x, u = T(x_np, dtype, grad=True), T(u_np, dtype, grad=True)
    out = ZERO_ROW_FNS[name](x, u)
    assert torch.isfinite(out).all()
    if name in ("geodesic_update", "step_default", "step_no_clamp", "step_learnable"):
        assert out[0].abs().max().item() < 1e-12  # the sphere of radius 0 is the point 0
    if name == "step_bridge0":  # Pre-Norm: x + u = u
        np.testing.assert_allclose(N(out[0]), N(u[0]), rtol=4 * torch.finfo(dtype).eps, atol=1e-6)
    if name.startswith("entry"):
        assert torch.equal(out[0], x[0])
    if dtype != torch.float16:  # the direction x/|x| is singular at 0: fp16 cannot hold its gradient
        out.float().sum().backward()
        assert torch.isfinite(x.grad).all()
        assert u.grad is None or torch.isfinite(u.grad).all()


# ----------------------------------------------------------------------------------------------------------
# dtypes
# ----------------------------------------------------------------------------------------------------------
LOWP_FNS = {
    "tangent": (lambda x, u: tangent(x, u), lambda x, u: ref_tangent(x, u)),
    "exp_map": (lambda x, u: exp_map(x, tangent(x, u)), lambda x, u: ref_exp_map(x, ref_tangent(x, u))),
    "geodesic_update": (
        lambda x, u: geodesic_step(x, u, 0.6, max_angle=None), lambda x, u: ref_geodesic_update(x, u, 0.6)
    ),
    "step_default": (lambda x, u: geodesic_step(x, u, 0.6), lambda x, u: ref_geonorm_step(x, u, 0.6)),
    "step_bridge03": (
        lambda x, u: geodesic_step(x, u, 0.6, bridge=0.3),
        lambda x, u: ref_geonorm_step(x, u, 0.6, lam=0.3),
    ),
    "step_bridge0": (lambda x, u: geodesic_step(x, u, 0.6, bridge=0.0), lambda x, u: x + u),
    "entry_sqrt_d": (
        lambda x, u: entry_rescale(x, "sqrt_d", 0.7),
        lambda x, u: x * (math.sqrt(D) / nnorm(x)) ** 0.7,
    ),
}


@pytest.mark.parametrize("name", list(LOWP_FNS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_in_dtype_and_within_rounding(name, dtype):
    fn, ref = LOWP_FNS[name]
    x = torch.tensor(rand((4, 7, D), 40), dtype=dtype)
    u = torch.tensor(rand((4, 7, D), 41, 0.7), dtype=dtype)
    out = fn(x, u)
    assert out.dtype == dtype
    # expected: the exact result on the (rounded) inputs, rounded once to the dtype
    expected = torch.tensor(ref(N(x), N(u))).to(dtype)
    eps = torch.finfo(dtype).eps
    scale = N(expected.abs().amax(dim=-1, keepdim=True).to(torch.float64))  # per-token magnitude
    diff = np.abs(N(out) - N(expected))
    assert np.all(diff <= 4 * eps * np.maximum(np.abs(N(expected)), scale / 4)), diff.max()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_dtype_kept(dtype):
    x = torch.tensor(rand((2, D), 42), dtype=dtype)
    u = torch.tensor(rand((2, D), 43), dtype=dtype)
    for out in (
        tangent(x, u),
        exp_map(x, u),
        geodesic_step(x, u, 0.5, max_angle=None),
        geodesic_step(x, u, 0.5),
        geodesic_step(x, u, 0.5, bridge=0.4),
        entry_rescale(x, "sqrt_d", 1.0),
    ):
        assert out.dtype == dtype
    if dtype == torch.float32:  # float32 is computed in float32: close to the float64 formula
        close(geodesic_step(x, u, 0.5), ref_geonorm_step(N(x), N(u), 0.5), 1e-5)


# ----------------------------------------------------------------------------------------------------------
# the clamped GeoNorm step
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "base,alpha,expected_theta",
    [
        (1.2, 0.5, 0.5 * PI4),  # base angle above max_angle: base clamped, alpha*max below max
        (2.0, 1.5, PI4),  # base clamped and alpha*max above max
        (0.6, 1.5, PI4),  # only alpha*base exceeds max
        (0.3, 1.5, 0.45),  # neither
        (0.3, 0.5, 0.15),  # neither, small step
    ],
)
def test_clamped_step_angle_and_radius(base, alpha, expected_theta):
    x, u = controlled([base] * 3, seed=50)
    out = N(geodesic_step(T(x), T(u), alpha))
    # theta = min(a * min(|t|/|x|, max), max), measured
    theta = min(alpha * min(base, PI4), PI4)
    assert theta == pytest.approx(expected_theta)
    np.testing.assert_allclose(angle_between(x, out), theta, rtol=0, atol=1e-7)
    close(nnorm(out), nnorm(x), 1e-12)
    close(out, ref_geonorm_step(x, u, alpha), 1e-9)


def test_custom_max_angle():
    x, u = controlled([0.2, 0.5, 1.0, 2.0], seed=51)
    for m in (0.1, 0.4, 1.0, math.pi):
        out = N(geodesic_step(T(x), T(u), 1.3, max_angle=m))
        close(out, ref_geonorm_step(x, u, 1.3, m), 1e-9)
        np.testing.assert_allclose(
            angle_between(x, out), np.minimum(1.3 * np.minimum([0.2, 0.5, 1.0, 2.0], m), m), atol=1e-7
        )


def test_no_clamp_equals_geodesic_update():
    x, u = rand((6, 5, D), 52), rand((6, 5, D), 53, 2.0)  # large angles, so a clamp would matter
    a = 1.7
    free = geodesic_step(T(x), T(u), a, max_angle=None)
    close(free, N(geodesic_step(T(x), T(u), a, max_angle=None)), 1e-12)
    close(free, ref_geodesic_update(x, u, a), 1e-9)
    clamped = geodesic_step(T(x), T(u), a)
    assert np.abs(N(clamped) - N(free)).max() > 0.1  # the default clamp does change these


@pytest.mark.parametrize("c,b", [(1.0, 0.0), (1.4, 0.0), (0.6, 0.1), (1.2, 0.3)])
@pytest.mark.parametrize("max_angle", [PI4, None])
def test_learnable_step_angle(c, b, max_angle):
    bases = [0.1, 0.5, 0.9, 2.0]
    x, u = controlled(bases, seed=54)
    a = 0.8
    out = N(geodesic_step(T(x), T(u), a, max_angle=max_angle, step_scale=T(c), step_bias=T(b)))
    close(out, ref_geonorm_step(x, u, a, max_angle, 1.0, c, b), 1e-9)
    expected = ref_geo_angle(np.array(bases), a, max_angle, c, b)
    np.testing.assert_allclose(angle_between(x, out), expected, rtol=0, atol=1e-7)
    close(nnorm(out), nnorm(x), 1e-12)
    # unit scale and zero bias are the plain step
    if (c, b) == (1.0, 0.0):
        close(out, N(geodesic_step(T(x), T(u), a, max_angle=max_angle)), 1e-12)


def test_geonorm_angle_formula():
    base = np.array([0.1, 0.5, 0.9, 2.0, 5.0])
    for a, m, c, b in [
        (0.5, PI4, None, None),
        (1.5, PI4, None, None),
        (1.5, None, None, None),
        (0.7, 0.6, 1.3, 0.05),
        (2.0, None, 0.8, 0.1),
    ]:
        got = geonorm_angle(T(base), a, m, None if c is None else T(c), None if b is None else T(b))
        expected = ref_geo_angle(base, a, m, 1.0 if c is None else c, 0.0 if b is None else b)
        close(got, expected, 1e-12)


# ----------------------------------------------------------------------------------------------------------
# the bridge
# ----------------------------------------------------------------------------------------------------------
def test_bridge_zero_is_prenorm():
    x, u = rand(SHAPE, 60), rand(SHAPE, 61, 1.5)
    for m in (PI4, None):
        close(geodesic_step(T(x), T(u), 0.7, max_angle=m, bridge=0.0), x + u, 1e-12)
        close(
            geodesic_step(T(x), T(u), 0.7, max_angle=m, bridge=0.0, step_scale=T(1.3), step_bias=T(0.2)),
            x + u,
            1e-12,
        )
    # also an update that turns x around (x + u on the far side of the origin)
    x2, u2 = controlled([0.4, 1.0], seed=62, along=-2.5)
    close(geodesic_step(T(x2), T(u2), 0.7, bridge=0.0), x2 + u2, 1e-12)


def test_bridge_one_is_geonorm():
    x, u = rand(SHAPE, 63), rand(SHAPE, 64, 1.5)
    out = geodesic_step(T(x), T(u), 0.7, max_angle=PI4, bridge=1.0)
    close(out, ref_geonorm_step(x, u, 0.7), 1e-9)
    close(out, N(geodesic_step(T(x), T(u), 0.7)), 0.0)


@pytest.mark.parametrize("lam", [0.05, 0.25, 0.5, 0.8])
@pytest.mark.parametrize("max_angle", [PI4, None])
def test_bridge_intermediate_formula(lam, max_angle):
    x, u = rand(SHAPE, 65), rand(SHAPE, 66, 1.5)
    close(
        geodesic_step(T(x), T(u), 0.7, max_angle=max_angle, bridge=lam),
        ref_geonorm_step(x, u, 0.7, max_angle, lam),
        1e-9,
    )
    c, b = 1.2, 0.1
    close(
        geodesic_step(T(x), T(u), 0.7, max_angle=max_angle, bridge=lam, step_scale=T(c), step_bias=T(b)),
        ref_geonorm_step(x, u, 0.7, max_angle, lam, c, b),
        1e-9,
    )
    # the measured rotation is the interpolated angle
    t = ref_tangent(x, u)
    th = (1 - lam) * np.arctan2(nnorm(t), nnorm(x) + ndot(u, x) / nnorm(x)) + lam * ref_geo_angle(
        nnorm(t) / nnorm(x), 0.7, max_angle
    )
    assert th.max() < math.pi
    out = N(geodesic_step(T(x), T(u), 0.7, max_angle=max_angle, bridge=lam))
    np.testing.assert_allclose(angle_between(x, out), th[..., 0], rtol=0, atol=1e-7)


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_framed_bridge_and_final_clamp_formula(lam):
    """With a frame (c, r) the Pre-Norm side of the bridge is r (x + c u): its angle atan2(c|t|, |x| + c<u,x>/|x|)
    and its radius |r (x + c u)|; geo_clamp="final" clamps only a |t|/|x|, never the base angle."""
    x, u = rand(SHAPE, 70), rand(SHAPE, 71, 1.5)
    c, r, a, m = 0.6, 0.8, 0.3, 1.2
    t = ref_tangent(x, u)
    nx, nt = nnorm(x), nnorm(t)
    theta_pre = np.arctan2(c * nt, nx + c * ndot(u, x) / nx)
    theta_geo = np.minimum(a * nt / nx, m)
    assert (nt / nx > m).any() and (a * nt / nx < m).all()  # here "both" would clamp the base angle, "final" not
    theta = (1 - lam) * theta_pre + lam * theta_geo
    radius = (1 - lam) * nnorm(r * (x + c * u)) + lam * nx
    expected = radius * (np.cos(theta) * x / nx + np.sin(theta) * t / nt)
    got = geodesic_step(T(x), T(u), a, max_angle=m, bridge=lam, frame=(c, r), clamp="final")
    close(got, expected, 1e-9)
    if lam == 0.0:
        assert torch.equal(got, T(r * (x + c * u)))  # exactly the framed Pre-Norm update
    both = ref_geonorm_step(x, u, a, m, lam) if lam == 1.0 else None
    if both is not None:  # the paper's clamp differs where the base angle passes max_angle
        assert np.abs(N(geodesic_step(T(x), T(u), a, max_angle=m, bridge=lam)) - both).max() < 1e-9
        assert np.abs(both - expected).max() > 1e-3


def test_bridge_approaches_geonorm_continuously():
    x, u = rand(SHAPE, 67), rand(SHAPE, 68, 1.5)
    at_one = N(geodesic_step(T(x), T(u), 0.7))
    d3 = np.abs(N(geodesic_step(T(x), T(u), 0.7, bridge=1 - 1e-3)) - at_one).max()
    d6 = np.abs(N(geodesic_step(T(x), T(u), 0.7, bridge=1 - 1e-6)) - at_one).max()
    assert 0 < d6 < 1e-5
    assert 500 < d3 / d6 < 2000  # proportional to 1 - lam


def test_entry_rescale():
    h = rand((2, 5, D), 69, 0.3)
    for lam in (0.0, 0.3, 1.0):
        assert torch.equal(entry_rescale(T(h), "embedding", lam), T(h))
        close(entry_rescale(T(h), "sqrt_d", lam), h * (math.sqrt(D) / nnorm(h)) ** lam, 1e-12)
    close(nnorm(N(entry_rescale(T(h), "sqrt_d", 1.0))), np.full((2, 5, 1), math.sqrt(D)), 1e-12)
    close(entry_rescale(T(h), "sqrt_d", 0.0), h, 0.0)


def test_prenorm_angle():
    x, u = rand(SHAPE, 70), rand(SHAPE, 71, 1.5)
    got = prenorm_angle(T(x), T(u))
    assert got.shape == SHAPE[:-1]
    close(got, angle_between(x, x + u), 1e-7)
    # beyond pi/2: x + u behind the plane orthogonal to x
    x2, u2 = controlled([0.5, 1.0, 2.0], seed=72, along=-1.8)
    close(prenorm_angle(T(x2), T(u2)), angle_between(x2, x2 + u2), 1e-7)
    assert N(prenorm_angle(T(x2), T(u2))).min() > math.pi / 2


# ----------------------------------------------------------------------------------------------------------
# what keeps every accepted setting finite (hf_geonorm/modeling/method.md, "Choices the paper leaves open")
# ----------------------------------------------------------------------------------------------------------
def test_alpha_above_the_largest_accepted_is_refused_and_says_why():
    assert GeoNormSettings(geo_alpha=MAX_ALPHA).geo_alpha == MAX_ALPHA
    assert GeoNormSettings(geo_alpha=[1.0, MAX_ALPHA]).geo_alpha == [1.0, MAX_ALPHA]
    for alpha in (1e30, 1e300, [1.0, 2.0 * MAX_ALPHA]):
        with pytest.raises(ValueError, match=r"geo_alpha must be at most 1e\+06: .*overflow"):
            GeoNormSettings(geo_alpha=alpha)


STAYING_FNS = {  # the steps that keep the radius: a state below the floor has none to keep
    "exp_map": lambda x, u: exp_map(x, tangent(x, u)),
    "geodesic_update": lambda x, u: geodesic_step(x, u, 1e3, max_angle=None),
    "step_default": lambda x, u: geodesic_step(x, u, 0.5),
    "step_no_clamp": lambda x, u: geodesic_step(x, u, MAX_ALPHA, max_angle=None),
    "step_learnable": lambda x, u: geodesic_step(
        x, u, 0.5, max_angle=PI4, step_scale=torch.tensor(1.3), step_bias=torch.tensor(0.1)
    ),
    "composed_default": lambda x, u: geodesic_step(x, u, 0.5, fused=False),
    "composed_no_clamp": lambda x, u: geodesic_step(x, u, MAX_ALPHA, max_angle=None, fused=False),
}


@pytest.mark.parametrize("name", list(STAYING_FNS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_a_state_below_the_norm_floor_stays_where_it_is(name, dtype):
    """|x| < NORM_FLOOR: out = x exactly, the gradient passes straight through to x and none reaches u; just
    above the floor the state turns by the step's angle."""
    scales = np.array([0.0, 1e-30, 1e-18, 1e-13, 0.5 * NORM_FLOOR])[:, None]
    x_np = rand((5, D), 80) / np.sqrt(D) * scales
    u_np = rand((5, D), 81, 3.0)
    x, u = T(x_np, dtype, grad=True), T(u_np, dtype, grad=True)
    out = STAYING_FNS[name](x, u)
    g = torch.ones_like(out)
    out.backward(g)
    assert torch.equal(out, x.detach())
    assert torch.equal(x.grad, g)
    assert u.grad is None or not u.grad.any()
    # just above the floor, the step moves the state (by the clamped angle, here at most pi/4)
    above = T(rand((1, D), 82) / np.sqrt(D) * 4.0 * NORM_FLOOR, torch.float64)
    moved = N(geodesic_step(above, T(u_np[:1]), 0.5))
    np.testing.assert_allclose(angle_between(N(above), moved), [0.5 * PI4], rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# Pre-Norm is GeoNorm with depth-dependent angles (hf_geonorm/modeling/method.md, "Pre-Norm as GeoNorm")
# ----------------------------------------------------------------------------------------------------------
def ref_norm(h, kind, weight, bias):
    """RMSNorm / LayerNorm with eps 0 (exactly scale invariant) and their own weights."""
    if kind == "layer":
        h = h - h.mean(axis=-1, keepdims=True)
        return h / np.sqrt((h * h).mean(axis=-1, keepdims=True)) * weight + bias
    return h / np.sqrt((h * h).mean(axis=-1, keepdims=True)) * weight


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_prenorm_is_geonorm_with_depth_dependent_angles(kind):
    """A 12-layer Pre-Norm stack h <- h + F(N(h)) (random float64 MLPs) equals, on the sphere of radius
    sqrt(d), the exp_map step y <- exp_map(y, theta |y| t/|t|) with theta = atan2(|t|/s, |y| + <u,y>/(|y| s)),
    t = tangent(y, u) and the mass s = |h|/sqrt(d) carried along as s <- |s y + u|/sqrt(d)."""
    d, rng = D, np.random.default_rng(83)
    h = rng.standard_normal((6, d)) * 3.0
    y, s = math.sqrt(d) * h / nnorm(h), nnorm(h) / math.sqrt(d)
    for _ in range(12):
        w1, w2 = rng.standard_normal((d, 2 * d)) / math.sqrt(d), rng.standard_normal((2 * d, d))
        weight, bias = 1.0 + 0.3 * rng.standard_normal(d), 0.2 * rng.standard_normal(d)

        def sublayer(z, w1=w1, w2=w2, weight=weight, bias=bias):
            return np.tanh(ref_norm(z, kind, weight, bias) @ w1) @ w2

        h = h + sublayer(h)  # Pre-Norm
        u = sublayer(y)  # the sublayer sees only the point on the sphere
        t = N(tangent(T(y), T(u)))
        theta = np.arctan2(nnorm(t) / s, nnorm(y) + ndot(u, y) / (nnorm(y) * s))
        y_next = N(exp_map(T(y), T(theta * nnorm(y) * t / nnorm(t))))
        s = nnorm(s * y + u) / math.sqrt(d)
        y = y_next
        close(y, math.sqrt(d) * h / nnorm(h), 1e-11)
        close(s, nnorm(h) / math.sqrt(d), 1e-11)
