"""What a GGUF file says of the model it holds, for the card of a model converted from it: the Hub id it states
(``base_model``), the name it gives the model, and its tensors' types (the weights are de-quantised from them).

llama.cpp's converter writes the model's names under ``general.*``: ``general.name`` (a title, "SmolLM2 135M"),
``general.basename``, ``general.organization``, the repository it came from (``general.source.repo_url``) and the
models it was made from (``general.base_model.N.name``, ``.organization``, ``.repo_url``). A Hub id is taken only
where the file states one: a huggingface.co address, or an organization and a name that together are an id as
written; a title is never turned into an id.

``header_description`` is what ``hf-geonorm info`` says of a ``.gguf`` file where its header settles it:
``inspection.describe_gguf`` reads a file as ``convert`` does, through transformers' config of it (a second read of
the header, with torch and transformers imported: most of a minute on a busy machine, for facts the header states)
and the size checks every command makes. Where the header leaves nothing for those to find (an architecture of
``HEADER_TYPES`` whose block count, width and vocabulary are stated and agree with the tensors), the facts come from
the header alone, without building transformers' config: this module and those it imports read the header with
the standard library only (and ``gguf`` for the tensor types' names).
Anything else (another architecture, a missing size, metadata that disagrees with the tensors, which the checks
refuse) is left to ``describe_gguf``."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from ..checkpoints.gguf_header import GGUFHeader, read_gguf_header
from .card_metadata import base_model_problem

# Tensor types that hold the values as they are (float or integer): anything else is a quantisation.
PLAIN_TENSOR_TYPES = frozenset({"F64", "F32", "F16", "BF16", "I8", "I16", "I32", "I64"})
HUB_REPOSITORY = "general.source.huggingface.repository"
SOURCE_ADDRESSES = ("general.source.repo_url", HUB_REPOSITORY, "general.source.url")
PARENTS_READ = 64  # the general.base_model.N entries read, whatever count a file states


def is_quantised(tensor_type: str) -> bool:
    return tensor_type not in PLAIN_TENSOR_TYPES


def _hub_id_in_address(value: Any, plain_id: bool = False) -> str | None:
    """``owner/name`` of a huggingface.co address (a model's page or repository); with ``plain_id`` also a Hub id
    given as it is (older files state ``general.source.huggingface.repository`` so)."""
    if plain_id and isinstance(value, str) and value.count("/") == 1 and base_model_problem(value) is None:
        return value
    if not isinstance(value, str) or "huggingface.co/" not in value:
        return None
    parts = value.split("huggingface.co/", 1)[1].strip("/").split("/")
    return "/".join(parts[:2]) if len(parts) >= 2 and parts[0] not in ("datasets", "spaces") else None


def _hub_id_of(organization: Any, name: Any) -> str | None:
    """``organization/name`` where it is a Hub id as written (a title such as "SmolLM2 135M" is not)."""
    if not isinstance(organization, str) or not isinstance(name, str):
        return None
    candidate = f"{organization}/{name}"
    return candidate if base_model_problem(candidate) is None else None


def gguf_metadata(header: GGUFHeader) -> dict[str, Any]:
    """license, base_model (a Hub id) and language from the file's ``general.*`` keys, where it has them."""
    value = header.fields.get
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


def gguf_lineage(path: str | os.PathLike, header: GGUFHeader | None = None) -> dict[str, Any]:
    """The card facts the GGUF file ``path`` (its ``header``, read here when not given) states: ``license`` and
    ``language`` (``gguf_metadata``), ``base_model`` (the first Hub id among: the repository the model was converted
    from, its organization and name, then the models it was made from), ``source_model`` (the model's name as the
    file gives it: ``general.name``, else ``general.basename``) and ``source_tensor_types`` (how many tensors of each
    type it holds)."""
    if header is None:
        try:
            header = read_gguf_header(path)
        except ValueError:  # the metadata is optional; loading the file reports what is wrong with it
            return {}
    value = header.fields.get
    found = {key: item for key, item in gguf_metadata(header).items() if key != "base_model"}
    count = value("general.base_model.count")
    parents = range(min(count, PARENTS_READ) if isinstance(count, int) and count > 0 else 0)
    candidates = [_hub_id_in_address(value(key), plain_id=key == HUB_REPOSITORY) for key in SOURCE_ADDRESSES]
    candidates.append(_hub_id_of(value("general.organization"), value("general.name")))
    for i in parents:
        prefix = f"general.base_model.{i}"
        candidates += [_hub_id_in_address(value(f"{prefix}.repo_url")), _hub_id_in_address(value(f"{prefix}.url")),
                       _hub_id_of(value(f"{prefix}.organization"), value(f"{prefix}.name"))]  # fmt: skip
    base_model = next((candidate for candidate in candidates if candidate), None)
    if base_model is not None:
        found["base_model"] = base_model
    named = next((value(key) for key in ("general.name", "general.basename") if isinstance(value(key), str)), None)
    if named is not None and named.strip():
        found["source_model"] = named.strip()
    types = Counter(header.tensor_types())
    if types:
        found["source_tensor_types"] = dict(types.most_common())
    return found


# GGUF architectures whose transformers config reads block_count, embedding_length and context_length as
# num_hidden_layers, hidden_size and max_position_embeddings, and the stock model type GeoNorm converts them to
# (tests/conversion/test_info.py checks both against transformers and the supported types).
HEADER_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2"}


def header_description(path: str | os.PathLike, header: GGUFHeader | None = None) -> dict[str, Any] | None:
    """``describe_gguf``'s facts of the file ``path`` from its ``header`` (read here when not given), or None where
    the header does not settle them. ``ValueError`` naming the file when it is not a GGUF file."""
    header = header if header is not None else read_gguf_header(path)
    fields = header.fields
    architecture = fields.get("general.architecture")
    model_type = HEADER_TYPES.get(architecture)
    names = " ".join(str(fields.get(key, "")) for key in ("general.name", "general.basename"))
    if model_type is None or (architecture == "llama" and "mistral" in names.lower()):  # transformers: mistral
        return None
    stated = {key: fields.get(f"{architecture}.{key}") for key in ("block_count", "embedding_length", "context_length")}
    vocab = fields.get(f"{architecture}.vocab_size", header.array_lengths.get("tokenizer.ggml.tokens"))
    embedding = next((t.shape for t in header.tensors if t.name == "token_embd.weight"), None)
    blocks = {t.name.split(".")[1] for t in header.tensors if t.name.startswith("blk.")}
    if not all(isinstance(v, int) and v > 0 for v in (*stated.values(), vocab)):
        return None
    if embedding != (stated["embedding_length"], vocab) or stated["block_count"] != len(blocks):
        return None  # the checks of describe_gguf name what disagrees
    return {
        "path": str(path),
        "kind": "gguf",
        "model_type": model_type,
        "family": model_type,
        "geonorm": False,
        "num_layers": stated["block_count"],
        "hidden_size": stated["embedding_length"],
        "vocab_size": vocab,
        "positions": stated["context_length"],
        "parameters": sum(t.n_elements for t in header.tensors),
        "parameters_from": "GGUF tensors",
        "metadata": gguf_lineage(path, header),
    }
