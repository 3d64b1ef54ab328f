"""A checkpoint made a GeoNorm folder (``convert.convert_checkpoint``, ``hf-geonorm convert``, with what it takes
besides the settings: ``options.ConversionOptions``) and what a folder or ``.gguf`` file holds (``inspection``:
``hf-geonorm info`` and ``architectures``). Both read a checkpoint, measure it and write or read its card, so they sit
above ``checkpoints``, ``analysis`` and ``sharing``."""
