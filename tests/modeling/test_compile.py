"""torch.compile of GeoNorm training steps: no graph break comes from this project.

- A tiny GeoNorm LLaMA's training step (forward, loss, backward) compiles with ``fullgraph=True`` and matches
  eager. This is the one whole-model compilation: with the ``aot_eager`` backend by default (Dynamo's capture
  and AOTAutograd's forward/backward tracing, where graph breaks and untraceable backward code show up), and
  with Inductor under ``--runslow`` (minutes of C++ compilation on a CPU).
- GPT-2: stock GPT2LMHeadModel names no loss (its class name), which makes transformers break the graph (its
  ``loss_function`` property warns); the converted model names it (``loss_type``), so its whole training step
  compiles with ``fullgraph=True``.
- Every residual style and GeoNorm setting compiles with ``fullgraph=True``, forward and backward, with the
  fused update on and off.
- The fused GeoNorm step compiled by Inductor (the code a compiled model runs) matches eager, values and
  gradients.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import hf_geonorm
from hf_geonorm import GeoNormResidual, GeoNormSettings
from hf_geonorm.modeling import fused
from hf_geonorm.modeling.geometry import FusedGeodesicStep

from support.tiny_models import tiny_model, token_ids


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    fused.set_fused_enabled(True)
    yield
    fused.set_fused_enabled(True)
    torch._dynamo.reset()


def training_loss(model):
    def step(ids):
        return model(ids, labels=ids).loss

    return step


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_llama_training_step_compiles_fullgraph_and_matches_eager(backend):
    model = hf_geonorm.convert(tiny_model("llama", num_hidden_layers=2)).train()  # Dynamo traces every layer anew
    ids = token_ids()
    eager = training_loss(model)(ids)
    eager.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    loss = torch.compile(training_loss(model), fullgraph=True, backend=backend)(ids)
    loss.backward()
    torch.testing.assert_close(loss, eager, atol=1e-5, rtol=1e-5)
    got = grads(model)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_converted_gpt2_training_step_is_one_graph():
    """Stock GPT2LMHeadModel names no loss (its class name), which makes transformers break the graph; the
    converted model names it, so the whole training step compiles as one graph (``fullgraph=True`` raises on a
    graph break, naming its reason and frame)."""
    stock = tiny_model("gpt2", n_layer=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).train()
    geo = hf_geonorm.convert(stock).train()
    assert geo.loss_type == "ForCausalLM"
    ids = token_ids()
    eager = training_loss(geo)(ids)
    loss = torch.compile(training_loss(geo), fullgraph=True, backend="aot_eager")(ids)
    loss.backward()
    torch.testing.assert_close(loss, eager, atol=1e-5, rtol=1e-5)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in geo.parameters())


D = 16
VARIANTS = {
    "pre": dict(norm_style="pre"),
    "post": dict(norm_style="post"),
    "sandwich": dict(norm_style="sandwich"),
    "deepnorm": dict(norm_style="deepnorm"),
    "geo": dict(),
    "geo_no_clamp": dict(geo_max_angle=None),
    "geo_bridge": dict(geo_bridge=0.4, geo_radius="sqrt_d"),
    "geo_learnable": dict(geo_learnable_step=True),
}


def residual_block(settings: GeoNormSettings, seed: int):
    """Two sublayers through GeoNormResidual (enter, sublayer_input, forward): a loss function and its
    parameters."""
    torch.manual_seed(seed)
    norms = nn.ModuleList([nn.RMSNorm(D) for _ in range(2)])
    subs = nn.ModuleList([nn.Linear(D, D), nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))])
    out_norms = [nn.RMSNorm(D) if settings.norm_style == "sandwich" else None for _ in range(2)]
    res = nn.ModuleList([GeoNormResidual(settings, 0, 2, out_norms[i]) for i in range(2)])

    def block(h):
        h = res[0].enter(h)
        for i in range(2):
            h = res[i](h, subs[i](res[i].sublayer_input(h, norms[i])), norms[i])
        return h.square().mean()

    return block, [*norms.parameters(), *subs.parameters(), *res.parameters()]


@pytest.mark.parametrize("fused_on", [True, False])
def test_every_residual_style_compiles_fullgraph(fused_on):
    """Every style and setting, each in its own block, compiled together as one function with fullgraph=True
    (a graph break in any of them raises, naming its frame): forward and backward equal to eager. The unfused
    path matters for the geo variants only."""
    names = [name for name in VARIANTS if fused_on or name.startswith("geo")]
    blocks = [residual_block(GeoNormSettings(**VARIANTS[name]), seed) for seed, name in enumerate(names)]
    params = [p for _, block_params in blocks for p in block_params]

    def losses(h):
        return [block(h) for block, _ in blocks]

    h0 = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1)) * 2
    fused.set_fused_enabled(fused_on)
    eager = losses(h0)
    expected = torch.autograd.grad(sum(eager), params)  # the blocks share no parameter
    compiled = torch.compile(losses, fullgraph=True, backend="aot_eager")(h0)
    got = torch.autograd.grad(sum(compiled), params)
    for name, c, e in zip(names, compiled, eager, strict=True):
        assert math.isfinite(c.item()), name
        torch.testing.assert_close(c, e, atol=1e-6, rtol=1e-5, msg=name)
    owners = [name for name, (_, block_params) in zip(names, blocks, strict=True) for _ in block_params]
    for name, g, e in zip(owners, got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4, msg=name)
    if fused_on:  # the fused Function is what the geo blocks compiled
        assert fused.can_fuse(h0, h0, 0.8)


@pytest.mark.parametrize("keep", ["output", "update"])
def test_fused_step_under_inductor_matches_eager(keep):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 7, 40, generator=g) * 2).requires_grad_(True)
    u = torch.randn(3, 7, 40, generator=g).requires_grad_(True)
    w = torch.randn(3, 7, 40, generator=g)

    def loss(a, b):
        return (FusedGeodesicStep.apply(a, b, 0.9, math.pi / 4, None, keep) * w).sum()

    eager = loss(x, u)
    expected = torch.autograd.grad(eager, (x, u))
    compiled = torch.compile(loss, fullgraph=True)(x, u)
    got = torch.autograd.grad(compiled, (x, u))
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-5)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
