"""The sizes a model's config states, checked before anything is built, and the parameters they amount to.

transformers builds every size a config does not state at its class's defaults, without a word: a LLaMA config of
only ``vocab_size`` is the 6.7B-parameter default model, and so is a GPT-2 config relabelled ``llama`` (LLaMA
reads none of ``n_layer``, ``n_embd``, ``n_head``). ``check_sizes`` refuses both, and depths no model can have,
for every command that reads a model (``loading.open_source``, and ``info``), so that what is reported and built
is what the config says. ``parameter_count`` counts a config's parameters without memory (on the meta device).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from .patching import family_for

# A config deeper than this is refused: no model that deep can be built, and the per-layer lists a config or its
# step sizes make would fill the memory (10^9 layers: 23.5 GB of step sizes alone).
MAX_LAYERS = 1_000_000
# The sizes that shape a model, by the attribute every config class has, and the names configs give them: a name
# the model type's class does not read leaves that size at the class's default.
SIZE_NAMES = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "n_heads"),
}


def stated_layers(config: dict[str, Any], where: str) -> int:
    """The number of layers ``config`` (a config.json as a dict) states; ``ValueError`` naming ``where`` when it
    states none (its model would be built at its class's default depth and sizes) or more than ``MAX_LAYERS``."""
    for key in SIZE_NAMES["num_hidden_layers"]:
        value = config.get(key)
        if key in config and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{where}: {key} is {json.dumps(value)}, not a whole number of layers; fix it")
        if isinstance(value, int):
            if value > MAX_LAYERS:
                raise ValueError(
                    f"{where}: {key} is {value:,}; hf-geonorm reads models of at most {MAX_LAYERS:,} layers (no "
                    "model that deep can be built): fix the number of layers"
                )
            return value
    config_class = family_for(config["model_type"]).stock_config_class
    key = config_class.attribute_map.get("num_hidden_layers", "num_hidden_layers")
    raise ValueError(
        f"{where} states no number of layers ({key}): its model would be built at {config_class.__name__}'s "
        "default sizes; state the model's sizes in config.json"
    )


def built_config(config: dict[str, Any]) -> Any | None:
    """The config object that loading builds from ``config`` (a config.json as a dict, of a supported model type):
    its stock class's (a GeoNorm config class is that class plus the settings, which ``loading.resolve_settings``
    checks), every size it does not read at the class's default; None where the class refuses the values (loading
    then says why)."""
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        return family_for(config["model_type"]).stock_config_class.from_dict(fields)
    except Exception:  # noqa: BLE001 - a config the stock class refuses is reported when the model loads
        return None


def config_refusal(config: dict[str, Any]) -> str:
    """Why the stock config class refuses ``config``, in one line (its validation errors span several)."""
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        family_for(config["model_type"]).stock_config_class.from_dict(fields)
    except Exception as error:  # noqa: BLE001 - whatever the class raises is its reason
        return " ".join(str(error).split()) or type(error).__name__
    return "its config class refuses it"


def check_sizes(config: dict[str, Any], where: str) -> Any | None:
    """``built_config`` of ``config`` once its sizes are what loading builds: ``ValueError`` naming ``where`` for a
    config that states no number of layers, or more than ``MAX_LAYERS``, or a size under a name its model type does
    not read (the keys of another model type: that size would be its class's default)."""
    stated_layers(config, where)
    built = built_config(config)
    if built is None:
        raise ValueError(f"{where}: {config_refusal(config)}; fix config.json")
    unread, built_with = [], []
    for attribute, names in SIZE_NAMES.items():
        try:
            value = getattr(built, attribute)
        except Exception:  # noqa: BLE001 - a class without it (or with one per layer) is not compared on it
            continue
        ignored = [name for name in names if config.get(name) is not None and config[name] != value]
        if ignored:
            unread += ignored
            built_with.append(f"{type(built).attribute_map.get(attribute, attribute)} {value}")
    if unread:
        raise ValueError(
            f"{where}: model_type {config['model_type']!r} does not read {', '.join(sorted(unread))}, so loading "
            f"would build its model with its own defaults instead ({', '.join(built_with)}); those keys belong to "
            "another model type: fix model_type or those keys"
        )
    return built


# Configs deeper than this are counted from two builds of fewer layers (a layer's parameters, times the layers):
# building 100,000 layers, even on the meta device, takes minutes and gigabytes.
LAYERS_BUILT = 32


def parameter_count(config: Any, check_forward: bool = False) -> int:
    """Parameters of the model ``config`` describes (tied ones once), built on the meta device (no memory);
    with ``check_forward`` a few tokens also run through it there, which finds sizes that do not fit together.
    A config of more than ``LAYERS_BUILT`` layers is built with ``LAYERS_BUILT`` and half as many, and the
    difference per layer extended to all of them."""
    layers = getattr(config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers <= LAYERS_BUILT:
        return _built_count(config, check_forward)
    few, more = LAYERS_BUILT // 2, LAYERS_BUILT
    fewer_count = _built_count(with_layers(config, few), False)
    more_count = _built_count(with_layers(config, more), check_forward)
    return more_count + (layers - more) * (more_count - fewer_count) // (more - few)


def with_layers(config: Any, layers: int) -> Any:
    """A copy of ``config`` with ``layers`` layers: its per-layer (and per-update) lists cut to match."""
    total = config.num_hidden_layers
    values = config.to_dict()
    for key, value in values.items():
        if isinstance(value, list) and len(value) in (total, 2 * total):
            values[key] = value[: layers * (len(value) // total)]
    values["num_hidden_layers"] = layers
    values.pop("model_type", None)
    return type(config)(**values)


def _built_count(config: Any, check_forward: bool) -> int:
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
