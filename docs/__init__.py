"""The GeoNorm method specification (method.md), installed with the package as ``hf_geonorm.docs``."""
