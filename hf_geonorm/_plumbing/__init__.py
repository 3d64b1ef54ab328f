"""Files on disk: outputs written all or nothing (``atomic``, with SIGTERM and SIGINT handled while they are
written: ``signals``; a full device named alike whichever writer reports it: ``full_device``), text read as UTF-8
(``text_files``), GGUF checkpoints de-quantised (``gguf_files``) and safetensors headers read without loading
weights (``safetensors_files``)."""
