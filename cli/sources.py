"""Where a model comes from: a local checkpoint folder, a ``.gguf`` file or a Hugging Face Hub id.

``resolve_source`` reads only the config (cheap) and turns every user mistake into a one-line
``click.ClickException``; ``load_model`` and ``load_tokenizer`` load the rest.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "spiece.model",
    "vocab.txt",
)


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an error message, at most ``limit`` characters."""
    text = str(error).strip() or type(error).__name__
    line = text.splitlines()[0].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass
class Source:
    """A resolved SOURCE argument."""

    spec: str
    kind: str  # "folder", "gguf" or "hub"
    load_dir: str  # what from_pretrained gets
    gguf_file: str | None
    config: dict[str, Any]  # the config as a dict (model_type and sizes)
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
    def num_layers(self) -> int:
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if isinstance(self.config.get(key), int):
                return self.config[key]
        raise click.ClickException(f"{self.spec}: the config has no number of layers (num_hidden_layers)")

    def load_kwargs(self) -> dict[str, Any]:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def _looks_like_path(spec: str) -> bool:
    return (
        spec.startswith((".", "/", "~"))
        or spec.count("/") > 1
        or os.sep != "/"
        and os.sep in spec
        or spec.lower().endswith((".gguf", ".json", ".safetensors", ".bin"))
    )


def read_config_json(folder: Path, spec: str) -> dict[str, Any]:
    """The folder's config.json as a dict; a missing or corrupt file is a one-line error."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise click.ClickException(f"{spec} has no config.json: not a transformers checkpoint folder")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise click.ClickException(f"{config_path} is corrupt (not valid JSON: {first_line(error)})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise click.ClickException(f"{config_path} is corrupt: it has no model_type")
    return config


def _gguf_config(path: Path, spec: str) -> dict[str, Any]:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "reading .gguf files needs the gguf package: pip install gguf (or hf-geonorm[gguf])"
        ) from None
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as error:  # noqa: BLE001 - a corrupt or unsupported file, reported in one line
        raise click.ClickException(f"cannot read {spec} as a GGUF checkpoint: {first_line(error)}") from None
    return config.to_dict()


def _hub_config(spec: str) -> dict[str, Any]:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(spec)
    except HFValidationError:
        raise click.ClickException(
            f"{spec}: no such file or folder, and not a valid Hugging Face Hub model id"
        ) from None
    from huggingface_hub import is_offline_mode
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(spec)
    except (OSError, ValueError, KeyError) as error:
        if is_offline_mode():
            reason = "the Hub is offline (HF_HUB_OFFLINE=1) and the model is not in the local cache"
        else:
            reason = first_line(error)
        raise click.ClickException(
            f"{spec} is not a local folder or .gguf file, and loading it from the Hugging Face Hub failed: {reason}"
        ) from None
    return config.to_dict()


def resolve_source(spec: str) -> Source:
    """Classify SOURCE and read its config; check that GeoNorm supports its architecture."""
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise click.ClickException(
                f"{spec} is a file but not a .gguf checkpoint; SOURCE is a checkpoint folder, a .gguf file or a Hub id"
            )
        source = Source(spec, "gguf", str(path.parent), path.name, _gguf_config(path, spec), path)
    elif path.is_dir():
        source = Source(spec, "folder", str(path), None, read_config_json(path, spec), path)
    elif _looks_like_path(spec):
        raise click.ClickException(f"{spec}: no such file or folder")
    else:
        source = Source(spec, "hub", spec, None, _hub_config(spec))
    check_supported(source.model_type)
    return source


def check_supported(model_type: str) -> None:
    import hf_geonorm

    try:
        hf_geonorm.family_for(model_type)
    except ValueError:
        supported = hf_geonorm.supported_architectures()
        raise click.ClickException(
            f"unsupported architecture {model_type!r}: GeoNorm supports {len(supported)} decoder-only model types "
            "(list them with: hf-geonorm architectures)"
        ) from None


def _torch_dtype(dtype: str) -> Any:
    import torch

    return "auto" if dtype == "auto" else getattr(torch, dtype)


def dequantize_gguf(model: Any) -> Any:
    """A GGUF-loaded model is de-quantised already but marked quantised: clear the marks so it saves and
    trains as a plain checkpoint (its logits do not change)."""
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


def load_model(source: Source, dtype: str = "auto") -> Any:
    """The source's causal LM (stock or GeoNorm class), in eval mode, never marked quantised."""
    from transformers import AutoModelForCausalLM

    import hf_geonorm  # noqa: F401 - registers the geonorm_* types

    kwargs = source.load_kwargs()
    if source.kind != "gguf":
        kwargs["dtype"] = _torch_dtype(dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(source.load_dir, **kwargs)
    except Exception as error:  # noqa: BLE001 - corrupt or missing weights, a missing package: one line
        raise click.ClickException(f"cannot load the model from {source.spec}: {first_line(error)}") from None
    if source.kind == "gguf":
        dequantize_gguf(model)
        if dtype != "auto":
            model = model.to(_torch_dtype(dtype))
    return model.eval()


def apply_settings(model: Any, settings: dict[str, Any]) -> Any:
    """``hf_geonorm.apply_geonorm`` in place, as a one-line error when the settings do not fit the model.

    A model loaded with ``from_pretrained`` keeps ``model_type`` as an instance attribute of its config, which
    hides the GeoNorm config class's ``geonorm_X`` after apply_geonorm swaps the class; it is reset here so
    the saved config.json names the GeoNorm type.
    """
    from hf_geonorm import apply_geonorm

    try:
        apply_geonorm(model, **settings)
    except ValueError as error:
        raise click.ClickException(f"cannot convert: {first_line(error)}") from None
    expected = type(model.config).model_type
    if model.config.model_type != expected:
        model.config.model_type = expected
    return model


def has_tokenizer(source: Source) -> bool:
    if source.kind == "folder":
        return any((source.path / name).is_file() for name in TOKENIZER_FILES)
    return True  # gguf files carry one; a Hub repo may


def load_tokenizer(source: Source, quiet: bool = False) -> Any:
    """The source's tokenizer, or None when it has none (a warning on stderr when one exists but fails)."""
    if not has_tokenizer(source):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.load_dir, **source.load_kwargs())
    except Exception as error:  # noqa: BLE001 - a source without a usable tokenizer is still convertible
        if not quiet and source.kind != "hub":
            click.echo(f"warning: could not load the tokenizer of {source.spec}: {first_line(error)}", err=True)
        return None


