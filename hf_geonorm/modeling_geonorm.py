"""GeoNorm versions of stock transformers decoder-only models.

For every supported stock ``model_type`` X this module defines ``GeoNorm<X>Config`` (model_type
``geonorm_X``), ``GeoNorm<X>Model`` and ``GeoNorm<X>ForCausalLM``: subclasses of the stock classes whose
decoder layers are swapped, class and all, for a subclass with a GeoNorm ``forward``. Parameter names and
shapes stay the stock ones, so stock checkpoints load with no missing or unexpected keys.

The file imports only torch, transformers and its flat siblings, because it is copied beside saved
checkpoints as remote code.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .geometry import step_sizes
from .residual import GeoNormResidual, identity_norm_like
from .settings import GeoNormSettings

SETTING_DEFAULTS = GeoNormSettings().to_dict()


@dataclass(frozen=True)
class BlockLayout:
    """Where a stock decoder layer keeps its parts, and how it forms its residual updates.

    Names are attribute paths on the decoder layer. ``attn_norm``/``mlp_norm`` are the sublayer input norms:
    ``None`` (or an attribute that is ``None`` on the layer) means the sublayer reads the state itself
    (OLMo 2: x + N(F(x))), except that a parallel block without its own ``mlp_norm`` feeds the MLP through
    ``attn_norm`` (one shared norm: Phi, GPT-J, Cohere).
    ``attn_out_norm``/``mlp_out_norm`` name norms the stock block already applies to a sublayer's output
    (Gemma 2/3, OLMo 2): they stay part of the update u. ``parallel`` blocks add one summed update.
    ``attn_dropout``/``mlp_dropout`` drop out each sublayer's update and ``update_dropout`` the summed update of
    a parallel block; each names a dropout module or a float probability (``config.hidden_dropout``).
    ``plain_norms`` is False where the input norms are more than a normalisation with weight and bias (AXK2's
    gated RMSNorm): ``sandwich`` cannot add fresh norms of their kind that start as the identity.
    ``select`` picks the layout of one config where a model type has several block variants (Falcon); it may
    raise ``ValueError`` for a variant GeoNorm cannot express.
    """

    layers: str = "layers"
    attn_norm: str | None = "input_layernorm"
    attn: str = "self_attn"
    mlp_norm: str | None = "post_attention_layernorm"
    mlp: str = "mlp"
    parallel: bool = False
    parallel_flag: str | None = None
    attn_out_norm: str | None = None
    mlp_out_norm: str | None = None
    attn_dropout: str | None = None
    mlp_dropout: str | None = None
    update_dropout: str | None = None
    residual_multiplier: str | None = None
    norm_weight_offset: float = 0.0
    plain_norms: bool = True
    call: str = "keywords"
    final_norm: str = "norm"
    select: Callable[[Any], BlockLayout] | None = None

    def is_parallel(self, config: Any) -> bool:
        if self.parallel_flag is not None:
            return bool(getattr(config, self.parallel_flag))
        return self.parallel

    def for_config(self, config: Any) -> BlockLayout:
        """The layout of the block variant ``config`` builds (itself unless the type has variants)."""
        return self if self.select is None else self.select(config)

    @property
    def has_out_norms(self) -> bool:
        return self.attn_out_norm is not None or self.mlp_out_norm is not None

    @property
    def has_input_norms(self) -> bool:
        """Whether every sublayer reads a normalised state (post, deepnorm and sandwich reuse these norms)."""
        return self.attn_norm is not None and (self.mlp_norm is not None or self.parallel or bool(self.parallel_flag))


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
PHI3 = BlockLayout(attn_dropout="resid_attn_dropout", mlp_dropout="resid_mlp_dropout")
GRANITE = BlockLayout(residual_multiplier="residual_multiplier")
GPT2 = BlockLayout(layers="h", attn_norm="ln_1", attn="attn", mlp_norm="ln_2", call="gpt2", final_norm="ln_f")

# Parallel residual: one step with u = Attn(N1 x) + FFN(N2 x), or one shared norm (mlp_norm=None).
GPT_NEOX = BlockLayout(
    attn="attention",
    attn_dropout="post_attention_dropout",
    mlp_dropout="post_mlp_dropout",
    parallel_flag="use_parallel_residual",
    final_norm="final_layer_norm",
)
PHI = BlockLayout(
    mlp_norm=None,
    parallel=True,
    attn_dropout="resid_dropout",
    mlp_dropout="resid_dropout",
    final_norm="final_layernorm",
)
GPTJ = BlockLayout(layers="h", attn_norm="ln_1", attn="attn", mlp_norm=None, parallel=True, final_norm="ln_f")
COHERE = BlockLayout(mlp_norm=None, parallel=True)
# StableLM's post_attention_layernorm is None on parallel blocks: the MLP then shares input_layernorm.
STABLELM = BlockLayout(parallel_flag="use_parallel_residual", mlp_dropout="dropout")
FALCON = BlockLayout(
    layers="h",
    attn="self_attention",
    mlp_norm=None,
    parallel=True,
    update_dropout="config.hidden_dropout",
    call="tuple",
    final_norm="ln_f",
    select=_falcon_layout,
)
FALCON_NEW = replace(FALCON, attn_norm="ln_attn", mlp_norm="ln_mlp")
FALCON_SEQUENTIAL = replace(
    FALCON,
    mlp_norm="post_attention_layernorm",
    parallel=False,
    attn_dropout="config.attention_dropout",
    mlp_dropout="config.hidden_dropout",
    update_dropout=None,
)

# Norms after each sublayer already present: the stock update, output norm included, is u.
GEMMA2 = BlockLayout(
    attn_out_norm="post_attention_layernorm",
    mlp_norm="pre_feedforward_layernorm",
    mlp_out_norm="post_feedforward_layernorm",
    norm_weight_offset=1.0,
)
OLMO2 = BlockLayout(  # no input norms: x + N(F(x)), so each sublayer reads the state itself
    attn_norm=None, mlp_norm=None, attn_out_norm="post_attention_layernorm", mlp_out_norm="post_feedforward_layernorm"
)
GLM4 = BlockLayout(attn_out_norm="post_self_attn_layernorm", mlp_out_norm="post_mlp_layernorm")

# Close variants of LLaMA's block.
NEMOTRON = BlockLayout(norm_weight_offset=1.0)  # LayerNorm1P computes (1 + w) x
PERSIMMON = BlockLayout(mlp_dropout="dropout", final_norm="final_layernorm")
APERTUS = BlockLayout(attn_norm="attention_layernorm", mlp_norm="feedforward_layernorm")
GPT_NEO = replace(GPT2, call="tuple")
GPT_BIGCODE = replace(GPT2, call="gpt_bigcode")

# Stock model types whose decoder layer forward is LLaMA's, token for token, used the same way by their model
# (found by benchmarks/scan_layouts.py on transformers 5.24; tests/test_layouts.py re-checks the list against the
# installed version). They get the LLaMA layout, except where LLAMA_NORM_VARIANTS says their norms differ.
LLAMA_LAYOUT_TYPES = (
    "arcee", "aria_text", "axk1", "axk2", "bitnet", "cwm", "deepseek_v2", "deepseek_v3", "deepseek_v32",
    "diffllama", "dots1", "dots3_note_text", "ernie4_5", "ernie4_5_moe", "exaone", "exaone_moe", "flint", "gemma",
    "glm", "glm4_moe", "glm4_moe_lite", "helium", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "internlm3",
    "iquestcoder", "jais2", "laguna", "llama", "mellum", "mimo_v2_flash", "ministral", "ministral3", "mistral",
    "nanochat", "olmo", "olmoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "sarvam_mla", "sarvam_moe",
    "seed_oss", "smollm3", "solar_open", "starcoder2", "youtu",
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
    "codegen": GPTJ,
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


def _get_path(module: nn.Module, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _first(output: Any) -> torch.Tensor:
    """Sublayers return a tensor or a tuple whose first item is the hidden-state update."""
    return output[0] if isinstance(output, tuple) else output


class GeoNormDecoderLayerMixin:
    """The GeoNorm ``forward`` shared by every swapped decoder layer (see GEONORM.md, "A GeoNorm block").

    A block reads its parts through ``geonorm_layout``; ``geonorm_attn_residual`` and
    ``geonorm_mlp_residual`` hold the residual update of each sublayer (one for parallel blocks).
    """

    geonorm_layout: BlockLayout
    geonorm_layer_index: int
    geonorm_parallel: bool

    def _call_attention(self, attn: nn.Module, h: torch.Tensor, attn_kwargs: dict[str, Any]) -> Any:
        return attn(hidden_states=h, **attn_kwargs)

    def _dropout(self, name: str | None, u: torch.Tensor) -> torch.Tensor:
        if name is None:
            return u
        dropout = _get_path(self, name)
        if isinstance(dropout, nn.Module):
            return dropout(u)
        return F.dropout(u, p=float(dropout), training=self.training)

    def _norm(self, name: str | None) -> nn.Module | None:
        return None if name is None else getattr(self, name)

    def _attn_update(self, h: torch.Tensor, attn_kwargs: dict[str, Any]) -> torch.Tensor:
        lay = self.geonorm_layout
        u = _first(self._call_attention(getattr(self, lay.attn), h, attn_kwargs))
        if lay.attn_out_norm is not None:
            u = getattr(self, lay.attn_out_norm)(u)
        u = self._dropout(lay.attn_dropout, u)
        if lay.residual_multiplier is not None:
            u = u * getattr(self, lay.residual_multiplier)
        return u

    def _mlp_update(self, h: torch.Tensor) -> torch.Tensor:
        lay = self.geonorm_layout
        u = _first(getattr(self, lay.mlp)(h))
        if lay.mlp_out_norm is not None:
            u = getattr(self, lay.mlp_out_norm)(u)
        u = self._dropout(lay.mlp_dropout, u)
        if lay.residual_multiplier is not None:
            u = u * getattr(self, lay.residual_multiplier)
        return u

    def _geonorm_block(self, hidden_states: torch.Tensor, attn_kwargs: dict[str, Any]) -> torch.Tensor:
        lay = self.geonorm_layout
        attn_res: GeoNormResidual = self.geonorm_attn_residual
        x = attn_res.enter(hidden_states) if self.geonorm_layer_index == 0 else hidden_states
        attn_norm = self._norm(lay.attn_norm)
        mlp_norm = self._norm(lay.mlp_norm)
        # Without an input norm a sublayer reads the state itself; only 'pre' and 'geo' allow that
        # (check_settings_fit), and those pass the norm to the residual update unused.
        attn_in = attn_res.sublayer_input(x, attn_norm) if attn_norm is not None else x
        if self.geonorm_parallel:
            if mlp_norm is None:
                mlp_norm, mlp_in = attn_norm, attn_in
            else:
                mlp_in = attn_res.sublayer_input(x, mlp_norm)
            u = self._attn_update(attn_in, attn_kwargs)
            u = self._dropout(lay.update_dropout, u + self._mlp_update(mlp_in))
            return attn_res(x, u, attn_norm)
        x = attn_res(x, self._attn_update(attn_in, attn_kwargs), attn_norm)
        mlp_res: GeoNormResidual = self.geonorm_mlp_residual
        mlp_in = mlp_res.sublayer_input(x, mlp_norm) if mlp_norm is not None else x
        return mlp_res(x, self._mlp_update(mlp_in), mlp_norm)


class GeoNormKeywordLayerMixin(GeoNormDecoderLayerMixin):
    """Layers called as ``layer(hidden_states, **kwargs)`` that pass the kwargs on to attention (LLaMA)."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self._geonorm_block(hidden_states, kwargs)


