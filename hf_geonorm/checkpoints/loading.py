"""Where a model comes from (a checkpoint folder, a ``.gguf`` file or a Hugging Face Hub id) and loading it
strictly.

``open_source`` reads only the config. ``load_model`` loads the weights and, where transformers would fill a
missing or wrong-shape tensor with random values and only log it, raises a ``ValueError`` that names the keys.
Every user mistake (no such path, a corrupt config, damaged weights, an unsupported architecture) is a
one-line ``ValueError`` that names the file and the fix.

No code shipped with a folder or a Hub repository ever runs: every tokenizer, config and model is loaded with
``NO_REMOTE_CODE`` (transformers then never asks "Do you wish to run the custom code?"), GeoNorm types load
through the plugin's own classes, and what would need custom code is refused in one line (``errors.custom_code_error``).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._plumbing.text_files import SPECIAL_FILES
from ..errors import SettingsError, custom_code_error, first_line, needs_custom_code
from ..modeling.blocks import check_layout_settings
from ..modeling.norm_styles import NORM_STYLE_DECLARATIONS
from ..modeling.settings import GeoNormSettings
from .gguf_files import dequantize_gguf, gguf_config
from .gguf_header import read_gguf_header
from .loading_info import check_loading_info, geonorm_keys
from .loading_sizes import built_config, check_sizes, stated_layers
from .patching import family_for, supported_architectures
from .safetensors_files import WeightPathError, safetensors_header, weight_files

DTYPES = ("auto", "float32", "bfloat16", "float16")  # a model is read and written in; "auto": the checkpoint's own
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt"
)  # fmt: skip
PICKLE_WEIGHTS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")
PICKLE_ADVICE = (
    "hf-geonorm never loads pickles (unpickling can run any code in them): convert them to safetensors where you "
    "trust them, by loading the model with transformers and saving it with save_pretrained (it writes "
    "model.safetensors)"
)
# Sizes a model divides by or builds from (a head count of 0 is a ZeroDivisionError deep in the modelling code).
POSITIVE_SIZES = (
    "n_head", "num_attention_heads", "num_key_value_heads", "n_embd", "hidden_size", "n_layer", "num_hidden_layers",
    "head_dim", "vocab_size", "n_positions", "max_position_embeddings", "intermediate_size",
)  # fmt: skip
NO_REMOTE_CODE = {"trust_remote_code": False}  # for every from_pretrained of a folder, a file or a Hub id


def standard_tokenizer(tokenizer: Any, where: str, fix: str) -> Any:
    """``tokenizer`` unless its ``tokenizer_config.json`` asks for custom code (an ``auto_map``): without
    ``trust_remote_code`` transformers loads a standard class in its place without a word, and ``save_pretrained``
    would copy the ``auto_map`` into every output, a pointer to code that anyone able to add that file could fill."""
    if tokenizer is not None and (getattr(tokenizer, "init_kwargs", None) or {}).get("auto_map"):
        raise custom_code_error("tokenizer", where, fix)
    return tokenizer


STANDARD_TOKENIZER = (
    "give it a standard tokenizer: save one with save_pretrained (tokenizer.json and a tokenizer_config.json "
    "without auto_map) in place of its tokenizer files"
)


@dataclass
class Source:
    """A checkpoint to load: what ``open_source`` made of a folder, a ``.gguf`` file or a Hub id."""

    spec: str
    kind: str  # "folder", "gguf" or "hub"
    load_dir: str  # what from_pretrained gets
    gguf_file: str | None
    config: dict[str, Any]  # config.json as a dict
    path: Path | None = None  # the local file or folder

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    @property
    def stock_type(self) -> str:
        return self.model_type.removeprefix("geonorm_")

    @property
    def is_geonorm(self) -> bool:
        return self.model_type.startswith("geonorm_")

    @property
    def label(self) -> str:
        """How messages name the source: the folder or file name, or the Hub id."""
        return self.spec if self.kind == "hub" else Path(self.spec).name or self.spec

    @property
    def config_label(self) -> str:
        """How messages name the config: a folder's config.json, else the file or the Hub id."""
        return str(self.path / "config.json") if self.kind == "folder" else self.spec

    @property
    def num_layers(self) -> int:
        return stated_layers(self.config, self.config_label)

    @property
    def weight_files(self) -> list[Path]:
        """The safetensors files of a folder source (empty for a config-only folder, a .gguf file or a Hub id)."""
        if self.kind != "folder":
            return []
        try:
            return weight_files(self.path)
        except WeightPathError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"{self.path / 'model.safetensors.index.json'} is not a valid safetensors index ({first_line(error)}); "
                "save the model again"
            ) from None

    def load_kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def looks_like_path(spec: str) -> bool:
    """Whether ``spec`` names a local file or folder (one that is not there) rather than a Hub id ``NAME`` or
    ``ORG/NAME``: it starts like a path, has more than one ``/``, or ends like a checkpoint or tokenizer file."""
    return (
        spec.startswith((".", "/", "~"))
        or spec.count("/") > 1
        or (os.sep != "/" and os.sep in spec)
        or spec.lower().endswith((".gguf", ".json", ".safetensors", ".bin"))
    )


