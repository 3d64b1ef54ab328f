"""The patch that puts GeoNorm into a stock base model, and the checks before it.

``patch_base_model`` builds every sublayer's ``GeoNormResidual`` and hands each stock decoder layer to the GeoNorm
decoder layer of its block shape (``decoder_layers.py``, chosen by the layout's ``block``: its ``take_over``).
Imports only torch, transformers and flat siblings (remote code).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from .decoder_layers import FIRST_TOKENS, GeoNormDecoderLayer, decoder_layer_class
from .fresh_init import deepnet_init_, zero_positions_
from .layouts import BlockLayout
from .norm_styles import NORM_STYLE_DECLARATIONS, named_styles
from .residual import GeoNormResidual, UpdateSchedule, identity_norm_like
from .settings import GeoNormSettings
from .transformers_versions import (
    CAPTURE_REGISTRY_BY_MODEL,
    INSTALLED_VERSION,
    SUPPORTED_RANGE,
    UNTESTED_RELEASE,
    UnsupportedTransformers,
)


def _get_path(module: nn.Module, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _register_output_capture(base_model: nn.Module) -> None:
    """transformers keys ``output_hidden_states`` capture on the model's class name, registered in ``__init__``; a
    base model whose class is set afterwards (the base of a head, ``apply_geonorm``) must be registered too, with
    its class's entry, which names the GeoNorm decoder layer (``families.geonorm_recorded_outputs``). The registry
    takes the model from transformers 5.23 on, the name of its class before (``CAPTURE_REGISTRY_BY_MODEL``)."""
    from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY

    recordable = getattr(base_model, "_can_record_outputs", None)
    if recordable:
        _CAN_RECORD_REGISTRY[base_model if CAPTURE_REGISTRY_BY_MODEL else str(type(base_model))] = recordable


def _declare_no_split(base_model: nn.Module, layer_class: type) -> None:
    """transformers keeps a module whole on one device (``device_map``, FSDP auto wrap) by its class *name* in
    ``_no_split_modules``, which ``post_init`` copies onto each model: a base model built as the stock one and
    patched afterwards learns the name of its GeoNorm decoder layer here (its class declares it too)."""
    names = base_model._no_split_modules
    base_model._no_split_modules = {*(names or ()), layer_class.__name__}


def check_settings_fit(layout: BlockLayout, settings: GeoNormSettings, model_type: str) -> None:
    style = NORM_STYLE_DECLARATIONS[settings.norm_style]
    if layout.has_out_norms and not style.only_input_norms:
        raise ValueError(
            f"{model_type} already normalises each sublayer's output; only norm_style "
            f"{named_styles(lambda other: other.only_input_norms, 'and')} apply to it, got {settings.norm_style!r}"
        )
    if not layout.plain_norms and style.output_norms:
        raise ValueError(
            f"{model_type}'s block norms are not plain RMSNorm/LayerNorm (they carry more than a weight and bias), "
            f"so norm_style {settings.norm_style!r} cannot add fresh norms of their kind that start as the identity; "
            f"use {named_styles(lambda other: not other.output_norms, 'or')}"
        )
    if not layout.has_input_norms and not style.only_input_norms:
        raise ValueError(
            f"{model_type} has no input norm before a sublayer; only norm_style "
            f"{named_styles(lambda other: other.only_input_norms, 'and')} apply to it, got {settings.norm_style!r}"
        )


def check_layout_settings(
    layout: BlockLayout, config: Any, settings: GeoNormSettings, num_layers: int, model_type: str
) -> None:
    """``ValueError`` for settings the block variant of ``config`` cannot run: a per-update list on parallel blocks
    (one update per layer), ``geo_first_token_prenorm`` where the layers cannot find the first token."""
    if decoder_layer_class(layout).parallel_residual(config):
        for name in ("geo_alpha", "geo_bridge", "geo_frames", "geo_bridge_costs"):
            values = getattr(settings, name)
            if isinstance(values, list) and len(values) != num_layers:
                raise ValueError(
                    f"{name} given as a list must have one value per layer ({num_layers}) for {model_type}: its "
                    f"parallel blocks make one update per layer; got {len(values)}"
                )
    if settings.norm_style == "geo" and settings.geo_first_token_prenorm and not layout.position_ids:
        raise ValueError(
            f"geo_first_token_prenorm needs each sequence's first token, and {model_type}'s decoder layers are given "
            "neither position ids nor the padding mask; set geo_first_token_prenorm=False for this model"
        )


# What Python puts in every class body besides the methods a class defines.
CLASS_BODY_ENTRIES = frozenset({"__module__", "__qualname__", "__doc__", "__firstlineno__", "__static_attributes__"})


def check_stock_layer_class(layer_class: type) -> None:
    """``UnsupportedTransformers`` unless ``layer_class`` defines ``__init__`` and ``forward`` alone, directly over
    ``GradientCheckpointingLayer``: what setting a layer's class to a GeoNorm decoder layer relies on (the layer
    keeps what ``__init__`` made and loses only ``forward``). The tests check it on every release tested; above the
    newest, ``check_patch`` checks it here, so that a stock layer that gained a method is refused, not run without
    it."""
    defined = set(vars(layer_class)) - CLASS_BODY_ENTRIES
    if layer_class.__bases__ != (GradientCheckpointingLayer,) or defined != {"__init__", "forward"}:
        raise UnsupportedTransformers(
            f"{layer_class.__name__} of transformers {INSTALLED_VERSION} is not the decoder layer the GeoNorm "
            f"code was tested with (it defines {', '.join(sorted(defined))} over "
            f"{', '.join(base.__name__ for base in layer_class.__bases__)}): pip install "
            f"'transformers{SUPPORTED_RANGE}', the releases it is tested on"
        )


def check_patch(base_model: nn.Module, config: Any, layout: BlockLayout, settings: GeoNormSettings) -> BlockLayout:
    """Raise ``ValueError`` if ``base_model`` (with ``config``) cannot become GeoNorm with ``settings``; return
    the layout of the block variant it builds. Changes nothing, so callers validate before they patch."""
    layout = layout.for_config(config)
    num_layers = len(_get_path(base_model, layout.layers))
    settings.validate(num_layers)
    model_type = getattr(config, "model_type", "this model")
    check_layout_settings(layout, config, settings, num_layers, model_type)
    check_settings_fit(layout, settings, model_type)
    if getattr(config, "add_cross_attention", False):
        raise ValueError("GeoNorm supports decoder-only models; set add_cross_attention=False")
    for k, layer in enumerate(_get_path(base_model, layout.layers)):
        if UNTESTED_RELEASE and not isinstance(layer, GeoNormDecoderLayer):
            check_stock_layer_class(type(layer))
        for part in (layout.attn, layout.mlp, layout.attn_norm, layout.mlp_norm):
            if part is not None and not hasattr(layer, part):
                raise ValueError(
                    f"decoder layer {k} ({type(layer).__name__}) has no {part!r}: GeoNorm patches {model_type}'s own "
                    "decoder layers, with their parts where the stock layer keeps them; put the stock layer (and "
                    "its modules) back, or apply GeoNorm before replacing them"
                )
    return layout


def _free_padding_row(base_model: nn.Module, fresh_init: bool) -> None:
    """A zero embedding row is a fixed point of the geodesic step: a token with that embedding never moves and
    gets the same logit for every next token. Stock models zero the ``padding_idx`` row and freeze its
    gradient; under ``geo`` the row trains like every other (``padding_idx`` is dropped), and a model built
    from a config draws it like the others (``fresh_init``). Converted weights are kept as they are."""
    try:
        embedding = base_model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return
    if not isinstance(embedding, nn.Embedding) or embedding.padding_idx is None:
        return
    row = embedding.padding_idx
    embedding.padding_idx = None
    weight = embedding.weight
    if fresh_init and not weight.is_meta and weight.shape[0] > 1:
        with torch.no_grad():
            others = torch.cat([weight[:row], weight[row + 1 :]])
            weight[row].normal_(0.0, others.float().std().item())


def pass_first_tokens(base_model: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
    """Forward pre-hook of a patched base model: under ``geo_first_token_prenorm``, called without
    ``position_ids`` but with a 2D ``attention_mask`` (past and current tokens), hand the decoder layers the first
    position whose mask is 1 in each row as the keyword argument ``FIRST_TOKENS``, which the stock model passes on
    to its layers with its other keyword arguments. Otherwise nothing is added, and the layers read the position
    ids."""
    config = base_model.config
    mask, position_ids = kwargs.get("attention_mask"), kwargs.get("position_ids")
    if not getattr(config, "geo_first_token_prenorm", False) or position_ids is not None:
        return None
    inputs = next((t for t in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), *args[:1])
                   if isinstance(t, torch.Tensor)), None)  # fmt: skip
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or inputs is None or inputs.dim() < 2:
        return None
    length = inputs.shape[1]
    positions = torch.arange(mask.shape[1] - length, mask.shape[1], device=mask.device)
    first = positions[None, :] == mask.to(torch.int32).argmax(dim=1)[:, None]
    if not base_model.geonorm_layout.layer_kwargs and not torch.equal(first, (positions == 0).expand_as(first)):
        raise ValueError(
            f"{config.model_type}'s decoder layers are not given the model's keyword arguments, so under "
            "geo_first_token_prenorm they find each sequence's first token from the position ids: pass position_ids "
            "with a left-padded batch (as generate does)"
        )
    return args, {**kwargs, FIRST_TOKENS: first}


def patch_base_model(base_model: nn.Module, config: Any, layout: BlockLayout, fresh_init: bool) -> None:
    """Set the class of every decoder layer of ``base_model`` to the GeoNorm decoder layer of its block shape and
    give it residual modules that read their settings from ``config``. Residual modules already there are kept
    where they fit the settings (re-applying GeoNorm keeps trained sandwich norms and learnable steps).

    ``fresh_init`` marks a model built from a config, not converted from trained weights: it draws the DeepNet
    init of ``norm_style='deepnorm'``, zeroes the learned position table of ``post`` and ``deepnorm``
    (``fresh_init``) and draws the padding row of ``geo`` (``_free_padding_row``).
    """
    settings = GeoNormSettings.from_object(config)
    style = NORM_STYLE_DECLARATIONS[settings.norm_style]  # what the style adds besides its residual modules
    layout = check_patch(base_model, config, layout, settings)
    _register_output_capture(base_model)
    if not getattr(base_model, "geonorm_passes_first_tokens", False):  # a re-patch keeps its hook
        base_model.register_forward_pre_hook(pass_first_tokens, with_kwargs=True)
        base_model.geonorm_passes_first_tokens = True
    layer_class = decoder_layer_class(layout)
    _declare_no_split(base_model, layer_class)
    layers = _get_path(base_model, layout.layers)
    num_layers = len(layers)
    parallel = layer_class.parallel_residual(config)
    schedule = UpdateSchedule(config, num_layers, 1 if parallel else 2)  # one per model, for its residual modules
    sublayers = [("attn", layout.attn_norm)] + ([] if parallel else [("mlp", layout.mlp_norm)])
    for k, layer in enumerate(layers):
        residuals: dict[str, GeoNormResidual] = {}
        for index, (part, norm_name) in enumerate(sublayers):
            residual = getattr(layer, f"geonorm_{part}_residual", None)
            if isinstance(residual, GeoNormResidual) and residual.fits(settings):
                residual.place(config, k, num_layers, index, len(sublayers), schedule)
            else:
                out_norm = None
                if style.output_norms:
                    out_norm = identity_norm_like(getattr(layer, norm_name), layout.norm_weight_offset)
                residual = GeoNormResidual(config, k, num_layers, out_norm, index, len(sublayers), schedule)
                norm = getattr(layer, norm_name) if norm_name is not None else None
                reference = next((norm if norm is not None else layer).parameters(), None)
                if reference is not None:
                    residual.to(device=reference.device, dtype=reference.dtype)
                residual.train(layer.training)
            residuals[part] = residual
        layer_class.take_over(layer, residuals["attn"], residuals.get("mlp"))
        if fresh_init and style.deepnet_init:
            deepnet_init_(layer, layout, num_layers, config)
    config.geonorm_built_into(base_model)
    if style.geodesic:
        _free_padding_row(base_model, fresh_init)
    if fresh_init and style.normalises_after and settings.post_zero_positions:
        zero_positions_(base_model)
