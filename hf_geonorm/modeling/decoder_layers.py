"""The GeoNorm decoder layers: one class per block shape of the supported types, whose ``forward`` is the stock
layer's (``LlamaDecoderLayer.forward`` for LLaMA) with each residual addition ``residual + hidden_states`` a call
to the sublayer's ``GeoNormResidual`` (method.md, "The block").

``GeoNormDecoderLayer.take_over`` (called by ``blocks.patch_base_model``) sets a stock layer's class to the one its
layout names (``DECODER_LAYERS``) and gives it its attributes. Every stock decoder layer class defines only
``__init__`` and ``forward`` over ``GradientCheckpointingLayer`` (``tests/test_transformers_internals.py`` checks
this against the installed transformers), so a built layer keeps all its modules and takes this forward; gradient
checkpointing wraps it as it wraps the stock one.

Imports only torch, transformers and flat siblings (remote code).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .layouts import BlockLayout
from .residual import GeoNormResidual
from .transformers_versions import CACHE_ARGUMENT, GPTJ_BLOCK_RETURNS_TUPLE

# The keyword argument that carries the first real token of each sequence (a bool mask over the positions of the
# forward) from the base model's inputs to its decoder layers, as the stock model passes its other keyword
# arguments on (``blocks.pass_first_tokens`` adds it where a 2D attention mask says more than the position ids).
FIRST_TOKENS = "geonorm_first_tokens"


class GeoNormDecoderLayer(GradientCheckpointingLayer):
    """What every GeoNorm decoder layer has, given by ``take_over``: the residual update of each sublayer,
    ``geonorm_attn_residual`` and ``geonorm_mlp_residual``, or ``geonorm_attn_residual`` alone where attention and
    MLP make one summed update (``parallel``). Each knows its layer's index; each ``forward`` first hands its input
    to ``geonorm_attn_residual.enter``, which in layer 0 puts the embeddings where the style starts them."""

    # Whether attention and MLP make one summed update: True, False, or the config attribute that says so.
    parallel: ClassVar[bool | str] = False

    geonorm_attn_residual: GeoNormResidual
    geonorm_mlp_residual: GeoNormResidual

    @classmethod
    def take_over(cls, layer: nn.Module, attn_residual: GeoNormResidual, mlp_residual: GeoNormResidual | None) -> None:
        """Make the stock decoder ``layer`` (or a GeoNorm one patched anew) this class, with the residual module of
        each sublayer (``mlp_residual`` None for a parallel block). Its modules and parameters stay as they are."""
        if not isinstance(layer, cls):  # a re-patch keeps the class (and a subclass FSDP made of it)
            layer.__class__ = cls
        layer.geonorm_attn_residual = attn_residual
        if mlp_residual is not None:
            layer.geonorm_mlp_residual = mlp_residual

    @classmethod
    def parallel_residual(cls, config: Any) -> bool:
        """Whether a layer of ``config`` makes one update (one residual module) rather than two."""
        return cls.parallel if isinstance(cls.parallel, bool) else bool(getattr(config, cls.parallel))

    def geonorm_first_token_mask(
        self, first: torch.Tensor | None, position_ids: torch.Tensor | None
    ) -> torch.Tensor | None:
        """The first token of each sequence, when ``geo_first_token_prenorm`` keeps it on the Pre-Norm update (else
        None): ``first``, the keyword argument ``FIRST_TOKENS`` (which the forward takes out of the arguments it
        passes on to the attention) where the base model found it from a 2D ``attention_mask`` (a left-padded
        batch); else where the caller's ``position_ids`` are 0 (also packed sequences; the model's own position
        ids without them). A 4D mask or inputs passed to the base model by position cannot be read: then the
        position ids decide."""
        config = self.geonorm_attn_residual.config
        if config.norm_style != "geo" or not config.geo_first_token_prenorm:
            return None
        if first is not None:
            return first
        if position_ids is None:
            raise ValueError(
                f"geo_first_token_prenorm needs the position ids, and {config.model_type}'s decoder layers are not "
                "given them; set geo_first_token_prenorm=False for this model"
            )
        return position_ids == 0


# ---- sequential blocks: x = step(x, Attn(N1 x)), then x = step(x, MLP(N2 x)) ----


class GeoNormLlamaDecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm LLaMA decoder layer (``LlamaDecoderLayer``), also of every type whose layer is LLaMA's token for
    token (Mistral, Qwen 2/3, DeepSeek V2/V3, ...: ``layouts.LLAMA_LAYOUT_TYPES``), of Mixtral and PhiMoE, and of
    Gemma, AXK2 and Nemotron (LLaMA's layer with norms of their own kind)."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.geonorm_attn_residual(residual, hidden_states, self.input_layernorm, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.post_attention_layernorm)
        hidden_states = self.mlp(hidden_states)
        return self.geonorm_mlp_residual(residual, hidden_states, self.post_attention_layernorm, first_tokens)


class GeoNormApertusDecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm Apertus decoder layer: LLaMA's, with its norms named ``attention_layernorm`` and
    ``feedforward_layernorm``."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.attention_layernorm)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.geonorm_attn_residual(residual, hidden_states, self.attention_layernorm, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.feedforward_layernorm)
        hidden_states = self.mlp(hidden_states)
        return self.geonorm_mlp_residual(residual, hidden_states, self.feedforward_layernorm, first_tokens)


class GeoNormPhi3DecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm Phi-3 decoder layer: LLaMA's, with a dropout on each sublayer's update."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.resid_attn_dropout(hidden_states)
        hidden_states = self.geonorm_attn_residual(residual, hidden_states, self.input_layernorm, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.post_attention_layernorm)
        hidden_states = self.resid_mlp_dropout(self.mlp(hidden_states))
        return self.geonorm_mlp_residual(residual, hidden_states, self.post_attention_layernorm, first_tokens)


class GeoNormGraniteDecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm Granite decoder layer: LLaMA's, with each update scaled by ``residual_multiplier``."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = hidden_states * self.residual_multiplier
        hidden_states = self.geonorm_attn_residual(residual, hidden_states, self.input_layernorm, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.post_attention_layernorm)
        hidden_states = self.mlp(hidden_states) * self.residual_multiplier
        return self.geonorm_mlp_residual(residual, hidden_states, self.post_attention_layernorm, first_tokens)


class GeoNormPersimmonDecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm Persimmon decoder layer: LLaMA's, with a dropout on the MLP's update."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.geonorm_attn_residual(residual, hidden_states, self.input_layernorm, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.post_attention_layernorm)
        hidden_states = self.dropout(self.mlp(hidden_states))
        return self.geonorm_mlp_residual(residual, hidden_states, self.post_attention_layernorm, first_tokens)


class GeoNormGemma2DecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm Gemma 2 decoder layer, also Gemma 3's: each sublayer's output norm is part of its update."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.geonorm_attn_residual(residual, hidden_states, self.input_layernorm, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.pre_feedforward_layernorm)
        hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
        return self.geonorm_mlp_residual(residual, hidden_states, self.pre_feedforward_layernorm, first_tokens)


class GeoNormGlm4DecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm GLM-4 decoder layer: each sublayer's output norm is part of its update."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.post_self_attn_layernorm(hidden_states)
        hidden_states = self.geonorm_attn_residual(residual, hidden_states, self.input_layernorm, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.post_attention_layernorm)
        hidden_states = self.post_mlp_layernorm(self.mlp(hidden_states))
        return self.geonorm_mlp_residual(residual, hidden_states, self.post_attention_layernorm, first_tokens)


class GeoNormOlmo2DecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm OLMo 2 decoder layer, also OLMo 3's and EXAONE 4's: no input norms, x + N(F(x)); only ``pre``
    and ``geo`` apply (they take no input norm)."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.geonorm_attn_residual(residual, hidden_states, None, first_tokens)

        residual = hidden_states
        hidden_states = self.post_feedforward_layernorm(self.mlp(hidden_states))
        return self.geonorm_mlp_residual(residual, hidden_states, None, first_tokens)


# ---- parallel blocks: x = step(x, Attn(N1 x) + MLP(N2 x)), one update per layer ----


class GeoNormGPTNeoXLayer(GeoNormDecoderLayer):
    """The GeoNorm GPT-NeoX layer: parallel, or sequential with ``use_parallel_residual=False``."""

    parallel = "use_parallel_residual"

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        attn_input = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        attn_output, _ = self.attention(hidden_states=attn_input, **kwargs)
        attn_output = self.post_attention_dropout(attn_output)

        if self.use_parallel_residual:
            mlp_input = self.geonorm_attn_residual.sublayer_input(residual, self.post_attention_layernorm)
            mlp_output = self.post_mlp_dropout(self.mlp(mlp_input))
            return self.geonorm_attn_residual(residual, attn_output + mlp_output, self.input_layernorm, first_tokens)
        hidden_states = self.geonorm_attn_residual(residual, attn_output, self.input_layernorm, first_tokens)
        residual = hidden_states
        mlp_input = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.post_attention_layernorm)
        mlp_output = self.post_mlp_dropout(self.mlp(mlp_input))
        return self.geonorm_mlp_residual(residual, mlp_output, self.post_attention_layernorm, first_tokens)


class GeoNormStableLmDecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm StableLM decoder layer: parallel with one shared norm, or sequential with
    ``use_parallel_residual=False``."""

    parallel = "use_parallel_residual"

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        self_attn_output, _ = self.self_attn(hidden_states=hidden_states, **kwargs)

        if self.use_parallel_residual:
            mlp_output = self.dropout(self.mlp(hidden_states))
            update = self_attn_output + mlp_output
            return self.geonorm_attn_residual(residual, update, self.input_layernorm, first_tokens)
        hidden_states = self.geonorm_attn_residual(residual, self_attn_output, self.input_layernorm, first_tokens)
        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.post_attention_layernorm)
        mlp_output = self.dropout(self.mlp(hidden_states))
        return self.geonorm_mlp_residual(residual, mlp_output, self.post_attention_layernorm, first_tokens)


class GeoNormPhiDecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm Phi decoder layer: parallel with one shared norm and a dropout on each sublayer's output."""

    parallel = True

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        attn_outputs, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        attn_outputs = self.resid_dropout(attn_outputs)
        feed_forward_hidden_states = self.resid_dropout(self.mlp(hidden_states))
        update = attn_outputs + feed_forward_hidden_states
        return self.geonorm_attn_residual(residual, update, self.input_layernorm, first_tokens)


class GeoNormGPTJBlock(GeoNormDecoderLayer):
    """The GeoNorm GPT-J block, also CodeGen's: parallel with one shared norm ``ln_1``. Before transformers 5.24
    their models read ``(hidden states, attention weights)`` from it (``GPTJ_BLOCK_RETURNS_TUPLE``)."""

    parallel = True

    def forward(
        self, hidden_states: torch.Tensor, **kwargs: Any
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.ln_1)
        attn_output, attn_weights = self.attn(hidden_states=hidden_states, **kwargs)
        feed_forward_hidden_states = self.mlp(hidden_states)
        update = attn_output + feed_forward_hidden_states
        hidden_states = self.geonorm_attn_residual(residual, update, self.ln_1, first_tokens)
        if GPTJ_BLOCK_RETURNS_TUPLE:
            return hidden_states, attn_weights
        return hidden_states


class GeoNormCohereDecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm Cohere decoder layer: parallel with one shared norm ``input_layernorm``."""

    parallel = True

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.input_layernorm)
        hidden_states_attention, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        hidden_states_mlp = self.mlp(hidden_states)
        update = hidden_states_attention + hidden_states_mlp
        return self.geonorm_attn_residual(residual, update, self.input_layernorm, first_tokens)


class GeoNormFalconDecoderLayer(GeoNormDecoderLayer):
    """The GeoNorm Falcon decoder layer, in Falcon's three working variants (``layouts._falcon_layout``): parallel
    with one shared norm (the default), parallel with a norm each (``new_decoder_architecture`` with
    ``num_ln_in_parallel_attn=2``), and sequential (``parallel_attn=False``). Its model reads
    ``(hidden states, attention weights)``."""

    parallel = "parallel_attn"

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        config = self.config
        residual = hidden_states
        if config.new_decoder_architecture and config.num_ln_in_parallel_attn == 2:
            attention_norm = self.ln_attn
            attention_layernorm_out = self.geonorm_attn_residual.sublayer_input(hidden_states, self.ln_attn)
            mlp_layernorm_out = self.geonorm_attn_residual.sublayer_input(hidden_states, self.ln_mlp)
        else:
            attention_norm = self.input_layernorm
            attention_layernorm_out = self.geonorm_attn_residual.sublayer_input(hidden_states, attention_norm)
            mlp_layernorm_out = attention_layernorm_out
        attention_output, attn_weights = self.self_attention(hidden_states=attention_layernorm_out, **kwargs)

        if config.parallel_attn:
            update = F.dropout(attention_output + self.mlp(mlp_layernorm_out), config.hidden_dropout, self.training)
            hidden_states = self.geonorm_attn_residual(residual, update, attention_norm, first_tokens)
        else:
            attention_output = F.dropout(attention_output, config.attention_dropout, self.training)
            hidden_states = self.geonorm_attn_residual(residual, attention_output, attention_norm, first_tokens)
            residual = hidden_states
            hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.post_attention_layernorm)
            mlp_output = F.dropout(self.mlp(hidden_states), config.hidden_dropout, self.training)
            hidden_states = self.geonorm_mlp_residual(residual, mlp_output, self.post_attention_layernorm, first_tokens)
        return hidden_states, attn_weights if kwargs.get("output_attentions") else None


# ---- GPT-2's block and its descendants, each called as its stock model calls it ----


class GeoNormGPT2Block(GeoNormDecoderLayer):
    """The GeoNorm GPT-2 block (decoder-only: no cross-attention), which its model calls with positional
    ``cache`` and ``attention_mask``; its attention takes the cache under the name of the installed transformers
    (``CACHE_ARGUMENT``: ``past_key_values`` before 5.24)."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        cache: Any = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        if encoder_hidden_states is not None:
            raise ValueError("GeoNorm supports decoder-only GPT-2 (no cross-attention)")
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.ln_1)
        attn_output, _ = self.attn(
            hidden_states, attention_mask=attention_mask, use_cache=use_cache, **{CACHE_ARGUMENT: cache}, **kwargs
        )
        hidden_states = self.geonorm_attn_residual(residual, attn_output, self.ln_1, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.ln_2)
        feed_forward_hidden_states = self.mlp(hidden_states)
        return self.geonorm_mlp_residual(residual, feed_forward_hidden_states, self.ln_2, first_tokens)


