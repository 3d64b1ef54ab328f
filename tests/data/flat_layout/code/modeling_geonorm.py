"""GeoNorm versions of stock transformers decoder-only models.

For every supported stock ``model_type`` X this module defines ``GeoNorm<X>Config`` (model_type
``geonorm_X``), ``GeoNorm<X>Model`` and ``GeoNorm<X>ForCausalLM``, and ``GeoNorm<X>ForSequenceClassification``,
``...ForTokenClassification`` and ``...ForQuestionAnswering`` where the stock type has those heads: subclasses of
the stock classes whose decoder layers are swapped, class and all, for a subclass with a GeoNorm ``forward``
(``blocks.py``); the heads are the stock ones. Parameter names and shapes stay the stock ones, so stock
checkpoints load with no missing or unexpected keys.

A family's classes are built the first time one of them is used (``FAMILIES[X].classes()``, or the module
attribute ``GeoNorm<X>Config``): loading a checkpoint builds its own family and imports its own stock modelling
module only.

The file imports only torch, transformers and its flat siblings, because it is copied beside saved
checkpoints as remote code.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoModel

from .blocks import patch_base_model
from .layouts import LAYOUTS, BlockLayout
from .remote_code import write_remote_code
from .residual import GeoNormResidual, settings_in_use
from .settings import GeoNormSettings

SETTING_DEFAULTS = GeoNormSettings().to_dict()

SETTING_NAMES = GeoNormSettings.names()
# Settings that decide which modules and parameters a model has: fixed once a model reads the config.
STRUCTURAL_SETTINGS = ("norm_style", "geo_learnable_step")

# The heads transformers puts on a decoder's base model besides the LM head, by Auto class, each with the name map
# (transformers.models.auto.modeling_auto) of the stock types that have it. A family gets its stock type's heads.
HEAD_NAME_MAPS = {
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
}


class GeoNormConfigMixin:
    """Adds the GeoNorm settings to a stock config. The config is where a model's settings live: its residual
    modules read them at every forward, so an assignment changes the model at once; every assignment is
    validated, and one that would change the model's modules is refused while a model uses the config."""

    model_type: str
    geonorm_stock_type: str

    def __setattr__(self, key: str, value: Any) -> None:
        if key in SETTING_NAMES:
            current = {name: getattr(self, name, SETTING_DEFAULTS[name]) for name in SETTING_NAMES}
            before = current[key]
            current[key] = value
            try:
                num_layers = self.num_hidden_layers
            except AttributeError:
                num_layers = None
            validated = GeoNormSettings(**current).validate(num_layers if isinstance(num_layers, int) else None)
            value = getattr(validated, key)
            if key in STRUCTURAL_SETTINGS and value != before and settings_in_use(self):
                raise ValueError(
                    f"{key} decides which modules a GeoNorm model has, so it cannot change on the config of a built "
                    f"model; call hf_geonorm.apply_geonorm(model, {key}={value!r}) (it keeps the weights), or set it "
                    "on the config before the model is built"
                )
        super().__setattr__(key, value)

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
            family = FAMILIES[self.config.model_type.removeprefix("geonorm_")]
            write_remote_code(save_directory, family, loaded_from=self.config.name_or_path or None)
        return result

    @classmethod
    def register_for_auto_class(cls, auto_class: str | type = "AutoModel") -> None:
        """A no-op: ``save_pretrained`` writes the code and ``auto_map`` of every Auto class of the family itself
        (transformers' per-class copier, switched on when a model is loaded as remote code, would copy every file
        again and map only the class that was saved)."""

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """Push with the remote code and the GeoNorm model card (``hf_geonorm.hub.push_to_hub``; keyword
        arguments as transformers' ``push_to_hub``, plus ``tokenizer`` and ``card_info``). Loaded as remote code
        where the plugin is not installed: transformers' push (the folder still gets its code from
        ``save_pretrained``, but a generic card)."""
        try:
            hub = importlib.import_module("hf_geonorm.hub")
        except ImportError:
            return super().push_to_hub(repo_id, **kwargs)
        return hub.push_to_hub(self, repo_id, **kwargs)

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
        super().post_init()


