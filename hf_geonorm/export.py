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
CARD_REPO_PLACEHOLDER = "path/to/this/folder"
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
    ``angles`` is the summary ``hf-geonorm angles --json`` prints (``lower_third_mean_angle``,
    ``upper_third_mean_angle``, ``lower_to_upper_ratio``), optionally with ``text`` and ``tokens`` (what it was
    measured on) and ``sublayers`` (its per-sublayer rows: ``layer``, ``sublayer``, ``angle``).
    ``repo_id`` is used in the loading snippets (the Hub id the folder will be pushed to, when known; otherwise
    the placeholder ``CARD_REPO_PLACEHOLDER``, which ``push_folder`` replaces by the repository it pushes to).
    """

    model_name: str | None = None
    base_model: str | None = None
    license: str | None = None
    language: str | list[str] | None = None
    source: str | None = None
    repo_id: str | None = None
    evaluation: list[str] = field(default_factory=list)
    angles: dict[str, Any] | None = None
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
        angles=_angles_for_card(info.angles),
        repo_id=info.repo_id or CARD_REPO_PLACEHOLDER,
        has_tokenizer=has_tokenizer,
        remote_code_files=remote_code or [p.name for p in remote_code_files()],
    )
    card = ModelCard.from_template(data, template_str=card_template(), **template_kwargs)
    return ModelCard(re.sub(r"\n{3,}", "\n\n", card.content))


def _angles_for_card(angles: dict[str, Any] | None) -> dict[str, Any] | None:
    """The angles summary in the form the template reads; rows with a non-numeric angle are dropped."""
    if not angles:
        return None
    keys = ("lower_third_mean_angle", "upper_third_mean_angle", "lower_to_upper_ratio")
    missing = [k for k in keys if not isinstance(angles.get(k), (int, float))]
    if missing:
        raise ValueError(f"CardInfo.angles needs the numbers {', '.join(missing)} (hf-geonorm angles --json: summary)")
    rows = [
        {"layer": row["layer"], "sublayer": row.get("sublayer", ""), "angle": float(row["angle"])}
        for row in angles.get("sublayers") or []
        if isinstance(row, dict) and isinstance(row.get("angle"), (int, float)) and "layer" in row
    ]
    return {**{k: float(angles[k]) for k in keys}, "text": angles.get("text"), "tokens": angles.get("tokens"),
            "sublayers": rows}  # fmt: skip


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


# ---- sharing: model-card validation, folder checks, push ----

# The license identifiers the Hub accepts in card metadata: the list of hub-docs' repositories-licenses.md (the
# Hub's reference) and the Llama 3 licenses real Meta cards use. A license missing here: license: other + license_name.
HUB_LICENSES = frozenset(
    """
    apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m bigscience-bloom-rail-1.0 bigcode-openrail-m
    afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0 cc-by-2.0
    cc-by-2.5 cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0 cc-by-nc-4.0 cc-by-nd-4.0
    cc-by-nc-nd-3.0 cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 cdla-sharing-1.0
    cdla-permissive-1.0 cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0 eupl-1.1 agpl-3.0 gfdl gpl
    gpl-2.0 gpl-3.0 lgpl lgpl-2.1 lgpl-3.0 isc lppl-1.3c ms-pl mpl-2.0 odc-by odbl openrail++ osl-3.0 postgresql
    ofl-1.1 ncsa unlicense zlib pddl lgpl-lr deepfloyd-if-license llama2 llama3 llama3.1 llama3.2 llama3.3 gemma
    unknown other
    """.split()
)
# The pipeline tags the Hub knows (huggingface.js, packages/tasks/src/pipelines.ts).
HUB_PIPELINE_TAGS = frozenset(
    """
    biology text-classification token-classification table-question-answering question-answering
    zero-shot-classification translation summarization feature-extraction text-generation text2text-generation
    fill-mask sentence-similarity text-to-speech text-to-audio automatic-speech-recognition audio-to-audio
    audio-classification audio-text-to-text voice-activity-detection depth-estimation image-classification
    object-detection image-segmentation text-to-image image-to-text image-to-image image-to-video
    unconditional-image-generation video-classification reinforcement-learning robotics tabular-classification
    tabular-regression tabular-to-text table-to-text multiple-choice text-ranking text-retrieval
    time-series-forecasting text-to-video image-text-to-text visual-question-answering document-question-answering
    zero-shot-image-classification graph-ml mask-generation zero-shot-object-detection text-to-3d image-to-3d
    image-feature-extraction video-text-to-text keypoint-detection visual-document-retrieval any-to-any other
    """.split()
)
_LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*$")
_LICENSE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_LIBRARY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _is_repo_id(value: Any) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(value, str) or value.startswith(("http://", "https://")):
        return False
    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def _string_list(value: Any) -> list[str] | None:
    """``value`` as a list of non-empty strings (a single string counts), or None when it is not one."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        return None
    return items


