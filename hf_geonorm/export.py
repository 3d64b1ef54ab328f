"""Writing GeoNorm folders that load anywhere: weights, a config with ``auto_map``, the flat modelling source
beside them (so ``trust_remote_code=True`` works where the plugin is not installed) and a model card.

``save_with_remote_code`` is the one writer the command line, the Trainer path and ``push`` share;
``atomic_directory`` gives them "nothing half-written": everything goes to a temporary folder next to the
target, which is renamed into place only when complete.

The remote code is ``modeling_geonorm.py`` plus every flat sibling it imports relatively (found the way
transformers finds them when it loads the folder). ``auto_map`` is written into the saved ``config.json``
only together with those files; the in-memory config is left as it was, so a later plain
``save_pretrained`` of the same model cannot produce an ``auto_map`` without its files.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .geometry import step_sizes
from .patching import family_for
from .settings import GeoNormSettings

PACKAGE_DIR = Path(__file__).resolve().parent
REMOTE_CODE_ENTRY = PACKAGE_DIR / "modeling_geonorm.py"
AUTO_CLASSES = ("AutoConfig", "AutoModel", "AutoModelForCausalLM")
CARD_TEMPLATE = "geonorm_model_card.md"
STYLE_DESCRIPTIONS = {
    "pre": "Pre-Norm, x + F(N(x)): the stock model",
    "post": "Post-Norm, N(x + F(x))",
    "sandwich": "Sandwich-Norm, x + N'(F(N(x)))",
    "deepnorm": "DeepNorm, N(alpha x + F(x))",
    "geo": "GeoNorm: geodesic steps on the sphere",
}


# ---- the remote code ----


def _relative_imports(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    found = re.findall(r"^\s*import\s+\.(\S+)\s*$", text, flags=re.MULTILINE)
    found += re.findall(r"^\s*from\s+\.(\S+)\s+import", text, flags=re.MULTILINE)
    return sorted(set(found))


def _module_closure(entry: Path) -> tuple[list[Path], list[str]]:
    """``entry`` and every file it reaches through ``from .x import``, recursively: (present, missing names)."""
    present: list[Path] = []
    missing: list[str] = []
    queue = [entry]
    seen: set[Path] = set()
    while queue:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        if not path.is_file():
            missing.append(path.name)
            continue
        present.append(path)
        queue.extend(path.parent / f"{name}.py" for name in _relative_imports(path))
    return present, missing


def remote_code_files() -> list[Path]:
    """The files copied beside a saved GeoNorm model: ``modeling_geonorm.py`` first, then its flat siblings."""
    present, missing = _module_closure(REMOTE_CODE_ENTRY)
    if missing:  # an installation problem, not a user mistake
        raise RuntimeError(f"the GeoNorm modelling source is incomplete: missing {', '.join(missing)} in {PACKAGE_DIR}")
    return present


def auto_map_for(model_type: str) -> dict[str, str]:
    """``auto_map`` entries for the GeoNorm family of ``model_type`` (stock ``X`` or ``geonorm_X``)."""
    family = family_for(model_type)
    module = REMOTE_CODE_ENTRY.stem
    classes = {
        "AutoConfig": family.config_class,
        "AutoModel": family.base_class,
        "AutoModelForCausalLM": family.causal_class,
    }
    for cls in classes.values():
        if cls.__module__.rsplit(".", 1)[-1] != module:
            raise RuntimeError(
                f"{cls.__name__} is defined in {cls.__module__}, not in the remote-code file {module}.py"
            )
    return {auto: f"{module}.{cls.__name__}" for auto, cls in classes.items()}


def write_remote_code(path: str | os.PathLike) -> list[str]:
    """Copy the modelling source flat into ``path``; returns the file names written."""
    path = Path(path)
    names = []
    for source in remote_code_files():
        shutil.copyfile(source, path / source.name)
        names.append(source.name)
    return names


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def add_remote_code(path: str | os.PathLike) -> dict[str, str]:
    """Make a GeoNorm folder saved by a plain ``save_pretrained`` (a Trainer checkpoint, say) self-contained:
    copy the modelling source into it and set ``auto_map`` in its ``config.json``. Returns the auto_map."""
    path = Path(path)
    config_path = path / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    model_type = config.get("model_type", "")
    if not str(model_type).startswith("geonorm_"):
        raise ValueError(f"{config_path} has model_type {model_type!r}; remote code is written for GeoNorm models only")
    auto_map = auto_map_for(model_type)
    write_remote_code(path)
    config["auto_map"] = auto_map
    _write_json(config_path, config)
    return auto_map


@dataclass
class RemoteCodeStatus:
    """What a folder's ``auto_map`` points at and whether those files are there."""

    auto_map: dict[str, Any]
    files: list[str]
    missing: list[str]

    @property
    def present(self) -> bool:
        return bool(self.auto_map)

    @property
    def complete(self) -> bool:
        return self.present and not self.missing