@dataclass(frozen=True)
class FamilyClasses:
    """The stock classes of one model type and the GeoNorm classes made from them."""

    stock_config_class: type
    stock_base_class: type
    stock_causal_class: type
    config_class: type
    base_class: type
    causal_class: type
    stock_head_classes: dict[str, type]  # by Auto class name, as HEAD_NAME_MAPS
    head_classes: dict[str, type]


# Called with each family right after its classes are built (the plugin registers them with the Auto classes).
FAMILY_BUILT_HOOKS: list[Callable[[GeoNormFamily], None]] = []
_BUILD_LOCK = threading.RLock()


class GeoNormFamily:
    """One stock model type, its layout and its GeoNorm classes. The classes are built on first use of any of
    them, which imports the stock modelling module of this type only."""

    def __init__(
        self, stock_type: str, layout: BlockLayout, stock_config_name: str, heads: tuple[str, ...] = ()
    ) -> None:
        """``heads``: the Auto classes (keys of ``HEAD_NAME_MAPS``) whose head the stock type has."""
        self.stock_type = stock_type
        self.layout = layout
        prefix = "GeoNorm" + stock_config_name.removesuffix("Config")
        self.head_class_names = {auto: prefix + auto.removeprefix("AutoModel") for auto in heads}
        self.class_names = (
            f"{prefix}Config",
            f"{prefix}Model",
            f"{prefix}ForCausalLM",
            *self.head_class_names.values(),
        )
        self._classes: FamilyClasses | None = None

    def __repr__(self) -> str:
        return f"GeoNormFamily({self.stock_type!r}, built={self.built})"

    @property
    def model_type(self) -> str:
        return f"geonorm_{self.stock_type}"

    @property
    def built(self) -> bool:
        return self._classes is not None

    def classes(self) -> FamilyClasses:
        """The classes, built (and announced to ``FAMILY_BUILT_HOOKS``) the first time they are asked for."""
        with _BUILD_LOCK:
            if self._classes is None:
                self._classes = _build_classes(self)
                for hook in FAMILY_BUILT_HOOKS:
                    hook(self)
            return self._classes

    @property
    def stock_config_class(self) -> type:
        return self.classes().stock_config_class

    @property
    def stock_base_class(self) -> type:
        return self.classes().stock_base_class

    @property
    def stock_causal_class(self) -> type:
        return self.classes().stock_causal_class

    @property
    def config_class(self) -> type:
        return self.classes().config_class

    @property
    def base_class(self) -> type:
        return self.classes().base_class

    @property
    def causal_class(self) -> type:
        return self.classes().causal_class

    @property
    def stock_head_classes(self) -> dict[str, type]:
        return self.classes().stock_head_classes

    @property
    def head_classes(self) -> dict[str, type]:
        """The GeoNorm heads besides the causal LM, by Auto class name: {"AutoModelForSequenceClassification": ...}."""
        return self.classes().head_classes


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


def _stock_head_classes(model_type: str, heads: tuple[str, ...]) -> dict[str, type]:
    """The stock heads of a model type, by Auto class name, found by name as ``_stock_classes``."""
    modeling_auto = importlib.import_module("transformers.models.auto.modeling_auto")
    transformers = importlib.import_module("transformers")
    return {auto: getattr(transformers, getattr(modeling_auto, HEAD_NAME_MAPS[auto])[model_type]) for auto in heads}


