"""The model card of a GeoNorm folder: ``README.md`` rendered from the folder's ``config.json`` and the card
facts (``CardInfo``), which are stored as data beside it in ``geonorm_card.json``.

A card is always rendered from data, never read back from Markdown: ``write_model_card(path)`` without new
facts re-renders from ``geonorm_card.json``. The card links the method specification that the model's
``save_pretrained`` copies beside the code (``remote_code.METHOD_SPEC``). Every card written passes ``push``'s
metadata check, and ends in a comment with the sha256 of the text above it: a README.md that still matches is
one hf-geonorm wrote and nobody edited since (``written_as_is``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import tempfile
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from ..checkpoints.patching import family_for
from ..checkpoints.safetensors_files import saved_parameter_count
from ..modeling.geometry import step_sizes, updates_per_layer
from ..modeling.norm_styles import NORM_STYLE_DECLARATIONS
from ..modeling.remote_code import ENTRY_MODULE, METHOD_SPEC, module_closure, remote_code_files
from ..modeling.settings import GeoNormSettings
from .card_metadata import (
    HEAD_PIPELINE_TAGS,
    card_lineage,
    card_metadata_of,  # noqa: F401 - inspection reads a card's metadata through this module
    usable_lineage,
    validate_card,
)
from .gguf_lineage import is_quantised
from .model_facts import bridge_words, lora_targets, style_tags, tensor_types_text

# the card's template: model_cards/ at the top of the repository, installed as the package hf_geonorm.model_cards
CARD_TEMPLATE = "geonorm_model_card.md"
CARD_TEMPLATES = "hf_geonorm.model_cards"
CARD_DATA = "geonorm_card.json"
CARD_REPO_PLACEHOLDER = "path/to/this/folder"
LEARNED_POSITION_TYPES = ("gpt2", "gpt_neo", "gpt_bigcode")  # a position table: generate stops at its end


@dataclass
class CardInfo:
    """What the model card says beyond the config: where the model came from and how it was evaluated.

    ``evaluation`` holds lines such as "perplexity on X: 14.50 before, 14.50 after conversion".
    ``training`` is how ``hf-geonorm train`` trained it (data, steps, tokens, learning rate, ...: shown as a list,
    as Trainer's own card lists its hyperparameters).
    ``angles`` is the summary ``hf-geonorm angles --json`` prints (``lower_third_mean_angle``,
    ``upper_third_mean_angle``, ``lower_to_upper_ratio``), optionally with ``text`` and ``tokens`` (what it was
    measured on) and ``sublayers`` (its per-sublayer rows: ``layer``, ``sublayer``, ``angle``).
    ``repo_id`` is used in the loading snippets (the Hub id the folder will be pushed to, when known; otherwise
    the placeholder ``CARD_REPO_PLACEHOLDER``, which ``hub.push_folder`` replaces by the repository it pushes to).
    ``num_parameters`` defaults to the count in the folder's safetensors headers. ``license`` is a Hub license
    identifier; ``other`` needs ``license_name`` (and may have ``license_link``, a URL or a file of the folder).
    ``source_model`` is the model's name as its source states it where that is no Hub id (a GGUF file's
    ``general.name``), and ``source_tensor_types`` the number of the source's tensors of each type (a GGUF file's
    ``Q4_1``, ``F32``, ...: the weights were de-quantised from them). ``trained_with`` says who trained the model
    where ``hf-geonorm train`` did not, and what ``training`` was read from (or that nothing says how it was trained).
    """

    model_name: str | None = None
    base_model: str | None = None
    license: str | None = None
    license_name: str | None = None
    license_link: str | None = None
    language: str | list[str] | None = None
    source: str | None = None
    source_model: str | None = None
    source_tensor_types: dict[str, int] | None = None
    repo_id: str | None = None
    evaluation: list[str] = field(default_factory=list)
    training: dict[str, Any] | None = None
    trained_with: str | None = None
    angles: dict[str, Any] | None = None
    tags: list[str] = field(default_factory=list)
    num_parameters: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CardInfo:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown card facts {', '.join(unknown)}; CardInfo has {', '.join(sorted(known))}")
        return cls(**data)


def save_card_info(path: str | os.PathLike, info: CardInfo) -> Path:
    """Store the card facts of the folder ``path`` in ``path/geonorm_card.json``."""
    target = Path(path) / CARD_DATA
    target.write_text(json.dumps(info.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return target


def load_card_info(path: str | os.PathLike) -> CardInfo | None:
    """The card facts stored in the folder ``path`` (None when it has none)."""
    source = Path(path) / CARD_DATA
    if not source.is_file():
        return None
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{source} is not valid JSON ({error}); rewrite it with write_model_card") from None
    if not isinstance(data, dict):
        raise ValueError(f"{source} holds a JSON {type(data).__name__}, not an object of card facts")
    return CardInfo.from_dict(data)


def card_template() -> str:
    """The Jinja template of the model card: package data of ``hf_geonorm.model_cards``."""
    return resources.files(CARD_TEMPLATES).joinpath(CARD_TEMPLATE).read_text(encoding="utf-8")


def max_rotation(a: float, max_angle: float | None, clamp: str = "both") -> float:
    """The largest angle one update with step size ``a`` can make (inf without a clamp; ``max_angle`` when only
    the final angle is clamped)."""
    if max_angle is None:
        return math.inf
    return max_angle if clamp == "final" else min(a * max_angle, max_angle)


def bridge_text(settings: GeoNormSettings) -> str:
    """What ``geo_bridge`` makes of the model, in words."""
    if settings.norm_style != "geo":
        return "used by `geo` only"
    bridges = settings.geo_bridge if isinstance(settings.geo_bridge, list) else [settings.geo_bridge]
    if all(b == 0.0 for b in bridges):
        return "exactly the Pre-Norm model"
    if all(b == 1.0 for b in bridges):
        return "pure GeoNorm"
    return "between Pre-Norm and GeoNorm" + (", update by update" if len(bridges) > 1 else "")


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


def head_of(config: Any, family: Any) -> tuple[str, str]:
    """The card's ``pipeline_tag`` and the Auto class its loading examples use: those of the family's head named
    in ``config.architectures``, or the causal LM's."""
    architectures = set(getattr(config, "architectures", None) or [])
    for auto, head_class in family.head_classes.items():
        if head_class.__name__ in architectures:
            return HEAD_PIPELINE_TAGS[auto], auto
    return "text-generation", "AutoModelForCausalLM"


