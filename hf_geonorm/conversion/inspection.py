"""What a checkpoint folder holds (``hf-geonorm info``), whether a model fits this machine's memory
(``check_fits_memory``, for ``hf-geonorm init``, with ``loading_sizes.parameter_count``), and which architectures
GeoNorm patches, and how (``hf-geonorm architectures``); read from headers and configs, loading no weights."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from ..checkpoints.loading import (
    PICKLE_ADVICE,
    Source,
    check_supported,
    pickle_weights,
    read_config_json,
    resolve_settings,
)
from ..checkpoints.loading_sizes import check_sizes, parameter_count
from ..checkpoints.patching import family_for, supported_architectures
from ..checkpoints.safetensors_files import WeightPathError, saved_parameter_count
from ..errors import first_line
from ..modeling.decoder_layers import decoder_layer_class
from ..modeling.geometry import step_sizes, updates_per_layer
from ..sharing.card_checks import check_remote_code
from ..sharing.model_card import card_metadata_of

LAYOUT_COLUMNS = ("layers", "attn_norm", "attn", "mlp_norm", "mlp")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


POSITION_KEYS = ("max_position_embeddings", "n_positions", "seq_length")


def positions(config: dict[str, Any]) -> int | None:
    """The positions the model's config gives it: the longest prompt plus generated tokens it is built for."""
    return next((config[key] for key in POSITION_KEYS if isinstance(config.get(key), int)), None)


def describe(path: str | os.PathLike) -> dict[str, Any]:
    """``describe_folder`` for a checkpoint folder, ``describe_gguf`` for a ``.gguf`` file (the output folder of a
    run or a sweep, no model of its own, is summarised by ``training.run.summary`` and ``sweep.summary``)."""
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return describe_gguf(path)
    return describe_folder(path)


def describe_gguf(path: Path) -> dict[str, Any]:
    """The facts of a ``.gguf`` checkpoint: type, sizes, positions, parameters (the tensors' element counts), the
    license, base model and model name it states and its tensors' types (``sharing.gguf_lineage``). From its header
    alone where that settles them (``gguf_lineage.header_description``), else from its metadata as ``convert`` reads it,
    with the same checks."""
    from ..checkpoints.gguf_header import read_gguf_header
    from ..checkpoints.loading import open_source
    from ..sharing.gguf_lineage import gguf_lineage, header_description

    header = read_gguf_header(path)
    described = header_description(path, header)
    if described is not None:
        return described
    source = open_source(path)
    config = source.config
    return {
        "path": str(path),
        "kind": "gguf",
        "model_type": source.model_type,
        "family": source.stock_type,
        "geonorm": False,
        "num_layers": source.num_layers,
        "hidden_size": config.get("hidden_size", config.get("n_embd")),
        "vocab_size": config.get("vocab_size"),
        "positions": positions(config),
        "parameters": sum(t.n_elements for t in header.tensors),
        "parameters_from": "GGUF tensors",
        "metadata": gguf_lineage(path, header),
    }


