"""torch.compile of GeoNorm training steps: no graph break comes from this project.

- A tiny GeoNorm LLaMA's training step (forward, loss, backward) compiles with ``fullgraph=True`` and
  matches eager.
- GPT-2: transformers itself breaks the graph (its ``loss_function`` property warns when the class name does
  not say which loss, and GPT2LMHeadModel's does not; the stock model breaks the same way). ``explain``
  attributes every break to transformers' files, none to hf_geonorm's; with ``loss_type`` named the whole
  step compiles with ``fullgraph=True``.
- Every residual style and GeoNorm setting compiles with ``fullgraph=True``, forward and backward, with the
  fused update on and off.
- The fused GeoNorm step compiled by Inductor (the code a compiled model runs) matches eager, values and
  gradients. (tests/test_models.py compiles a whole tiny model with Inductor.)
Compilation is slow on CPU: tiny models, and the cheap ``aot_eager`` backend for the model-level checks
(Dynamo's capture and AOTAutograd's forward/backward tracing: where graph breaks and untraceable backward
code show up).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
from tiny_models import tiny_model, token_ids
from torch import nn

import hf_geonorm
from hf_geonorm import GeoNormResidual, GeoNormSettings, fused

PACKAGE_DIR = Path(hf_geonorm.__file__).resolve().parent
TRANSFORMERS_DIR = Path(transformers.__file__).resolve().parent


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


def frames_of_breaks(explanation) -> list[str]:
    """The source file of the innermost user frame of every graph break."""
    return [str(Path(r.user_stack[-1].filename).resolve()) for r in explanation.break_reasons if r.user_stack]


def test_llama_training_step_compiles_fullgraph_and_matches_eager():
    model = hf_geonorm.convert(tiny_model("llama")).train()
    ids = token_ids()
    eager = training_loss(model)(ids)
    eager.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    loss = torch.compile(training_loss(model), fullgraph=True, backend="aot_eager")(ids)
    loss.backward()
    torch.testing.assert_close(loss, eager, atol=1e-5, rtol=1e-5)
    got = grads(model)
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_converted_gpt2_training_step_is_one_graph():
    """Stock GPT2LMHeadModel names no loss (its class name), which makes transformers break the graph; the
    converted model names it, so the whole training step compiles as one graph."""
    stock = tiny_model("gpt2", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).train()
    geo = hf_geonorm.convert(stock).train()
    assert geo.loss_type == "ForCausalLM"
    ids = token_ids()
    explained = torch._dynamo.explain(training_loss(geo))(ids)
    assert explained.graph_break_count == 0, frames_of_breaks(explained)
    torch._dynamo.reset()
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


@pytest.mark.parametrize(
    "variant,fused_on", [(v, True) for v in VARIANTS] + [(v, False) for v in VARIANTS if v.startswith("geo")]
)
def test_residual_modules_compile_fullgraph(variant, fused_on):
    """Two sublayers through GeoNormResidual (enter, sublayer_input, forward), compiled whole with
    fullgraph=True, forward and backward equal to eager."""
    settings = GeoNormSettings(**VARIANTS[variant])
    torch.manual_seed(0)
    norms = nn.ModuleList([nn.RMSNorm(D) for _ in range(2)])
    subs = nn.ModuleList([nn.Linear(D, D), nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))])
    out_norms = [nn.RMSNorm(D) if settings.norm_style == "sandwich" else None for _ in range(2)]
    res = nn.ModuleList([GeoNormResidual(settings, 0, 2, 0.8, out_norms[i]) for i in range(2)])
    params = [*norms.parameters(), *subs.parameters(), *res.parameters()]

    def block(h):
        h = res[0].enter(h)
        for i in range(2):
            h = res[i](h, subs[i](res[i].sublayer_input(h, norms[i])), norms[i])
        return h.square().mean()

    h0 = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1)) * 2
    fused.set_fused_enabled(fused_on)
    eager = block(h0)
    expected = torch.autograd.grad(eager, params)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(h0)
    got = torch.autograd.grad(compiled, params)
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-5)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)
    if variant == "geo" and fused_on:  # the fused Function is what was compiled
        assert fused.can_fuse(h0, h0, 0.8, 1.0, None, None)
    assert math.isfinite(compiled.item())


@pytest.mark.parametrize("keep", ["output", "update"])
def test_fused_step_under_inductor_matches_eager(keep):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(3, 7, 40, generator=g) * 2).requires_grad_(True)
    u = torch.randn(3, 7, 40, generator=g).requires_grad_(True)
    w = torch.randn(3, 7, 40, generator=g)

    def loss(a, b):
        return (fused.fused_geonorm_step(a, b, 0.9, math.pi / 4, keep=keep) * w).sum()

    eager = loss(x, u)
    expected = torch.autograd.grad(eager, (x, u))
    compiled = torch.compile(loss, fullgraph=True)(x, u)
    got = torch.autograd.grad(compiled, (x, u))
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-5)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