def card_metadata(source: Source) -> dict[str, Any]:
    """base_model and license for the model card, when the source tells them."""
    found: dict[str, Any] = {}
    if source.kind == "hub":
        found["base_model"] = source.spec
    readme = source.path / "README.md" if source.kind == "folder" else None
    if source.kind == "hub":
        try:
            from huggingface_hub import ModelCard

            card = ModelCard.load(source.spec)
            found.update(_card_fields(card.data.to_dict()))
        except Exception:  # noqa: BLE001 - the card is optional
            pass
    elif readme is not None and readme.is_file():
        try:
            from huggingface_hub import ModelCard

            data = ModelCard.load(readme).data.to_dict()
            found.update(_card_fields(data))
        except Exception:  # noqa: BLE001
            pass
    elif source.kind == "gguf":
        found.update(_gguf_metadata(source.path))
    return found


def _card_fields(data: dict[str, Any]) -> dict[str, Any]:
    found = {}
    if data.get("license"):
        found["license"] = data["license"]
    if data.get("language"):
        found["language"] = data["language"]
    base = data.get("base_model")
    # a converted GeoNorm folder names its own base model; keep that lineage
    if base and "geonorm" in (data.get("tags") or []):
        found["base_model"] = base
    return found


def _gguf_metadata(path: Path) -> dict[str, Any]:
    try:
        from gguf import GGUFReader

        fields = GGUFReader(str(path)).fields
    except Exception:  # noqa: BLE001
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
