"""The model to train. ``scratch_config`` is the one from-scratch recipe: ``hf-geonorm train --arch`` builds its
model from it (``build_model``), ``hf-geonorm init`` writes it to a folder (``write_scratch_config``) and the
benchmarks train on it, so the three agree field for field. A folder's model is ``model_from_folder``."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from ..._plumbing.atomic import atomic_directory, check_target
from ..._plumbing.full_device import full_device_as_os_error
from ..._plumbing.output_lock import check_not_in_use, output_lock
from ...checkpoints.loading import (
    NO_REMOTE_CODE,
    PICKLE_WEIGHTS,
    check_supported,
    load_model,
    open_source,
    resolve_settings,
)
from ...checkpoints.patching import config_class_for
from ...conversion.inspection import check_fits_memory, parameter_count
from ...errors import SettingsError, first_line
from ...modeling.settings import GeoNormSettings
from ...sharing.folders import save_config_with_remote_code
from ..data.tokenizer import folder_config, has_trained_weights
from ..options import (
    FINE_TUNING_LR,
    FINE_TUNING_WEIGHT_DECAY,
    PRETRAINING_WEIGHT_DECAY,
    WARMUP_SHARE,
    OptionError,
    TrainOptions,
)
from ..presets import DEFAULT_VOCAB, fit_token_ids, preset_positions, preset_sizes
from ..rate_rule import FINE_TUNING, RATE_GIVEN, DefaultRate, pretraining_rate

POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")
FROM_SCRATCH = "training from scratch, "


def padded_vocab(tokens: int) -> int:
    """The vocabulary for a tokenizer of ``tokens`` tokens: rounded up to a multiple of 64 (as nanoGPT's 50304),
    which the matrix kernels are faster at; the extra rows are never looked up."""
    return int(math.ceil(tokens / 64) * 64)


def scratch_config(
    arch: str,
    sizes: str | Mapping[str, int],
    vocab_size: int,
    max_length: int | None,
    settings: Mapping[str, Any],
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    tie_embeddings: bool = True,
) -> PretrainedConfig:
    """The GeoNorm config of a from-scratch ``arch`` model: ``sizes`` (a preset name, or layers, width and heads
    as ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``) with the sizes that follow from them,
    ``max_length`` positions (None: the preset's), ``vocab_size`` rows, the GeoNorm ``settings``, and dropout off.

    The special-token ids are the tokenizer's (``bos_token_id``, ``eos_token_id``; without them the family's
    defaults that fit the vocabulary); there is no padding id: blocks are never padded, and a padding row is a zero
    embedding, a fixed point of the geodesic step (a token sharing its id, often eos, would never move off zero).
    ``tie_embeddings`` True (the default, for ``init`` and ``train --arch`` alike) shares the input embedding and the
    output head, as the paper's GPT-3-shaped preset sizes count them.
    ``ValueError`` when the sizes do not fit ``arch``,
    ``errors.SettingsError`` for a bad setting.
    """
    check_supported(arch)
    family_config = config_class_for(arch)
    try:
        values = preset_sizes(family_config, sizes, max_length)
    except ValueError:
        raise
    except Exception as error:  # noqa: BLE001 - a config class that cannot be read generically
        raise ValueError(
            f"cannot size a {arch} config generically ({type(error).__name__}: {first_line(error)}); build one "
            "with transformers and convert it"
        ) from None
    try:
        GeoNormSettings(**settings).validate(values["num_hidden_layers"])
    except (TypeError, ValueError) as error:  # the settings are the caller's
        raise SettingsError(first_line(error)) from None
    values["vocab_size"] = vocab_size
    for name, token_id in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id)):
        if token_id is not None:
            values[name] = token_id
    values["pad_token_id"] = None
    values["tie_word_embeddings"] = tie_embeddings
    fit_token_ids(values, family_config)
    for name, value in vars(family_config()).items():  # pretraining from scratch: no dropout, as nanoGPT and LLaMA
        if (name.endswith("pdrop") or name.endswith("dropout")) and isinstance(value, float):
            values[name] = 0.0
    try:
        return family_config(**values, **settings)
    except Exception as error:  # noqa: BLE001 - the settings are valid (above): the sizes do not fit arch
        raise ValueError(
            f"the {sizes if isinstance(sizes, str) else 'given'} sizes do not fit {arch} ({type(error).__name__}: "
            f"{first_line(error)}); build a config of your own with transformers and convert it, or choose another "
            "architecture"
        ) from None


def check_positions(model: str | None, seq_len: int) -> None:
    """``seq_len`` (``--seq-len``) within the ``model`` folder's positions, before any tokenizing (a model built
    from ``--arch`` gets at least ``--seq-len`` positions)."""
    config = folder_config(model) or {}
    positions = next((config[key] for key in POSITION_KEYS if isinstance(config.get(key), int)), None)
    if positions is not None and seq_len > positions:
        raise OptionError(
            f"--seq-len {seq_len} is beyond the {positions} positions of {model} (config.json "
            f"max_position_embeddings): give --seq-len {positions} or less, or write the config with more positions "
            "(hf-geonorm init --max-length)"
        )


def build_model(
    options: TrainOptions, tokenizer: Any, *, own_tokenizer: bool = False, log: Any = None
) -> torch.nn.Module:
    """The model to train: ``options.model`` (see ``model_from_folder``; ``own_tokenizer`` when ``tokenizer`` is
    the folder's own), or the recipe's ``arch`` at ``preset`` size, with the preset's positions (``--seq-len`` when
    longer: a model that generates only as far as its training blocks is a trap) and the tokenizer's vocabulary.
    Settings given in ``options.settings`` override the folder's. ``log`` gets a line when the model's vocabulary
    is not the folder config's."""
    if options.model is not None:
        sized = options.vocab_size is not None or options.tokenizer is not None  # the user chose the vocabulary
        return model_from_folder(
            options.model, options.settings, tokenizer, own_tokenizer=own_tokenizer, sized_by_user=sized, log=log
        )
    positions = max(options.seq_len, preset_positions(options.preset))  # room to generate past a training block
    config = scratch_config(
        options.arch, options.preset, padded_vocab(len(tokenizer)), positions, options.settings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return AutoModelForCausalLM.from_config(config)


def model_from_folder(
    folder: str,
    settings: dict[str, Any],
    tokenizer: Any,
    *,
    own_tokenizer: bool = True,
    sized_by_user: bool = True,
    log: Any = None,
) -> torch.nn.Module:
    """The model of a folder, as GeoNorm with ``settings`` applied: its safetensors weights loaded strictly (a
    stock checkpoint is converted), or, for a config written to train from scratch (``hf-geonorm init``: no
    ``architectures``), freshly initialised with ``tokenizer``'s special-token ids (the tokenizer it trains on,
    perhaps trained on the fly). A from-scratch config trains with its own tokenizer (``own_tokenizer``) at its
    ``vocab_size``; with another one (``--tokenizer``, or trained on the fly) its embedding is sized to that
    tokenizer (padded to 64, as ``train --arch``), which ``log`` reports when it differs from the config's: one the
    user sized (``sized_by_user``: ``--vocab-size``, ``--tokenizer``), or one trained to the config's size that the
    data could not fill.
    Pickle-only folders, weight files under other names and saved models without weights are refused."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{folder} has no config.json; give a folder from hf-geonorm init (a config to train from scratch) or a "
            "saved model (config.json and model.safetensors)"
        )
    source = open_source(path)
    full = resolve_settings(settings, source)
    if source.is_geonorm:
        config = AutoConfig.from_pretrained(path, **NO_REMOTE_CODE)
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
    rows = padded_vocab(len(tokenizer))
    if not own_tokenizer and rows != config.vocab_size:
        if log is not None and sized_by_user:
            log(
                f"{path / 'config.json'} has vocab_size {config.vocab_size}; the tokenizer has {len(tokenizer)} "
                f"tokens: the model is built with {rows} rows"
            )
        elif log is not None:  # the tokenizer trained to the config's size stopped short: the data has too few merges
            log(
                f"the tokenizer trained on the data has {len(tokenizer):,} tokens, fewer than the vocab_size "
                f"{config.vocab_size:,} of {path / 'config.json'} (the data holds too little text for more): the "
                f"model's embedding is sized to it: {rows:,} rows (rounded up to a multiple of 64); --vocab-size N "
                "trains a tokenizer of N tokens instead"
            )
        config.vocab_size = rows
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"{folder}: its config.json has vocab_size {config.vocab_size}, fewer than the tokenizer's "
            f"{len(tokenizer)} tokens; write the config with hf-geonorm init --vocab-size "
            f"{padded_vocab(len(tokenizer))} (or --tokenizer), or train with the tokenizer it was written for"
        )
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    parameters = parameter_count(config)
    check_fits_memory(parameters, f"the model of {path / 'config.json'}")
    if log is not None:
        log(f"building the model of {path / 'config.json'}: {parameters:,} parameters")
    return AutoModelForCausalLM.from_config(config)


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
    """Write the recipe's config (``scratch_config``) of a from-scratch GeoNorm ``arch`` model (a stock model type)
    at ``preset`` size, with ``auto_map`` and the modelling source, and the tokenizer (a folder or Hub id) when
    given, to ``output_dir``.

    The vocabulary is ``vocab_size``, else the tokenizer's rounded up to 64, else ``presets.DEFAULT_VOCAB``; the
    tokenizer's special-token ids go into the config. ``ValueError`` when the preset does not fit ``arch``,
    ``errors.SettingsError`` for a bad setting; nothing is written then.
    """
    check_not_in_use(output_dir, "OUTPUT_DIR")  # a run writing there is the mistake to name first
    check_target(output_dir, force)
    loaded = None
    if tokenizer:
        from ..data.tokenizer import tokenizer_from

        loaded = tokenizer_from(tokenizer)
    if vocab_size is None:
        vocab_size = padded_vocab(len(loaded)) if loaded is not None else DEFAULT_VOCAB
    elif loaded is not None and vocab_size < len(loaded):
        raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {len(loaded)} tokens")
    config = scratch_config(
        arch, preset, vocab_size, max_length, settings or {}, tie_embeddings=tie_embeddings,
        bos_token_id=getattr(loaded, "bos_token_id", None), eos_token_id=getattr(loaded, "eos_token_id", None),
    )  # fmt: skip
    try:
        parameters = parameter_count(config, check_forward=True)
    except Exception as error:  # noqa: BLE001 - any failure means the preset does not fit this architecture
        raise ValueError(
            f"the {preset} preset does not fit {arch} ({type(error).__name__}: {first_line(error)}); build a config "
            "of your own with transformers and convert it, or choose another architecture"
        ) from None
    check_fits_memory(parameters, f"the {arch} {preset} config (vocabulary {vocab_size:,})")
    with (
        output_lock(output_dir, "init", "OUTPUT_DIR"),
        atomic_directory(output_dir, force=force, command="init") as tmp,
    ):
        with full_device_as_os_error():
            save_config_with_remote_code(config, tmp, tokenizer=loaded)
    return ScratchConfig(Path(output_dir), config, parameters, config.geonorm_settings().to_dict())


def with_learning_rate(options: TrainOptions, config: Any) -> tuple[TrainOptions, list[str]]:
    """``options`` with the defaults that depend on the model resolved, and a log line for each saying why: a
    ``--model`` folder with trained weights is fine-tuned at ``FINE_TUNING_LR`` with ``FINE_TUNING_WEIGHT_DECAY``; a
    model trained from scratch gets the rate for its architecture, norm style, width and depth
    (``pretraining_rate``: the log names its source, and says to sweep first where no cell measured the model) and
    ``PRETRAINING_WEIGHT_DECAY``. The warm-up is a ``WARMUP_SHARE``th of the steps, so that a short fine-tune
    reaches its peak rate."""
    changes: dict[str, Any] = {}
    lines = []
    fine_tuning = options.model is not None and has_trained_weights(options.model)
    if options.lr is None:
        chosen = default_rate(options.model, config, getattr(config, "norm_style", "pre"))
        changes["lr"] = chosen.lr
        advice = "" if fine_tuning else "; `hf-geonorm sweep` measures it on your data"
        if chosen.needs_sweep:  # its account ends in rate_rule.SWEEP_FIRST
            advice = " (`hf-geonorm sweep`: its default grid spans 1/8 to 8 times this rate)"
        lines.append(f"learning rate {chosen.lr:g}, the default for {chosen.why}{advice}; --lr sets another")
    if options.weight_decay is None:
        changes["weight_decay"] = FINE_TUNING_WEIGHT_DECAY if fine_tuning else PRETRAINING_WEIGHT_DECAY
        purpose = "to fine-tune trained weights" if fine_tuning else "from scratch"
        lines.append(f"weight decay {changes['weight_decay']:g}, the default {purpose}; --weight-decay sets another")
    if options.warmup_steps is None:
        changes["warmup_steps"] = options.max_steps // WARMUP_SHARE
        lines.append(f"warm-up {changes['warmup_steps']} steps, a {WARMUP_SHARE}th of --max-steps "
                     f"{options.max_steps}; --warmup-steps sets another")  # fmt: skip
    return replace(options, **changes), lines


def default_rate(model: str | None, config: Any, style: str) -> DefaultRate:
    """The peak rate ``train`` gives a model of ``config`` in norm ``style`` when ``--lr`` is not given, where it
    comes from and why: ``FINE_TUNING_LR`` for a ``model`` folder (``--model``) with trained weights, else
    ``pretraining_rate``'s."""
    if model is not None and has_trained_weights(model):
        return DefaultRate(FINE_TUNING_LR, FINE_TUNING, f"{model} holds trained weights: fine-tuning")
    chosen = pretraining_rate(config.model_type.removeprefix("geonorm_"), style, config.hidden_size,
                              config.num_hidden_layers)  # fmt: skip
    return replace(chosen, why=FROM_SCRATCH + chosen.why)


def rate_choice(lr: float | None, model: str | None, config: Any, given_by: str | None = None) -> DefaultRate:
    """Where the run's peak learning rate comes from, for its card and ``metrics.json``: ``--lr`` where given
    (``lr``; ``given_by`` names the program that gave it, such as a sweep), else ``default_rate``'s source for the
    ``--model`` (``model``) of ``config``, with a ``why`` that names no folder of this machine (the card is shared)."""
    if lr is not None:
        return DefaultRate(lr, RATE_GIVEN, given_by or RATE_GIVEN)
    chosen = default_rate(model, config, getattr(config, "norm_style", "pre"))
    if chosen.source == FINE_TUNING:
        return replace(chosen, why=f"{FINE_TUNING}: the default for a --model with trained weights")
    return replace(chosen, why=chosen.why.removeprefix(FROM_SCRATCH))  # pretraining_rate's own account


def planned_config(options: TrainOptions) -> PretrainedConfig:
    """The config of the model ``train`` would build for ``options``, without building it or its tokenizer: the
    ``--model`` folder's, else the ``--arch`` recipe's at ``--preset`` size (its vocabulary a stand-in)."""
    if options.model is not None:
        return AutoConfig.from_pretrained(Path(options.model).expanduser(), **NO_REMOTE_CODE)
    positions = max(options.seq_len, preset_positions(options.preset))
    return scratch_config(options.arch, options.preset, DEFAULT_VOCAB, positions, options.settings)


def what_it_computes(config: Any, options: TrainOptions) -> str:
    """The model's norm style as it computes: ``geo_bridge`` 0 is exact Pre-Norm whatever ``norm_style`` says."""
    style = getattr(config, "norm_style", "?")
    bridge = getattr(config, "geo_bridge", 1.0)
    bridges = bridge if isinstance(bridge, list) else [bridge]  # a list: one per layer or per update
    if style == "geo" and max(bridges) == 0 and options.bridge_anneal is None:
        return (
            "norm_style geo at geo_bridge 0: it computes exact Pre-Norm (the source model); --bridge-anneal STEPS "
            "moves it to GeoNorm while it trains"
        )
    if style == "geo" and min(bridges) < 1:
        shown = f"{min(bridges):g} to {max(bridges):g}" if isinstance(bridge, list) else f"{bridge:g}"
        return f"norm_style geo at geo_bridge {shown}" + (
            f", annealed to 1 over {options.bridge_anneal} steps" if options.bridge_anneal else ""
        )
    return f"norm_style {style}"