def validate_card(card: Any, geonorm: bool = True) -> list[str]:
    """Check a model card offline; return the problems found (an empty list: the card is valid).

    ``card`` is the card text, a path to a README.md or a ``huggingface_hub.ModelCard``. What is checked:

    - the metadata block is found exactly as the Hub finds it (huggingface_hub's ``REGEX_YAML_BLOCK``, "the same
      regex as in the Hub server"), is valid YAML and a mapping;
    - huggingface_hub parses it (``ModelCard``/``ModelCardData``, strict: a malformed ``model-index`` is an error)
      and its metadata survives a render/parse round trip unchanged;
    - the field types of the published metadata spec (hub-docs ``modelcard.md``): ``license`` one of the Hub's
      license identifiers (``other`` needs ``license_name``), ``pipeline_tag`` one of the Hub's tasks,
      ``library_name`` a library name, ``tags``/``datasets``/``metrics`` lists of strings, ``language`` ISO codes,
      ``base_model`` and ``datasets`` well-formed Hub ids;
    - with ``geonorm``: what a GeoNorm card must say (``library_name: transformers``, ``pipeline_tag:
      text-generation``, the ``geonorm`` tag).

    Not checked (the Hub's ``/api/validate-yaml``, which ``ModelCard.validate()`` calls, is online only): that
    ``base_model`` and ``datasets`` exist on the Hub, and any server-side rule beyond the published spec.
    """
    import yaml
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    if isinstance(card, ModelCard):
        text = str(card)
    elif isinstance(card, Path) or (isinstance(card, str) and "\n" not in card and Path(card).is_file()):
        text = Path(card).read_text(encoding="utf-8")
    else:
        text = str(card)
    match = REGEX_YAML_BLOCK.search(text)
    if not match:
        return ["no YAML metadata block (a '---' line, the metadata, a '---' line) at the top"]
    try:
        raw = yaml.safe_load(match.group(2))
    except yaml.YAMLError as error:
        return [f"the metadata is not valid YAML: {' '.join(str(error).split())}"]
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        return [f"the metadata is a YAML {type(raw).__name__}, not a mapping of fields"]
    try:
        parsed = ModelCard(text)
    except Exception as error:  # noqa: BLE001 - any parse error is a problem of the card
        return [f"huggingface_hub cannot parse the metadata: {' '.join(str(error).split())[:300]}"]
    problems: list[str] = []
    data = parsed.data.to_dict()
    if yaml.safe_load(parsed.data.to_yaml()) != data or ModelCard(str(parsed)).data.to_dict() != data:
        problems.append("the metadata does not survive a huggingface_hub render/parse round trip")

    license_ = raw.get("license")
    if license_ is not None:
        if not isinstance(license_, str):
            problems.append(f"license must be one license identifier (a string), not {license_!r}")
        elif license_ not in HUB_LICENSES:
            problems.append(f"license {license_!r} is not a Hub license identifier (e.g. apache-2.0, mit; or other)")
        elif license_ == "other":
            name = raw.get("license_name")
            if not isinstance(name, str) or not _LICENSE_NAME.match(name):
                problems.append("license: other needs license_name (lowercase letters, digits, '-', '.', '_')")
    if "license_link" in raw and not isinstance(raw["license_link"], str):
        problems.append("license_link must be a string (a URL or a file in the repository)")
    tag = raw.get("pipeline_tag")
    if tag is not None and (not isinstance(tag, str) or tag not in HUB_PIPELINE_TAGS):
        problems.append(f"pipeline_tag {tag!r} is not a Hub task (e.g. text-generation)")
    library = raw.get("library_name")
    if library is not None and (not isinstance(library, str) or not _LIBRARY_NAME.match(library)):
        problems.append(f"library_name must be a library name such as transformers, not {library!r}")
    for key in ("tags", "datasets", "metrics"):
        if key in raw and (raw[key] is None or isinstance(raw[key], str) or _string_list(raw[key]) is None):
            problems.append(f"{key} must be a list of non-empty strings")
    if "language" in raw:
        languages = _string_list(raw["language"])
        if languages is None or not all(_LANGUAGE_CODE.match(code) for code in languages):
            problems.append(f"language must be ISO 639 codes (e.g. en, or a list of them), not {raw['language']!r}")
    if "base_model" in raw:
        bases = _string_list(raw["base_model"])
        if bases is None or not all(_is_repo_id(b) for b in bases):
            problems.append(f"base_model must be a Hub model id (or a list of them), not {raw['base_model']!r}")
    if isinstance(_string_list(raw.get("datasets")), list) and not all(_is_repo_id(d) for d in raw["datasets"]):
        problems.append("datasets must be Hub dataset ids")
    if geonorm:
        if library != "transformers":
            problems.append(f"a GeoNorm card needs library_name: transformers (found {library!r})")
        if tag != "text-generation":
            problems.append(f"a GeoNorm card needs pipeline_tag: text-generation (found {tag!r})")
        if "geonorm" not in (_string_list(raw.get("tags")) or []):
            problems.append("a GeoNorm card needs the tag geonorm")
    return problems


