"""Everything GeoNorm needs to know about each stock architecture, in one table: ``LAYOUTS``.

One ``BlockLayout`` per stock ``model_type`` says which GeoNorm decoder layer runs its block
(``decoder_layers.py``), where a decoder layer keeps its parts, where a fused query/key/value projection keeps the
values, which modules LoRA targets by default and whether the projections are GPT-2 ``Conv1D``s. Adding an
architecture is one entry in ``LAYOUTS`` (a type whose decoder layer is LLaMA's, token for token, is one name in
``LLAMA_LAYOUT_TYPES``), and a decoder layer class where its block has a shape of its own.

Imports only torch (this file is copied beside saved checkpoints as remote code).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

# LoRA's default targets: the query and value projections under every name the LLaMA-like attentions use
# (LLaMA's, multi-head latent attention's, fused ones). PEFT matches names as suffixes, so on a LLaMA attention
# this selects q_proj and v_proj, as PEFT's own entry for llama does.
ATTENTION_LORA_TARGETS = ("q_proj", "v_proj", "q_b_proj", "kv_b_proj", "qkv_proj", "query_key_value")

# The value and output projections DeepNet's from-scratch init scales, under the names every tabled
# architecture gives them (fused q/k/v projections: ``BlockLayout.fused_values``).
DEEPNORM_SCALED = re.compile(r"(^|\.)(v_proj|o_proj|out_proj|dense|c_proj|wo|wv|value)\.weight$")

FusedValues = Callable[[nn.Module, Any], torch.Tensor]

LEARNED_POSITIONS = ("wpe", "embed_positions")  # the base model's learned position table (GPT-2-shaped families)


@dataclass(frozen=True)
class BlockLayout:
    """Where a stock decoder layer keeps its parts, and which GeoNorm decoder layer runs it.

    ``block`` names the layer's shape: its GeoNorm class is ``decoder_layers.DECODER_LAYERS[block]``, whose
    ``forward`` is the stock layer's, written out (which parts it calls in which order, its dropouts, how its model
    calls it). The other names are attribute paths on the decoder layer that patching and the checks read.
    ``attn_norm``/``mlp_norm`` are the sublayer input norms: ``None`` means the sublayer reads the state itself
    (OLMo 2: x + N(F(x))), except that an ``mlp_norm`` of ``None`` (or an attribute that is ``None`` on the layer)
    beside an ``attn_norm`` is a parallel block's one shared norm (Phi, GPT-J, Cohere).
    ``attn_out_norm``/``mlp_out_norm`` name norms the stock block already applies to a sublayer's output
    (Gemma 2/3, OLMo 2): they stay part of the update u, and the post-normalising styles do not apply.
    ``plain_norms`` is False where the input norms are more than a normalisation with weight and bias (AXK2's
    gated RMSNorm): ``sandwich`` cannot add fresh norms of their kind that start as the identity.
    ``fused_values`` gives, from an attention module and the config, the rows (a view) of a fused q/k/v
    weight that make the values; ``None`` where the values have a projection of their own.
    ``lora_targets`` are LoRA's default target modules; ``conv1d`` marks GPT-2's ``Conv1D`` projections
    (weight stored in x out: LoRA needs ``fan_in_fan_out=True``).
    ``select`` picks the layout of one config where a model type has several block variants (Falcon's norms); it
    may raise ``ValueError`` for a variant GeoNorm cannot express.
    ``position_ids`` is False where the stock model calls its layers without position ids or a padding mask
    (GPT-Neo, GPT-BigCode): they cannot find each sequence's first token (``geo_first_token_prenorm``).
    ``layer_kwargs`` is False where the stock model does not pass its keyword arguments on to its layers (Falcon):
    they then find the first token of a left-padded batch only from position ids given with it.
    """

    block: str = "llama"
    layers: str = "layers"
    attn_norm: str | None = "input_layernorm"
    attn: str = "self_attn"
    mlp_norm: str | None = "post_attention_layernorm"
    mlp: str = "mlp"
    attn_out_norm: str | None = None
    mlp_out_norm: str | None = None
    norm_weight_offset: float = 0.0
    plain_norms: bool = True
    fused_values: FusedValues | None = None
    lora_targets: tuple[str, ...] = ATTENTION_LORA_TARGETS
    conv1d: bool = False
    select: Callable[[Any], BlockLayout] | None = None
    position_ids: bool = True
    layer_kwargs: bool = True

    def for_config(self, config: Any) -> BlockLayout:
        """The layout of the block variant ``config`` builds (itself unless the type has variants)."""
        return self if self.select is None else self.select(config)

    @property
    def has_out_norms(self) -> bool:
        return self.attn_out_norm is not None or self.mlp_out_norm is not None

    @property
    def has_input_norms(self) -> bool:
        """Whether every sublayer reads a normalised state (post, deepnorm and sandwich reuse these norms): a
        parallel block's MLP reads through ``attn_norm`` where it has no ``mlp_norm``."""
        return self.attn_norm is not None


# ---- where fused q/k/v projections keep the values (nn.Linear weights are out x in) ----


def _per_head_values(weight: torch.Tensor, config: Any) -> torch.Tensor:
    """[q, k, v] per head: GPT-NeoX, Persimmon, multi-head Falcon and GPTBigCode."""
    heads, hidden = config.num_attention_heads, config.hidden_size
    return weight.view(heads, 3, hidden // heads, hidden)[:, 2]


def _neox_values(attn: nn.Module, config: Any) -> torch.Tensor:
    return _per_head_values(attn.query_key_value.weight, config)


def _falcon_values(attn: nn.Module, config: Any) -> torch.Tensor:
    weight, heads = attn.query_key_value.weight, config.num_attention_heads
    head_dim = config.hidden_size // heads
    if attn.new_decoder_architecture:  # per key/value group [q..., k, v]
        return weight.view(attn.num_kv_heads, heads // attn.num_kv_heads + 2, head_dim, config.hidden_size)[:, -1]
    if attn.multi_query:  # [all q | one k | one v]
        return weight[weight.shape[0] - head_dim :]
    return _per_head_values(weight, config)


def _bigcode_values(attn: nn.Module, config: Any) -> torch.Tensor:
    weight = attn.c_attn.weight
    if attn.multi_query:  # [all q | one k | one v]
        return weight[weight.shape[0] - config.hidden_size // config.num_attention_heads :]
    return _per_head_values(weight, config)


def _gpt2_values(attn: nn.Module, config: Any) -> torch.Tensor:
    """GPT-2's Conv1D weight is in x 3*hidden, column blocks [q | k | v]."""
    return attn.c_attn.weight[:, 2 * config.hidden_size :]


def _codegen_values(attn: nn.Module, config: Any) -> torch.Tensor:
    """CodeGen packs [q, v, k] per model-parallel block."""
    return attn.qkv_proj.weight.view(attn.mp_num, 3, -1, config.hidden_size)[:, 1]


def _phi3_values(attn: nn.Module, config: Any) -> torch.Tensor:
    """Phi-3's qkv_proj rows are [all q | all k | all v]."""
    weight = attn.qkv_proj.weight
    return weight[weight.shape[0] - config.num_key_value_heads * attn.head_dim :]


# ---- the layouts ----


def _falcon_layout(config: Any) -> BlockLayout:
    """Falcon builds one of three blocks from ``new_decoder_architecture``, ``parallel_attn`` and
    ``num_ln_in_parallel_attn`` (FalconDecoderLayer); the other combinations fail in the stock model too."""
    new = bool(getattr(config, "new_decoder_architecture", False))
    parallel = bool(getattr(config, "parallel_attn", True))
    num_ln = getattr(config, "num_ln_in_parallel_attn", None)
    if num_ln is None:
        num_ln = 2 if new else 1
    if new and parallel:
        return FALCON_NEW if num_ln == 2 else FALCON
    if not new and parallel and num_ln != 2:
        return FALCON
    if not new and not parallel:
        return FALCON_SEQUENTIAL
    raise ValueError(
        f"GeoNorm cannot patch falcon with new_decoder_architecture={new}, parallel_attn={parallel}, "
        f"num_ln_in_parallel_attn={num_ln}: the stock FalconDecoderLayer builds norms its forward does not use "
        "for this combination (it fails without GeoNorm too). Supported: the default (parallel_attn=True), "
        "new_decoder_architecture=True with parallel_attn=True, and parallel_attn=False."
    )


LLAMA = BlockLayout()
GEMMA = BlockLayout(norm_weight_offset=1.0)
PHI3 = BlockLayout(block="phi3", fused_values=_phi3_values)
GRANITE = BlockLayout(block="granite")
GPT2 = BlockLayout(
    block="gpt2",
    layers="h",
    attn_norm="ln_1",
    attn="attn",
    mlp_norm="ln_2",
    fused_values=_gpt2_values,
    lora_targets=("c_attn",),
    conv1d=True,
)

# Parallel residual: one step with u = Attn(N1 x) + FFN(N2 x), or one shared norm (mlp_norm=None).
GPT_NEOX = BlockLayout(block="gpt_neox", attn="attention", fused_values=_neox_values)
PHI = BlockLayout(block="phi", mlp_norm=None, lora_targets=("q_proj", "v_proj", "fc1", "fc2"))
GPTJ = BlockLayout(block="gptj", layers="h", attn_norm="ln_1", attn="attn", mlp_norm=None)
CODEGEN = replace(GPTJ, fused_values=_codegen_values)
COHERE = BlockLayout(block="cohere", mlp_norm=None)
# StableLM's post_attention_layernorm is None on parallel blocks: the MLP then shares input_layernorm.
STABLELM = BlockLayout(block="stablelm")
FALCON = BlockLayout(
    block="falcon",
    layers="h",
    attn="self_attention",
    mlp_norm=None,
    fused_values=_falcon_values,
    select=_falcon_layout,
    layer_kwargs=False,
)
FALCON_NEW = replace(FALCON, attn_norm="ln_attn", mlp_norm="ln_mlp")
FALCON_SEQUENTIAL = replace(FALCON, mlp_norm="post_attention_layernorm")

# Norms after each sublayer already present: the stock update, output norm included, is u.
GEMMA2 = BlockLayout(
    block="gemma2",
    attn_out_norm="post_attention_layernorm",
    mlp_norm="pre_feedforward_layernorm",
    mlp_out_norm="post_feedforward_layernorm",
    norm_weight_offset=1.0,
)
OLMO2 = BlockLayout(  # no input norms: x + N(F(x)), so each sublayer reads the state itself
    block="olmo2",
    attn_norm=None,
    mlp_norm=None,
    attn_out_norm="post_attention_layernorm",
    mlp_out_norm="post_feedforward_layernorm",
)
GLM4 = BlockLayout(block="glm4", attn_out_norm="post_self_attn_layernorm", mlp_out_norm="post_mlp_layernorm")

# Close variants of LLaMA's block.
NEMOTRON = BlockLayout(norm_weight_offset=1.0)  # LayerNorm1P computes (1 + w) x
PERSIMMON = BlockLayout(block="persimmon", fused_values=_neox_values)
APERTUS = BlockLayout(block="apertus", attn_norm="attention_layernorm", mlp_norm="feedforward_layernorm")
# GPT-2's block shape with nn.Linear projections: GPT-Neo's separate q/k/v, GPTBigCode's fused c_attn.
GPT_NEO = replace(
    GPT2, block="gpt_neo", fused_values=None, lora_targets=ATTENTION_LORA_TARGETS, conv1d=False, position_ids=False
)
GPT_BIGCODE = replace(GPT2, block="gpt_bigcode", fused_values=_bigcode_values, conv1d=False, position_ids=False)

# Stock model types whose decoder layer forward is LLaMA's, token for token, used the same way by their model
# (found by benchmarks/scan_layouts.py on transformers 5.24 and 5.25; tests/test_layouts.py re-checks the list
# against the installed version). They get the LLaMA layout, except where LLAMA_NORM_VARIANTS says their norms
# differ.
LLAMA_LAYOUT_TYPES = (
    "arcee", "aria_text", "axk1", "axk2", "bitnet", "cwm", "deepseek_v2", "deepseek_v3", "deepseek_v32",
    "diffllama", "dots1", "dots3_note_text", "ernie4_5", "ernie4_5_moe", "exaone", "exaone_moe", "flint", "gemma",
    "glm", "glm4_moe", "glm4_moe_lite", "helium", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "internlm3",
    "iquestcoder", "jais2", "laguna", "llama", "mellum", "mimo_v2_flash", "minicpm5_moe", "ministral", "ministral3",
    "mistral", "nanochat", "olmo", "olmoe", "param2moe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "sarvam_mla",
    "sarvam_moe", "seed_oss", "smollm3", "solar_open", "starcoder2", "youtu",
)  # fmt: skip
# LLaMA's block whose norms are of another kind: Gemma's RMSNorm computes (1 + w) x, AXK2's is gated.
LLAMA_NORM_VARIANTS = {"gemma": GEMMA, "axk2": replace(LLAMA, plain_norms=False)}
# Same parts and use as LLaMA's layer; the forward differs only in not passing use_cache on to attention.
LLAMA_COMPATIBLE_TYPES = ("mixtral", "phimoe")

LAYOUTS: dict[str, BlockLayout] = {
    **{model_type: LLAMA for model_type in LLAMA_LAYOUT_TYPES + LLAMA_COMPATIBLE_TYPES},
    **LLAMA_NORM_VARIANTS,
    "phi3": PHI3,
    "granite": GRANITE,
    "gpt2": GPT2,
    "gpt_neox": GPT_NEOX,
    "phi": PHI,
    "gptj": GPTJ,
    "codegen": CODEGEN,
    "cohere": COHERE,
    "stablelm": STABLELM,
    "falcon": FALCON,
    "gemma2": GEMMA2,
    "gemma3_text": GEMMA2,
    "olmo2": OLMO2,
    "olmo3": OLMO2,
    "exaone4": OLMO2,
    "glm4": GLM4,
    "nemotron": NEMOTRON,
    "persimmon": PERSIMMON,
    "apertus": APERTUS,
    "gpt_neo": GPT_NEO,
    "gpt_bigcode": GPT_BIGCODE,
}