class GeoNormTupleLayerMixin(GeoNormDecoderLayerMixin):
    """Layers called as ``layer(hidden_states, **kwargs)`` that return ``(hidden_states, attention weights)``
    (Falcon, GPT-Neo: their models read ``outputs[0]`` and, with ``output_attentions``, ``outputs[1]``)."""

    def _call_attention(self, attn: nn.Module, h: torch.Tensor, attn_kwargs: dict[str, Any]) -> Any:
        output = attn(hidden_states=h, **attn_kwargs)
        if isinstance(output, tuple) and len(output) > 1 and attn_kwargs.get("output_attentions"):
            self.__dict__["_geonorm_attn_weights"] = output[1]
        return output

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.__dict__.pop("_geonorm_attn_weights", None)
        hidden_states = self._geonorm_block(hidden_states, kwargs)
        return hidden_states, self.__dict__.pop("_geonorm_attn_weights", None)


class GeoNormGPT2LayerMixin(GeoNormDecoderLayerMixin):
    """GPT-2's block, which its model calls with positional ``cache`` and ``attention_mask``."""

    def _call_attention(self, attn: nn.Module, h: torch.Tensor, attn_kwargs: dict[str, Any]) -> Any:
        return attn(h, **attn_kwargs)

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
        attn_kwargs = dict(cache=cache, attention_mask=attention_mask, use_cache=use_cache, **kwargs)
        return self._geonorm_block(hidden_states, attn_kwargs)


