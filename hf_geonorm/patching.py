"""The public API over the GeoNorm families: registration, ``apply_geonorm`` and ``convert``.

Importing ``hf_geonorm`` registers every family with AutoConfig, AutoModel and AutoModelForCausalLM and
tells PEFT which modules LoRA targets by default.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .modeling_geonorm import (
    FAMILIES,
    GeoNormBaseModelMixin,
    GeoNormCausalLMMixin,
    GeoNormFamily,
    patch_base_model,
)
from .settings import GeoNormSettings


def supported_architectures() -> list[str]:
    """The stock model types GeoNorm can patch, sorted."""
    return sorted(FAMILIES)


def family_for(model_type: str) -> GeoNormFamily:
    """The family of a stock model type or of its ``geonorm_`` counterpart."""
    stock = model_type.removeprefix("geonorm_")
    if stock not in FAMILIES:
        raise ValueError(
            f"GeoNorm does not support model_type {model_type!r}; supported: {', '.join(supported_architectures())}"
        )
    return FAMILIES[stock]


def config_class_for(model_type: str) -> type:
    """``GeoNorm<X>Config`` for a stock model type X (or ``geonorm_X``)."""
    return family_for(model_type).config_class



def _unwrap_peft(model: nn.Module) -> nn.Module:
    while hasattr(model, "get_base_model") and type(model).__module__.startswith("peft"):
        model = model.get_base_model()
    return model


def apply_geonorm(model: nn.Module, **settings: Any) -> nn.Module:
    """Patch a stock (or GeoNorm) model in place into its GeoNorm family; returns the same object.

    Its config becomes ``GeoNorm<X>Config`` with the given settings (defaults elsewhere; on a model that is
    GeoNorm already, its current settings). Works through a PEFT wrapper. Trained weights are kept as they
    are (no DeepNet init scaling); the parameters GeoNorm adds start at their identity values.
    """
    target = _unwrap_peft(model)
    config = getattr(target, "config", None)
    if config is None or not hasattr(target, "base_model_prefix"):
        raise ValueError(f"apply_geonorm needs a transformers PreTrainedModel, got {type(target).__name__}")
    family = family_for(config.model_type)
    current = config.geonorm_settings().to_dict() if hasattr(config, "geonorm_settings") else {}
    chosen = GeoNormSettings.from_object(GeoNormSettings(**current), **settings)
    if isinstance(target, (family.stock_causal_class, GeoNormCausalLMMixin)):
        base = getattr(target, target.base_model_prefix)
        target.__class__ = family.causal_class
        if getattr(target, "loss_type", None) is None:  # GPT2LMHeadModel's name names no loss; the new class's does
            target.loss_type = "ForCausalLM"
    elif isinstance(target, (family.stock_base_class, GeoNormBaseModelMixin)):
        base = target
    else:
        raise ValueError(
            f"apply_geonorm patches {family.stock_causal_class.__name__} or {family.stock_base_class.__name__}; "
            f"got {type(target).__name__}"
        )
    chosen.validate(config.num_hidden_layers)
    config.__class__ = family.config_class
    vars(config).pop("model_type", None)  # a stock config may carry its type on the instance
    for name, value in chosen.to_dict().items():
        setattr(config, name, value)
    base.__class__ = family.base_class
    patch_base_model(base, config, family.layout, fresh_init=False)
    return model


def convert(model: nn.Module, **settings: Any) -> nn.Module:
    """A new instance of the registered GeoNorm class with the weights of ``model`` (left unchanged)."""
    return apply_geonorm(copy.deepcopy(model), **settings)


def set_bridge(model: nn.Module, bridge: float) -> None:
    """Move every GeoNorm update of ``model`` (and its config) to bridge value ``bridge`` in place."""
    target = _unwrap_peft(model)
    target.config.geo_bridge = bridge  # validated by the config
    for module in target.modules():
        if hasattr(module, "bridge") and hasattr(module, "norm_style"):
            module.bridge = float(bridge)


# LoRA's default targets for GeoNorm types whose stock type PEFT has no entry for: the query and value
# projections under the names the stock attentions use (LLaMA's, multi-head latent attention's, fused ones).
DEFAULT_LORA_TARGETS = ("q_proj", "v_proj", "q_b_proj", "kv_b_proj", "qkv_proj", "query_key_value")


def _register() -> None:
    from peft.utils import constants as peft_constants

    lora_targets = peft_constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    for family in FAMILIES.values():
        AutoConfig.register(family.model_type, family.config_class, exist_ok=True)
        AutoModel.register(family.config_class, family.base_class, exist_ok=True)
        AutoModelForCausalLM.register(family.config_class, family.causal_class, exist_ok=True)
        targets = lora_targets.get(family.stock_type, DEFAULT_LORA_TARGETS)
        lora_targets.setdefault(family.model_type, list(targets))


_register()
