"""GeoNorm written out plainly, to compare the library against (hf_geonorm/modeling/method.md, "The update", "Step
sizes" and "The block").

The reference runs a *stock* model with each decoder layer's output replaced by a copy of the stock block's
forward, written here per layout (tests/support/tiny_models.py names each case's layout), in which every residual
addition ``x + u`` is a call ``step(x, u)``. With ``step = x + u`` the copy must reproduce the stock model
(which checks the copies); with the geodesic step below it is the GeoNorm model. Embeddings, final norm and head
are the stock model's own.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from support.tiny_models import layers_of

PI4 = math.pi / 4
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def step_size(decay: str, alpha: float, k: int, num_layers: int) -> float:
    """a_k for layer k = 1..T."""
    return {
        "harmonic": alpha / k,
        "sqrt": alpha / math.sqrt(k),
        "linear": alpha * (num_layers + 1 - k) / num_layers,
        "constant": alpha,
    }[decay]


def geodesic_step(
    x: torch.Tensor, u: torch.Tensor, a: float, max_angle: float | None, clamped: list[int] | None = None
) -> torch.Tensor:
    """Rotate x by theta = min(a min(|t|/|x|, m), m) towards unit(t), t = u - (<u,x>/<x,x>) x, in float64
    (theta = min(a |t|/|x|, pi) without the clamp: no turn past the antipode). ``clamped`` collects how many rows
    the clamp changed."""
    x64, u64 = x.double(), u.double()
    xn = x64.norm(dim=-1, keepdim=True)
    t = u64 - (u64 * x64).sum(-1, keepdim=True) / xn**2 * x64
    tn = t.norm(dim=-1, keepdim=True)
    base = tn / xn
    if max_angle is None:
        theta = torch.clamp(a * base, max=math.pi)
    else:
        theta = torch.clamp(a * torch.clamp(base, max=max_angle), max=max_angle)
        if clamped is not None:
            clamped.append(int((a * base > max_angle).sum()))
    out = torch.cos(theta) * x64 + torch.sin(theta) * xn * t / tn
    return out.to(x.dtype)


# ---- each layout's stock block, with its residual additions replaced by `step(x, u)` ----


def _out(output):
    return output[0] if isinstance(output, tuple) else output


def block_llama(layer, x, kw, step, n1="input_layernorm", n2="post_attention_layernorm"):
    x = step(x, _out(layer.self_attn(hidden_states=getattr(layer, n1)(x), **kw)))
    return step(x, _out(layer.mlp(getattr(layer, n2)(x))))


def block_apertus(layer, x, kw, step):
    return block_llama(layer, x, kw, step, "attention_layernorm", "feedforward_layernorm")


def block_persimmon(layer, x, kw, step):
    x = step(x, _out(layer.self_attn(hidden_states=layer.input_layernorm(x), **kw)))
    return step(x, layer.dropout(layer.mlp(layer.post_attention_layernorm(x))))


def block_gemma2(layer, x, kw, step):
    a = layer.post_attention_layernorm(_out(layer.self_attn(hidden_states=layer.input_layernorm(x), **kw)))
    x = step(x, a)
    return step(x, layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x))))


def block_glm4(layer, x, kw, step):
    a = layer.post_self_attn_layernorm(_out(layer.self_attn(hidden_states=layer.input_layernorm(x), **kw)))
    x = step(x, a)
    return step(x, layer.post_mlp_layernorm(layer.mlp(layer.post_attention_layernorm(x))))


def block_olmo2(layer, x, kw, step):  # no input norms: x + N(F(x))
    x = step(x, layer.post_attention_layernorm(_out(layer.self_attn(hidden_states=x, **kw))))
    return step(x, layer.post_feedforward_layernorm(layer.mlp(x)))


def block_gpt_neox(layer, x, kw, step):
    a = layer.post_attention_dropout(_out(layer.attention(layer.input_layernorm(x), **kw)))
    if layer.use_parallel_residual:
        return step(x, a + layer.post_mlp_dropout(layer.mlp(layer.post_attention_layernorm(x))))
    x = step(x, a)
    return step(x, layer.post_mlp_dropout(layer.mlp(layer.post_attention_layernorm(x))))


def block_phi(layer, x, kw, step):
    h = layer.input_layernorm(x)
    a = layer.resid_dropout(_out(layer.self_attn(hidden_states=h, **kw)))
    return step(x, a + layer.resid_dropout(layer.mlp(h)))


def block_parallel(layer, x, kw, step):  # GPT-J, CodeGen, Cohere: one norm, u = Attn(h) + MLP(h)
    norm, attn = (layer.ln_1, layer.attn) if hasattr(layer, "ln_1") else (layer.input_layernorm, layer.self_attn)
    h = norm(x)
    return step(x, _out(attn(hidden_states=h, **kw)) + layer.mlp(h))


def block_stablelm(layer, x, kw, step):
    h = layer.input_layernorm(x)
    a = _out(layer.self_attn(hidden_states=h, **kw))
    if layer.use_parallel_residual:
        return step(x, a + layer.dropout(layer.mlp(h)))
    x = step(x, a)
    return step(x, layer.dropout(layer.mlp(layer.post_attention_layernorm(x))))


def block_falcon(layer, x, kw, step):
    cfg = layer.config
    new, parallel, num_ln = cfg.new_decoder_architecture, cfg.parallel_attn, cfg.num_ln_in_parallel_attn
    if new and num_ln == 2:
        h_attn, h_mlp = layer.ln_attn(x), layer.ln_mlp(x)
    else:
        h_attn = h_mlp = layer.input_layernorm(x)
    a = _out(layer.self_attention(h_attn, **kw))
    if not new and not parallel:  # sequential
        x = step(x, F.dropout(a, cfg.attention_dropout, layer.training))
        return step(x, F.dropout(layer.mlp(layer.post_attention_layernorm(x)), cfg.hidden_dropout, layer.training))
    return step(x, F.dropout(layer.mlp(h_mlp) + a, cfg.hidden_dropout, layer.training))


def block_gpt2(layer, x, kw, step):  # GPT-2, GPT-Neo, GPTBigCode
    kw = {k: v for k, v in kw.items() if k not in ("encoder_hidden_states", "encoder_attention_mask")}
    x = step(x, _out(layer.attn(layer.ln_1(x), **kw)))
    return step(x, layer.mlp(layer.ln_2(x)))


BLOCKS = {
    "llama": block_llama,
    "apertus": block_apertus,
    "persimmon": block_persimmon,
    "gemma2": block_gemma2,
    "glm4": block_glm4,
    "olmo2": block_olmo2,
    "gpt_neox": block_gpt_neox,
    "phi": block_phi,
    "parallel": block_parallel,
    "stablelm": block_stablelm,
    "falcon": block_falcon,
    "gpt2": block_gpt2,
}


def _layer_inputs(layer, args, kwargs) -> tuple[torch.Tensor, dict]:
    """The hidden state and every other argument, by name, of a decoder layer call (GPT-2 passes its cache and
    mask positionally)."""
    signature = inspect.signature(layer.forward)
    bound = signature.bind(*args, **kwargs).arguments
    x = bound.pop(next(iter(signature.parameters)))
    named = {}
    for name, value in bound.items():
        named.update(value if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD else {name: value})
    return x, named


def reference_logits(
    stock, block: str, ids: torch.Tensor, step_for_layer: Callable[[int], Step], enter: Step | None = None
) -> torch.Tensor:
    """Logits of ``stock`` with decoder layer k (0-based) replaced by the written-out ``block`` whose residual
    additions are ``step_for_layer(k)``; ``enter(x, x)`` rescales the embeddings first. Granite's
    residual_multiplier scales each update u, as in its stock block."""
    layout = BLOCKS[block]
    multiplier = getattr(stock.config, "residual_multiplier", None)
    handles = []
    for k, layer in enumerate(layers_of(stock)):

        def hook(module, args, kwargs, output, k=k):
            x, named = _layer_inputs(module, args, kwargs)
            if k == 0 and enter is not None:
                x = enter(x, x)
            step = step_for_layer(k)
            scaled = step if multiplier is None else (lambda x, u: step(x, u * multiplier))
            new = layout(module, x, named, scaled)
            return (new, *output[1:]) if isinstance(output, tuple) else new

        handles.append(layer.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            return stock(ids, use_cache=False).logits
    finally:
        for handle in handles:
            handle.remove()


def plain_logits(stock, block: str, ids: torch.Tensor) -> torch.Tensor:
    """The written-out block with plain residual additions: must be the stock model."""
    return reference_logits(stock, block, ids, lambda k: lambda x, u: x + u)


def geonorm_logits(
    stock,
    block: str,
    ids: torch.Tensor,
    geo_decay: str = "harmonic",
    geo_alpha: float = 0.5,  # the documented defaults (README, Settings)
    geo_max_angle: float | None = PI4,
    geo_radius: str = "embedding",
    clamped: list[int] | None = None,
) -> torch.Tensor:
    """The GeoNorm model's logits for these settings, computed from the stock model's modules and the formulas
    above."""
    num_layers = len(layers_of(stock))
    steps = [step_size(geo_decay, geo_alpha, k + 1, num_layers) for k in range(num_layers)]

    def to_sqrt_d(x, _):
        return x * (math.sqrt(x.shape[-1]) / x.norm(dim=-1, keepdim=True))

    return reference_logits(
        stock,
        block,
        ids,
        lambda k: lambda x, u: geodesic_step(x, u, steps[k], geo_max_angle, clamped),
        to_sqrt_d if geo_radius == "sqrt_d" else None,
    )
