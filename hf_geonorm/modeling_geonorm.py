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
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .geometry import step_sizes
from .residual import GeoNormResidual, identity_norm_like
from .settings import GeoNormSettings

SETTING_DEFAULTS = GeoNormSettings().to_dict()


@dataclass(frozen=True)
class BlockLayout:
    """Where a stock decoder layer keeps its parts, and how it forms its residual updates.

    ``attn_out_norm``/``mlp_out_norm`` name norms the stock block already applies to a sublayer's output
    (Gemma 2/3, OLMo 2): they stay part of the update u. ``parallel`` blocks add one summed update.
    """

    layers: str = "layers"
    attn_norm: str = "input_layernorm"
    attn: str = "self_attn"
    mlp_norm: str | None = "post_attention_layernorm"
    mlp: str = "mlp"
    parallel: bool = False
    parallel_flag: str | None = None
    attn_out_norm: str | None = None
    mlp_out_norm: str | None = None
    attn_dropout: str | None = None
    mlp_dropout: str | None = None
    residual_multiplier: str | None = None
    norm_weight_offset: float = 0.0
    call: str = "keywords"
    final_norm: str = "norm"

    def is_parallel(self, config: Any) -> bool:
        if self.parallel_flag is not None:
            return bool(getattr(config, self.parallel_flag))
        return self.parallel

    @property
    def has_out_norms(self) -> bool:
        return self.attn_out_norm is not None or self.mlp_out_norm is not None


LLAMA = BlockLayout()
GEMMA = BlockLayout(norm_weight_offset=1.0)
PHI3 = BlockLayout(attn_dropout="resid_attn_dropout", mlp_dropout="resid_mlp_dropout")
GRANITE = BlockLayout(residual_multiplier="residual_multiplier")
GPT2 = BlockLayout(layers="h", attn_norm="ln_1", attn="attn", mlp_norm="ln_2", call="gpt2", final_norm="ln_f")

# Stock model types whose decoder layer is LLaMA's, token for token (found by scanning transformers 5.24 with
# benchmarks/scan_layouts.py; tests/test_layouts.py re-checks the list against the installed version).
LLAMA_LAYOUT_TYPES = (
    "arcee", "bitnet", "cwm", "deepseek_v2", "deepseek_v3", "diffllama", "dots1", "ernie4_5", "glm",
    "glm4_moe", "helium", "hunyuan_v1_dense", "hunyuan_v1_moe", "llama", "ministral", "mistral", "mixtral",
    "olmo", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "seed_oss", "smollm3", "starcoder2",
)  # fmt: skip

