"""Files on disk: outputs written all or nothing (``atomic``), text read as UTF-8 (``text_files``) and GGUF
checkpoints de-quantised (``gguf_files``)."""
