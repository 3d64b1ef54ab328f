"""Checkpoints as files and as models: safetensors headers read without loading weights (``safetensors_files``), GGUF
headers and de-quantised weights (``gguf_header``, ``gguf_files``), a source (folder, ``.gguf`` file or Hub id)
opened and loaded strictly (``loading``, with the sizes and tensors it checks: ``loading_sizes``, ``loading_info``),
and a stock model or config turned GeoNorm in memory (``patching``: ``apply_geonorm``, ``convert``)."""
