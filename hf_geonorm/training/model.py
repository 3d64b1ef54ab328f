"""The model to train: a from-scratch GeoNorm config at a preset's size (``build_model`` for ``hf-geonorm train
--arch``, ``write_scratch_config`` for ``hf-geonorm init``), or a folder's model (``model_from_folder``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ..atomic import atomic_directory, check_target
from ..folders import save_config_with_remote_code
from ..loading import (
    PICKLE_WEIGHTS,
    SettingsError,
    check_supported,
    first_line,
    load_model,
    open_source,
    resolve_settings,
)
from ..modeling.settings import GeoNormSettings
from ..patching import config_class_for, family_for
from .options import TrainOptions
from .presets import DEFAULT_VOCAB, fit_token_ids, preset_sizes


def model_from_folder(folder: str, settings: dict[str, Any]) -> torch.nn.Module:
    """The model of a folder, as GeoNorm with ``settings`` applied: its safetensors weights loaded strictly (a
    stock checkpoint is converted), or, for a config written to train from scratch (``hf-geonorm init``: no
    ``architectures``), freshly initialised. Pickle-only folders, weight files under other names and saved models
    without weights are refused."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{folder} has no config.json; give a folder from hf-geonorm init (a config to train from scratch) or a "
            "saved model (config.json and model.safetensors)"
        )
    source = open_source(path)
    full = resolve_settings(settings, source)
    if source.is_geonorm:
        config = AutoConfig.from_pretrained(path)
        for name, value in full.items():
            setattr(config, name, value)
    else:
        config = config_class_for(source.model_type).from_pretrained(path, **full)
    if source.weight_files:
        return load_model(source, dtype="float32", config=config)
    patterns = ("*.safetensors", "*.bin", *PICKLE_WEIGHTS)
    stray = sorted({file.name for pattern in patterns for file in path.glob(pattern)})
    if stray:  # weights under another name, or pickles: training from scratch would silently drop them
        raise ValueError(
            f"{folder} holds {', '.join(stray)} but no model.safetensors or model.safetensors.index.json: hf-geonorm "
            "reads a model's weights from model.safetensors (one file) or the shards its index names, never from "
            "pickle files; save the model again with save_pretrained (it writes model.safetensors), or rename a "
            "single safetensors file to model.safetensors (a config to train from scratch, from hf-geonorm init, "
            "has no weight files)"
        )
    if source.config.get("architectures"):
        raise ValueError(
            f"{folder} holds the config.json of a saved {source.config['architectures'][0]} but no weights "
            "(model.safetensors): they are missing; give the folder with its weights (a config to train from "
            "scratch comes from hf-geonorm init)"
        )
    return AutoModelForCausalLM.from_config(config)


def build_model(options: TrainOptions, tokenizer: Any) -> torch.nn.Module:
    """The model to train: ``options.model`` (see ``model_from_folder``), or ``arch`` at ``preset`` size with
    dropout off. Settings given in ``options.settings`` override the folder's."""
    if options.model is not None:
        return model_from_folder(options.model, options.settings)
    family_config = config_class_for(options.arch)
    values = preset_sizes(family_config, options.preset, max_length=options.seq_len)
    values["vocab_size"] = int(math.ceil(len(tokenizer) / 64) * 64)
    for name in ("bos_token_id", "eos_token_id"):
        values[name] = getattr(tokenizer, name)
    # no padding row: blocks are never padded, and a zero embedding row is a fixed point of the geodesic step
    # (a token whose id is also the pad id, often eos, would never move off zero)
    values["pad_token_id"] = None
    fit_token_ids(values, family_config)
    defaults = family_config()
    for name, value in vars(defaults).items():  # pretraining from scratch: no dropout, as nanoGPT and LLaMA
        if (name.endswith("pdrop") or name.endswith("dropout")) and isinstance(value, float):
            values[name] = 0.0
    try:
        config = family_config(**values, **options.settings)
    except ValueError as error:  # the preset's sizes are valid: the caller's settings do not fit them
        raise SettingsError(first_line(error)) from None
    return AutoModelForCausalLM.from_config(config)


