"""Tiny random stock models built from configs (no downloads), and a plain GeoNorm reference written
from GEONORM.md that the tests compare the library against."""

from __future__ import annotations

import math
import types

import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

VOCAB = 128
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
MOE = dict(
    moe_intermediate_size=16,
    num_experts=4,
    n_routed_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    shared_expert_intermediate_size=16,
)
DEEPSEEK = dict(
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    n_shared_experts=1,
    first_k_dense_replace=1,
    n_group=1,
    topk_group=1,
    head_dim=None,
    num_key_value_heads=4,
)
DEFAULT_ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
OVERRIDES = {
    "deepseek_v2": DEEPSEEK,
    "deepseek_v3": DEEPSEEK,
    "dots1": dict(n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1),
    "hunyuan_v1_dense": DEFAULT_ROPE,
    "hunyuan_v1_moe": DEFAULT_ROPE,
    "ministral": DEFAULT_ROPE,
    "gpt2": dict(n_embd=32, n_layer=3, n_head=4, bos_token_id=1, eos_token_id=2),
}
GPT2_LIKE = {"gpt2"}


def tiny_config(model_type: str, **kwargs):
    if model_type in GPT2_LIKE:
        values = dict(vocab_size=VOCAB, n_positions=64, **OVERRIDES[model_type])
    else:
        values = {**BASE, **MOE, **OVERRIDES.get(model_type, {})}
    values.update(kwargs)
    return CONFIG_MAPPING[model_type](**values)


def tiny_model(model_type: str, seed: int = 0, **kwargs):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(model_type, **kwargs)).eval()


def token_ids(batch: int = 2, length: int = 9, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


# ---- the reference: GEONORM.md's block, written out, run on a stock model's own modules ----


def step_size(decay: str, alpha: float, k: int, num_layers: int) -> float:
    """a_k for layer k = 1..T."""
    return {
        "harmonic": alpha / k,
        "sqrt": alpha / math.sqrt(k),
        "linear": alpha * (num_layers + 1 - k) / num_layers,
        "constant": alpha,
    }[decay]


def reference_step(x: torch.Tensor, u: torch.Tensor, a: float, max_angle: float | None) -> torch.Tensor:
    """Rotate x by theta = min(a min(|t|/|x|, m), m) towards unit(t), t = u - (<u,x>/<x,x>) x, in float64."""
    x64, u64 = x.double(), u.double()
    xn = x64.norm(dim=-1, keepdim=True)
    t = u64 - (u64 * x64).sum(-1, keepdim=True) / xn**2 * x64
    tn = t.norm(dim=-1, keepdim=True)
    base = tn / xn
    theta = a * base if max_angle is None else torch.clamp(a * torch.clamp(base, max=max_angle), max=max_angle)
    out = torch.cos(theta) * x64 + torch.sin(theta) * xn * t / tn
    return out.to(x.dtype)


def install_reference(model, decay="harmonic", alpha=0.25, max_angle=math.pi / 4, radius="embedding"):
    """Replace each decoder layer's forward of a *stock* model by the reference GeoNorm block (instance-level,
    test only). The stock model's own norms, attention and MLP are called directly."""
    gpt2 = model.config.model_type in GPT2_LIKE
    layers = model.transformer.h if gpt2 else model.model.layers
    num_layers = len(layers)
    mult = getattr(model.config, "residual_multiplier", None)

    def block(layer, x, attn_call, k):
        if k == 1 and radius == "sqrt_d":
            x = x * (math.sqrt(x.shape[-1]) / x.norm(dim=-1, keepdim=True))
        a = step_size(decay, alpha, k, num_layers)
        n1, n2 = (layer.ln_1, layer.ln_2) if gpt2 else (layer.input_layernorm, layer.post_attention_layernorm)
        u = attn_call(n1(x))[0]
        if mult is not None:
            u = u * mult
        x = reference_step(x, u, a, max_angle)
        mlp = layer.mlp(n2(x))
        u = mlp[0] if isinstance(mlp, tuple) else mlp
        if mult is not None:
            u = u * mult
        return reference_step(x, u, a, max_angle)

    for index, layer in enumerate(layers):
        k = index + 1
        if gpt2:

            def forward(self, hidden_states, cache=None, attention_mask=None, *args, k=k, **kwargs):
                kwargs.pop("encoder_attention_mask", None)
                call = lambda h: self.attn(h, cache=cache, attention_mask=attention_mask, **kwargs)  # noqa: E731
                return block(self, hidden_states, call, k)
        else:

            def forward(self, hidden_states, k=k, **kwargs):
                return block(self, hidden_states, lambda h: self.self_attn(hidden_states=h, **kwargs), k)

        layer.forward = types.MethodType(forward, layer)
    return model
