"""The GeoNorm modelling source: exactly the files a saved GeoNorm folder carries as its remote code.

``modeling_geonorm.py`` is the entry module; transformers copies it and every sibling it imports with
``from .x import ...`` into the folder (this ``__init__`` is never copied). So nothing in this package may import
outside it other than the standard library, torch, transformers and (guarded) triton.
"""
