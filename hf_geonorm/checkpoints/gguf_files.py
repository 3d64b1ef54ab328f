"""GGUF checkpoints (llama.cpp's format): their config, de-quantised models and the file's metadata.

transformers reads a ``.gguf`` file (with the ``gguf`` package) and de-quantises it to float32, but marks the
model quantised, so ``save_pretrained`` and the Trainer refuse it; ``dequantize_gguf`` clears the marks.
``loading.open_source`` reads a GGUF file's config (``gguf_config``), ``loading.load_model`` its weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..errors import first_line
from .gguf_header import GGUF_PACKAGE_NEEDED, read_gguf_header
from .loading_sizes import parameter_count

# A file may lack a tensor or two of the model its metadata describes (``--allow-missing`` loads it); a model of
# more than this many times the values its tensors hold is no missing tensor, but metadata that is not theirs.
MAX_PARAMETERS_PER_VALUE_HELD = 2


def gguf_config(path: Path) -> dict[str, Any]:
    """The config transformers reads from the metadata of the GGUF file ``path``, as a dict, once the sizes it
    states fit the tensors the file holds; ``ValueError`` naming the file before anything is allocated otherwise
    (a block count of 10^9 would build 10^9 layers, an embedding length of 10^6 a vocabulary of 10^6-wide rows)."""
    try:
        import gguf  # noqa: F401 - transformers reads the file with it
    except ImportError:
        raise ValueError(f"cannot read {path}: {GGUF_PACKAGE_NEEDED}") from None
    from transformers import AutoConfig

    header = read_gguf_header(path)
    architecture = header.fields.get("general.architecture")
    block_count = header.fields.get(f"{architecture}.block_count")
    blocks = {t.name.split(".")[1] for t in header.tensors if t.name.startswith("blk.")}
    if isinstance(block_count, int) and block_count > len(blocks):
        raise ValueError(
            f"{path}: its metadata says {architecture}.block_count is {block_count:,}, but the file holds the "
            f"tensors of {len(blocks):,} blocks; the metadata does not belong to the tensors: write the file again"
        )
    try:  # no remote code, as every load (loading.NO_REMOTE_CODE)
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - a corrupt or unsupported file, reported in one line
        raise ValueError(f"cannot read {path} as a GGUF checkpoint: {first_line(error)}") from None
    held = sum(t.n_elements for t in header.tensors)
    try:
        parameters = parameter_count(config)
    except Exception:  # noqa: BLE001 - a model that cannot be built is reported when it loads
        return config.to_dict()
    if parameters > MAX_PARAMETERS_PER_VALUE_HELD * held:
        raise ValueError(
            f"{path}: its metadata describes a model of {parameters:,} parameters, but its tensors hold {held:,} "
            "values; the metadata does not belong to the tensors: write the file again"
        )
    return config.to_dict()


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