def write_model_card(path: str | os.PathLike, card_info: CardInfo | None = None) -> Path:
    """Render the model card of the saved GeoNorm folder ``path`` from its ``config.json`` (a Trainer
    checkpoint, say, or to add evaluation numbers) and write it to ``path/README.md``.

    Without ``card_info``, the base_model, license, language, tags, source and repository id of an existing card
    are kept, and the lines of its Evaluation list (the angles summary is not: pass it again in
    ``CardInfo.angles``).
    """
    path = Path(path)
    config_dict = json.loads((path / "config.json").read_text(encoding="utf-8"))
    model_type = config_dict.get("model_type", "")
    if not str(model_type).startswith("geonorm_"):
        raise ValueError(f"{path}/config.json has model_type {model_type!r}; cards are written for GeoNorm models")
    config = family_for(model_type).config_class.from_dict(config_dict)
    info = card_info
    if info is None:
        info = CardInfo()
        readme = path / "README.md"
        if readme.is_file():
            from huggingface_hub import ModelCard

            old_card = ModelCard.load(readme)
            old = old_card.data.to_dict()
            info = CardInfo(
                base_model=old.get("base_model"),
                license=old.get("license"),
                language=old.get("language"),
                tags=[t for t in old.get("tags") or [] if isinstance(t, str)],
            )
            section = re.search(r"^## Evaluation\n(.*?)(?=^## |\Z)", old_card.text, re.MULTILINE | re.DOTALL)
            info.evaluation = re.findall(r"^- (.+)$", section.group(1), re.MULTILINE) if section else []
            source = re.search(r"written by `hf-geonorm`[^\n]* from `([^`]+)`", old_card.text)
            info.source = source.group(1) if source else None
            named = re.search(r'from_pretrained\("([^"]+)"', old_card.text)
            if named and named.group(1) != CARD_REPO_PLACEHOLDER:
                info.repo_id = named.group(1)
    if info.num_parameters is None:
        info.num_parameters = _saved_parameter_count(path)
    has_tokenizer = any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    status = check_remote_code(path, config_dict)
    card = render_model_card(config, info, has_tokenizer=has_tokenizer, remote_code=status.files or None)
    card.save(path / "README.md")
    return path / "README.md"


class NotShareable(ValueError):
    """A folder that is not complete enough to push, or a push that cannot start (no token, bad repo id)."""


# Never uploaded: hidden files (the temporary files of an interrupted write), byte code, Trainer state.
PUSH_IGNORED = (".*", "__pycache__", "*.pyc", "optimizer.pt", "scheduler.pt", "rng_state*.pth", "training_args.bin",
                "trainer_state.json", "scaler.pt")  # fmt: skip


def shareable_files(path: str | os.PathLike) -> list[str]:
    """The files of a folder ``push_folder`` uploads (relative POSIX paths, sorted): everything but
    ``PUSH_IGNORED`` (in any folder) and symbolic links that lead out of the folder."""
    import fnmatch

    root = Path(path).resolve()
    names = []
    for file in sorted(Path(path).rglob("*")):
        relative = file.relative_to(path)
        if any(fnmatch.fnmatch(part, pattern) for part in relative.parts for pattern in PUSH_IGNORED):
            continue
        if file.is_file() and root in file.resolve().parents:
            names.append(relative.as_posix())
    return names