class GeoNormGPTNeoBlock(GeoNormDecoderLayer):
    """The GeoNorm GPT-Neo block: GPT-2's, called with keywords; its model reads ``(hidden states, attention
    weights)``."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.ln_1)
        attn_output, attn_weights = self.attn(hidden_states=hidden_states, **kwargs)
        hidden_states = self.geonorm_attn_residual(residual, attn_output, self.ln_1, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.ln_2)
        feed_forward_hidden_states = self.mlp(hidden_states)
        hidden_states = self.geonorm_mlp_residual(residual, feed_forward_hidden_states, self.ln_2, first_tokens)
        return hidden_states, attn_weights if kwargs.get("output_attentions") else None


class GeoNormGPTBigCodeBlock(GeoNormDecoderLayer):
    """The GeoNorm GPTBigCode block (decoder-only: no cross-attention): GPT-2's, which its model calls with
    ``encoder_hidden_states`` as the second positional argument."""

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        layer_past: Any = None,
        attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = False,
        output_attentions: bool | None = False,
        **kwargs: Any,
    ) -> torch.Tensor:
        if encoder_hidden_states is not None:
            raise ValueError("GeoNorm supports decoder-only GPTBigCode (no cross-attention)")
        hidden_states = self.geonorm_attn_residual.enter(hidden_states)
        first_tokens = self.geonorm_first_token_mask(kwargs.pop(FIRST_TOKENS, None), kwargs.get("position_ids"))
        residual = hidden_states
        hidden_states = self.geonorm_attn_residual.sublayer_input(hidden_states, self.ln_1)
        attn_output, _ = self.attn(
            hidden_states,
            layer_past=layer_past,
            attention_mask=attention_mask,
            use_cache=use_cache,
            output_attentions=output_attentions,
            **kwargs,
        )
        hidden_states = self.geonorm_attn_residual(residual, attn_output, self.ln_1, first_tokens)

        residual = hidden_states
        hidden_states = self.geonorm_mlp_residual.sublayer_input(hidden_states, self.ln_2)
        feed_forward_hidden_states = self.mlp(hidden_states)
        return self.geonorm_mlp_residual(residual, feed_forward_hidden_states, self.ln_2, first_tokens)


# The decoder layer class of each block shape, by the name a layout gives it (``BlockLayout.block``).
DECODER_LAYERS: dict[str, type[GeoNormDecoderLayer]] = {
    "llama": GeoNormLlamaDecoderLayer,
    "apertus": GeoNormApertusDecoderLayer,
    "phi3": GeoNormPhi3DecoderLayer,
    "granite": GeoNormGraniteDecoderLayer,
    "persimmon": GeoNormPersimmonDecoderLayer,
    "gemma2": GeoNormGemma2DecoderLayer,
    "glm4": GeoNormGlm4DecoderLayer,
    "olmo2": GeoNormOlmo2DecoderLayer,
    "gpt_neox": GeoNormGPTNeoXLayer,
    "stablelm": GeoNormStableLmDecoderLayer,
    "phi": GeoNormPhiDecoderLayer,
    "gptj": GeoNormGPTJBlock,
    "cohere": GeoNormCohereDecoderLayer,
    "falcon": GeoNormFalconDecoderLayer,
    "gpt2": GeoNormGPT2Block,
    "gpt_neo": GeoNormGPTNeoBlock,
    "gpt_bigcode": GeoNormGPTBigCodeBlock,
}


def decoder_layer_class(layout: BlockLayout) -> type[GeoNormDecoderLayer]:
    """The GeoNorm decoder layer class of a layout's block shape."""
    return DECODER_LAYERS[layout.block]
