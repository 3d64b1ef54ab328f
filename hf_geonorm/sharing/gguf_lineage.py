"""What a GGUF file says of the model it holds, for the card of a model converted from it: the Hub id it states
(``base_model``), the name it gives the model, and its tensors' types (the weights are de-quantised from them).

llama.cpp's converter writes the model's names under ``general.*``: ``general.name`` (a title, "SmolLM2 135M"),
``general.basename``, ``general.organization``, the repository it came from (``general.source.repo_url``) and the
models it was made from (``general.base_model.N.name``, ``.organization``, ``.repo_url``). A Hub id is taken only
where the file states one: a huggingface.co address, or an organization and a name that together are an id as
written; a title is never turned into an id."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from ..files.gguf_files import gguf_metadata
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


def gguf_lineage(path: str | os.PathLike) -> dict[str, Any]:
    """The card facts the GGUF file ``path`` states: ``license`` and ``language`` (``gguf_metadata``),
    ``base_model`` (the first Hub id among: the repository the model was converted from, its organization and
    name, then the models it was made from), ``source_model`` (the model's name as the file gives it:
    ``general.name``, else ``general.basename``) and ``source_tensor_types`` (how many tensors of each type it
    holds)."""
    from gguf import GGUFReader

    found = {key: value for key, value in gguf_metadata(path).items() if key != "base_model"}
    try:
        reader = GGUFReader(str(path))
    except Exception:  # noqa: BLE001 - the metadata is optional; loading the file reports what is wrong with it
        return found

    def value(key: str) -> Any:
        item = reader.fields.get(key)
        if item is None:
            return None
        try:
            return item.contents()
        except Exception:  # noqa: BLE001 - a field of a type this gguf cannot read: not stated
            return None

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
    types = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    if types:
        found["source_tensor_types"] = dict(types.most_common())
    return found