def check_shareable(path: str | os.PathLike) -> list[str]:
    """Why the folder ``path`` cannot be pushed as a GeoNorm model (an empty list: it can).

    It needs safetensors weights whose headers match their sizes, a ``config.json`` of a GeoNorm type this
    hf-geonorm supports, complete remote code (``auto_map`` for AutoConfig, AutoModel and AutoModelForCausalLM
    naming this family's classes, every file they import present and compiling) and a README.md model card that
    passes ``validate_card``.
    """
    path = Path(path)
    if not path.exists():
        return [f"{path}: no such folder"]
    if not path.is_dir():
        return [f"{path} is a file; push takes a model folder"]
    config_path = path / "config.json"
    if not config_path.is_file():
        return [f"{path} has no config.json: not a saved model folder"]
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        return [f"{config_path} is not valid JSON ({' '.join(str(error).split())})"]
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str):
        return [f"{config_path} has no model_type"]
    if not model_type.startswith("geonorm_"):
        return [f"{path} holds a {model_type!r} model, not a GeoNorm one: convert it first (hf-geonorm convert)"]
    try:
        expected_map = auto_map_for(model_type)
    except ValueError:
        return [f"{path} is {model_type!r}, which this hf-geonorm does not support"]
    problems = []
    problems += _weight_problems(path)
    problems += _remote_code_problems(path, config, expected_map)
    readme = path / "README.md"
    if not readme.is_file():
        problems.append(
            f"{path} has no README.md model card: write one with hf_geonorm.export.write_model_card({str(path)!r})"
        )
    else:
        problems += [f"README.md: {p}" for p in validate_card(readme)]
    return problems


def _weight_problems(path: Path) -> list[str]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return [f"{index.name} is not a valid safetensors index"]
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            return [f"the weights are incomplete: {', '.join(missing)} (named by {index.name}) missing"]
        files = [path / s for s in shards]
    else:
        files = weight_files(path)
    if not files:
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            return [f"{path} has pickle weights only; GeoNorm folders share safetensors (re-save the model)"]
        return [f"{path} has no weights (model.safetensors): a config-only folder has nothing to share yet"]
    problems = []
    for file in files:
        try:
            _safetensors_header(file)
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            problems.append(f"{file.name} is damaged: {' '.join(str(error).split())}")
    return problems


def _remote_code_problems(path: Path, config: dict[str, Any], expected: dict[str, str]) -> list[str]:
    hint = f"add it with hf_geonorm.export.add_remote_code({str(path)!r})"
    auto_map = config.get("auto_map")
    if not auto_map:
        return [f"config.json has no auto_map, so the model does not load without hf-geonorm: {hint}"]
    if not isinstance(auto_map, dict):
        return ["config.json: auto_map is not a mapping"]
    wrong = [k for k, v in expected.items() if auto_map.get(k) != v]
    if wrong:
        return [f"config.json: auto_map does not name this family's classes for {', '.join(wrong)}: {hint}"]
    status = check_remote_code(path, config)
    if status.missing:
        return [f"the remote code is incomplete: {', '.join(status.missing)} missing ({hint})"]
    problems = []
    for name in status.files:
        try:
            compile((path / name).read_text(encoding="utf-8"), name, "exec")
        except (SyntaxError, ValueError, UnicodeDecodeError) as error:
            problems.append(f"the remote code file {name} does not compile ({type(error).__name__}: {error})")
    return problems


@dataclass
class PushResult:
    """Where ``push_folder`` put the files."""

    repo_id: str
    revision: str
    commit_url: str
    commit_oid: str
    files: list[str]
    pr_url: str | None = None


def resolve_token(token: str | None = None) -> str:
    """``token``, else the usual Hugging Face login (HF_TOKEN, the token file of ``hf auth login``)."""
    from huggingface_hub import get_token

    token = token or get_token()
    if not token:
        raise NotShareable("no Hugging Face token: set HF_TOKEN or log in with `hf auth login` (write access)")
    return token