class GeoNormGPTBigCodeLayerMixin(GeoNormDecoderLayerMixin):
    """GPTBigCode's block, which its model calls with ``encoder_hidden_states`` as the second positional argument."""

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
        attn_kwargs = dict(
            layer_past=layer_past,
            attention_mask=attention_mask,
            use_cache=use_cache,
            output_attentions=output_attentions,
            **kwargs,
        )
        return self._geonorm_block(hidden_states, attn_kwargs)


LAYER_MIXINS: dict[str, type] = {
    "keywords": GeoNormKeywordLayerMixin,
    "tuple": GeoNormTupleLayerMixin,
    "gpt2": GeoNormGPT2LayerMixin,
    "gpt_bigcode": GeoNormGPTBigCodeLayerMixin,
}
_LAYER_CLASSES: dict[tuple[type, str], type] = {}


def geonorm_layer_class(stock_layer_class: type, layout: BlockLayout) -> type:
    """The GeoNorm subclass of a stock decoder-layer class (made once and cached)."""
    if issubclass(stock_layer_class, GeoNormDecoderLayerMixin):
        return stock_layer_class
    key = (stock_layer_class, layout.call)
    if key not in _LAYER_CLASSES:
        mixin = LAYER_MIXINS[layout.call]
        name = f"GeoNorm{stock_layer_class.__name__}"
        _LAYER_CLASSES[key] = type(name, (mixin, stock_layer_class), {"__module__": __name__})
    return _LAYER_CLASSES[key]


