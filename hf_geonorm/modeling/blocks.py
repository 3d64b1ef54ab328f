"""The GeoNorm decoder block, and the patch that puts it into a stock base model.

Each stock decoder layer's class is swapped for a subclass (``geonorm_layer_class``) whose ``forward`` runs the
block of method.md, "The block", over the parts its ``BlockLayout`` names; ``patch_base_model`` does the
swap and gives every sublayer its ``GeoNormResidual``. Imports only torch and flat siblings (remote code).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .fresh_init import deepnet_init_, zero_positions_
from .layouts import BlockLayout
from .residual import GeoNormResidual, UpdateSchedule, identity_norm_like
from .settings import GeoNormSettings


def _get_path(module: nn.Module, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part)
    return module


def _first(output: Any) -> torch.Tensor:
    """Sublayers return a tensor or a tuple whose first item is the hidden-state update."""
    return output[0] if isinstance(output, tuple) else output


class FirstTokens:
    """The first real token of each sequence in the current forward of one base model (a bool mask over its
    positions), found by the base model's forward pre-hook from a 2D attention mask when no position ids are given
    (``_find_first_tokens``); None otherwise, and the layers then read the position ids. One object, shared by the
    base model and its decoder layers: the stock model calls its layers with its own arguments, so this is how a
    value of the model's inputs reaches them."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None


