"""The public API over the GeoNorm families: registration, ``apply_geonorm`` and ``convert``.

Importing ``hf_geonorm`` registers every family with AutoConfig (a stand-in that builds the family the first
time it is used), and registers a family's models with AutoModel, AutoModelForCausalLM and the Auto classes of
its heads when its classes are built. No family is built at import. A family built tells PEFT which modules LoRA
targets by default for its ``geonorm_X`` type (``modeling/peft_targets.py``, which the remote code runs too):
importing ``hf_geonorm`` does not import PEFT.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import transformers
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from ..modeling import modeling_geonorm as _modeling
from ..modeling.blocks import check_patch, patch_base_model
from ..modeling.families import FAMILY_BUILT_HOOKS, HEAD_NAME_MAPS, GeoNormFamily
from ..modeling.model_mixins import GeoNormBaseModelMixin
from ..modeling.modeling_geonorm import FAMILIES
from ..modeling.settings import GeoNormSettings


def supported_architectures() -> list[str]:
    """The stock model types GeoNorm can patch, sorted."""
    return sorted(FAMILIES)


def family_for(model_type: str) -> GeoNormFamily:
    """The family of a stock model type or of its ``geonorm_`` counterpart (its classes are built on first use)."""
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
    GeoNorm already, its current settings). Works through a PEFT wrapper. All or nothing: everything is validated
    before the model is touched (a ``ValueError`` names what does not fit), and a patch that fails part way for
    any other reason is undone, so on any exception the model is left as it was. Trained weights are kept as they
    are (no DeepNet init scaling); the parameters GeoNorm adds start at their identity values, and on a GeoNorm
    model the ones that fit the new settings are kept. This is also how to change ``norm_style`` or
    ``geo_learnable_step`` of a built model (its config refuses those two; the other settings are plain config
    assignments).
    """
    target = _unwrap_peft(model)
    config = getattr(target, "config", None)
    if config is None or not hasattr(target, "base_model_prefix"):
        raise ValueError(f"apply_geonorm needs a transformers PreTrainedModel, got {type(target).__name__}")
    family = family_for(config.model_type)
    current = config.geonorm_settings().to_dict() if hasattr(config, "geonorm_settings") else {}
    chosen = GeoNormSettings.from_object(GeoNormSettings(**current), **settings)
    # the causal LM and the other heads: stock class -> GeoNorm class (a GeoNorm class is a stock class too)
    with_head = {family.stock_causal_class: family.causal_class}
    with_head.update({family.stock_head_classes[auto]: head for auto, head in family.head_classes.items()})
    head_class = next((geonorm for stock, geonorm in with_head.items() if isinstance(target, stock)), None)
    if head_class is not None:
        base = getattr(target, target.base_model_prefix)
    elif isinstance(target, (family.stock_base_class, GeoNormBaseModelMixin)):
        base = target
    else:
        names = ", ".join(cls.__name__ for cls in (family.stock_base_class, *with_head))
        raise ValueError(f"apply_geonorm patches the {family.stock_type} models {names}; got {type(target).__name__}")
    check_patch(base, config, family.layout, chosen)
    with _restored_on_error(target, config):
        _patch(target, base, config, family, head_class, chosen)
    return model


@contextlib.contextmanager
def _restored_on_error(target: nn.Module, config: Any) -> Iterator[None]:
    """Undo a patch that fails part way (an error ``check_patch`` could not foresee, such as running out of
    memory): every module of ``target`` gets back its class and attributes, and ``config`` its class and values.
    Parameters are never changed by a patch of trained weights, so this restores the model as it was."""
    kept = ("_modules", "_parameters", "_buffers", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")
    modules = [(m, type(m), dict(vars(m)), {name: dict(getattr(m, name)) for name in kept}) for m in target.modules()]
    config_state = (type(config), dict(vars(config)))
    try:
        yield
    except BaseException:
        for module, cls, state, contents in modules:
            module.__class__ = cls
            vars(module).clear()
            vars(module).update(state)
            for name, value in contents.items():
                getattr(module, name).clear()
                getattr(module, name).update(value)
        config.__class__ = config_state[0]
        vars(config).clear()
        vars(config).update(config_state[1])
        raise


def _patch(target: nn.Module, base: nn.Module, config: Any, family: GeoNormFamily, head_class: type | None,
           chosen: GeoNormSettings) -> None:  # fmt: skip
    """The changes of ``apply_geonorm``, once everything is validated."""
    if head_class is not None:
        if target.base_model_prefix != head_class.base_model_prefix:  # the GeoNorm heads use the causal LM's name
            delattr(target, target.base_model_prefix)
            setattr(target, head_class.base_model_prefix, base)
        target.__class__ = head_class
        if head_class is family.causal_class and getattr(target, "loss_type", None) is None:
            target.loss_type = "ForCausalLM"  # GPT2LMHeadModel's name names no loss; the new class's does
    config.__class__ = family.config_class
    vars(config).pop("model_type", None)  # a stock config may carry its type on the instance
    config.set_geonorm_settings(chosen)
    base.__class__ = family.base_class
    patch_base_model(base, config, family.layout, fresh_init=False)
    if target is not base:  # its post_init collected its base's no-split names before the patch named the layer's
        target._no_split_modules = {*(target._no_split_modules or ()), *base._no_split_modules}


def convert(model: nn.Module, **settings: Any) -> nn.Module:
    """A new instance of the registered GeoNorm class with the weights of ``model`` (left unchanged)."""
    return apply_geonorm(copy.deepcopy(model), **settings)


class _LazyConfigClass(type):
    """The AutoConfig entry of a family whose classes are not built yet: a stand-in carrying the name, module
    and ``model_type`` of the real config class (what transformers reads of an entry it does not use). Any other
    use, a call or ``from_dict`` or ``from_pretrained``, builds the family and goes to the real class, which
    then replaces the stand-in in AutoConfig."""

    geonorm_stock_type: str

    def real_class(cls) -> type:
        return FAMILIES[cls.geonorm_stock_type].config_class

    def __getattr__(cls, name: str) -> Any:  # only for what the stand-in itself lacks
        return getattr(cls.real_class(), name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real_class()(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, cls.real_class())

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, cls.real_class())


def _stand_in(family: GeoNormFamily) -> type:
    namespace = {
        "__module__": _modeling.__name__,
        "__doc__": f"Stand-in for {family.class_names[0]} until the {family.stock_type} family is built.",
        "model_type": family.model_type,
        "geonorm_stock_type": family.stock_type,
    }
    return _LazyConfigClass(family.class_names[0], (), namespace)


# AutoModelForSequenceClassification, ...: the Auto classes of the heads besides the causal LM
HEAD_AUTO_CLASSES = {name: getattr(transformers, name) for name in HEAD_NAME_MAPS}


def _register_built(family: GeoNormFamily) -> None:
    AutoConfig.register(family.model_type, family.config_class, exist_ok=True)
    AutoModel.register(family.config_class, family.base_class, exist_ok=True)
    AutoModelForCausalLM.register(family.config_class, family.causal_class, exist_ok=True)
    for auto, head_class in family.head_classes.items():
        HEAD_AUTO_CLASSES[auto].register(family.config_class, head_class, exist_ok=True)


def _register() -> None:
    FAMILY_BUILT_HOOKS.append(_register_built)
    for family in FAMILIES.values():
        if family.built:
            _register_built(family)
        else:
            AutoConfig.register(family.model_type, _stand_in(family), exist_ok=True)


_register()