def render_model_card(
    config: Any,
    info: CardInfo | None = None,
    has_tokenizer: bool = False,
    remote_code: list[str] | None = None,
) -> Any:
    """The ``huggingface_hub.ModelCard`` of a GeoNorm model with ``config``; ``remote_code`` names the source
    files beside the weights (default: those ``save_pretrained`` writes)."""
    from huggingface_hub import ModelCard, ModelCardData

    info = info or CardInfo()
    family = family_for(config.model_type)
    settings = GeoNormSettings.from_object(config)
    num_layers = config.num_hidden_layers
    steps = []
    if settings.norm_style == "geo":
        max_angle = settings.geo_max_angle
        per = updates_per_layer(settings.geo_alpha, num_layers)
        for i, a in enumerate(step_sizes(settings.geo_decay, settings.geo_alpha, num_layers, per)):
            layer = f"{i // per + 1}" + ("" if per == 1 else (" attention", " feed-forward")[i % per])
            steps.append({"layer": layer, "a": a, "max_rotation": max_rotation(a, max_angle, settings.geo_clamp)})
    pipeline_tag, auto_class = head_of(config, family)
    tags = ["geonorm", family.stock_type, family.model_type, *style_tags(settings)]
    tags += [t for t in info.tags if t not in tags]
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag=pipeline_tag,
        tags=tags,
        base_model=info.base_model,
        license=info.license,
        license_name=info.license_name,
        license_link=info.license_link,
        language=info.language,
    )
    computes = bridge_words(settings)
    style = NORM_STYLE_DECLARATIONS[settings.norm_style]
    # a model of another style is one of the baselines hf-geonorm trains beside GeoNorm, and is named as such
    kind = "GeoNorm" if style.geodesic else style.title
    baseline = "" if style.geodesic else " (hf-geonorm baseline)"
    name = info.model_name or (
        f"{info.base_model.split('/')[-1]}-{kind}" if info.base_model else
        f"{info.source_model} {kind}" if info.source_model else f"{kind} {family.stock_type}"
    ) + (f" {computes}" if computes else "") + baseline  # fmt: skip
    card = ModelCard.from_template(
        data,
        template_str=card_template(),
        model_name=name,
        stock_type=family.stock_type,
        model_type=family.model_type,
        base_model=info.base_model,
        source=info.source,
        source_model=info.source_model,
        source_tensors=tensor_types_text(info.source_tensor_types) if info.source_tensor_types else None,
        dequantised=any(is_quantised(kind) for kind in info.source_tensor_types or {}),
        dtype=str(getattr(config, "dtype", None) or "float32").removeprefix("torch."),
        tool_version=_version(),
        num_layers=num_layers,
        hidden_size=getattr(config, "hidden_size", "?"),
        num_parameters=_human(info.num_parameters) if info.num_parameters else None,
        settings=settings.to_dict(),
        bridge_text=bridge_text(settings),
        style_description=style.card_text,
        model_kind=kind,
        baseline=not style.geodesic,
        steps=steps,
        per_update_steps=len(steps) > num_layers,
        evaluation=info.evaluation,
        training=info.training,
        trained_with=info.trained_with,
        angles=_angles_for_card(info.angles),
        repo_id=info.repo_id or CARD_REPO_PLACEHOLDER,
        has_tokenizer=has_tokenizer,
        auto_class=auto_class,
        positions=next((getattr(config, key) for key in ("n_positions", "max_position_embeddings")
                        if isinstance(getattr(config, key, None), int)), None),  # fmt: skip
        learned_positions=family.stock_type in LEARNED_POSITION_TYPES,
        lora_targets=lora_targets(config, family),
        conv1d=family.layout.conv1d,
        remote_code_files=remote_code or [p.name for p in remote_code_files()],
        method_spec=METHOD_SPEC,
    )
    return ModelCard(re.sub(r"\n{3,}", "\n\n", card.content))