LAYOUTS: dict[str, BlockLayout] = {
    **{model_type: LLAMA for model_type in LLAMA_LAYOUT_TYPES},
    "gemma": GEMMA,
    "phi3": PHI3,
    "granite": GRANITE,
    "gpt2": GPT2,
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

    def _attn_update(self, h: torch.Tensor, attn_kwargs: dict[str, Any]) -> torch.Tensor:
        lay = self.geonorm_layout
        attn = getattr(self, lay.attn)
        if lay.call == "gpt2":
            u = _first(attn(h, **attn_kwargs))
        else:
            u = _first(attn(hidden_states=h, **attn_kwargs))
        if lay.attn_out_norm is not None:
            u = getattr(self, lay.attn_out_norm)(u)
        if lay.attn_dropout is not None:
            u = getattr(self, lay.attn_dropout)(u)
        if lay.residual_multiplier is not None:
            u = u * getattr(self, lay.residual_multiplier)
        return u

    def _mlp_update(self, h: torch.Tensor) -> torch.Tensor:
        lay = self.geonorm_layout
        u = _first(getattr(self, lay.mlp)(h))
        if lay.mlp_out_norm is not None:
            u = getattr(self, lay.mlp_out_norm)(u)
        if lay.mlp_dropout is not None:
            u = getattr(self, lay.mlp_dropout)(u)
        if lay.residual_multiplier is not None:
            u = u * getattr(self, lay.residual_multiplier)
        return u

    def _geonorm_block(self, hidden_states: torch.Tensor, attn_kwargs: dict[str, Any]) -> torch.Tensor:
        lay = self.geonorm_layout
        attn_res: GeoNormResidual = self.geonorm_attn_residual
        x = attn_res.enter(hidden_states) if self.geonorm_layer_index == 0 else hidden_states
        attn_norm = getattr(self, lay.attn_norm)
        if self.geonorm_parallel:
            mlp_norm = getattr(self, lay.mlp_norm) if lay.mlp_norm is not None else attn_norm
            u = self._attn_update(attn_res.sublayer_input(x, attn_norm), attn_kwargs)
            u = u + self._mlp_update(attn_res.sublayer_input(x, mlp_norm))
            return attn_res(x, u, attn_norm)
        x = attn_res(x, self._attn_update(attn_res.sublayer_input(x, attn_norm), attn_kwargs), attn_norm)
        mlp_res: GeoNormResidual = self.geonorm_mlp_residual
        mlp_norm = getattr(self, lay.mlp_norm)
        return mlp_res(x, self._mlp_update(mlp_res.sublayer_input(x, mlp_norm)), mlp_norm)


class GeoNormKeywordLayerMixin(GeoNormDecoderLayerMixin):
    """Layers called as ``layer(hidden_states, **kwargs)`` that pass the kwargs on to attention (LLaMA)."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self._geonorm_block(hidden_states, kwargs)


class GeoNormGPT2LayerMixin(GeoNormDecoderLayerMixin):
    """GPT-2's block, which its model calls with positional ``cache`` and ``attention_mask``."""

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


LAYER_MIXINS: dict[str, type] = {"keywords": GeoNormKeywordLayerMixin, "gpt2": GeoNormGPT2LayerMixin}
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


def _deepnorm_scale_(layer: nn.Module, layout: BlockLayout, beta: float, hidden_size: int) -> None:
    """DeepNet's from-scratch init: FFN, value and output projections scaled by beta = (8T)^(-1/4)."""
    with torch.no_grad():
        for name, param in getattr(layer, layout.mlp).named_parameters():
            if name.endswith("weight") and param.dim() >= 2:
                param.mul_(beta)
        attn = getattr(layer, layout.attn)
        for name, param in attn.named_parameters():
            if DEEPNORM_SCALED.search(name):
                param.mul_(beta)
        if layout.call == "gpt2":  # c_attn packs q, k, v column-wise (Conv1D: in x 3*hidden)
            attn.c_attn.weight[:, 2 * hidden_size :].mul_(beta)


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


def patch_base_model(base_model: nn.Module, config: Any, layout: BlockLayout, fresh_init: bool) -> None:
    """Swap every decoder layer of ``base_model`` for its GeoNorm class and give it residual modules.

    ``fresh_init`` applies the DeepNet init scaling of ``norm_style='deepnorm'`` (models built from a
    config, not converted from trained weights).
    """
    _register_output_capture(base_model)
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
            reference = next(getattr(layer, norm_name).parameters(), None)
            if reference is not None:
                residual.to(device=reference.device, dtype=reference.dtype)
            setattr(layer, f"geonorm_{part}_residual", residual)
        if fresh_init and settings.norm_style == "deepnorm":
            _deepnorm_scale_(layer, layout, (8.0 * num_layers) ** -0.25, config.hidden_size)


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
    """Initialises the parameters GeoNorm adds (the learnable step starts at scale 1, bias 0)."""

    geonorm_layout: BlockLayout

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
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    configuration = importlib.import_module(f"transformers.models.{model_type}.configuration_{model_type}")
    return (
        getattr(configuration, CONFIG_MAPPING_NAMES[model_type]),
        getattr(modeling, MODEL_MAPPING_NAMES[model_type]),
        getattr(modeling, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]),
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
