"""GGUF checkpoints (llama.cpp's format): de-quantised models and the file's metadata.

transformers reads a ``.gguf`` file (with the ``gguf`` package) and de-quantises it to float32, but marks the
model quantised, so ``save_pretrained`` and the Trainer refuse it; ``dequantize_gguf`` clears the marks.
``loading.open_source`` reads a GGUF file's config, ``loading.load_model`` its weights.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn


def dequantize_gguf(model: nn.Module) -> nn.Module:
    """Clear the quantisation marks of a GGUF-loaded model (its weights are float32 already), so it saves and
    trains as a plain checkpoint; its logits do not change."""
    model.hf_quantizer = None
    config = model.config
    if "quantization_config" in vars(config):
        delattr(config, "quantization_config")
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # a read-only property derived from hf_quantizer
            pass
    return model


def gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """license, base_model (a Hub id) and language from the file's ``general.*`` keys, where it has them."""
    try:
        from gguf import GGUFReader

        fields = GGUFReader(str(path)).fields
    except Exception:  # noqa: BLE001 - the metadata is optional
        return {}

    def value(key: str) -> Any:
        item = fields.get(key)
        if item is None:
            return None
        try:
            return item.contents()
        except Exception:  # noqa: BLE001
            return None

    found: dict[str, Any] = {}
    if isinstance(value("general.license"), str):
        found["license"] = value("general.license")
    url = value("general.base_model.0.repo_url") or value("general.source.huggingface.repository")
    if isinstance(url, str) and "huggingface.co/" in url:
        found["base_model"] = url.split("huggingface.co/", 1)[1].strip("/")
    languages = value("general.languages")
    if isinstance(languages, list) and all(isinstance(x, str) for x in languages):
        found["language"] = languages
    return found