def describe_folder(path: str | os.PathLike) -> dict[str, Any]:
    """The facts of a checkpoint folder as a JSON-ready dict: type and family, sizes as loading builds them,
    positions, parameter count (from the safetensors headers, else from the config), pickle weights (never loaded),
    GeoNorm settings and step sizes, remote code, model card and tokenizer. ``ValueError`` naming the file for a
    corrupt config, sizes loading would not build as stated (``loading_sizes.check_sizes``, as every command that
    reads a model), bad stored settings or damaged weights."""
    path = Path(path)
    if not path.is_dir():
        if path.is_file():
            raise ValueError(f"{path} is a file, not a checkpoint folder: give a checkpoint folder or a .gguf file")
        raise ValueError(f"{path}: {'not a folder' if path.exists() else 'no such folder'}")
    pickles = pickle_weights(path)
    if pickles and not (path / "config.json").exists():
        raise ValueError(f"{path} has no config.json, only pickle weights ({', '.join(pickles)}); {PICKLE_ADVICE}")
    config = read_config_json(path)
    model_type = config["model_type"]
    check_supported(model_type, str(path))
    family = family_for(model_type)
    source = Source(str(path), "folder", str(path), None, config, path)
    built = check_sizes(config, source.config_label)
    num_layers = source.num_layers
    out: dict[str, Any] = {
        "path": str(path),
        "model_type": model_type,
        "family": family.stock_type,
        "geonorm": source.is_geonorm,
        "architectures": config.get("architectures"),
        "num_layers": num_layers,
        **built_sizes(built, config),
        "dtype": config.get("dtype", config.get("torch_dtype")),
        "pickle_weights": pickles,
    }
    try:
        counted = saved_parameter_count(path)
    except WeightPathError:
        raise
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(f"{path}: the safetensors weights are corrupt ({first_line(error)})") from None
    if counted is not None:
        out["parameters"], out["parameters_by_dtype"] = counted
        out["parameters_from"] = "safetensors header"
    else:
        config_class = family.config_class if source.is_geonorm else family.stock_config_class
        try:
            out["parameters"] = parameter_count(config_class.from_dict(config))
            out["parameters_from"] = "config (no safetensors weights in the folder)"
        except Exception:  # noqa: BLE001 - an unknown size is fine here
            out["parameters"] = None
    if source.is_geonorm:
        settings = resolve_settings({}, source)
        out["settings"] = settings
        if settings["norm_style"] == "geo":
            per = updates_per_layer(settings["geo_alpha"], num_layers)
            out["step_sizes"] = step_sizes(settings["geo_decay"], settings["geo_alpha"], num_layers, per)
    status = check_remote_code(path, config)
    out["remote_code"] = {
        "auto_map": status.auto_map,
        "files": status.files,
        "missing": status.missing,
        "complete": status.complete,
    }
    out["model_card"] = _card_facts(path / "README.md")
    out["tokenizer"] = any((path / name).is_file() for name in TOKENIZER_FILES)
    return out


def built_sizes(built: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Hidden size, vocabulary and positions as loading builds them (``built``, the config object), where a size the
    config leaves out is its class's default; as ``config`` states them where the class refused it (None)."""
    if built is None:
        return {"hidden_size": config.get("hidden_size", config.get("n_embd")), "vocab_size": config.get("vocab_size"),
                "positions": positions(config)}  # fmt: skip
    values = built.to_dict()
    return {"hidden_size": values.get(built.attribute_map.get("hidden_size", "hidden_size")),
            "vocab_size": values.get("vocab_size"), "positions": positions(values)}  # fmt: skip


def machine_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits_memory(parameters: int, what: str) -> None:
    """``ValueError`` naming both numbers when the float32 weights of ``parameters`` parameters alone exceed this
    machine's memory: building the model would fail only after allocating gigabytes (or take the machine down)."""
    memory = machine_memory()
    needed = parameters * 4
    if memory is not None and needed > memory:
        raise ValueError(
            f"{what} has {parameters:,} parameters, {needed / 1e9:,.1f} GB in float32, more than this machine's "
            f"{memory / 1e9:,.1f} GB of memory: choose smaller sizes"
        )


def _card_facts(readme: Path) -> dict[str, Any] | None:
    if not readme.is_file():
        return None
    card: dict[str, Any] = {"file": readme.name}
    try:
        data = card_metadata_of(readme)
        card.update({k: data.get(k) for k in ("base_model", "license", "tags", "pipeline_tag", "library_name")})
    except Exception as error:  # noqa: BLE001 - a card without valid metadata is still reported
        card["error"] = first_line(error)
    return card


def _layout_value(value: Any) -> Any:
    if callable(value):
        return f"chosen by config ({getattr(value, '__name__', 'function')})"
    return value


def architecture_rows() -> list[dict[str, Any]]:
    """One row per supported stock model type: its block layout (where a decoder layer keeps its norms,
    attention and MLP), whether it adds one parallel update (``parallel`` and ``parallel_flag`` as the GeoNorm
    decoder layer of its block declares it, and ``parallel_text``), and the layout fields that differ from their
    defaults (``extras``)."""
    rows = []
    for model_type in supported_architectures():
        layout = family_for(model_type).layout
        parallel = decoder_layer_class(layout).parallel
        row: dict[str, Any] = {"model_type": model_type}
        extras = {}
        for f in dataclasses.fields(layout):
            value = _layout_value(getattr(layout, f.name))
            row[f.name] = value
            default = f.default if f.default is not dataclasses.MISSING else None
            if f.name not in LAYOUT_COLUMNS and value != default:
                extras[f.name] = value
        row["parallel"] = parallel is True
        row["parallel_flag"] = parallel if isinstance(parallel, str) else None
        row["parallel_text"] = f"config.{parallel}" if isinstance(parallel, str) else ("yes" if parallel else "no")
        row["extras"] = extras
        rows.append(row)
    return rows