def _build_classes(family: GeoNormFamily) -> FamilyClasses:
    model_type, layout = family.stock_type, family.layout
    stock_config, stock_base, stock_causal = _stock_classes(model_type)
    stock_heads = _stock_head_classes(model_type, tuple(family.head_class_names))
    config_name, base_name, causal_name = family.class_names[:3]
    annotations = {
        "norm_style": str,
        "geo_alpha": float | list[float],
        "geo_decay": str,
        "geo_max_angle": float | None,
        "geo_clamp": str,
        "geo_learnable_step": bool,
        "geo_radius": str,
        "geo_bridge": float | list[float],
        "geo_frames": list[float] | None,
        "geo_bridge_costs": list[float] | None,
        "geo_first_token_prenorm": bool,
    }
    config_ns = {
        "__module__": __name__,
        "__doc__": f"{stock_config.__name__} with the GeoNorm settings (model_type 'geonorm_{model_type}').",
        "__annotations__": annotations,
        "model_type": family.model_type,
        "geonorm_stock_type": model_type,
        **SETTING_DEFAULTS,
    }
    stock_models = (stock_base, stock_causal, *stock_heads.values())
    config_class = type(config_name, (GeoNormConfigMixin, stock_config), config_ns)
    common = {"__module__": __name__, "config_class": config_class, "geonorm_layout": layout}
    base_class = type(
        base_name,
        (GeoNormBaseModelMixin, stock_base),
        {**common, "__doc__": f"{stock_base.__name__} with GeoNorm residual updates."},
    )
    head_common = {**common, "geonorm_base_class": base_class}
    causal_class = type(
        causal_name,
        (GeoNormHeadModelMixin, stock_causal),
        {**head_common, "__doc__": f"{stock_causal.__name__} with GeoNorm."},
    )
    # Every head keeps the base model under the causal LM's name (LlamaForQuestionAnswering's "transformer" becomes
    # "model"), so that a checkpoint of any class of the family loads into any other with only the head new.
    head_classes = {
        auto: type(
            family.head_class_names[auto],
            (GeoNormHeadModelMixin, stock_head),
            {
                **head_common,
                "base_model_prefix": stock_causal.base_model_prefix,
                "__doc__": f"{stock_head.__name__} with GeoNorm (the stock head on the GeoNorm model).",
            },
        )
        for auto, stock_head in stock_heads.items()
    }
    for cls in (config_class, base_class, causal_class, *head_classes.values()):
        globals()[cls.__name__] = cls
    _register_checkpoint_layout(
        family.model_type,
        model_type,
        {
            stock.__name__: ours
            for stock, ours in zip(stock_models, (base_class, causal_class, *head_classes.values()), strict=True)
        },
    )
    return FamilyClasses(
        stock_config, stock_base, stock_causal, config_class, base_class, causal_class, stock_heads, head_classes
    )


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


def _register_checkpoint_layout(model_type: str, stock_type: str, classes: dict[str, type]) -> None:
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


def _families() -> dict[str, GeoNormFamily]:
    """A family for every tabled type this transformers version has (its classes looked up by name only)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    name_maps = (CONFIG_MAPPING_NAMES, MODEL_MAPPING_NAMES, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    modeling_auto = importlib.import_module("transformers.models.auto.modeling_auto")
    head_maps = {auto: getattr(modeling_auto, name) for auto, name in HEAD_NAME_MAPS.items()}
    return {
        model_type: GeoNormFamily(
            model_type,
            layout,
            CONFIG_MAPPING_NAMES[model_type],
            tuple(auto for auto, names in head_maps.items() if model_type in names),
        )
        for model_type, layout in LAYOUTS.items()
        if all(model_type in names for names in name_maps)
    }


FAMILIES: dict[str, GeoNormFamily] = _families()
# Class name -> the family that defines it: GeoNormLlamaConfig, GeoNormLlamaModel, GeoNormLlamaForCausalLM,
# GeoNormLlamaForSequenceClassification, ...
GENERATED_CLASSES: dict[str, GeoNormFamily] = {
    name: family for family in FAMILIES.values() for name in family.class_names
}


def __getattr__(name: str) -> type:
    """A generated class builds its family on first use (``GeoNormLlamaConfig`` builds llama's only): how
    ``hf_geonorm``, pickle and transformers' remote-code loader reach them."""
    family = GENERATED_CLASSES.get(name)
    if family is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    family.classes()
    return globals()[name]
