"""Every decoder layout beyond LLaMA's, GPT-2's and the first few variants, proven on tiny random stock models.

For each covered model type (and each block variant a config can select) the tests show:
- ``norm_style='pre'`` gives the stock logits, ``'geo'`` with ``geo_bridge=0`` too;
- ``'geo'`` keeps every token's norm through the layers (its embedding norm, or sqrt(d) with ``geo_radius='sqrt_d'``);
- ``'geo'`` logits equal a plain re-implementation written here: the stock block's own forward, copied per
  family below with each residual addition ``x + u`` replaced by the clamped geodesic step of GEONORM.md
  (written out with torch ops; with plain addition the same code reproduces the stock model, which checks it);
- save_pretrained -> AutoModelForCausalLM.from_pretrained gives the same class and logits.
benchmarks/scan_layouts.py supplies the list of LLaMA-identical types that LLAMA_LAYOUT_TYPES must contain.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm.modeling_geonorm import FAMILIES, LAYOUTS, LLAMA, LLAMA_LAYOUT_TYPES

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 100
PI4 = math.pi / 4

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
NO_HEAD_DIM = {k: v for k, v in COMMON.items() if k not in ("head_dim", "num_key_value_heads")}
MOE = dict(
    moe_intermediate_size=16,
    num_experts_per_tok=2,
    n_routed_experts=4,
    num_experts=4,
    num_local_experts=4,
    moe_num_experts=4,
    moe_k=2,
    n_shared_experts=1,
    num_shared_experts=1,
    moe_num_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    shared_expert_intermediate_size=16,
    shared_experts_intermediate_size=16,
)
MLA = dict(
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=4,
    qk_nope_head_dim=4,
    v_head_dim=8,
    head_dim=4,
    index_topk=8,
    index_head_dim=8,
    index_n_heads=2,
)
GPT = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)

# case id -> (model type, config kwargs)
CASES: dict[str, tuple[str, dict]] = {
    "gpt_neox-parallel": ("gpt_neox", dict(COMMON, use_parallel_residual=True)),
    "gpt_neox-sequential": ("gpt_neox", dict(COMMON, use_parallel_residual=False)),
    "phi": ("phi", COMMON),
    "gptj": ("gptj", dict(GPT, rotary_dim=4)),
    "codegen": ("codegen", dict(GPT, rotary_dim=4, n_ctx=64)),
    "falcon": ("falcon", NO_HEAD_DIM),
    "falcon-alibi": ("falcon", dict(NO_HEAD_DIM, alibi=True)),
    "falcon-new": ("falcon", dict(NO_HEAD_DIM, new_decoder_architecture=True, num_kv_heads=2)),
    "falcon-new-1ln": (
        "falcon",
        dict(NO_HEAD_DIM, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
    ),
    "falcon-sequential": ("falcon", dict(NO_HEAD_DIM, parallel_attn=False)),
    "cohere": ("cohere", COMMON),
    "stablelm-parallel": ("stablelm", dict(COMMON, use_parallel_residual=True)),
    "stablelm-sequential": ("stablelm", dict(COMMON, use_parallel_residual=False)),
    "gemma2": ("gemma2", dict(COMMON, sliding_window=4)),
    "gemma3_text": ("gemma3_text", dict(COMMON, sliding_window=4, layer_types=["sliding_attention", "full_attention"])),
    "olmo2": ("olmo2", COMMON),
    "olmo3": ("olmo3", COMMON),
    "glm4": ("glm4", COMMON),
    "exaone4": ("exaone4", COMMON),
    "phimoe": ("phimoe", dict(COMMON, num_local_experts=4, num_experts_per_tok=2)),
    "nemotron": ("nemotron", COMMON),
    "persimmon": ("persimmon", COMMON),
    "apertus": ("apertus", COMMON),
    "gpt_neo": (
        "gpt_neo",
        dict(
            vocab_size=VOCAB,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            attention_types=[[["global", "local"], 1]],
            window_size=4,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    "gpt_bigcode": ("gpt_bigcode", GPT),
}
# LLaMA-identical types added with this file (the older ones are covered by tests/test_models.py)
for _t in ("exaone", "flint", "internlm3", "iquestcoder", "jais2", "ministral3", "nanochat"):
    CASES[_t] = (_t, COMMON)
for _t in (
    "aria_text", "ernie4_5_moe", "exaone_moe", "hy_v3", "laguna", "mellum", "mimo_v2_flash", "olmoe", "sarvam_moe",
    "solar_open",
):  # fmt: skip
    CASES[_t] = (_t, dict(COMMON, **MOE))
for _t in ("axk1", "glm4_moe_lite", "sarvam_mla", "youtu"):
    CASES[_t] = (_t, dict(COMMON, **MOE, **MLA))
for _t in ("axk2", "deepseek_v32", "dots3_note_text"):  # these need as many key/value heads as query heads
    CASES[_t] = (_t, dict(COMMON, **MOE, **MLA, num_key_value_heads=4))

# what the brief asks to cover beyond the LLaMA-identical types (each must appear in CASES)
NEW_FAMILIES = {
    "gpt_neox", "phi", "gptj", "codegen", "falcon", "cohere", "stablelm", "gemma2", "gemma3_text", "olmo2",
    "olmo3", "glm4", "exaone4", "phimoe", "nemotron", "persimmon", "apertus", "gpt_neo", "gpt_bigcode",
}  # fmt: skip
IDS = list(CASES)


@functools.cache
def stock_model(case: str):
    model_type, kwargs = CASES[case]
    family = FAMILIES[model_type]
    config = family.stock_config_class(**kwargs)
    torch.manual_seed(0)
    model = family.stock_causal_class(config).eval()
    # some inits zero the output projections (NanoChat) or set every norm weight alike: perturb them all
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return model


def token_ids() -> torch.Tensor:
    return torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))


def logits(model, ids=None, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(ids if ids is not None else token_ids(), **kwargs).logits


def layers_of(model):
    base = model.base_model
    return base.layers if hasattr(base, "layers") else base.h


# ---- the reference: each family's stock block with its residual additions replaced by `step(x, u)` ----


def _out(output):
    return output[0] if isinstance(output, tuple) else output


def ref_llama(layer, x, kw, step, n1="input_layernorm", n2="post_attention_layernorm"):
    x = step(x, _out(layer.self_attn(hidden_states=getattr(layer, n1)(x), **kw)))
    return step(x, _out(layer.mlp(getattr(layer, n2)(x))))


def ref_apertus(layer, x, kw, step):
    return ref_llama(layer, x, kw, step, "attention_layernorm", "feedforward_layernorm")


def ref_persimmon(layer, x, kw, step):
    x = step(x, _out(layer.self_attn(hidden_states=layer.input_layernorm(x), **kw)))
    return step(x, layer.dropout(layer.mlp(layer.post_attention_layernorm(x))))


def ref_gemma2(layer, x, kw, step):
    a = layer.post_attention_layernorm(_out(layer.self_attn(hidden_states=layer.input_layernorm(x), **kw)))
    x = step(x, a)
    return step(x, layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x))))


def ref_glm4(layer, x, kw, step):
    a = layer.post_self_attn_layernorm(_out(layer.self_attn(hidden_states=layer.input_layernorm(x), **kw)))
    x = step(x, a)
    return step(x, layer.post_mlp_layernorm(layer.mlp(layer.post_attention_layernorm(x))))


def ref_olmo2(layer, x, kw, step):  # no input norms: x + N(F(x))
    x = step(x, layer.post_attention_layernorm(_out(layer.self_attn(hidden_states=x, **kw))))
    return step(x, layer.post_feedforward_layernorm(layer.mlp(x)))


def ref_gpt_neox(layer, x, kw, step):
    a = layer.post_attention_dropout(_out(layer.attention(layer.input_layernorm(x), **kw)))
    if layer.use_parallel_residual:
        return step(x, a + layer.post_mlp_dropout(layer.mlp(layer.post_attention_layernorm(x))))
    x = step(x, a)
    return step(x, layer.post_mlp_dropout(layer.mlp(layer.post_attention_layernorm(x))))


def ref_phi(layer, x, kw, step):
    h = layer.input_layernorm(x)
    a = layer.resid_dropout(_out(layer.self_attn(hidden_states=h, **kw)))
    return step(x, a + layer.resid_dropout(layer.mlp(h)))


def ref_shared_parallel(layer, x, kw, step):  # GPT-J, CodeGen, Cohere: one norm, u = Attn(h) + MLP(h)
    norm, attn = (layer.ln_1, layer.attn) if hasattr(layer, "ln_1") else (layer.input_layernorm, layer.self_attn)
    h = norm(x)
    return step(x, _out(attn(hidden_states=h, **kw)) + layer.mlp(h))


def ref_stablelm(layer, x, kw, step):
    h = layer.input_layernorm(x)
    a = _out(layer.self_attn(hidden_states=h, **kw))
    if layer.use_parallel_residual:
        return step(x, a + layer.dropout(layer.mlp(h)))
    x = step(x, a)
    return step(x, layer.dropout(layer.mlp(layer.post_attention_layernorm(x))))


def ref_falcon(layer, x, kw, step):
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


def ref_gpt2_shaped(layer, x, kw, step):  # GPT-Neo, GPTBigCode
    kw = {k: v for k, v in kw.items() if k != "encoder_attention_mask"}
    x = step(x, _out(layer.attn(layer.ln_1(x), **kw)))
    return step(x, layer.mlp(layer.ln_2(x)))


REFERENCE_BLOCKS = {
    "apertus": ref_apertus,
    "persimmon": ref_persimmon,
    "gemma2": ref_gemma2,
    "gemma3_text": ref_gemma2,
    "glm4": ref_glm4,
    "olmo2": ref_olmo2,
    "olmo3": ref_olmo2,
    "exaone4": ref_olmo2,
    "gpt_neox": ref_gpt_neox,
    "phi": ref_phi,
    "gptj": ref_shared_parallel,
    "codegen": ref_shared_parallel,
    "cohere": ref_shared_parallel,
    "stablelm": ref_stablelm,
    "falcon": ref_falcon,
    "gpt_neo": ref_gpt2_shaped,
    "gpt_bigcode": ref_gpt2_shaped,
}


def geo_step(x: torch.Tensor, u: torch.Tensor, a: float, max_angle: float, counts: list) -> torch.Tensor:
    """GEONORM.md's model-level step: rotate x by theta = min(a min(|t|/|x|, m), m) towards unit(t)."""
    x64, u64 = x.double(), u.double()
    xn = x64.norm(dim=-1, keepdim=True)
    t = u64 - (u64 * x64).sum(-1, keepdim=True) / xn**2 * x64
    tn = t.norm(dim=-1, keepdim=True)
    base = tn / xn
    theta = torch.clamp(a * torch.clamp(base, max=max_angle), max=max_angle)
    counts.append(int((a * base > max_angle).sum()))
    out = torch.cos(theta) * x64 + torch.sin(theta) * xn * t / tn
    return out.to(x.dtype)