def check_remote_code(path: str | os.PathLike, config: dict[str, Any] | None = None) -> RemoteCodeStatus:
    """Read ``auto_map`` of the folder's config and check every module it names (and their relative imports)."""
    path = Path(path)
    if config is None:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    auto_map = config.get("auto_map") or {}
    files: list[str] = []
    missing: list[str] = []
    for reference in auto_map.values():
        refs = reference if isinstance(reference, (list, tuple)) else [reference]
        for ref in refs:
            if not isinstance(ref, str) or "." not in ref:
                continue
            module = ref.split("--")[-1].rsplit(".", 1)[0]
            present, absent = _module_closure(path / f"{module}.py")
            files += [p.name for p in present if p.name not in files]
            missing += [name for name in absent if name not in missing]
    return RemoteCodeStatus(dict(auto_map), files, missing)


# ---- the model card ----


@dataclass
class CardInfo:
    """What the model card says beyond the config: where the model came from and how it was evaluated.

    ``evaluation`` holds lines such as "perplexity on X: 14.50 before, 14.50 after conversion".
    ``repo_id`` is used in the loading snippets (the Hub id the folder will be pushed to, when known).
    """

    model_name: str | None = None
    base_model: str | None = None
    license: str | None = None
    language: str | list[str] | None = None
    source: str | None = None
    repo_id: str | None = None
    evaluation: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    num_parameters: int | None = None


def card_template() -> str:
    """The Jinja template of the model card (package data of ``hf_geonorm.model_cards``; the repository's
    ``model_cards/`` folder when running from a source checkout)."""
    try:
        return resources.files("hf_geonorm.model_cards").joinpath(CARD_TEMPLATE).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        fallback = PACKAGE_DIR.parent / "model_cards" / CARD_TEMPLATE
        if not fallback.is_file():
            raise FileNotFoundError(f"the model card template {CARD_TEMPLATE} is not installed") from None
        return fallback.read_text(encoding="utf-8")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("hf-geonorm")
    except Exception:  # noqa: BLE001 - running from a source tree
        return ""