def pickle_weights(folder: Path) -> list[str]:
    """The names of the pickle weight files in ``folder`` (``pytorch_model.bin``, ...), which are never loaded."""
    return sorted({p.name for pattern in PICKLE_WEIGHTS for p in folder.glob(pattern)})


def read_config_json(folder: str | os.PathLike) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict; a missing or corrupt file is a ``ValueError`` naming it, and so is
    one that is not a regular file (never opened: a FIFO would wait for a writer)."""
    config_path = Path(folder) / "config.json"
    if not config_path.is_file():
        if config_path.exists():
            mode = config_path.stat().st_mode
            kind = next((name for check, name in SPECIAL_FILES if check(mode)), "a special file")
            raise ValueError(f"{config_path} is {kind}, not a regular file: a checkpoint's config.json is a JSON file")
        raise ValueError(f"{folder} has no config.json: not a transformers checkpoint folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{config_path} is corrupt (not valid JSON: {first_line(error)}); fix or download it again"
        ) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError(f"{config_path} is corrupt: it has no model_type")
    for key in POSITIVE_SIZES:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 1:
            raise ValueError(f"{config_path}: {key} is {value}; a size or count must be at least 1 (fix the file)")
    return config


def _supported(model_type: str) -> bool:
    try:
        family_for(model_type)
    except ValueError:
        return False
    return True


def check_supported(model_type: str, where: str | None = None) -> None:
    """``ValueError`` unless GeoNorm has a family for ``model_type`` (stock ``X`` or ``geonorm_X``)."""
    if not _supported(model_type):
        n = len(supported_architectures())
        raise ValueError(
            f"unsupported architecture {model_type!r}{f' in {where}' if where else ''}: GeoNorm supports {n} "
            "decoder-only model types (list them with: hf-geonorm architectures)"
        )


def _hub_config(spec: str) -> dict[str, Any]:
    from huggingface_hub import is_offline_mode
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    from transformers import AutoConfig

    try:
        validate_repo_id(spec)
    except HFValidationError:
        raise ValueError(f"{spec}: no such file or folder, and not a valid Hugging Face Hub model id") from None
    try:
        config = AutoConfig.from_pretrained(spec, **NO_REMOTE_CODE)
    except (OSError, ValueError, KeyError) as error:
        if needs_custom_code(error):
            raise custom_code_error("config", spec, "hf-geonorm converts the stock model types only") from None
        if is_offline_mode():
            reason = "the Hub is offline (HF_HUB_OFFLINE=1) and the model is not in the local cache"
        else:
            reason = first_line(error)
        raise ValueError(
            f"{spec} is not a local folder or .gguf file, and loading it from the Hugging Face Hub failed: {reason}"
        ) from None
    return config.to_dict()


def open_source(spec: str | os.PathLike) -> Source:
    """Classify ``spec`` (a checkpoint folder, a ``.gguf`` file or a Hub id), read its config, and check that
    GeoNorm supports its architecture and that its sizes are what loading builds (``loading_sizes.check_sizes``:
    every command that reads a model refuses the same configs). Loads no weights."""
    spec = str(spec)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(
                f"{spec} is a file but not a .gguf checkpoint; give a checkpoint folder, a .gguf file or a Hub id"
            )
        source = Source(spec, "gguf", str(path.parent), path.name, gguf_config(path), path)
    elif path.is_dir():
        source = Source(spec, "folder", str(path), None, read_config_json(path), path)
        if source.config.get("auto_map") and not _supported(source.model_type):
            raise custom_code_error("config", spec, "hf-geonorm converts the stock model types only (list them with: "
                                    "hf-geonorm architectures)")  # fmt: skip
    elif looks_like_path(spec):
        raise ValueError(f"{spec}: no such file or folder")
    else:
        source = Source(spec, "hub", spec, None, _hub_config(spec))
    check_supported(source.model_type, source.spec)
    check_sizes(source.config, source.config_label)
    check_activations(source.config, source.config_label)
    return source


ACTIVATION_KEYS = ("hidden_act", "activation_function", "hidden_activation")  # what the stock configs name them


def check_activations(config: dict[str, Any], where: str) -> None:
    """``ValueError`` naming ``where`` for an activation function transformers does not have (its model would
    fail to build with the name alone as its message)."""
    from transformers.activations import ACT2FN

    for key in ACTIVATION_KEYS:
        value = config.get(key)
        if isinstance(value, str) and value not in ACT2FN:
            raise ValueError(f"{where}: {key} {value!r} is not an activation function transformers has (it has "
                             f"{', '.join(sorted(ACT2FN))}); fix it")  # fmt: skip


def torch_dtype(dtype: str) -> Any:
    """``"auto"`` or the torch dtype named ``dtype`` (one of ``DTYPES``)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return "auto" if dtype == "auto" else getattr(torch, dtype)


