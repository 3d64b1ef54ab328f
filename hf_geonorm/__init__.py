"""GeoNorm for HuggingFace Transformers: residual updates as geodesic steps on a sphere.

Importing the package registers a ``geonorm_X`` family (config, base model, causal LM and the stock type's other
heads) for every supported stock model type X with the transformers Auto classes. A family's classes are built on
first use:
``hf_geonorm.GeoNormLlamaConfig`` (or loading a ``geonorm_llama`` checkpoint) builds llama's only.
"""

from .checkpoints.patching import (
    apply_geonorm,
    config_class_for,
    convert,
    family_for,
    supported_architectures,
)
from .modeling import model_mixins as _model_mixins
from .modeling import modeling_geonorm as _modeling
from .modeling.families import GeoNormFamily
from .modeling.geometry import (
    entry_rescale,
    exp_map,
    geodesic_step,
    prenorm_angle,
    step_sizes,
    tangent,
)
from .modeling.layouts import BlockLayout
from .modeling.residual import GeoNormResidual, identity_norm_like
from .modeling.settings import NORM_STYLES, RADII, GeoNormSettings
from .sharing.hub import push_model_to_hub as _push_model_to_hub
from .training.liger import enable_liger_kernels as _enable_liger_kernels

# The plugin's models push with the GeoNorm card (remote-code copies of the modelling code push as transformers does).
_model_mixins.PUSH_TO_HUB = _push_model_to_hub
# Liger-Kernel's patches of a stock type X apply to geonorm_X too (when liger-kernel is installed)
_enable_liger_kernels()

__all__ = [
    "NORM_STYLES",
    "RADII",
    "BlockLayout",
    "GeoNormFamily",
    "GeoNormResidual",
    "GeoNormSettings",
    "apply_geonorm",
    "config_class_for",
    "convert",
    "entry_rescale",
    "exp_map",
    "family_for",
    "geodesic_step",
    "identity_norm_like",
    "prenorm_angle",
    "step_sizes",
    "supported_architectures",
    "tangent",
]


def __getattr__(name: str) -> type:
    """``GeoNorm<X>Config``, ``GeoNorm<X>Model``, ``GeoNorm<X>ForCausalLM``, ``GeoNorm<X>ForSequenceClassification``
    and the other heads: built with their family on first use (they are left out of ``__all__``, so that a star
    import does not build all families)."""
    if name in _modeling.GENERATED_CLASSES:
        return getattr(_modeling, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_modeling.GENERATED_CLASSES])
