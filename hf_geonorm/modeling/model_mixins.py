"""The behaviour GeoNorm adds to the stock classes, as mixins that ``families.py`` puts in front of the stock
config and model classes of each family: validated settings on the config, whole folders on save (weights, code,
``auto_map``), the push with the GeoNorm card, the initial values of GeoNorm's parameters, and the swap of the
decoder layers at construction.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AutoModel

from .blocks import patch_base_model
from .checkpoint_layout import guarded_conversions
from .layouts import LEARNED_POSITIONS, BlockLayout
from .remote_code import write_remote_code
from .residual import GeoNormResidual
from .settings import GeoNormSettings
from .transformers_versions import CACHE_ARGUMENT

# How a GeoNorm model pushes itself: set by the plugin (``hf_geonorm``) on its own copy of this module to its Hub
# layer, which also writes the GeoNorm model card. A copy loaded as remote code never gets it (and so never
# imports an installed plugin, which may be another version) and pushes as transformers does.
PUSH_TO_HUB: Callable[..., Any] | None = None

SETTING_DEFAULTS = GeoNormSettings().to_dict()

SETTING_NAMES = GeoNormSettings.names()
# Settings that decide which modules and parameters a model has: fixed once a model reads the config.
STRUCTURAL_SETTINGS = ("norm_style", "geo_learnable_step")
# The config's count of the live models built from it (``GeoNormConfigMixin.geonorm_built_into``); never saved.
BUILT_MODELS = "_geonorm_built_models"
# Set once a config's __init__ is done: until then its depth may still be the class default (transformers applies
# ``num_hidden_layers=`` and the other mapped names after the fields), so per-layer lists wait for the end of init.
INITIALISED = "_geonorm_initialised"


class GeoNormConfigMixin:
    """Adds the GeoNorm settings to a stock config. The config is where a model's settings live: its residual
    modules read them at every forward, so an assignment changes the model at once; every assignment is
    validated, and one that would change the model's modules is refused while a model built from the config
    lives (``geonorm_built_into``)."""

    model_type: str
    geonorm_stock_type: str

    def __setattr__(self, key: str, value: Any) -> None:
        if key in SETTING_NAMES:
            current = {name: getattr(self, name, SETTING_DEFAULTS[name]) for name in SETTING_NAMES}
            before = current[key]
            current[key] = value
            num_layers = self.num_hidden_layers if getattr(self, INITIALISED, False) else None
            validated = GeoNormSettings(**current).validate(num_layers if isinstance(num_layers, int) else None)
            value = getattr(validated, key)
            if key in STRUCTURAL_SETTINGS and value != before and getattr(self, BUILT_MODELS, 0) > 0:
                raise ValueError(
                    f"{key} decides which modules a GeoNorm model has, so it cannot change on the config of a built "
                    f"model; call hf_geonorm.apply_geonorm(model, {key}={value!r}) (it keeps the weights), or set it "
                    "on the config before the model is built"
                )
        super().__setattr__(key, value)

    def __post_init__(self, **kwargs: Any) -> None:
        """Check the per-layer lists against the depth the config ends with (``GPT2Config(num_hidden_layers=4,
        geo_alpha=[...] * 4)`` sets the depth after the settings)."""
        super().__post_init__(**kwargs)
        settings = GeoNormSettings(**{name: getattr(self, name) for name in SETTING_NAMES})
        depth = self.num_hidden_layers
        settings.validate(depth if isinstance(depth, int) else None)
        super().__setattr__(INITIALISED, True)

    def geonorm_built_into(self, model: nn.Module) -> None:
        """Count ``model`` among the models built from this config until it is garbage collected (a base model,
        when ``blocks.patch_base_model`` gives it modules that read this config): meanwhile the settings that
        decide which modules exist are refused. A copy of the model (``copy.deepcopy``) copies the count with its
        config, and keeps it."""
        super().__setattr__(BUILT_MODELS, getattr(self, BUILT_MODELS, 0) + 1)
        weakref.finalize(model, self._geonorm_model_gone)

    def _geonorm_model_gone(self) -> None:
        super().__setattr__(BUILT_MODELS, max(getattr(self, BUILT_MODELS, 0) - 1, 0))

    def to_dict(self) -> dict[str, Any]:
        """transformers' ``to_dict`` (what a save writes) without the count of built models."""
        out = super().to_dict()
        out.pop(BUILT_MODELS, None)
        out.pop(INITIALISED, None)
        return out

    def set_geonorm_settings(self, settings: GeoNormSettings) -> None:
        """Write validated settings, structural ones included: for ``apply_geonorm``, which rebuilds the modules."""
        for name, value in settings.to_dict().items():
            super().__setattr__(name, value)

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

    @classmethod
    def register_for_auto_class(cls, auto_class: str | type = "AutoConfig") -> None:
        """A no-op: the model's ``save_pretrained`` writes the code and ``auto_map`` (``write_remote_code``)."""


