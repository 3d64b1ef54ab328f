"""The GeoNorm families: for every supported stock ``model_type`` X, ``GeoNorm<X>Config`` (model_type
``geonorm_X``), ``GeoNorm<X>Model``, ``GeoNorm<X>ForCausalLM`` and the stock type's other heads, made with
``type()`` from the stock classes and the mixins of ``model_mixins.py``.

A family's classes are built the first time one of them is used (``GeoNormFamily.classes``), which imports the
stock modelling module of that type only; ``FAMILY_BUILT_HOOKS`` hear of each build (the plugin registers the
classes with the Auto classes there).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import get_type_hints

from .checkpoint_layout import register_checkpoint_layout
from .decoder_layers import decoder_layer_class
from .layouts import LAYOUTS, BlockLayout
from .model_mixins import SETTING_DEFAULTS, GeoNormBaseModelMixin, GeoNormConfigMixin, GeoNormHeadModelMixin
from .settings import GeoNormSettings
from .transformers_versions import check_transformers

# The heads transformers puts on a decoder's base model besides the LM head, by Auto class, each with the name map
# (transformers.models.auto.modeling_auto) of the stock types that have it. A family gets its stock type's heads.
HEAD_NAME_MAPS = {
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForTokenClassification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "AutoModelForQuestionAnswering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
}


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

    def named(self, name: str) -> type:
        """The GeoNorm class called ``name`` (``GeoNormLlamaConfig``, ...)."""
        ours = (self.config_class, self.base_class, self.causal_class, *self.head_classes.values())
        return next(cls for cls in ours if cls.__name__ == name)


# Called with each family right after its classes are built (the plugin registers them with the Auto classes).
FAMILY_BUILT_HOOKS: list[Callable[[GeoNormFamily], None]] = []
_BUILD_LOCK = threading.RLock()


class GeoNormFamily:
    """One stock model type, its layout and its GeoNorm classes. The classes are built on first use of any of
    them, which imports the stock modelling module of this type only."""

    def __init__(
        self, stock_type: str, layout: BlockLayout, stock_config_name: str, heads: tuple[str, ...], module: str
    ) -> None:
        """``heads``: the Auto classes (keys of ``HEAD_NAME_MAPS``) whose head the stock type has; ``module``: the
        module the classes say they are defined in (the entry module, ``modeling_geonorm``, whose attributes
        they are: how ``auto_map``, pickle and transformers' remote-code loader find them)."""
        self.stock_type = stock_type
        self.layout = layout
        self.module = module
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


def geonorm_recorded_outputs(stock_class: type, layer_class: type) -> dict | None:
    """The ``_can_record_outputs`` of a GeoNorm model class: the stock class's, with the hidden states recorded at
    the GeoNorm decoder layer. transformers finds the layers whose outputs ``output_hidden_states`` returns by
    ``isinstance`` on the class named there, and a patched layer is no longer an instance of the stock one."""
    recorded = stock_class._can_record_outputs
    if not recorded or "hidden_states" not in recorded:  # the model collects its hidden states itself
        return recorded
    return {**recorded, "hidden_states": layer_class}


def _build_classes(family: GeoNormFamily) -> FamilyClasses:
    model_type, layout = family.stock_type, family.layout
    stock_config, stock_base, stock_causal = _stock_classes(model_type)
    stock_heads = _stock_head_classes(model_type, tuple(family.head_class_names))
    config_name, base_name, causal_name = family.class_names[:3]
    config_ns = {
        "__module__": family.module,
        "__doc__": f"{stock_config.__name__} with the GeoNorm settings (model_type 'geonorm_{model_type}').",
        "__annotations__": get_type_hints(GeoNormSettings),  # the settings' one declaration of their types
        "model_type": family.model_type,
        "geonorm_stock_type": model_type,
        **SETTING_DEFAULTS,
    }
    stock_models = (stock_base, stock_causal, *stock_heads.values())
    config_class = type(config_name, (GeoNormConfigMixin, stock_config), config_ns)
    layer_class = decoder_layer_class(layout)

    def model_namespace(stock: type) -> dict:
        """What a GeoNorm model class sets over ``stock``: its family, and its decoder layer named where transformers
        looks layers up (hidden-state capture by class, no-split by class name)."""
        return {
            "__module__": family.module,
            "config_class": config_class,
            "geonorm_layout": layout,
            "geonorm_family": family,
            "_can_record_outputs": geonorm_recorded_outputs(stock, layer_class),
            "_no_split_modules": [*(stock._no_split_modules or ()), layer_class.__name__],
        }

    base_class = type(
        base_name,
        (GeoNormBaseModelMixin, stock_base),
        {**model_namespace(stock_base), "__doc__": f"{stock_base.__name__} with GeoNorm residual updates."},
    )
    causal_class = type(
        causal_name,
        (GeoNormHeadModelMixin, stock_causal),
        {
            **model_namespace(stock_causal),
            "geonorm_base_class": base_class,
            "__doc__": f"{stock_causal.__name__} with GeoNorm.",
        },
    )
    # Every head keeps the base model under the causal LM's name (LlamaForQuestionAnswering's "transformer" becomes
    # "model"), so that a checkpoint of any class of the family loads into any other with only the head new.
    head_classes = {
        auto: type(
            family.head_class_names[auto],
            (GeoNormHeadModelMixin, stock_head),
            {
                **model_namespace(stock_head),
                "geonorm_base_class": base_class,
                "base_model_prefix": stock_causal.base_model_prefix,
                "__doc__": f"{stock_head.__name__} with GeoNorm (the stock head on the GeoNorm model).",
            },
        )
        for auto, stock_head in stock_heads.items()
    }
    register_checkpoint_layout(
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


def discover_families(module: str) -> dict[str, GeoNormFamily]:
    """A family for every tabled type this transformers version has (its classes looked up by name only, none
    built), its classes to be defined in ``module``; first the check that the installed transformers is one the
    code is tested on (``transformers_versions.check_transformers``: the plugin and a folder's remote code both
    run it when they are imported)."""
    check_transformers()
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
            module,
        )
        for model_type, layout in LAYOUTS.items()
        if all(model_type in names for names in name_maps)
    }
