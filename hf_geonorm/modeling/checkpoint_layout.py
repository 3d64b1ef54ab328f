"""GeoNorm folders in the stock checkpoint layout: a family takes its stock type's checkpoint conversion (the
renamings and merges transformers applies on load and save by model type), with GeoNorm's own tensors shielded
from it, so GeoNorm folders are written in the stock layout and stock folders load into GeoNorm classes whole."""

from __future__ import annotations

from typing import Any

# The modules GeoNorm adds to a decoder layer (blocks.py); their parameters are the learnable step.
RESIDUAL_MODULES = ("geonorm_attn_residual", "geonorm_mlp_residual")


def guarded_conversions(conversions: list[Any] | None) -> list[Any] | None:
    """A stock checkpoint conversion that leaves GeoNorm's own tensors alone. Its renamings are regular
    expressions over whole keys, and some match GeoNorm's names (Mixtral's reversed ``.mlp.`` matches
    ``_mlp_`` in ``geonorm_mlp_residual``): the names are swapped for ones no stock pattern matches before the
    stock transforms run and swapped back after, in both directions (transformers reverses the list to save)."""
    if not conversions:
        return conversions
    from transformers.conversion_mapping import WeightRenaming

    hidden = {name: name.upper().replace("_", "") for name in RESIDUAL_MODULES}
    if any(isinstance(t, WeightRenaming) and t.target_patterns == [hidden[RESIDUAL_MODULES[0]]] for t in conversions):
        return conversions
    hide = [WeightRenaming(name, alias) for name, alias in hidden.items()]
    show = [WeightRenaming(alias, name) for name, alias in hidden.items()]
    return [*hide, *conversions, *show]


def register_checkpoint_layout(model_type: str, stock_type: str, classes: dict[str, type]) -> None:
    """Give the GeoNorm type the checkpoint conversion of its stock type. transformers keeps some weights in memory
    in another layout than in files (MoE experts fused, gpt_neox's ``embed_out``, exaone's GPT-style names) and
    translates on load and save by ``model_type`` and class name; without this, a stock folder would load into a
    GeoNorm class with random tensors. Registered by name, so that transformers also applies it to the classes when
    they run as remote code; ``classes``: stock class name -> the GeoNorm class made from it."""
    from transformers import conversion_mapping

    by_type = conversion_mapping.get_checkpoint_conversion_mapping(stock_type)
    if by_type is not None:
        conversion_mapping.register_checkpoint_conversion_mapping(model_type, guarded_conversions(by_type), True)
    for stock_name, cls in classes.items():
        by_class = conversion_mapping.get_checkpoint_conversion_mapping(stock_name)
        if by_class is not None:
            conversion_mapping.register_checkpoint_conversion_mapping(cls.__name__, guarded_conversions(by_class), True)
