"""GeoNorm for HuggingFace Transformers: residual updates as geodesic steps on a sphere.

Importing the package registers a ``geonorm_X`` family (config, base model, causal LM) for every supported
stock model type X with the transformers Auto classes.
"""

from . import modeling_geonorm as _modeling
from .geometry import (
    entry_rescale,
    exp_map,
    geodesic_update,
    geonorm_step,
    prenorm_angle,
    step_sizes,
    tangent,
)
from .modeling_geonorm import BlockLayout, GeoNormFamily
from .patching import (
    apply_geonorm,
    config_class_for,
    convert,
    family_for,
    set_bridge,
    supported_architectures,
)
from .residual import GeoNormResidual, identity_norm_like
from .settings import NORM_STYLES, RADII, GeoNormSettings

globals().update({name: getattr(_modeling, name) for name in _modeling.GENERATED_CLASS_NAMES})

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
    "geodesic_update",
    "geonorm_step",
    "identity_norm_like",
    "prenorm_angle",
    "set_bridge",
    "step_sizes",
    "supported_architectures",
    "tangent",
    *_modeling.GENERATED_CLASS_NAMES,
]
