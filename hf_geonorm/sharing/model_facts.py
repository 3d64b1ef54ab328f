"""What a model card says the model is, beyond its settings: what it computes where its ``norm_style`` alone would
mislead (``bridge_words``: ``geo`` at bridge 0 computes exact Pre-Norm), the tags that say so (``style_tags``), the
LoRA target modules it has (``lora_targets``), and the types of the tensors its weights were read from
(``tensor_types_text``)."""

from __future__ import annotations

from typing import Any

from ..modeling.settings import GeoNormSettings, computes_prenorm
from .gguf_lineage import is_quantised

AT_BRIDGE_ZERO = "at bridge 0: computes exactly Pre-Norm until trained with a bridge anneal"
MODULES_BUILT = 8  # layers of the model built on the meta device to find its module names (a layer's repeat)


def bridge_words(settings: GeoNormSettings) -> str | None:
    """What a ``geo`` model whose ``geo_bridge`` is not 1 computes, in a few words that follow its name ("GeoNorm
    llama at bridge 0: computes exactly Pre-Norm ..."); None where ``norm_style`` says it."""
    if settings.norm_style != "geo":
        return None
    if computes_prenorm(settings.to_dict()):
        return AT_BRIDGE_ZERO
    bridges = settings.geo_bridge if isinstance(settings.geo_bridge, list) else [settings.geo_bridge]
    if all(b == 1.0 for b in bridges):
        return None
    where = f"bridge {bridges[0]:g}" if len(set(bridges)) == 1 else "a bridge per update"
    return f"at {where}: between Pre-Norm and GeoNorm"


def style_tags(settings: GeoNormSettings) -> list[str]:
    """The card's tags of the norm style: ``norm-style-X``, except for a ``geo`` model at bridge 0, which computes
    exact Pre-Norm and is tagged so (``norm-style-geo-at-bridge-0``, ``computes-pre-norm``)."""
    if settings.norm_style == "geo" and computes_prenorm(settings.to_dict()):
        return ["norm-style-geo-at-bridge-0", "computes-pre-norm"]
    return [f"norm-style-{settings.norm_style}"]


def module_names(config: Any) -> set[str]:
    """The last parts of the module names of the model ``config`` describes (``q_proj``, ``c_attn``), as PEFT
    matches target modules; built on the meta device with at most ``MODULES_BUILT`` layers (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..checkpoints.loading_sizes import with_layers

    layers = getattr(config, "num_hidden_layers", None)
    built = with_layers(config, MODULES_BUILT) if isinstance(layers, int) and layers > MODULES_BUILT else config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(built, experts_implementation="eager")
    return {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}


def lora_targets(config: Any, family: Any) -> list[str]:
    """The target modules the card's LoRA example names: those PEFT's own table names for the stock model type
    (the family layout's where PEFT has no entry) that this model has; the layout's that it has where none of
    PEFT's are there."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    layout = list(family.layout.lora_targets)
    wanted = list(PEFT_TARGETS.get(family.stock_type) or layout)
    names = module_names(config)
    return [t for t in wanted if t in names] or [t for t in layout if t in names] or wanted


def tensor_types_text(types: dict[str, int]) -> str:
    """The tensor types of a source file in words, quantised ones first: "Q4_1 (14 tensors) and F32 (5 tensors)"."""
    ordered = sorted(types.items(), key=lambda item: (not is_quantised(item[0]), -item[1], item[0]))
    parts = [f"{name} ({count} tensor{'s' if count != 1 else ''})" for name, count in ordered]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