def check_repo_id(repo_id: str) -> str:
    """``repo_id`` if it is a well-formed Hub model id ("name" or "namespace/name")."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise NotShareable(f"{repo_id!r} is not a valid Hub repository id: {str(error).splitlines()[0]}") from None
    if repo_id.count("/") > 1 or repo_id.startswith(("datasets/", "spaces/")) or not repo_id.strip("/"):
        raise NotShareable(f"{repo_id!r} is not a model repository id (namespace/name)")
    return repo_id


def _prepare_target(api: Any, repo_id: str, private: bool | None, revision: str | None) -> str:
    """Create the repository when missing (and the branch ``revision``); return the full repository id."""
    repo_id = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True).repo_id
    if revision and revision != "main" and not revision.startswith("refs/"):
        api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
    return repo_id


def _card_for_repo(path: Path, repo_id: str) -> bytes:
    """README.md with the placeholder in its loading examples replaced by the repository id."""
    return (path / "README.md").read_bytes().replace(f'"{CARD_REPO_PLACEHOLDER}"'.encode(), f'"{repo_id}"'.encode())


def push_folder(
    path: str | os.PathLike,
    repo_id: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    token: str | None = None,
    create_pr: bool = False,
) -> PushResult:
    """Upload the GeoNorm folder ``path`` to the Hub model repository ``repo_id`` in one commit.

    Refuses (``NotShareable``) a folder ``check_shareable`` finds incomplete, a malformed repository id and a
    missing token before anything is sent. Creates the repository when missing (``private`` applies then
    only) and the branch ``revision`` when it names a missing one. The endpoint is huggingface_hub's
    (``HF_ENDPOINT``). Files in ``PUSH_IGNORED`` are not uploaded; the README's placeholder repository id
    becomes ``repo_id``.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    check_repo_id(repo_id)
    path = Path(path)
    problems = check_shareable(path)
    if problems:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        raise NotShareable(problems[0] + more)
    token = resolve_token(token)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    api = HfApi(token=token)
    repo_id = _prepare_target(api, repo_id, private, revision)
    files = shareable_files(path)
    operations = [
        CommitOperationAdd(
            path_in_repo=name,
            path_or_fileobj=_card_for_repo(path, repo_id) if name == "README.md" else str(path / name),
        )
        for name in files
    ]
    message = commit_message or f"Upload {config['model_type']} model (GeoNorm) with hf-geonorm"
    info = api.create_commit(
        repo_id,
        operations,
        commit_message=message,
        commit_description=commit_description,
        repo_type="model",
        revision=revision,
        create_pr=create_pr,
    )
    return PushResult(repo_id, revision or "main", info.commit_url, info.oid, files, info.pr_url)


def push_to_hub(
    model: Any,
    repo_id: str,
    *,
    tokenizer: Any = None,
    card_info: CardInfo | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    max_shard_size: int | str | None = "50GB",
    tags: list[str] | None = None,
) -> PushResult:
    """Push a GeoNorm model (and ``tokenizer``) to the Hub with its remote code and model card.

    What transformers' ``PreTrainedModel.push_to_hub`` cannot do: it saves with a plain ``save_pretrained`` (no
    ``auto_map`` for a model built in this process) and then replaces the README with a generic card. This
    writes the folder with ``save_with_remote_code`` into a temporary folder (the card from ``card_info``, plus
    ``tags`` and the model's ``model_tags``; its loading examples name the repository pushed to) and uploads it
    with ``push_folder``, which checks it like ``hf-geonorm push``. The keyword arguments are those of
    ``PreTrainedModel.push_to_hub``; the model is left unchanged.
    """
    import copy

    if type(model).__module__.startswith("peft"):
        raise ValueError("push_to_hub pushes full GeoNorm models; merge the adapters first (merge_and_unload())")
    model_type = _geonorm_type(model.config)
    if model_type is None:
        raise ValueError(f"push_to_hub pushes GeoNorm models; this one is {model.config.model_type!r}")
    check_repo_id(repo_id)
    token = resolve_token(token)
    info = copy.deepcopy(card_info) if card_info is not None else CardInfo()
    extra = list(tags or []) + list(getattr(model, "model_tags", None) or [])
    info.tags = info.tags + [t for t in extra if t not in info.tags]
    with tempfile.TemporaryDirectory(prefix="geonorm-push-") as tmp:
        save_with_remote_code(model, tmp, tokenizer=tokenizer, card_info=info, max_shard_size=max_shard_size)
        return push_folder(
            tmp,
            repo_id,
            private=private,
            revision=revision,
            commit_message=commit_message,
            commit_description=commit_description,
            token=token,
            create_pr=create_pr,
        )