def write_model_card(path: str | os.PathLike, card_info: CardInfo | None = None) -> Path:
    """Render the model card of the saved GeoNorm folder ``path`` (from its ``config.json``) into
    ``path/README.md``.

    ``card_info`` is stored as ``path/geonorm_card.json``; without it, the facts stored there are used (none: a
    card with no base model, license or evaluation). A Trainer checkpoint, say, gets its card this way, and a
    card gets new evaluation numbers by passing the stored facts with more lines. ``ValueError``, before anything
    is written, for facts push would refuse (a license the Hub does not know, a base model that is no Hub id).
    """
    path = Path(path)
    text = card_file_text(folder_card(path, card_info or load_card_info(path) or CardInfo()), path)
    if card_info is not None:
        save_card_info(path, card_info)
    replace_text(path / "README.md", text)
    return path / "README.md"


FINGERPRINT_START = "<!-- hf-geonorm card, sha256 of the text above:"
_FINGERPRINT = re.compile(re.escape(FINGERPRINT_START) + r" ([0-9a-f]{64}) -->\n\Z")


def card_file_text(card: Any, path: Path) -> str:
    """The README.md of the folder ``path`` holding ``card``, ending in its fingerprint; ``ValueError`` naming
    what push's check (``validate_card``) would refuse in it."""
    text = str(card).rstrip("\n") + "\n\n"  # the fingerprint on a line of its own, after a blank one
    problems = validate_card(text)
    if problems:
        raise ValueError(f"{path}: the model card would not pass push's check: {'; '.join(problems)} (give it other "
                         f"facts: hf-geonorm card {path} --license, --base-model; or another CardInfo)")  # fmt: skip
    return f"{text}{FINGERPRINT_START} {hashlib.sha256(text.encode('utf-8')).hexdigest()} -->\n"


def written_as_is(text: str) -> bool:
    """Whether the card ``text`` is exactly what hf-geonorm wrote: it ends in a fingerprint of the text above it."""
    match = _FINGERPRINT.search(text)
    return match is not None and hashlib.sha256(text[: match.start()].encode("utf-8")).hexdigest() == match.group(1)


def replace_text(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` whole: into a temporary file beside it, then renamed over it; with the
    permissions ``target`` had, or those of a new file (mkstemp's would make it private)."""
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mask = os.umask(0)
        os.umask(mask)
        mode = 0o666 & ~mask
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def folder_card(path: Path, info: CardInfo) -> Any:
    """The card of the saved GeoNorm folder ``path`` with the facts ``info`` (its parameters counted from the
    safetensors headers when ``info`` does not say); ``ValueError`` for a folder of another model type."""
    config_dict = json.loads((path / "config.json").read_text(encoding="utf-8"))
    model_type = config_dict.get("model_type", "")
    if not str(model_type).startswith("geonorm_"):
        raise ValueError(f"{path}/config.json has model_type {model_type!r}; cards are written for GeoNorm models")
    config = family_for(model_type).config_class.from_dict(config_dict)
    if info.num_parameters is None:
        try:
            counted = saved_parameter_count(path)
        except (OSError, ValueError, KeyError):
            counted = None
        info = CardInfo.from_dict({**info.to_dict(), "num_parameters": counted[0] if counted else None})
    has_tokenizer = any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json"))
    code, _ = module_closure(path / f"{ENTRY_MODULE}.py")
    return render_model_card(config, info, has_tokenizer=has_tokenizer, remote_code=[p.name for p in code] or None)


# What a model made from a folder keeps of that folder's card: where it came from and under which terms.
LINEAGE = ("base_model", "license", "license_name", "license_link", "language", "source", "source_model",
           "source_tensor_types")  # fmt: skip


def inherited_card_info(folder: str | os.PathLike) -> CardInfo:
    """The lineage a model made from ``folder`` carries (``LINEAGE``): the folder's GeoNorm card facts, else what
    its README front matter says, read as ``convert`` reads a source's card (``card_metadata.card_lineage``: a
    stock checkpoint's license, language and base model); empty when neither. Facts push would refuse are left
    out, and a card that cannot be read is not read, each with a warning."""
    path = Path(folder)
    stored = load_card_info(path)
    if stored is not None:
        return CardInfo(**usable_lineage({key: getattr(stored, key) for key in LINEAGE}, str(path / CARD_DATA)))
    readme = path / "README.md"
    return CardInfo(**card_lineage(readme)) if readme.is_file() else CardInfo()
