"""Tests of GeoNormResidual (every norm style) and GeoNormSettings.

A small decoder is simulated here: T layers of two sublayers each (an "attention" and an "FFN" stand-in:
random float64 MLPs / linear maps), each sublayer with its own input norm (RMSNorm or LayerNorm with random
weights). The reference for every style is written out in this file from hf_geonorm/modeling/method.md, "The family".
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from hf_geonorm import GeoNormResidual, GeoNormSettings, identity_norm_like, step_sizes

D = 16
T = 3  # decoder layers; 2 sublayers each: 6 sublayers
PI4 = math.pi / 4
DECAYS = ["harmonic", "sqrt", "linear", "constant"]


class OffsetRMSNorm(nn.Module):
    """Gemma-style RMSNorm that computes (1 + w) x / rms(x)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (1.0 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def make_norm(kind: str) -> nn.Module:
    if kind == "rms":
        norm = nn.RMSNorm(D, eps=1e-6, dtype=torch.float64)
    elif kind == "layer":
        norm = nn.LayerNorm(D, eps=1e-5, dtype=torch.float64)
    else:
        norm = OffsetRMSNorm(D).double()
    with torch.no_grad():
        for name, p in norm.named_parameters():
            p.copy_((1.0 if name == "weight" and kind != "offset" else 0.0) + 0.3 * torch.randn_like(p))
    return norm


def make_sublayer(j: int) -> nn.Module:
    if j == 0:  # "attention": a linear map
        lin = nn.Linear(D, D, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.mul_(2.0)
        return lin
    return nn.Sequential(  # "FFN": a small MLP
        nn.Linear(D, 4 * D, dtype=torch.float64), nn.GELU(), nn.Linear(4 * D, D, dtype=torch.float64)
    )


class Stack(nn.Module):
    """T layers x 2 sublayers, each with its own input norm; seeded."""

    def __init__(self, norm_kind: str = "rms", seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.norms = nn.ModuleList([make_norm(norm_kind) for _ in range(2 * T)])
        self.subs = nn.ModuleList([make_sublayer(i % 2) for i in range(2 * T)])


def embeddings(seed: int = 100, scale: float = 0.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 5, D, generator=g, dtype=torch.float64) * scale


def residuals(stack: Stack, settings: GeoNormSettings) -> list[GeoNormResidual]:
    out = []
    for i in range(2 * T):
        k = i // 2  # the attention and FFN of layer k share a_k
        out_norm = identity_norm_like(stack.norms[i]) if settings.norm_style == "sandwich" else None
        out.append(GeoNormResidual(settings, k, T, out_norm))
    return out


def run_module(stack: Stack, res: list[GeoNormResidual], h0: torch.Tensor, trace: list | None = None):
    h = res[0].enter(h0)
    if trace is not None:
        trace.append(h)
    for i in range(2 * T):
        y = res[i].sublayer_input(h, stack.norms[i])
        h = res[i](h, stack.subs[i](y), stack.norms[i])
        if trace is not None:
            trace.append(h)
    return h


# ----------------------------------------------------------------------------------------------------------
# reference formulas
# ----------------------------------------------------------------------------------------------------------
def ref_step_sizes(decay: str, a: float, n: int) -> list[float]:
    ks = range(1, n + 1)
    return {
        "harmonic": [a / k for k in ks],
        "sqrt": [a / math.sqrt(k) for k in ks],
        "linear": [a * (n + 1 - k) / n for k in ks],
        "constant": [a for _ in ks],
    }[decay]


def _nrm(a: torch.Tensor) -> torch.Tensor:
    return torch.sqrt((a * a).sum(-1, keepdim=True))


def ref_geo_step(x, u, a, max_angle=PI4, c=1.0, b=0.0):
    """Clamped GeoNorm step: rotate x by theta = min(a (c min(|t|/|x|, max) + b), max) towards t; with no clamp
    theta = min(a (c |t|/|x| + b), pi), no turn past the antipode."""
    xn = _nrm(x)
    t = u - ((u * x).sum(-1, keepdim=True) / (xn * xn)) * x
    tn = _nrm(t)
    base = tn / xn
    if max_angle is None:
        theta = torch.clamp(a * (c * base + b), max=math.pi)
    else:
        theta = torch.clamp(a * (c * torch.clamp(base, max=max_angle) + b), max=max_angle)
    return torch.cos(theta) * x + torch.sin(theta) * xn * t / tn


def ref_prenorm(stack: Stack, h0: torch.Tensor) -> torch.Tensor:
    h = h0
    for i in range(2 * T):
        h = h + stack.subs[i](stack.norms[i](h))
    return h


# ----------------------------------------------------------------------------------------------------------
# pre / post / sandwich / deepnorm
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_pre_is_bit_exact(kind):
    stack, h0 = Stack(kind, 1), embeddings()
    res = residuals(stack, GeoNormSettings(norm_style="pre"))
    assert torch.equal(run_module(stack, res, h0), ref_prenorm(stack, h0))


@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("radius", ["embedding", "sqrt_d"])
@pytest.mark.parametrize("learnable", [False, True])
def test_geo_bridge_zero_is_prenorm(kind, radius, learnable):
    stack, h0 = Stack(kind, 2), embeddings()
    settings = GeoNormSettings(norm_style="geo", geo_bridge=0.0, geo_radius=radius, geo_learnable_step=learnable)
    res = residuals(stack, settings)
    if learnable:
        with torch.no_grad():  # Pre-Norm whatever the learnable step
            for r in res:
                r.step_scale.fill_(1.7)
                r.step_bias.fill_(0.2)
    assert torch.equal(res[0].enter(h0), h0)  # with bridge 0 the entry is unchanged, for both radii
    expected = ref_prenorm(stack, h0)
    torch.testing.assert_close(run_module(stack, res, h0), expected, rtol=0, atol=1e-10)
    assert (expected - h0).abs().max() > 1.0  # the stack does move the state


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_post(kind):
    stack, h0 = Stack(kind, 3), embeddings()
    res = residuals(stack, GeoNormSettings(norm_style="post"))
    h = h0
    for i in range(2 * T):
        h = stack.norms[i](h + stack.subs[i](h))
    torch.testing.assert_close(run_module(stack, res, h0), h, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_sandwich(kind):
    stack, h0 = Stack(kind, 4), embeddings()
    res = residuals(stack, GeoNormSettings(norm_style="sandwich"))
    for r in res:  # created as the plain normalisation
        assert torch.equal(r.output_norm.weight, torch.ones(D, dtype=torch.float64))
        if kind == "layer":
            assert torch.equal(r.output_norm.bias, torch.zeros(D, dtype=torch.float64))
        with torch.no_grad():  # then trained: the module must use its own output norm
            for p in r.output_norm.parameters():
                p.add_(0.2 * torch.randn_like(p))
    h = h0
    for i in range(2 * T):
        h = h + res[i].output_norm(stack.subs[i](stack.norms[i](h)))
    torch.testing.assert_close(run_module(stack, res, h0), h, rtol=0, atol=1e-12)


def test_sandwich_needs_output_norm():
    with pytest.raises(ValueError, match="output norm"):
        GeoNormResidual(GeoNormSettings(norm_style="sandwich"), 0, T)


@pytest.mark.parametrize("kind", ["rms", "layer", "offset"])
def test_identity_norm_like(kind):
    torch.manual_seed(5)
    norm = make_norm(kind)
    before = {n: p.clone() for n, p in norm.named_parameters()}
    offset = 1.0 if kind == "offset" else 0.0
    new = identity_norm_like(norm, weight_offset=offset)
    assert type(new) is type(norm) and new is not norm
    assert torch.equal(new.weight, torch.full((D,), 1.0 - offset, dtype=torch.float64))
    if kind == "layer":
        assert torch.equal(new.bias, torch.zeros(D, dtype=torch.float64))
    for n, p in norm.named_parameters():  # the original is untouched and shares no storage
        assert torch.equal(p, before[n])
        assert p.data_ptr() != dict(new.named_parameters())[n].data_ptr()
    # it acts as the plain normalisation
    x = embeddings(6)
    if kind == "layer":
        xc = x - x.mean(-1, keepdim=True)
        plain = xc / torch.sqrt(xc.pow(2).mean(-1, keepdim=True) + norm.eps)
    else:
        plain = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    torch.testing.assert_close(new(x), plain, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_deepnorm(kind):
    stack, h0 = Stack(kind, 7), embeddings()
    res = residuals(stack, GeoNormSettings(norm_style="deepnorm"))
    alpha = (2 * T) ** 0.25
    h = h0
    for i in range(2 * T):
        h = stack.norms[i](alpha * h + stack.subs[i](h))
    torch.testing.assert_close(run_module(stack, res, h0), h, rtol=0, atol=1e-12)


@pytest.mark.parametrize("style", ["pre", "post", "sandwich", "deepnorm", "geo"])
def test_sublayer_input_and_enter(style):
    stack, x = Stack("rms", 8), embeddings()
    r = residuals(stack, GeoNormSettings(norm_style=style, geo_radius="sqrt_d", geo_bridge=0.5))[0]
    expected_in = x if style in ("post", "deepnorm") else stack.norms[0](x)
    assert torch.equal(r.sublayer_input(x, stack.norms[0]), expected_in)
    entered = r.enter(x)
    if style == "geo":  # h (sqrt(d)/|h|)^lam
        torch.testing.assert_close(entered, x * (math.sqrt(D) / _nrm(x)) ** 0.5, rtol=0, atol=1e-12)
    else:
        assert torch.equal(entered, x)


# ----------------------------------------------------------------------------------------------------------
# geo with bridge 1: the clamped geodesic step, on the sphere
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("radius", ["embedding", "sqrt_d"])
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_geo_matches_reference_and_stays_on_sphere(decay, radius, kind):
    stack, h0 = Stack(kind, 9), embeddings()
    alpha = 1.3
    settings = GeoNormSettings(norm_style="geo", geo_decay=decay, geo_alpha=alpha, geo_radius=radius)
    sizes = ref_step_sizes(decay, alpha, T)
    np.testing.assert_allclose(step_sizes(decay, alpha, T), sizes, rtol=1e-15)
    res = residuals(stack, settings)
    trace: list[torch.Tensor] = []
    out = run_module(stack, res, h0, trace)

    h = h0 * math.sqrt(D) / _nrm(h0) if radius == "sqrt_d" else h0
    radius_expected = _nrm(h)
    for i in range(2 * T):
        h = ref_geo_step(h, stack.subs[i](stack.norms[i](h)), sizes[i // 2])
    torch.testing.assert_close(out, h, rtol=0, atol=1e-10)

    if radius == "sqrt_d":
        torch.testing.assert_close(radius_expected, torch.full_like(radius_expected, math.sqrt(D)))
    else:
        torch.testing.assert_close(radius_expected, _nrm(h0), rtol=0, atol=0)
    for state in trace:  # every token keeps its radius through every sublayer
        torch.testing.assert_close(_nrm(state), radius_expected, rtol=0, atol=1e-12)
    assert (out - trace[0]).abs().max() > 0.1  # and the state does move


def test_geo_clamp_is_active_in_the_stack_and_none_disables_it():
    """The stack above does reach the clamp, so the reference comparison covers the clamped branch."""
    stack, h0 = Stack("rms", 9), embeddings()
    clamped = residuals(stack, GeoNormSettings(norm_style="geo", geo_alpha=1.3, geo_decay="constant"))
    free = residuals(stack, GeoNormSettings(norm_style="geo", geo_alpha=1.3, geo_decay="constant", geo_max_angle=None))
    out_free = run_module(stack, free, h0)
    h = h0
    for i in range(2 * T):
        h = ref_geo_step(h, stack.subs[i](stack.norms[i](h)), 1.3, None)
    torch.testing.assert_close(out_free, h, rtol=0, atol=1e-10)
    assert (run_module(stack, clamped, h0) - out_free).abs().max() > 0.01


def test_geo_intermediate_bridge_in_stack():
    stack, h0 = Stack("layer", 10), embeddings()
    lam = 0.4
    settings = GeoNormSettings(norm_style="geo", geo_bridge=lam, geo_radius="sqrt_d")
    out = run_module(stack, residuals(stack, settings), h0)
    sizes = ref_step_sizes("harmonic", 0.5, T)  # the documented default alpha
    h = h0 * (math.sqrt(D) / _nrm(h0)) ** lam
    for i in range(2 * T):
        u = stack.subs[i](stack.norms[i](h))
        hn = _nrm(h)
        t = u - ((u * h).sum(-1, keepdim=True) / (hn * hn)) * h
        tn = _nrm(t)
        theta_pre = torch.atan2(tn, hn + (u * h).sum(-1, keepdim=True) / hn)
        theta_geo = torch.clamp(sizes[i // 2] * torch.clamp(tn / hn, max=PI4), max=PI4)
        theta = (1 - lam) * theta_pre + lam * theta_geo
        h = ((1 - lam) * _nrm(h + u) + lam * hn) * (torch.cos(theta) * h / hn + torch.sin(theta) * t / tn)
    torch.testing.assert_close(out, h, rtol=0, atol=1e-10)


def test_geo_learnable_step_in_stack_and_gradients():
    stack, h0 = Stack("rms", 11), embeddings()
    settings = GeoNormSettings(norm_style="geo", geo_learnable_step=True, geo_alpha=0.9, geo_decay="sqrt")
    res = residuals(stack, settings)
    plain = run_module(stack, residuals(stack, GeoNormSettings(norm_style="geo", geo_alpha=0.9, geo_decay="sqrt")), h0)
    torch.testing.assert_close(run_module(stack, res, h0), plain, rtol=0, atol=1e-12)  # init = plain
    cs, bs = [1.3, 0.7, 1.0, 1.5, 0.9, 1.1], [0.02, 0.0, 0.05, -0.01, 0.03, 0.0]
    with torch.no_grad():
        for r, c, b in zip(res, cs, bs, strict=True):
            r.double()  # the parameters are created in float32; a float64 model holds them in float64
            r.step_scale.fill_(c)
            r.step_bias.fill_(b)
    out = run_module(stack, res, h0)
    sizes = ref_step_sizes("sqrt", 0.9, T)
    h = h0
    for i in range(2 * T):
        h = ref_geo_step(h, stack.subs[i](stack.norms[i](h)), sizes[i // 2], PI4, cs[i], bs[i])
    torch.testing.assert_close(out, h, rtol=0, atol=1e-10)
    out.pow(2).sum().backward()
    for r in res:
        assert r.step_scale.grad is not None and torch.isfinite(r.step_scale.grad)
        assert r.step_bias.grad is not None and torch.isfinite(r.step_bias.grad)
    assert any(r.step_scale.grad.abs() > 0 for r in res)


# ----------------------------------------------------------------------------------------------------------
# parameters
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["pre", "post", "deepnorm", "geo"])
@pytest.mark.parametrize("learnable", [False, True])
def test_parameters(style, learnable):
    settings = GeoNormSettings(norm_style=style, geo_learnable_step=learnable)
    r = GeoNormResidual(settings, 0, T)
    params = dict(r.named_parameters())
    if style == "geo" and learnable:
        assert sorted(params) == ["step_bias", "step_scale"]
        assert r.step_scale.shape == () and r.step_scale.item() == 1.0
        assert r.step_bias.shape == () and r.step_bias.item() == 0.0
        assert all(p.requires_grad for p in params.values())
    else:
        assert params == {}
    assert list(r.buffers()) == []


@pytest.mark.parametrize("learnable", [False, True])
def test_sandwich_parameters_are_the_output_norm(learnable):
    torch.manual_seed(12)
    norm = make_norm("layer")
    r = GeoNormResidual(
        GeoNormSettings(norm_style="sandwich", geo_learnable_step=learnable), 0, T, identity_norm_like(norm)
    )
    assert sorted(n for n, _ in r.named_parameters()) == ["output_norm.bias", "output_norm.weight"]


def test_step_size_stored_per_layer():
    settings = GeoNormSettings(norm_style="geo", geo_decay="linear", geo_alpha=2.0)
    res = residuals(Stack("rms", 13), settings)
    np.testing.assert_allclose([r.step_size for r in res[::2]], ref_step_sizes("linear", 2.0, T), rtol=1e-15)
    assert all(r.step_size == res[2 * (r.layer_index)].step_size for r in res)


# ----------------------------------------------------------------------------------------------------------
# GeoNormSettings
# ----------------------------------------------------------------------------------------------------------
def test_settings_defaults():
    s = GeoNormSettings()
    assert (s.norm_style, s.geo_alpha, s.geo_decay, s.geo_max_angle) == ("geo", 0.5, "harmonic", math.pi / 4)
    assert (s.geo_learnable_step, s.geo_radius, s.geo_bridge) == (False, "embedding", 1.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"geo_max_angle": None},
        {"geo_max_angle": math.pi},
        {"geo_max_angle": 1e-3},
        {"geo_bridge": 0.0},
        {"geo_bridge": 1},
        {"geo_bridge": 0.37},
        {"geo_alpha": 0.0},
        {"geo_alpha": 3},
        {"geo_alpha": [1.0, 0.5, 0.0]},
        {"geo_learnable_step": True},
        {"geo_radius": "sqrt_d"},
        *({"norm_style": s} for s in ["pre", "post", "sandwich", "deepnorm", "geo"]),
        *({"geo_decay": d} for d in DECAYS),
    ],
)
def test_settings_valid(kwargs):
    s = GeoNormSettings(**kwargs).validate(num_layers=3)
    assert isinstance(s.geo_bridge, float) and isinstance(s.geo_max_angle, (float, type(None)))
    assert all(isinstance(a, float) for a in (s.geo_alpha if isinstance(s.geo_alpha, list) else [s.geo_alpha]))


NAN = float("nan")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"norm_style": "layer"}, r"norm_style.*pre, post, sandwich, deepnorm, geo"),
        ({"norm_style": "Geo"}, r"norm_style.*pre, post, sandwich, deepnorm, geo"),
        ({"geo_decay": "exp"}, r"geo_decay.*harmonic, sqrt, linear, constant"),
        ({"geo_radius": "unit"}, r"geo_radius.*embedding, sqrt_d"),
        ({"geo_alpha": -0.1}, r"geo_alpha.*finite number >= 0"),
        ({"geo_alpha": NAN}, r"geo_alpha.*finite number >= 0"),
        ({"geo_alpha": float("inf")}, r"geo_alpha.*finite number >= 0"),
        ({"geo_alpha": True}, r"geo_alpha.*finite number >= 0"),
        ({"geo_alpha": "1.0"}, r"geo_alpha.*finite number >= 0"),
        ({"geo_alpha": [1.0, -1.0, 0.5]}, r"geo_alpha.*finite number >= 0"),
        ({"geo_alpha": [1.0, NAN, 0.5]}, r"geo_alpha.*finite number >= 0"),
        ({"geo_max_angle": 0.0}, r"geo_max_angle.*\(0, pi\]"),
        ({"geo_max_angle": -0.5}, r"geo_max_angle.*\(0, pi\]"),
        ({"geo_max_angle": 3.2}, r"geo_max_angle.*\(0, pi\]"),
        ({"geo_max_angle": NAN}, r"geo_max_angle.*\(0, pi\]"),
        ({"geo_max_angle": True}, r"geo_max_angle.*\(0, pi\]"),
        ({"geo_learnable_step": 1}, r"geo_learnable_step.*True or False"),
        ({"geo_learnable_step": "yes"}, r"geo_learnable_step.*True or False"),
        ({"geo_bridge": -0.01}, r"geo_bridge.*\[0, 1\]"),
        ({"geo_bridge": 1.01}, r"geo_bridge.*\[0, 1\]"),
        ({"geo_bridge": NAN}, r"geo_bridge.*\[0, 1\]"),
        ({"geo_bridge": True}, r"geo_bridge.*\[0, 1\]"),
        ({"geo_bridge": [0.0, 1.5, 1.0]}, r"geo_bridge.*\[0, 1\] .*or a list"),
        ({"geo_bridge": []}, r"geo_bridge.*\[0, 1\] .*or a list"),
        ({"geo_frames": [1.0, 0.0, 0.5]}, r"geo_frames.*positive numbers"),
        ({"geo_frames": 0.5}, r"geo_frames.*positive numbers"),
        ({"geo_frames": [1.0, NAN]}, r"geo_frames.*positive numbers"),
        ({"geo_bridge_costs": [0.1, math.inf]}, r"geo_bridge_costs.*finite numbers"),
        ({"geo_bridge_costs": 0.1}, r"geo_bridge_costs.*finite numbers"),
        ({"geo_bridge_costs": [0.1, True]}, r"geo_bridge_costs.*finite numbers"),
        ({"geo_clamp": "base"}, r"geo_clamp.*both, final"),
    ],
)
def test_settings_invalid(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GeoNormSettings(**kwargs)
    # validate() catches a value set after construction as well
    s = GeoNormSettings()
    for k, v in kwargs.items():
        setattr(s, k, v)
    with pytest.raises(ValueError, match=message):
        s.validate()


def test_settings_list_lengths():
    s = GeoNormSettings(geo_alpha=[1.0, 0.5, 0.25])
    assert s.validate(num_layers=3) is s
    with pytest.raises(ValueError, match=r"one value per layer \(4\).*3"):
        s.validate(num_layers=4)
    for name in ("geo_bridge", "geo_frames", "geo_bridge_costs"):  # the per-update lists are checked the same way
        given = GeoNormSettings(**{name: [0.5] * 6})
        assert given.validate(num_layers=3) is given and given.validate(num_layers=6) is given
        with pytest.raises(ValueError, match=rf"{name} given as a list.*per layer \(4\).*per update \(8:.*got 6"):
            given.validate(num_layers=4)


def test_settings_from_object():
    class Cfg:
        norm_style = "sandwich"
        geo_bridge = 0.5
        hidden_size = 16

    s = GeoNormSettings.from_object(Cfg(), geo_decay="linear")
    assert (s.norm_style, s.geo_bridge, s.geo_decay, s.geo_radius) == ("sandwich", 0.5, "linear", "embedding")
    with pytest.raises(ValueError, match=r"geo_decayy.*valid: norm_style"):
        GeoNormSettings.from_object(Cfg(), geo_decayy="linear")
    with pytest.raises(ValueError, match="geo_bridge"):
        GeoNormSettings.from_object(Cfg(), geo_bridge=2.0)