def check_weight_files(source: Source) -> list[Path]:
    """The safetensors files of a folder source, each checked against its header; ``ValueError`` naming the file
    for a pickle-only folder, a folder without weights, a missing shard or a damaged file."""
    files = source.weight_files
    if not files:
        pickles = pickle_weights(source.path)
        if pickles:
            raise ValueError(f"{source.spec} holds pickle weights only ({', '.join(pickles)}); {PICKLE_ADVICE}")
        raise ValueError(
            f"{source.spec} has a config.json but no weights (model.safetensors); give a folder with its weights"
        )
    for file in files:
        if not file.is_file():
            raise ValueError(f"{file} is missing (named by model.safetensors.index.json); download or save it again")
        try:
            safetensors_header(file)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{file} is damaged ({first_line(error)}); download or save the model again") from None
    return files


def _weights_label(source: Source) -> str:
    """How messages name the weights: the file, the shards' index of a sharded folder, or the source."""
    if source.kind != "folder":
        return source.spec
    index = source.path / "model.safetensors.index.json"
    return str(index if index.is_file() else source.path / "model.safetensors")


def _new_geonorm_keys(source: Source, model: nn.Module) -> set[str]:
    """The keys of the GeoNorm tensors ``model`` has and the source's own settings do not: those may be missing
    (they start at their identity values); the others were saved with the checkpoint."""
    keys = geonorm_keys(model)
    if not source.is_geonorm:
        return keys
    stored = current_settings(source)
    style = NORM_STYLE_DECLARATIONS.get(stored.get("norm_style", GeoNormSettings.norm_style))
    learnable = style is not None and style.geodesic and stored.get("geo_learnable_step", False) is True
    had = {
        key
        for key in keys
        if (learnable and key.rsplit(".", 1)[-1] in ("step_scale", "step_bias"))
        or (style is not None and style.output_norms and ".output_norm." in key)
    }
    return keys - had


