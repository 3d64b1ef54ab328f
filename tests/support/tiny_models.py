"""The registry of test cases: every model the property suites build, in one place.

A case is a stock model type, the keyword arguments of a tiny config for it (no downloads) and the decoder
block layout it has, named by the written-out reference block in tests/support/reference.py that the GeoNorm model is
checked against. Suites parametrize over ``CASES`` (or a named subset of it) and build models with
``stock_model`` (cached, shared by all tests) or ``tiny_model`` (fresh). Adding a model type or a block
variant is one entry here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

VOCAB = 128
LAYERS = 3
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
NO_HEAD_DIM = {k: v for k, v in BASE.items() if k not in ("head_dim", "num_key_value_heads")}
GPT = dict(vocab_size=VOCAB, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)
MOE = dict(  # the names the MoE configs use for the same few things: 4 experts, 2 per token, 1 shared
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
MLA = dict(  # multi-head latent attention (DeepSeek and its descendants)
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
DOTS3_SLIDING = dict(  # its third layer is a sliding-window MLA layer with its own shape
    swa_num_attention_heads=4,
    swa_num_key_value_heads=4,
    swa_q_lora_rank=16,
    swa_kv_lora_rank=16,
    swa_head_dim=8,
    swa_qk_nope_head_dim=4,
    swa_v_head_dim=8,
)
DEFAULT_ROPE = dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


# decoder layers identical to LLaMA's (granite, hunyuan and ministral below, with config settings of their own)
LLAMA_SHAPED = (
    "arcee", "bitnet", "cwm", "diffllama", "ernie4_5", "exaone", "gemma", "glm", "helium", "internlm3", "iquestcoder",
    "jais2", "llama", "ministral3", "mistral", "nanochat", "olmo", "phi3", "qwen2", "qwen3", "seed_oss", "smollm3",
    "starcoder2",
)  # fmt: skip
LLAMA_SHAPED_MOE = (
    "aria_text", "dots1", "ernie4_5_moe", "exaone_moe", "flint", "glm4_moe", "hy_v3", "laguna", "mellum",
    "mimo_v2_flash", "minicpm5_moe", "mixtral", "olmoe", "param2moe", "qwen2_moe", "qwen3_moe", "sarvam_moe",
    "solar_open",
)  # fmt: skip


@dataclass(frozen=True)
class Case:
    name: str
    model_type: str
    config: dict = field(repr=False)  # keyword arguments of the stock config class
    block: str = "llama"  # the layout: a block of tests/support/reference.py


def _cases() -> dict[str, Case]:
    cases = [
        *(Case(t, t, BASE) for t in LLAMA_SHAPED),
        Case("granite", "granite", dict(BASE, residual_multiplier=0.5, embedding_multiplier=2.0)),
        *(Case(t, t, dict(BASE, **DEFAULT_ROPE)) for t in ("hunyuan_v1_dense", "ministral")),
        Case("hunyuan_v1_moe", "hunyuan_v1_moe", dict(BASE, **MOE, **DEFAULT_ROPE)),
        *(Case(t, t, dict(BASE, **MOE)) for t in LLAMA_SHAPED_MOE),
        *(Case(t, t, dict(BASE, **MOE, **MLA)) for t in ("axk1", "glm4_moe_lite", "sarvam_mla", "youtu")),
        *(  # these need as many key/value heads as query heads
            Case(t, t, dict(BASE, **MOE, **MLA, num_key_value_heads=4))
            for t in ("deepseek_v2", "deepseek_v3", "axk2", "deepseek_v32")
        ),
        Case("dots3_note_text", "dots3_note_text", dict(BASE, **MOE, **MLA, num_key_value_heads=4, **DOTS3_SLIDING)),
        # other layouts
        Case("gpt2", "gpt2", GPT, "gpt2"),
        Case("gpt_bigcode", "gpt_bigcode", GPT, "gpt2"),
        Case(
            "gpt_neo",
            "gpt_neo",
            dict(
                vocab_size=VOCAB,
                hidden_size=32,
                num_layers=LAYERS,
                num_heads=4,
                intermediate_size=64,
                max_position_embeddings=64,
                attention_types=[[["global", "local"], 1], [["global"], 1]],
                window_size=4,
                bos_token_id=1,
                eos_token_id=2,
            ),
            "gpt2",
        ),
        Case("gptj", "gptj", dict(GPT, rotary_dim=4), "parallel"),
        Case("codegen", "codegen", dict(GPT, rotary_dim=4, n_ctx=64), "parallel"),
        Case("cohere", "cohere", BASE, "parallel"),
        Case("gpt_neox-parallel", "gpt_neox", dict(BASE, use_parallel_residual=True), "gpt_neox"),
        Case("gpt_neox-sequential", "gpt_neox", dict(BASE, use_parallel_residual=False), "gpt_neox"),
        Case("stablelm-parallel", "stablelm", dict(BASE, use_parallel_residual=True), "stablelm"),
        Case("stablelm-sequential", "stablelm", dict(BASE, use_parallel_residual=False), "stablelm"),
        Case("phi", "phi", BASE, "phi"),
        Case("falcon", "falcon", NO_HEAD_DIM, "falcon"),
        Case("falcon-alibi", "falcon", dict(NO_HEAD_DIM, alibi=True), "falcon"),
        Case("falcon-new", "falcon", dict(NO_HEAD_DIM, new_decoder_architecture=True, num_kv_heads=2), "falcon"),
        Case(
            "falcon-new-1ln",
            "falcon",
            dict(NO_HEAD_DIM, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
            "falcon",
        ),
        Case("falcon-sequential", "falcon", dict(NO_HEAD_DIM, parallel_attn=False), "falcon"),
        Case("gemma2", "gemma2", dict(BASE, sliding_window=4), "gemma2"),
        Case(
            "gemma3_text",
            "gemma3_text",
            dict(BASE, sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
            "gemma2",
        ),
        Case("glm4", "glm4", BASE, "glm4"),
        *(Case(t, t, BASE, "olmo2") for t in ("olmo2", "olmo3", "exaone4")),  # no input norms
        Case("phimoe", "phimoe", dict(BASE, num_local_experts=4, num_experts_per_tok=2)),
        Case("nemotron", "nemotron", BASE),
        Case("persimmon", "persimmon", BASE, "persimmon"),
        Case("apertus", "apertus", BASE, "apertus"),
    ]
    # the types of the installed transformers only (minicpm5_moe and param2moe are new in 5.25)
    return {case.name: case for case in cases if case.model_type in CONFIG_MAPPING}


CASES: dict[str, Case] = _cases()
# The types the project covered first (LLaMA-shaped, and GPT-2): the slower checks that need a saved folder per
# case (SDPA against eager, LoRA save/reload/merge) run on these only.
CLASSIC = [
    "arcee", "bitnet", "cwm", "deepseek_v2", "deepseek_v3", "diffllama", "dots1", "ernie4_5", "glm", "glm4_moe",
    "helium", "hunyuan_v1_dense", "hunyuan_v1_moe", "llama", "ministral", "mistral", "mixtral", "olmo", "qwen2",
    "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "starcoder2", "gemma", "phi3", "granite", "gpt2",
]  # fmt: skip


def tiny_config(name: str, **overrides):
    """The stock config of a case (or of the model type of the same name), with keyword overrides."""
    case = CASES[name]
    return CONFIG_MAPPING[case.model_type](**{**case.config, **overrides})


def tiny_model(name: str, seed: int = 0, perturb: bool = False, **overrides):
    """A fresh tiny random stock model in eval mode. ``perturb`` adds 0.02 N(0, 1) to every parameter: some
    inits zero the output projections (NanoChat) or set every norm weight alike, which would hide mistakes."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(name, **overrides)).eval()
    if perturb:
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.02 * torch.randn_like(param))
    return model


@functools.cache
def stock_model(name: str):
    """The perturbed stock model of a case, built once per test session: tests must not modify it."""
    return tiny_model(name, perturb=True)


def token_ids(batch: int = 2, length: int = 9, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def layers_of(model) -> torch.nn.ModuleList:
    """The decoder layers of a causal LM (``model.layers`` or GPT-2's ``h``), stock or GeoNorm."""
    base = model.base_model
    return base.layers if hasattr(base, "layers") else base.h


def layer_outputs(model, ids):
    """The embeddings and every decoder layer's output (the last hidden state transformers reports is after the
    final norm)."""
    seen = []

    def keep(module, args, out):
        seen.append(out[0] if isinstance(out, tuple) else out)

    hooks = [layer.register_forward_hook(keep) for layer in layers_of(model)]
    try:
        with torch.no_grad():
            first = model(ids, output_hidden_states=True).hidden_states[0]
    finally:
        for hook in hooks:
            hook.remove()
    return first, seen