class GeoNormDecoderLayerMixin:
    """The GeoNorm ``forward`` shared by every swapped decoder layer (method.md, "The block").

    A block reads its parts through ``geonorm_layout``; ``geonorm_attn_residual`` and
    ``geonorm_mlp_residual`` hold the residual update of each sublayer (one for parallel blocks). The values of one
    forward pass from call to call as arguments and results (the attention weights, the first tokens);
    ``geonorm_first_tokens`` is the base model's ``FirstTokens``.
    """

    geonorm_layout: BlockLayout
    geonorm_layer_index: int
    geonorm_parallel: bool
    geonorm_first_tokens: FirstTokens

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

    def _attn_update(self, h: torch.Tensor, attn_kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention update, and the attention weights when the sublayer returns them (else None)."""
        lay = self.geonorm_layout
        output = self._call_attention(getattr(self, lay.attn), h, attn_kwargs)
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        u = _first(output)
        if lay.attn_out_norm is not None:
            u = getattr(self, lay.attn_out_norm)(u)
        u = self._dropout(lay.attn_dropout, u)
        if lay.residual_multiplier is not None:
            u = u * getattr(self, lay.residual_multiplier)
        return u, weights

    def _mlp_update(self, h: torch.Tensor) -> torch.Tensor:
        lay = self.geonorm_layout
        u = _first(getattr(self, lay.mlp)(h))
        if lay.mlp_out_norm is not None:
            u = getattr(self, lay.mlp_out_norm)(u)
        u = self._dropout(lay.mlp_dropout, u)
        if lay.residual_multiplier is not None:
            u = u * getattr(self, lay.residual_multiplier)
        return u

    def _geonorm_block(
        self, hidden_states: torch.Tensor, attn_kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block's new hidden states, and the attention weights its attention returned (or None)."""
        lay = self.geonorm_layout
        attn_res: GeoNormResidual = self.geonorm_attn_residual
        x = attn_res.enter(hidden_states) if self.geonorm_layer_index == 0 else hidden_states
        attn_norm = self._norm(lay.attn_norm)
        mlp_norm = self._norm(lay.mlp_norm)
        # Without an input norm a sublayer reads the state itself; only 'pre' and 'geo' allow that
        # (check_settings_fit), and those pass the norm to the residual update unused.
        attn_in = attn_res.sublayer_input(x, attn_norm) if attn_norm is not None else x
        first = self._first_tokens(attn_kwargs)
        if self.geonorm_parallel:
            if mlp_norm is None:
                mlp_norm, mlp_in = attn_norm, attn_in
            else:
                mlp_in = attn_res.sublayer_input(x, mlp_norm)
            u, weights = self._attn_update(attn_in, attn_kwargs)
            u = self._dropout(lay.update_dropout, u + self._mlp_update(mlp_in))
            return attn_res(x, u, attn_norm, first), weights
        u, weights = self._attn_update(attn_in, attn_kwargs)
        x = attn_res(x, u, attn_norm, first)
        mlp_res: GeoNormResidual = self.geonorm_mlp_residual
        mlp_in = mlp_res.sublayer_input(x, mlp_norm) if mlp_norm is not None else x
        return mlp_res(x, self._mlp_update(mlp_in), mlp_norm, first), weights

    def _first_tokens(self, attn_kwargs: dict[str, Any]) -> torch.Tensor | None:
        """The first token of each sequence, when ``geo_first_token_prenorm`` keeps it on the Pre-Norm update (else
        None): where the caller's ``position_ids`` are 0 (also packed sequences); without them, the first position
        whose 2D ``attention_mask`` is 1 in each row (a left-padded batch; found by ``_find_first_tokens`` from the
        base model's inputs, in ``geonorm_first_tokens``); with neither, position 0 (the model's own position ids). A
        4D mask or inputs passed to the base model by position cannot be read: then the position ids decide."""
        config = self.geonorm_attn_residual.config
        if config.norm_style != "geo" or not config.geo_first_token_prenorm:
            return None
        first = self.geonorm_first_tokens.mask
        if first is not None:
            return first
        position_ids = attn_kwargs.get("position_ids")
        if position_ids is None:
            raise ValueError(
                f"geo_first_token_prenorm needs the position ids, and {config.model_type}'s decoder layers are not "
                "given them; set geo_first_token_prenorm=False for this model"
            )
        return position_ids == 0


class GeoNormKeywordLayerMixin(GeoNormDecoderLayerMixin):
    """Layers called as ``layer(hidden_states, **kwargs)`` that pass the kwargs on to attention (LLaMA)."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self._geonorm_block(hidden_states, kwargs)[0]


class GeoNormTupleLayerMixin(GeoNormDecoderLayerMixin):
    """Layers called as ``layer(hidden_states, **kwargs)`` that return ``(hidden_states, attention weights)``
    (Falcon, GPT-Neo: their models read ``outputs[0]`` and, with ``output_attentions``, ``outputs[1]``)."""

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden_states, weights = self._geonorm_block(hidden_states, kwargs)
        return hidden_states, weights if kwargs.get("output_attentions") else None


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
        return self._geonorm_block(hidden_states, attn_kwargs)[0]


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
        return self._geonorm_block(hidden_states, attn_kwargs)[0]


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


def check_layout_settings(
    layout: BlockLayout, config: Any, settings: GeoNormSettings, num_layers: int, model_type: str
) -> None:
    """``ValueError`` for settings the block variant of ``config`` cannot run: a per-update list on parallel blocks
    (one update per layer), ``geo_first_token_prenorm`` where the layers cannot find the first token."""
    if layout.is_parallel(config):
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


def _find_first_tokens(base_model: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """Forward pre-hook of a patched base model: under ``geo_first_token_prenorm``, called without
    ``position_ids`` but with a 2D ``attention_mask`` (past and current tokens), mark the first position whose mask
    is 1 in each row in the model's ``FirstTokens``; otherwise clear the mark (the layers then read the position
    ids)."""
    first = None
    config = base_model.config
    mask, position_ids = kwargs.get("attention_mask"), kwargs.get("position_ids")
    if getattr(config, "geo_first_token_prenorm", False) and position_ids is None and isinstance(mask, torch.Tensor):
        inputs = next((t for t in (kwargs.get("input_ids"), kwargs.get("inputs_embeds"), *args[:1])
                       if isinstance(t, torch.Tensor)), None)  # fmt: skip
        if mask.dim() == 2 and inputs is not None and inputs.dim() >= 2:
            length = inputs.shape[1]
            positions = torch.arange(mask.shape[1] - length, mask.shape[1], device=mask.device)
            first = positions[None, :] == mask.to(torch.int32).argmax(dim=1)[:, None]
    base_model.geonorm_first_tokens.mask = first


def patch_base_model(base_model: nn.Module, config: Any, layout: BlockLayout, fresh_init: bool) -> None:
    """Swap every decoder layer of ``base_model`` for its GeoNorm class and give it residual modules that read
    their settings from ``config``. Residual modules already there are kept where they fit the settings
    (re-applying GeoNorm keeps trained sandwich norms and learnable steps).

    ``fresh_init`` marks a model built from a config, not converted from trained weights: it draws the DeepNet
    init of ``norm_style='deepnorm'``, zeroes the learned position table of ``post`` and ``deepnorm``
    (``fresh_init``) and draws the padding row of ``geo`` (``_free_padding_row``).
    """
    settings = GeoNormSettings.from_object(config)
    layout = check_patch(base_model, config, layout, settings)
    _register_output_capture(base_model)
    first_tokens = getattr(base_model, "geonorm_first_tokens", None)
    if not isinstance(first_tokens, FirstTokens):  # the first patch of this base model (a re-patch keeps its hook)
        first_tokens = base_model.geonorm_first_tokens = FirstTokens()
        base_model.register_forward_pre_hook(_find_first_tokens, with_kwargs=True)
    layers = _get_path(base_model, layout.layers)
    num_layers = len(layers)
    parallel = layout.is_parallel(config)
    schedule = UpdateSchedule(config, num_layers, 1 if parallel else 2)  # one per model, for its residual modules
    for k, layer in enumerate(layers):
        layer.__class__ = geonorm_layer_class(type(layer), layout)
        layer.geonorm_layout = layout
        layer.geonorm_layer_index = k
        layer.geonorm_parallel = parallel
        layer.geonorm_first_tokens = first_tokens
        sublayers = [("attn", layout.attn_norm)] + ([] if parallel else [("mlp", layout.mlp_norm)])
        for index, (part, norm_name) in enumerate(sublayers):
            existing = getattr(layer, f"geonorm_{part}_residual", None)
            if isinstance(existing, GeoNormResidual) and existing.fits(settings):
                existing.config, existing.layer_index, existing.num_layers = config, k, num_layers
                existing.sublayer, existing.sublayers, existing.schedule = index, len(sublayers), schedule
                continue
            out_norm = None
            if settings.norm_style == "sandwich":
                out_norm = identity_norm_like(getattr(layer, norm_name), layout.norm_weight_offset)
            residual = GeoNormResidual(config, k, num_layers, out_norm, index, len(sublayers), schedule)
            norm = getattr(layer, norm_name) if norm_name is not None else None
            reference = next((norm if norm is not None else layer).parameters(), None)
            if reference is not None:
                residual.to(device=reference.device, dtype=reference.dtype)
            residual.train(layer.training)
            setattr(layer, f"geonorm_{part}_residual", residual)
        if fresh_init and settings.norm_style == "deepnorm":
            deepnet_init_(layer, layout, num_layers, config)
    if settings.norm_style == "geo":
        _free_padding_row(base_model, fresh_init)
    if fresh_init and settings.norm_style in ("post", "deepnorm") and settings.post_zero_positions:
        zero_positions_(base_model)