def load_model(source: Source, dtype: str = "auto", config: Any = None, allow_missing: bool = False) -> nn.Module:
    """The source's causal LM (stock or GeoNorm class, or the class of ``config`` when given), in eval mode and
    never marked quantised (a GGUF file is de-quantised to float32, then cast to ``dtype``).

    Raises ``ValueError`` (naming the file) for damaged, pickle-only or missing weights, and for any tensor that
    is missing, unexpected or of the wrong shape, except the ones GeoNorm adds on purpose (``allow_missing``
    lets missing and unexpected ones through with a warning).
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {
        **source.load_kwargs(),
        **NO_REMOTE_CODE,
        "output_loading_info": True,
        "ignore_mismatched_sizes": True,  # so they come back in the loading info; refused below
    }
    if source.kind == "folder":
        check_weight_files(source)
    if source.kind != "gguf":
        kwargs["dtype"] = torch_dtype(dtype)
        kwargs["use_safetensors"] = True
    if config is not None:
        kwargs["config"] = config
    try:
        model, info = AutoModelForCausalLM.from_pretrained(source.load_dir, **kwargs)
    except SafetensorError as error:
        raise ValueError(
            f"{source.spec}: a safetensors file is damaged ({first_line(error)}); download or save it again"
        ) from None
    except (OSError, ValueError, RuntimeError, KeyError, ImportError) as error:
        raise ValueError(f"cannot load the model from {source.spec}: {first_line(error)}") from None
    check_loading_info(_weights_label(source), info, _new_geonorm_keys(source, model), allow_missing)
    if source.kind == "gguf":
        dequantize_gguf(model)
        if dtype != "auto":
            model = model.to(torch_dtype(dtype))
    return model.eval()


GGUF_TOKENIZER_KEY = "tokenizer.ggml.model"  # the metadata a GGUF file holds its tokenizer under


def tokenizer_files(source: Source) -> list[str]:
    """The tokenizer files of a folder source, or of a GGUF file the file itself when its metadata holds a
    tokenizer; empty when the source has none (a Hub repository is not listed: see ``has_tokenizer``)."""
    if source.kind == "folder":
        return [str(source.path / name) for name in TOKENIZER_FILES if (source.path / name).is_file()]
    if source.kind == "gguf":
        return [str(source.path)] if GGUF_TOKENIZER_KEY in read_gguf_header(source.path).fields else []
    return []


def has_tokenizer(source: Source) -> bool:
    return source.kind == "hub" or bool(tokenizer_files(source))  # a Hub repository may have one


def load_tokenizer(source: Source) -> Any:
    """The source's tokenizer, or None when it truly has none (no tokenizer file in a folder, no tokenizer in a
    GGUF file's metadata, none in a Hub repository). ``ValueError`` naming the files and the cause when a tokenizer
    is there but does not load, or needs custom code: a figure measured without it would mean nothing."""
    if not has_tokenizer(source):
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.load_dir, **source.load_kwargs(), **NO_REMOTE_CODE)
    except Exception as error:  # noqa: BLE001 - whatever the tokenizer libraries raise, reported in one line
        if needs_custom_code(error):
            raise custom_code_error("tokenizer", source.spec, STANDARD_TOKENIZER) from None
        if source.kind == "hub":
            return None  # files are not listed before a download: a repository without a tokenizer fails alike
        files = ", ".join(tokenizer_files(source))
        raise ValueError(
            f"the tokenizer of {source.spec} ({files}) does not load: {first_line(error)}; repair or replace those "
            "files (save_pretrained of the model's tokenizer), or remove them to run without a tokenizer"
        ) from None
    return standard_tokenizer(tokenizer, source.spec, STANDARD_TOKENIZER)


def current_settings(source: Source) -> dict[str, Any]:
    """The GeoNorm settings stored in a GeoNorm source's config (empty for a stock source)."""
    if not source.is_geonorm:
        return {}
    return {k: v for k, v in source.config.items() if k in GeoNormSettings.names()}


def resolve_settings(given: dict[str, Any] | None, source: Source) -> dict[str, Any]:
    """The full settings for ``source``: its stored ones (or the defaults) updated with ``given``, validated for
    its number of layers. ``SettingsError`` for a bad given value; ``ValueError`` naming config.json for a bad
    stored one that ``given`` does not override."""
    given = dict(given or {})
    stored = {k: v for k, v in current_settings(source).items() if k not in given}
    try:
        GeoNormSettings(**stored).validate(source.num_layers)
        with contextlib.suppress(SettingsError):  # the model is built with all stored settings before conversion
            _check_for_source(_stored_settings(source), source)
    except ValueError as error:
        raise ValueError(f"{source.config_label}: {first_line(error)} (fix the file)") from None
    try:
        return _check_for_source(GeoNormSettings(**{**stored, **given}).validate(source.num_layers), source).to_dict()
    except ValueError as error:
        raise SettingsError(first_line(error)) from None


def _stored_settings(source: Source) -> GeoNormSettings:
    """All the settings stored in the source's config (``SettingsError`` where one is out of range)."""
    try:
        return GeoNormSettings(**current_settings(source)).validate(source.num_layers)
    except ValueError as error:
        raise SettingsError(first_line(error)) from None


def _check_for_source(settings: GeoNormSettings, source: Source) -> GeoNormSettings:
    """``settings`` if the source's block variant can run them (``blocks.check_layout_settings``: per-update lists
    on parallel blocks, the first token where layers cannot find it), before any weights are loaded."""
    config = built_config(source.config)
    if config is None:  # a config the stock class refuses is reported when the model loads
        return settings
    layout = family_for(source.model_type).layout.for_config(config)
    check_layout_settings(layout, config, settings, source.num_layers, source.stock_type)
    return settings