class GeoNormPreTrainedMixin:
    """Initialises the parameters GeoNorm adds (the learnable step starts at scale 1, bias 0), and saves every
    folder whole: weights, ``config.json`` with ``auto_map`` and the flat source beside them."""

    geonorm_layout: BlockLayout
    geonorm_family: Any  # the GeoNormFamily of the class (families.py)

    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True, **kwargs: Any) -> Any:
        """transformers' ``save_pretrained``, then ``write_remote_code``: the folder loads with
        ``trust_remote_code=True`` where hf-geonorm is not installed (also when this process runs the remote code)."""
        if kwargs.get("push_to_hub"):
            raise ValueError(
                "save_pretrained(push_to_hub=True) would upload before the GeoNorm remote code is written; "
                "call model.push_to_hub(repo_id) instead"
            )
        # a model loaded as a stock one and converted carries the stock conversion, which would rename GeoNorm's
        # own tensors on the way out
        if getattr(self, "_weight_conversions", None):
            self._weight_conversions = guarded_conversions(self._weight_conversions)
        result = super().save_pretrained(save_directory, is_main_process=is_main_process, **kwargs)
        adapters_only = getattr(self, "_hf_peft_config_loaded", False)
        if self.should_save_on_this_rank(is_main_process) and not adapters_only:
            write_remote_code(save_directory, self.geonorm_family, loaded_from=self.config.name_or_path or None)
        return result

    @classmethod
    def register_for_auto_class(cls, auto_class: str | type = "AutoModel") -> None:
        """A no-op: ``save_pretrained`` writes the code and ``auto_map`` of every Auto class of the family itself
        (transformers' per-class copier, switched on when a model is loaded as remote code, would copy every file
        again and map only the class that was saved)."""

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Push with the remote code and the GeoNorm model card where the plugin installed ``PUSH_TO_HUB``
        (``hf_geonorm.sharing.hub.push_model_to_hub``; keyword arguments as transformers' ``push_to_hub``, plus
        ``tokenizer`` and ``card_info``). Loaded as remote code: transformers' push (the folder still gets its code
        from ``save_pretrained``, but a generic card)."""
        if PUSH_TO_HUB is None:
            return super().push_to_hub(repo_id, **kwargs)
        return PUSH_TO_HUB(self, repo_id, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, GeoNormResidual):
            if module.step_scale is not None:
                module.step_scale.fill_(1.0)
                module.step_bias.fill_(0.0)
            return
        super()._init_weights(module)


class PositionLimit(ValueError):
    """A sequence longer than a model with learned positions has positions for (its table would raise IndexError)."""


def _sequence_positions(args: tuple, kwargs: dict[str, Any]) -> tuple[int, torch.Tensor | None]:
    """How long the sequence gets with this forward (cached tokens plus new ones), and the position ids given."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    embeds = kwargs.get("inputs_embeds")
    new = ids.shape[-1] if ids is not None else (embeds.shape[-2] if embeds is not None else 0)
    past = kwargs.get(CACHE_ARGUMENT)
    cached = past.get_seq_length() if hasattr(past, "get_seq_length") else 0
    return cached + new, kwargs.get("position_ids")


def guard_positions(base: nn.Module) -> None:
    """Make a forward beyond a learned position table a ``PositionLimit`` that names the limit and the way out,
    rather than torch's ``IndexError: index out of range in self`` (a ``generate`` with too many new tokens)."""
    table = next((getattr(base, name) for name in LEARNED_POSITIONS if isinstance(getattr(base, name, None),
                                                                              nn.Embedding)), None)  # fmt: skip
    if table is None or getattr(base, "geonorm_positions_guarded", False):
        return
    limit = table.num_embeddings

    def check(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        length, position_ids = _sequence_positions(args, kwargs)
        # given position ids (generate passes them) are read, which waits for the device; training passes none
        reach = length if position_ids is None else int(position_ids.max()) + 1
        if reach > limit:
            raise PositionLimit(
                f"the sequence reaches {reach} tokens (prompt plus generated), beyond this model's {limit} learned "
                f"positions (config n_positions / max_position_embeddings): give generate max_new_tokens of at most "
                f"{limit} minus the prompt's length, or train a model with more positions (hf-geonorm train "
                "--seq-len, hf-geonorm init --max-length)"
            )

    base.register_forward_pre_hook(check, with_kwargs=True)
    base.geonorm_positions_guarded = True


class GeoNormBaseModelMixin(GeoNormPreTrainedMixin):
    """A stock base model whose decoder layers are GeoNorm layers from construction on."""

    def post_init(self) -> None:
        patch_base_model(self, self.config, self.geonorm_layout, fresh_init=True)
        guard_positions(self)
        super().post_init()


class GeoNormHeadModelMixin(GeoNormPreTrainedMixin):
    """A stock model with a head on its base model (the causal LM, a classifier...): the inner base model becomes
    the GeoNorm base model before weights initialise; the head stays the stock one."""

    geonorm_base_class: type

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        if type(config).__name__ == self.config_class.__name__:
            # transformers' generic heads build their base model with AutoModel.from_config(config): AutoModel must
            # know it also where the plugin is not installed (remote code, whose config may come from a second copy
            # of this module), or it asks whether to trust the code again.
            AutoModel.register(type(config), self.geonorm_base_class, exist_ok=True)
        super().__init__(config, *args, **kwargs)

    def post_init(self) -> None:
        base = getattr(self, self.base_model_prefix)
        if not isinstance(base, GeoNormBaseModelMixin):
            base.__class__ = self.geonorm_base_class
            patch_base_model(base, self.config, self.geonorm_layout, fresh_init=True)
        guard_positions(base)
        super().post_init()