def _human(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def render_model_card(
    config: Any,
    info: CardInfo | None = None,
    has_tokenizer: bool = False,
    remote_code: list[str] | None = None,
) -> Any:
    """The ``huggingface_hub.ModelCard`` of a GeoNorm model with ``config``."""
    from huggingface_hub import ModelCard, ModelCardData

    info = info or CardInfo()
    family = family_for(_geonorm_type(config) or config.model_type)
    settings = GeoNormSettings.from_object(config)
    num_layers = config.num_hidden_layers
    steps = []
    if settings.norm_style == "geo":
        max_angle = settings.geo_max_angle
        for k, a in enumerate(step_sizes(settings.geo_decay, settings.geo_alpha, num_layers), start=1):
            steps.append({"layer": k, "a": a, "max_rotation": max_rotation(a, max_angle)})
    tags = ["geonorm", family.stock_type, family.model_type, f"norm-style-{settings.norm_style}"]
    tags += [t for t in info.tags if t not in tags]
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=tags,
        base_model=info.base_model,
        license=info.license,
        language=info.language,
    )
    name = info.model_name or (
        f"{info.base_model.split('/')[-1]}-GeoNorm" if info.base_model else f"GeoNorm {family.stock_type}"
    )
    template_kwargs = dict(
        model_name=name,
        stock_type=family.stock_type,
        model_type=family.model_type,
        base_model=info.base_model,
        source=info.source,
        tool_version=_version(),
        num_layers=num_layers,
        hidden_size=getattr(config, "hidden_size", "?"),
        num_parameters=_human(info.num_parameters) if info.num_parameters else None,
        settings=settings.to_dict(),
        style_description=STYLE_DESCRIPTIONS[settings.norm_style],
        steps=steps,
        evaluation=info.evaluation,
        repo_id=info.repo_id or "path/to/this/folder",
        has_tokenizer=has_tokenizer,
        remote_code_files=remote_code or [p.name for p in remote_code_files()],
    )
    card = ModelCard.from_template(data, template_str=card_template(), **template_kwargs)
    return ModelCard(re.sub(r"\n{3,}", "\n\n", card.content))


# ---- writing folders ----