def reference_logits(case: str, step_for_layer) -> torch.Tensor:
    """Run the stock model with each decoder layer's output replaced by the reference block's (its input is the
    previous replacement); embeddings, final norm and head are the stock model's own."""
    stock = stock_model(case)
    block = REFERENCE_BLOCKS.get(CASES[case][0], ref_llama)
    handles = []
    for k, layer in enumerate(layers_of(stock)):

        def hook(module, args, kwargs, output, k=k):
            x = args[0] if args else kwargs["hidden_states"]
            new = block(module, x, kwargs, step_for_layer(k))
            return (new, *output[1:]) if isinstance(output, tuple) else new

        handles.append(layer.register_forward_hook(hook, with_kwargs=True))
    try:
        return logits(stock, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()


# ---- the tests ----


def test_every_requested_family_has_a_case():
    assert NEW_FAMILIES <= {model_type for model_type, _ in CASES.values()}
    assert NEW_FAMILIES <= set(hf_geonorm.supported_architectures())


@pytest.mark.parametrize("case", IDS)
def test_pre_and_bridge_zero_equal_the_stock_model(case):
    stock = stock_model(case)
    reference = logits(stock)
    pre = hf_geonorm.convert(stock, norm_style="pre")
    assert type(pre) is FAMILIES[CASES[case][0]].causal_class
    assert all(type(layer).__name__.startswith("GeoNorm") for layer in layers_of(pre))
    assert (logits(pre) - reference).abs().max() <= 1e-6
    bridge0 = hf_geonorm.convert(stock, norm_style="geo", geo_bridge=0.0)
    assert (logits(bridge0) - reference).abs().max() <= 1e-5
    assert (logits(hf_geonorm.convert(stock, norm_style="geo")) - reference).abs().max() > 1e-4  # geo differs


@pytest.mark.parametrize("case", IDS)
def test_geo_keeps_each_token_norm_through_the_layers(case):
    stock = stock_model(case)
    d = stock.config.hidden_size
    for radius in ("embedding", "sqrt_d"):
        model = hf_geonorm.convert(stock, norm_style="geo", geo_radius=radius)
        layers = layers_of(model)
        last: list = []
        handle = layers[-1].register_forward_hook(lambda m, a, out, last=last: last.append(_out(out)))
        try:
            out = model(token_ids(), output_hidden_states=True)
        finally:
            handle.remove()
        states = out.hidden_states
        assert len(states) == len(layers) + 1  # the last entry is after the final norm: replaced by the hook
        h0 = states[0].norm(dim=-1)
        norms = [h.norm(dim=-1) for h in [*states[1 : len(layers)], last[0]]]
        expected = h0 if radius == "embedding" else torch.full_like(h0, math.sqrt(d))
        for norm in norms:
            torch.testing.assert_close(norm, expected, rtol=1e-5, atol=0)
    # not vacuous: the stock model does change the norms
    with torch.no_grad():
        stock_states = stock(token_ids(), output_hidden_states=True).hidden_states
    before, after = stock_states[0].norm(dim=-1), stock_states[1].norm(dim=-1)
    assert ((after - before).abs() / before).max() > 1e-3


@pytest.mark.parametrize("case", IDS)
def test_geo_equals_the_written_out_reference(case):
    stock = stock_model(case)
    num_layers = len(layers_of(stock))
    # the reference with plain addition is the stock model (checks the per-family copies above)
    added = reference_logits(case, lambda k: lambda x, u: x + u)
    assert (added - logits(stock)).abs().max() <= 1e-6
    for settings, steps in (
        ({}, [0.25 / (k + 1) for k in range(num_layers)]),  # the documented defaults: harmonic a/k, a = 0.25
        ({"geo_alpha": 40.0, "geo_decay": "constant"}, [40.0] * num_layers),  # large steps: the clamps act
    ):
        counts: list = []
        expected = reference_logits(case, lambda k, s=steps, c=counts: lambda x, u: geo_step(x, u, s[k], PI4, c))
        got = logits(hf_geonorm.convert(stock, norm_style="geo", **settings))
        assert (got - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max().item())
        if settings:
            assert sum(counts) > 0, "the clamp never acted: the test would not check it"


@pytest.mark.parametrize("case", IDS)
def test_save_and_reload_through_the_auto_class(case, tmp_path):
    model = hf_geonorm.convert(stock_model(case), norm_style="geo", geo_alpha=0.75)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    assert loaded.config.model_type == f"geonorm_{CASES[case][0]}"
    assert loaded.config.geo_alpha == 0.75
    # bit-equal except where a MoE expert kernel rounds differently in a new instance (ernie4_5_moe: 3e-8)
    assert (logits(loaded) - logits(model)).abs().max() <= 1e-6


@pytest.mark.parametrize("case", IDS)
def test_generation_with_the_cache(case):
    """The layers pass the cache through: greedy decoding of 'pre' is the stock model's, and 'geo' decodes the
    same with and without the cache."""
    stock = stock_model(case)
    ids = token_ids()[:1, :4]
    greedy = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = stock.generate(ids, **greedy)
        assert torch.equal(hf_geonorm.convert(stock, norm_style="pre").generate(ids, **greedy), expected)
        geo = hf_geonorm.convert(stock, norm_style="geo")
        cached = geo.generate(ids, use_cache=True, output_scores=True, return_dict_in_generate=True, **greedy)
        plain = geo.generate(ids, use_cache=False, output_scores=True, return_dict_in_generate=True, **greedy)
    assert torch.equal(cached.sequences, plain.sequences)
    for a, b in zip(cached.scores, plain.scores, strict=True):
        assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("case", IDS)
def test_sandwich_output_norms_start_as_plain_normalisation(case):
    """identity_norm_like relies on the layout's norm kind: a fresh output norm must give unit RMS."""
    stock = stock_model(case)
    layout = LAYOUTS[CASES[case][0]]
    if layout.has_out_norms or not layout.has_input_norms or not layout.plain_norms:
        with pytest.raises(ValueError, match="sandwich"):
            hf_geonorm.convert(stock, norm_style="sandwich")
        return
    model = hf_geonorm.convert(stock, norm_style="sandwich")
    v = torch.randn(5, stock.config.hidden_size, generator=torch.Generator().manual_seed(3)) * 3 + 1
    out_norms = [m.output_norm for m in model.modules() if getattr(m, "norm_style", None) == "sandwich"]
    assert out_norms
    for norm in out_norms:
        torch.testing.assert_close(norm(v).pow(2).mean(-1), torch.ones(5), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("case", ["olmo2", "exaone4", "gemma2", "glm4"])
@pytest.mark.parametrize("style", ["post", "sandwich", "deepnorm"])
def test_output_norm_families_refuse_other_styles(case, style):
    with pytest.raises(ValueError, match="only norm_style 'pre'"):
        hf_geonorm.convert(stock_model(case), norm_style=style)


@pytest.mark.parametrize(
    "case", ["gpt_neox-parallel", "gpt_neox-sequential", "phi", "falcon", "falcon-sequential", "persimmon"]
)
def test_pre_keeps_the_stock_dropout_in_training(case):
    """Residual dropouts sit where the stock block has them and draw the same random numbers."""
    model_type, kwargs = CASES[case]
    family = FAMILIES[model_type]
    drop = dict(hidden_dropout=0.3, attention_dropout=0.2, resid_pdrop=0.3)
    config = family.stock_config_class(**kwargs, **drop)
    torch.manual_seed(0)
    stock = family.stock_causal_class(config).train()
    pre = hf_geonorm.convert(stock, norm_style="pre").train()
    ids = token_ids()
    torch.manual_seed(5)
    expected = stock(ids).logits
    torch.manual_seed(5)
    got = pre(ids).logits
    assert (got - expected).abs().max() <= 1e-6
    torch.manual_seed(6)
    assert (stock(ids).logits - expected).abs().max() > 1e-4  # dropout does act


@pytest.mark.parametrize("case", ["falcon", "gpt_neo"])
def test_tuple_layers_return_their_attention_weights(case):
    model_type, kwargs = CASES[case]
    family = FAMILIES[model_type]
    config = family.stock_config_class(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    stock = family.stock_causal_class(config).eval()
    pre = hf_geonorm.convert(stock, norm_style="pre")
    with torch.no_grad():
        expected = stock(token_ids(), output_attentions=True).attentions
        got = pre(token_ids(), output_attentions=True).attentions
    assert len(got) == len(expected) == config.num_hidden_layers
    for a, b in zip(got, expected, strict=True):
        assert a is not None and torch.equal(a, b)


@pytest.mark.parametrize(
    "variant",
    [
        dict(new_decoder_architecture=True, parallel_attn=False),
        dict(new_decoder_architecture=False, parallel_attn=True, num_ln_in_parallel_attn=2),
    ],
)
def test_falcon_variants_without_a_working_stock_block_are_refused(variant):
    family = FAMILIES["falcon"]
    config = family.stock_config_class(**NO_HEAD_DIM, **variant)
    stock = family.stock_causal_class(config).eval()
    with pytest.raises(Exception):  # noqa: B017 - the stock block itself fails (AttributeError/UnboundLocalError)
        logits(stock)
    with pytest.raises(ValueError, match="falcon with new_decoder_architecture"):
        hf_geonorm.convert(stock, norm_style="geo")
    geo_config = family.config_class(**NO_HEAD_DIM, **variant)
    with pytest.raises(ValueError, match="falcon with new_decoder_architecture"):
        family.causal_class(geo_config)


def _scan_module():
    if "scan_layouts" not in sys.modules:
        spec = importlib.util.spec_from_file_location("scan_layouts", ROOT / "benchmarks" / "scan_layouts.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["scan_layouts"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["scan_layouts"]


def test_llama_layout_types_match_the_installed_transformers():
    """Every causal LM whose decoder layer is LLaMA's (token for token, used the same way) is covered, and
    every covered one still is: this fails when transformers adds or changes such a model."""
    identical = set(_scan_module().llama_identical_types())
    assert "llama" in identical and "mistral" in identical  # the scan works at all
    missing = identical - set(LLAMA_LAYOUT_TYPES)
    assert not missing, f"LLaMA-identical types missing from LLAMA_LAYOUT_TYPES: {sorted(missing)}"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    installed = set(LLAMA_LAYOUT_TYPES) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    changed = installed - identical
    assert not changed, f"LLAMA_LAYOUT_TYPES entries no longer LLaMA-identical: {sorted(changed)}"
    for model_type in LLAMA_LAYOUT_TYPES:
        layout = LAYOUTS[model_type]
        assert layout == LLAMA or (layout.layers, layout.attn_norm, layout.mlp_norm) == (
            LLAMA.layers,
            LLAMA.attn_norm,
            LLAMA.mlp_norm,
        )


@pytest.mark.parametrize("case", IDS)
def test_lora_finds_its_default_targets(case):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(hf_geonorm.convert(stock_model(case)), LoraConfig(r=2))  # no target_modules
    assert model.get_nb_trainable_parameters()[0] > 0
    ids = token_ids()
    model(ids, labels=ids).loss.backward()
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_grads and all(g is not None for g in lora_grads)


FUSED_QKV = {
    "gpt_neox-sequential": {},
    "persimmon": {},
    "codegen": {},
    "falcon-sequential": {},  # multi-query
    "falcon-new": {},
    "falcon-mha": {"multi_query": False},
    "gpt_bigcode": {},  # multi-query
    "gpt_bigcode-mha": {"multi_query": False},
}


@pytest.mark.parametrize("variant", list(FUSED_QKV))
def test_deepnorm_from_scratch_scales_the_values_inside_fused_qkv_projections(variant):
    """DeepNet scales the value and output projections by beta = (8T)^(-1/4) and leaves queries and keys alone,
    so with biases zeroed the same attention input gives the same attention pattern and beta^2 times the
    stock output. Checked through each family's own attention forward, whatever its q/k/v packing."""
    case = variant.removesuffix("-mha") + ("-sequential" if variant == "falcon-mha" else "")
    model_type, kwargs = CASES[case]
    family = FAMILIES[model_type]
    config = family.stock_config_class(**kwargs, **FUSED_QKV[variant])
    torch.manual_seed(0)
    stock = family.stock_causal_class(config).eval()
    torch.manual_seed(0)
    deep = family.causal_class(family.config_class(**config.to_dict(), norm_style="deepnorm")).eval()
    for model in (stock, deep):
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("bias"):
                    param.zero_()
    attn_name = LAYOUTS[model_type].attn
    stock_attn, deep_attn = getattr(layers_of(stock)[0], attn_name), getattr(layers_of(deep)[0], attn_name)
    seen = {}
    hook = stock_attn.register_forward_pre_hook(lambda m, a, kw: seen.update(args=a, kwargs=kw), with_kwargs=True)
    with torch.no_grad():
        stock(token_ids(), use_cache=False)
        hook.remove()
        expected = stock_attn(*seen["args"], **seen["kwargs"])[0]
        got = deep_attn(*seen["args"], **seen["kwargs"])[0]
    beta = (8 * len(layers_of(stock))) ** -0.25
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(got, beta**2 * expected, rtol=1e-4, atol=1e-6)