def parameter_count(config: Any, check_forward: bool = False) -> int:
    """Parameters of the model ``config`` describes (tied ones once), built on the meta device (no memory);
    with ``check_forward`` a few tokens also run through it there, which finds sizes that do not fit together."""
    with torch.device("meta"):
        # eager experts: an MoE forward then raises NotImplementedError on meta (below) whatever kernel an earlier
        # real MoE model in this process made transformers choose (grouped_mm on meta demands bfloat16)
        model = AutoModelForCausalLM.from_config(config, experts_implementation="eager")
        if check_forward:
            try:
                model(torch.ones((1, 4), dtype=torch.long))
            except NotImplementedError:  # data-dependent ops (MoE routing) cannot run on meta: not checked
                pass
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@dataclass
class ScratchConfig:
    """What ``write_scratch_config`` wrote."""

    output: Path
    config: Any
    parameters: int
    settings: dict[str, Any]


def write_scratch_config(
    arch: str,
    output_dir: str | os.PathLike,
    preset: str,
    settings: dict[str, Any] | None = None,
    *,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
    max_length: int | None = None,
    tie_embeddings: bool = True,
    force: bool = False,
) -> ScratchConfig:
    """Write the config of a from-scratch GeoNorm ``arch`` model (a stock model type) at ``preset`` size, with
    ``auto_map`` and the modelling source, and the tokenizer (a folder or Hub id) when given, to ``output_dir``.

    The vocabulary is ``vocab_size``, else the tokenizer's rounded up to 64, else ``presets.DEFAULT_VOCAB``; the
    tokenizer's special-token ids go into the config. ``ValueError`` when the preset does not fit ``arch``,
    ``loading.SettingsError`` for a bad setting; nothing is written then.
    """
    check_target(output_dir, force)
    check_supported(arch)
    family = family_for(arch)
    try:
        values = preset_sizes(family.config_class, preset, max_length)
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001 - a config class that cannot be read generically
        raise ValueError(
            f"init cannot size a {arch} config generically ({type(error).__name__}: {first_line(error)}); build one "
            "with transformers and convert it"
        ) from None
    try:
        chosen = GeoNormSettings(**(settings or {})).validate(values["num_hidden_layers"]).to_dict()
    except ValueError as error:
        raise SettingsError(first_line(error)) from None
    loaded = None
    if tokenizer:
        from transformers import AutoTokenizer

        try:
            loaded = AutoTokenizer.from_pretrained(tokenizer)
        except Exception as error:  # noqa: BLE001 - reported in one line
            raise ValueError(f"cannot load the tokenizer {tokenizer}: {first_line(error)}") from None
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            token_id = getattr(loaded, name, None)
            if isinstance(token_id, int):
                values[name] = token_id
    if vocab_size is None:
        vocab_size = int(math.ceil(len(loaded) / 64) * 64) if loaded is not None else DEFAULT_VOCAB
    elif loaded is not None and vocab_size < len(loaded):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(loaded)} tokens")
    values["vocab_size"] = vocab_size
    values["tie_word_embeddings"] = tie_embeddings
    fit_token_ids(values, family.config_class)
    try:
        config = family.config_class(**values, **chosen)
        parameters = parameter_count(config, check_forward=True)
    except Exception as error:  # noqa: BLE001 - any failure means the preset does not fit this architecture
        raise ValueError(
            f"the {preset} preset does not fit {arch} ({type(error).__name__}: {first_line(error)}); build a config "
            "of your own with transformers and convert it, or choose another architecture"
        ) from None
    with atomic_directory(output_dir, force=force) as tmp:
        save_config_with_remote_code(config, tmp, tokenizer=loaded)
    return ScratchConfig(Path(output_dir), config, parameters, chosen)