def _safetensors_header(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100_000_000:
            raise ValueError(f"{path.name} is not a safetensors file")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has no safetensors header")
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    expected = 8 + size + max(ends, default=0)
    actual = path.stat().st_size
    if actual != expected:
        raise ValueError(f"{path.name} is truncated or damaged: {actual} bytes, its header describes {expected}")
    return header


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The safetensors files of a saved model (one file, or the shards its index names)."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        return [path / shard for shard in shards]
    single = path / "model.safetensors"
    return [single] if single.is_file() else []


def saved_parameter_count(path: str | os.PathLike) -> tuple[int, dict[str, int]] | None:
    """(number of parameters, count per dtype) from the safetensors headers alone, or None without weights.

    Tied weights are stored once, so this is the number of distinct parameters (and buffers saved with them).
    """
    files = weight_files(path)
    if not files:
        return None
    total = 0
    by_dtype: dict[str, int] = {}
    for file in files:
        for name, entry in _safetensors_header(file).items():
            if name == "__metadata__":
                continue
            n = math.prod(entry["shape"])
            total += n
            by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + n
    return total, by_dtype


def _saved_parameter_count(path: Path) -> int | None:
    try:
        counted = saved_parameter_count(path)
    except (OSError, ValueError, KeyError):
        return None
    return counted[0] if counted else None


def _geonorm_type(config: Any) -> str | None:
    """``geonorm_X`` of a GeoNorm config. The class's model_type counts: a config loaded from a stock checkpoint
    and then patched by ``apply_geonorm`` can still carry the stock ``model_type`` as an instance attribute."""
    for model_type in (getattr(type(config), "model_type", ""), getattr(config, "model_type", "")):
        if isinstance(model_type, str) and model_type.startswith("geonorm_"):
            return model_type
    return None


@contextlib.contextmanager
def _auto_map_set(config: Any, auto_map: dict[str, str]) -> Iterator[None]:
    had = "auto_map" in vars(config)
    previous = vars(config).get("auto_map")
    config.auto_map = dict(auto_map)
    try:
        yield
    finally:
        if had:
            config.auto_map = previous
        else:
            with contextlib.suppress(AttributeError):
                delattr(config, "auto_map")


def save_with_remote_code(
    model: Any,
    path: str | os.PathLike,
    tokenizer: Any = None,
    card_info: CardInfo | None | bool = None,
    **save_kwargs: Any,
) -> Path:
    """Save a GeoNorm model so that it loads with and without the plugin.

    Writes safetensors weights, ``config.json`` with ``auto_map`` (AutoConfig, AutoModel,
    AutoModelForCausalLM), the flat modelling source, the tokenizer when given and a ``README.md`` model card
    (``card_info=False`` skips it). ``path`` is created when missing; files already there are overwritten
    (use ``atomic_directory`` for an all-or-nothing write). The model and its config are left unchanged.
    """
    target = model
    if type(target).__module__.startswith("peft"):
        raise ValueError("save_with_remote_code saves full models; merge the adapters first (merge_and_unload())")
    config = target.config
    model_type = _geonorm_type(config)
    if model_type is None:
        raise ValueError(
            f"save_with_remote_code writes GeoNorm models; this one is {config.model_type!r} "
            "(convert it first: hf_geonorm.convert(model) or apply_geonorm(model))"
        )
    if getattr(target, "hf_quantizer", None) is not None:
        raise ValueError(
            "the model is marked quantised; de-quantise it first (a GGUF-loaded model: set model.hf_quantizer = None "
            "and delete config.quantization_config)"
        )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    auto_map = auto_map_for(model_type)
    with _auto_map_set(config, auto_map):
        target.save_pretrained(path, **save_kwargs)
    written = write_remote_code(path)
    _check_saved_config(path, auto_map, model_type)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    if card_info is not False:
        info = card_info if isinstance(card_info, CardInfo) else CardInfo()
        if info.num_parameters is None:
            info.num_parameters = _saved_parameter_count(path)
        card = render_model_card(config, info, has_tokenizer=tokenizer is not None, remote_code=written)
        card.save(path / "README.md")
    return path


def _check_saved_config(path: Path, auto_map: dict[str, str], model_type: str) -> None:
    """Make the written config.json name the GeoNorm type and our auto_map (a class registered elsewhere with
    register_for_auto_class, or a stale model_type, could have written something else), then check the files."""
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if config.get("auto_map") != auto_map or config.get("model_type") != model_type:
        config["auto_map"] = auto_map
        config["model_type"] = model_type
        _write_json(path / "config.json", config)
    status = check_remote_code(path, config)
    if not status.complete:
        raise RuntimeError(f"the saved folder {path} misses remote-code files: {', '.join(status.missing)}")


def save_config_with_remote_code(config: Any, path: str | os.PathLike, tokenizer: Any = None) -> Path:
    """Save a GeoNorm config (no weights: a from-scratch model) with ``auto_map`` and the modelling source."""
    model_type = _geonorm_type(config)
    if model_type is None:
        raise ValueError(f"expected a GeoNorm config, got model_type {config.model_type!r}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    auto_map = auto_map_for(model_type)
    with _auto_map_set(config, auto_map):
        config.save_pretrained(path)
    write_remote_code(path)
    _check_saved_config(path, auto_map, model_type)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def _missing_ancestors(path: Path) -> list[Path]:
    missing = []
    for parent in path.parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_directory(output_dir: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary folder next to ``output_dir``; when the block succeeds it replaces
    ``output_dir``, when it fails (or is interrupted) it is removed and ``output_dir`` is left as it was.

    An existing non-empty ``output_dir`` raises ``FileExistsError`` unless ``force``.
    """
    output = Path(output_dir).absolute()
    if output.exists() and not output.is_dir():
        raise FileExistsError(f"{output_dir} exists and is not a folder")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise FileExistsError(f"{output_dir} exists and is not empty; pass --force to replace it")
    created = _missing_ancestors(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        if output.exists():
            old = output.with_name(f".{output.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(output, old)
            try:
                os.replace(tmp, output)
            except BaseException:
                os.replace(old, output)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for parent in created:  # deepest first
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise


def max_rotation(a: float, max_angle: float | None) -> float:
    """The largest angle one update with step size ``a`` can make (inf without a clamp)."""
    return math.inf if max_angle is None else min(a * max_angle, max_angle)