DEEPNORM_SCALED = re.compile(r"(^|\.)(v_proj|o_proj|out_proj|dense|c_proj|wo|wv|value)\.weight$")


def _fused_value_weight(attn: nn.Module, heads: int, hidden_size: int) -> torch.Tensor | None:
    """The part of a fused query/key/value projection's weight that makes the values (a view into it), laid out
    as each family's attention splits its output; None where the values have a projection of their own."""
    head_dim = hidden_size // heads
    if hasattr(attn, "qkv_proj") and hasattr(attn, "mp_num"):  # codegen: per model-parallel block [q, v, k]
        return attn.qkv_proj.weight.view(attn.mp_num, 3, -1, hidden_size)[:, 1]
    fused = getattr(attn, "query_key_value", None) or getattr(attn, "c_attn", None)
    if fused is None:
        return None
    if not isinstance(fused, nn.Linear):  # GPT-2's Conv1D (in x 3*hidden): column blocks [q | k | v]
        return fused.weight[:, 2 * hidden_size :]
    weight = fused.weight  # nn.Linear: out x in
    if getattr(attn, "new_decoder_architecture", False):  # falcon: per key/value group [q..., k, v]
        return weight.view(attn.num_kv_heads, heads // attn.num_kv_heads + 2, head_dim, hidden_size)[:, -1]
    if getattr(attn, "multi_query", False):  # falcon / gpt_bigcode: [all q | one k | one v]
        return weight[weight.shape[0] - head_dim :]
    return weight.view(heads, 3, head_dim, hidden_size)[:, 2]  # gpt_neox, persimmon, falcon, gpt_bigcode: per head


def _deepnorm_scale_(layer: nn.Module, layout: BlockLayout, beta: float, config: Any) -> None:
    """DeepNet's from-scratch init: FFN, value and output projections scaled by beta = (8T)^(-1/4)."""
    with torch.no_grad():
        for name, param in getattr(layer, layout.mlp).named_parameters():
            if name.endswith("weight") and param.dim() >= 2:
                param.mul_(beta)
        attn = getattr(layer, layout.attn)
        for name, param in attn.named_parameters():
            if DEEPNORM_SCALED.search(name):
                param.mul_(beta)
        values = _fused_value_weight(attn, config.num_attention_heads, config.hidden_size)
        if values is not None:
            values.mul_(beta)


def _register_output_capture(base_model: nn.Module) -> None:
    """transformers keys ``output_hidden_states`` capture on the model's class name, registered in
    ``__init__``; a class swapped in afterwards must be registered too."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # older transformers capture outputs without the registry
        return
    recordable = getattr(base_model, "_can_record_outputs", None)
    if recordable:
        _CAN_RECORD_REGISTRY[base_model] = recordable


def check_settings_fit(layout: BlockLayout, settings: GeoNormSettings, model_type: str) -> None:
    if layout.has_out_norms and settings.norm_style not in ("pre", "geo"):
        raise ValueError(
            f"{model_type} already normalises each sublayer's output; only norm_style 'pre' (the stock "
            f"model) and 'geo' apply to it, got {settings.norm_style!r}"
        )
    if not layout.plain_norms and settings.norm_style == "sandwich":
        raise ValueError(
            f"{model_type}'s block norms are not plain RMSNorm/LayerNorm (they carry more than a weight and bias), "
            "so norm_style 'sandwich' cannot add fresh norms of their kind that start as the identity; use "
            "'pre', 'post', 'deepnorm' or 'geo'"
        )
    if not layout.has_input_norms and settings.norm_style not in ("pre", "geo"):
        raise ValueError(
            f"{model_type} has no input norm before a sublayer; only norm_style 'pre' (the stock model) and "
            f"'geo' apply to it, got {settings.norm_style!r}"
        )


def patch_base_model(base_model: nn.Module, config: Any, layout: BlockLayout, fresh_init: bool) -> None:
    """Swap every decoder layer of ``base_model`` for its GeoNorm class and give it residual modules.

    ``fresh_init`` applies the DeepNet init scaling of ``norm_style='deepnorm'`` (models built from a
    config, not converted from trained weights).
    """
    _register_output_capture(base_model)
    layout = layout.for_config(config)
    layers = _get_path(base_model, layout.layers)
    num_layers = len(layers)
    settings = GeoNormSettings.from_object(config).validate(num_layers)
    check_settings_fit(layout, settings, getattr(config, "model_type", "this model"))
    if getattr(config, "add_cross_attention", False):
        raise ValueError("GeoNorm supports decoder-only models; set add_cross_attention=False")
    steps = step_sizes(settings.geo_decay, settings.geo_alpha, num_layers)
    parallel = layout.is_parallel(config)
    for k, layer in enumerate(layers):
        layer.__class__ = geonorm_layer_class(type(layer), layout)
        layer.geonorm_layout = layout
        layer.geonorm_layer_index = k
        layer.geonorm_parallel = parallel
        sublayers = [("attn", layout.attn_norm)] + ([] if parallel else [("mlp", layout.mlp_norm)])
        for part, norm_name in sublayers:
            out_norm = None
            if settings.norm_style == "sandwich":
                out_norm = identity_norm_like(getattr(layer, norm_name), layout.norm_weight_offset)
            residual = GeoNormResidual(settings, k, num_layers, steps[k], output_norm=out_norm)
            norm = getattr(layer, norm_name) if norm_name is not None else None
            reference = next((norm if norm is not None else layer).parameters(), None)
            if reference is not None:
                residual.to(device=reference.device, dtype=reference.dtype)
            residual.train(layer.training)
            setattr(layer, f"geonorm_{part}_residual", residual)
        if fresh_init and settings.norm_style == "deepnorm":
            _deepnorm_scale_(layer, layout, (8.0 * num_layers) ** -0.25, config)


SETTING_NAMES = GeoNormSettings.names()


class GeoNormConfigMixin:
    """Adds the GeoNorm settings to a stock config; every assignment to one of them is validated."""

    model_type: str
    geonorm_stock_type: str

    def __setattr__(self, key: str, value: Any) -> None:
        if key in SETTING_NAMES:
            current = {name: getattr(self, name, SETTING_DEFAULTS[name]) for name in SETTING_NAMES}
            current[key] = value
            try:
                num_layers = self.num_hidden_layers
            except AttributeError:
                num_layers = None
            validated = GeoNormSettings(**current).validate(num_layers if isinstance(num_layers, int) else None)
            value = getattr(validated, key)
        super().__setattr__(key, value)

    @classmethod
    def _check_family(cls, config_dict: dict[str, Any]) -> dict[str, Any]:
        """Refuse a checkpoint of another family (transformers only warns and falls back to default sizes);
        a stock checkpoint of this family is read as this GeoNorm type."""
        found = config_dict.get("model_type")
        if found is not None and found not in (cls.model_type, cls.geonorm_stock_type):
            raise ValueError(
                f"{cls.__name__} reads {cls.geonorm_stock_type!r} or {cls.model_type!r} checkpoints, but this one "
                f"is {found!r}. Use the GeoNorm config of its own family: hf_geonorm.config_class_for({found!r})."
            )
        return {**config_dict, "model_type": cls.model_type} if found is not None else config_dict

    @classmethod
    def get_config_dict(cls, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        return cls._check_family(config_dict), kwargs

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        return super().from_dict(cls._check_family(config_dict), **kwargs)

    def geonorm_settings(self) -> GeoNormSettings:
        return GeoNormSettings.from_object(self)


class GeoNormPreTrainedMixin:
    """Initialises the parameters GeoNorm adds (the learnable step starts at scale 1, bias 0), and keeps saved
    folders whole: a config that names remote code (``auto_map``) is saved with that code beside it."""

    geonorm_layout: BlockLayout

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        result = super().save_pretrained(save_directory, *args, **kwargs)
        complete_remote_code(Path(save_directory), self.config.model_type)
        return result

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Push with the remote code and the GeoNorm model card (``hf_geonorm.export.push_to_hub``; keyword
        arguments as transformers' ``push_to_hub``, plus ``tokenizer`` and ``card_info``). Loaded as remote code
        where the plugin is not installed: transformers' push (the folder still gets its code, see
        ``complete_remote_code``, but a generic card)."""
        try:
            export = importlib.import_module("hf_geonorm.export")
        except ImportError:
            return super().push_to_hub(repo_id, **kwargs)
        return export.push_to_hub(self, repo_id, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, GeoNormResidual):
            if module.step_scale is not None:
                module.step_scale.fill_(1.0)
                module.step_bias.fill_(0.0)
            return
        super()._init_weights(module)


class GeoNormBaseModelMixin(GeoNormPreTrainedMixin):
    """A stock base model whose decoder layers are GeoNorm layers from construction on."""

    def post_init(self) -> None:
        patch_base_model(self, self.config, self.geonorm_layout, fresh_init=True)
        super().post_init()


class GeoNormCausalLMMixin(GeoNormPreTrainedMixin):
    """A stock causal LM whose inner base model becomes the GeoNorm base model before weights initialise."""

    geonorm_base_class: type

    def post_init(self) -> None:
        base = getattr(self, self.base_model_prefix)
        if not isinstance(base, GeoNormBaseModelMixin):
            base.__class__ = self.geonorm_base_class
            patch_base_model(base, self.config, self.geonorm_layout, fresh_init=True)
        super().post_init()


def remote_code_files() -> list[Path]:
    """This file and every flat sibling it reaches through ``from .x import``: the remote code of a folder."""
    from transformers.dynamic_module_utils import get_relative_import_files

    return [Path(__file__)] + sorted(Path(f) for f in get_relative_import_files(__file__))


def complete_remote_code(folder: Path, model_type: str) -> None:
    """If ``folder/config.json`` has an ``auto_map``, point it at this family's classes and copy the source
    beside it (a model loaded from an exported folder keeps ``auto_map``; re-saved without the source, the
    folder would name files that are not there)."""
    config_path = folder / "config.json"
    if not config_path.exists():
        return
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    if "auto_map" not in saved:
        return
    family = FAMILIES[model_type.removeprefix("geonorm_")]
    module = Path(__file__).stem
    saved["auto_map"] = {
        "AutoConfig": f"{module}.{family.config_class.__name__}",
        "AutoModel": f"{module}.{family.base_class.__name__}",
        "AutoModelForCausalLM": f"{module}.{family.causal_class.__name__}",
    }
    for source in remote_code_files():
        shutil.copyfile(source, folder / source.name)
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@dataclass(frozen=True)
class GeoNormFamily:
    """The stock classes of one model type and their GeoNorm counterparts."""

    stock_type: str
    layout: BlockLayout
    stock_config_class: type
    stock_base_class: type
    stock_causal_class: type
    config_class: type
    base_class: type
    causal_class: type

    @property
    def model_type(self) -> str:
        return f"geonorm_{self.stock_type}"


FAMILIES: dict[str, GeoNormFamily] = {}
GENERATED_CLASS_NAMES: list[str] = []


def _stock_classes(model_type: str) -> tuple[type, type, type]:
    """Config, base model and causal LM of a model type, found by name: some types live in another type's
    module (gemma3_text in gemma3) or reuse its model classes (exaone runs LlamaForCausalLM)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    transformers = importlib.import_module("transformers")
    return (
        getattr(transformers, CONFIG_MAPPING_NAMES[model_type]),
        getattr(transformers, MODEL_MAPPING_NAMES[model_type]),
        getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]),
    )


def _make_family(model_type: str, layout: BlockLayout) -> GeoNormFamily:
    stock_config, stock_base, stock_causal = _stock_classes(model_type)
    prefix = "GeoNorm" + stock_config.__name__.removesuffix("Config")
    annotations = {
        "norm_style": str,
        "geo_alpha": float | list[float],
        "geo_decay": str,
        "geo_max_angle": float | None,
        "geo_learnable_step": bool,
        "geo_radius": str,
        "geo_bridge": float,
    }
    config_ns = {
        "__module__": __name__,
        "__doc__": f"{stock_config.__name__} with the GeoNorm settings (model_type 'geonorm_{model_type}').",
        "__annotations__": annotations,
        "model_type": f"geonorm_{model_type}",
        "geonorm_stock_type": model_type,
        **SETTING_DEFAULTS,
    }
    config_class = type(f"{prefix}Config", (GeoNormConfigMixin, stock_config), config_ns)
    common = {"__module__": __name__, "config_class": config_class, "geonorm_layout": layout}
    base_class = type(
        f"{prefix}Model",
        (GeoNormBaseModelMixin, stock_base),
        {**common, "__doc__": f"{stock_base.__name__} with GeoNorm residual updates."},
    )
    causal_class = type(
        f"{prefix}ForCausalLM",
        (GeoNormCausalLMMixin, stock_causal),
        {**common, "geonorm_base_class": base_class, "__doc__": f"{stock_causal.__name__} with GeoNorm."},
    )
    for cls in (config_class, base_class, causal_class):
        globals()[cls.__name__] = cls
        GENERATED_CLASS_NAMES.append(cls.__name__)
    return GeoNormFamily(
        model_type, layout, stock_config, stock_base, stock_causal, config_class, base_class, causal_class
    )


for _model_type, _layout in LAYOUTS.items():
    try:
        FAMILIES[_model_type] = _make_family(_model_type, _layout)
    except (ImportError, AttributeError, KeyError):  # not in this transformers version
        continue
