"""Model sizes for from-scratch GeoNorm configs: the paper's 125M-1.3B shapes (GPT-3's), and a tiny one."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "max_position_embeddings": 256},
    "125m": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12},
    "350m": {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16},
    "760m": {"num_hidden_layers": 24, "hidden_size": 1536, "num_attention_heads": 16},
    "1.3b": {"num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 32},
}
DEFAULT_VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64
DEFAULT_POSITIONS = 2048  # a preset's context when it names none (GPT-3's)


def preset_positions(preset: str | Mapping[str, int]) -> int:
    """The positions of a preset (a name, or the sizes themselves): its own, else ``DEFAULT_POSITIONS``."""
    sizes = PRESETS.get(preset, {}) if isinstance(preset, str) else preset
    return sizes.get("max_position_embeddings", DEFAULT_POSITIONS)


def preset_sizes(config_class: type, preset: str | Mapping[str, int], max_length: int | None = None) -> dict[str, Any]:
    """The config values of a preset (a name, or the sizes themselves: layers, width, heads) for one architecture:
    its sizes, plus the sizes that must follow them (key/value heads, head and rotary dims, MLP width, per-layer
    attention types)."""
    if isinstance(preset, str) and preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}; got {preset!r}")
    sizes = PRESETS[preset] if isinstance(preset, str) else preset
    d, heads, layers = sizes["hidden_size"], sizes["num_attention_heads"], sizes["num_hidden_layers"]
    head_dim = d // heads
    values: dict[str, Any] = dict(sizes)
    values["max_position_embeddings"] = max_length or preset_positions(sizes)
    defaults = config_class()
    if hasattr(defaults, "num_key_value_heads"):
        values["num_key_value_heads"] = heads
    head_dim_is_property = isinstance(getattr(config_class, "head_dim", None), property)
    if hasattr(defaults, "head_dim") and not head_dim_is_property and not hasattr(defaults, "qk_rope_head_dim"):
        values["head_dim"] = head_dim
    if isinstance(getattr(defaults, "rotary_dim", None), int):
        values["rotary_dim"] = min(defaults.rotary_dim, head_dim)
    if getattr(defaults, "intermediate_size", None) is not None:
        # SwiGLU MLPs at 8d/3 (rounded up to 256) have the parameters of a 4d GELU MLP
        values["intermediate_size"] = int(math.ceil(8 * d / 3 / 256) * 256)
    if getattr(defaults, "attention_types", None) is not None:  # GPT-Neo: alternate global and local attention
        values["attention_types"] = [[["global", "local"], layers // 2]] if layers % 2 == 0 else [[["global"], layers]]
    return values


def fit_token_ids(values: dict[str, Any], config_class: type) -> None:
    """Drop default special-token ids that fall outside the chosen vocabulary (a tokenizer sets its own)."""
    defaults = config_class()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if name in values or not hasattr(defaults, name):
            continue
        ids = getattr(defaults, name)
        ids_list = ids if isinstance(ids, list) else [ids]
        if any(isinstance(i, int) and i >= values["vocab_size"] for i in ids_list):
            values[name] = None
