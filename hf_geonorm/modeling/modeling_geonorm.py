"""GeoNorm versions of stock transformers decoder-only models: the entry module of the modelling code, the one
``auto_map`` names (``modeling_geonorm.GeoNormLlamaForCausalLM``).

For every supported stock ``model_type`` X it has ``GeoNorm<X>Config`` (model_type ``geonorm_X``),
``GeoNorm<X>Model`` and ``GeoNorm<X>ForCausalLM``, and ``GeoNorm<X>ForSequenceClassification``,
``...ForTokenClassification`` and ``...ForQuestionAnswering`` where the stock type has those heads: subclasses of
the stock classes whose decoder layers run as the GeoNorm decoder layer of their block shape, written out in
``decoder_layers.py`` (set by ``blocks.py``); the heads are the stock ones. Parameter names and shapes stay the
stock ones, so stock checkpoints load with no missing or unexpected keys.

The classes are module attributes built on first use (``families.py``): loading a checkpoint builds its own
family and imports its own stock modelling module only.

The module and its siblings import only torch, transformers and each other, because they are copied beside saved
checkpoints as remote code.
"""

from __future__ import annotations

from .families import FAMILY_BUILT_HOOKS, GeoNormFamily, discover_families
from .peft_targets import register_lora_targets

FAMILIES: dict[str, GeoNormFamily] = discover_families(__name__)
# Class name -> the family that defines it: GeoNormLlamaConfig, GeoNormLlamaModel, GeoNormLlamaForCausalLM,
# GeoNormLlamaForSequenceClassification, ...
GENERATED_CLASSES: dict[str, GeoNormFamily] = {
    name: family for family in FAMILIES.values() for name in family.class_names
}


# PEFT learns a geonorm_X type's default LoRA targets when its family is built, before any model of it exists
FAMILY_BUILT_HOOKS.append(lambda family: register_lora_targets(family.model_type, family.layout.lora_targets))


def __getattr__(name: str) -> type:
    """A generated class builds its family on first use (``GeoNormLlamaConfig`` builds llama's only): how
    ``hf_geonorm``, pickle and transformers' remote-code loader reach them."""
    family = GENERATED_CLASSES.get(name)
    if family is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return family.classes().named(name)
