"""Offline checks of what is about to be shared: a model card's metadata (``validate_card``, the rules the
Hub applies to the YAML block), a folder's remote code (``check_remote_code``) and a whole GeoNorm folder
(``check_shareable``: weights, config, remote code, method specification, card). ``hub.push_folder`` runs
``check_shareable`` before it contacts the Hub.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files.safetensors_files import WeightPathError, safetensors_header, weight_files
from ..loading_info import tensor_names
from ..modeling.remote_code import METHOD_SPEC, auto_map, module_closure
from ..patching import family_for
from .model_card import ALIASES_REFUSED, HEAD_PIPELINE_TAGS, metadata_has_aliases

GEONORM_PIPELINE_TAGS = ("text-generation", *HEAD_PIPELINE_TAGS.values())  # the causal LM's task, the heads'

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
      text-generation`` or the task of a GeoNorm head, the ``geonorm`` tag).

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
    if metadata_has_aliases(text):
        return [ALIASES_REFUSED]
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
        if tag not in GEONORM_PIPELINE_TAGS:
            tasks = ", ".join(GEONORM_PIPELINE_TAGS)
            problems.append(f"a GeoNorm card needs pipeline_tag: one of {tasks} (found {tag!r})")
        if "geonorm" not in (_string_list(raw.get("tags")) or []):
            problems.append("a GeoNorm card needs the tag geonorm")
    return problems


def auto_map_for(model_type: str) -> dict[str, str]:
    """The ``auto_map`` a folder of ``model_type`` (stock ``X`` or ``geonorm_X``) must have."""
    return auto_map(family_for(model_type))


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
    found = config.get("auto_map") or {}
    files: list[str] = []
    missing: list[str] = []
    for reference in found.values():
        for ref in reference if isinstance(reference, (list, tuple)) else [reference]:
            if not isinstance(ref, str) or "." not in ref:
                continue
            module = ref.split("--")[-1].rsplit(".", 1)[0]
            present, absent = module_closure(path / f"{module}.py")
            files += [p.name for p in present if p.name not in files]
            missing += [name for name in absent if name not in missing]
    return RemoteCodeStatus(dict(found), files, missing)


def check_shareable(path: str | os.PathLike) -> list[str]:
    """Why the folder ``path`` cannot be pushed as a GeoNorm model (an empty list: it can).

    It needs safetensors weights whose headers match their sizes and that its config's model loads whole (every
    tensor it has, nothing left over, every shape right), a ``config.json`` of a GeoNorm type this hf-geonorm
    supports, complete remote code (``auto_map`` for AutoConfig, AutoModel, AutoModelForCausalLM and
    the family's heads naming this family's classes, every file they import present and compiling), the method
    specification the card links, and a README.md model card that passes ``validate_card``.
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
    problems = _weight_problems(path) + _remote_code_problems(path, config, expected_map) + _unsafe_files(path)
    if not problems:
        problems = _loading_problems(path, config)
    readme = path / "README.md"
    if not readme.is_file():
        problems.append(f"{path} has no README.md model card: write one with hf-geonorm card {path}")
    else:
        card_problems = validate_card(readme)
        problems += [f"README.md: {p}" for p in card_problems]
        if card_problems:
            problems.append(f"README.md is not a GeoNorm card (another tool's?): write one with hf-geonorm card {path}")
    return problems


def _weight_problems(path: Path) -> list[str]:
    index = path / "model.safetensors.index.json"
    try:
        files = weight_files(path)
    except WeightPathError as error:
        return [str(error)]
    except (ValueError, KeyError, TypeError, AttributeError):
        return [f"{index.name} is not a valid safetensors index"]
    missing = [file.relative_to(path).as_posix() for file in files if not file.is_file()]
    if missing:
        return [f"the weights are incomplete: {', '.join(missing)} (named by {index.name}) missing"]
    if not files:
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            return [f"{path} has pickle weights only; GeoNorm folders share safetensors (re-save the model)"]
        return [f"{path} has no weights (model.safetensors): a config-only folder has nothing to share yet"]
    problems = []
    for file in files:
        try:
            safetensors_header(file)
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            problems.append(f"{file.name} is damaged: {' '.join(str(error).split())}")
    return problems


# Files that hold pickles: loading one can run any code, so hf-geonorm never loads them and never pushes them.
PICKLE_SUFFIXES = (".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
SNIFFED_SUFFIXES = (".bin", "")  # checked by their first bytes: a pickle, or torch.save's zip of one


def is_pickle(file: Path) -> bool:
    """Whether ``file`` is a pickle: by its suffix, or for ``.bin`` and files without a suffix by its first bytes
    (a pickle's protocol opcode, or the zip archive ``torch.save`` writes)."""
    suffix = file.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        return True
    if suffix not in SNIFFED_SUFFIXES:
        return False
    try:
        with open(file, "rb") as f:
            start = f.read(4)
    except OSError:
        return False
    return (len(start) >= 2 and start[0] == 0x80 and 2 <= start[1] <= 5) or start == b"PK\x03\x04"


def _unsafe_files(path: Path) -> list[str]:
    """Pickle files push would upload, and a tokenizer that asks for custom code (an ``auto_map`` in its
    ``tokenizer_config.json``): both would run code on the machine of whoever loads them."""
    problems = []
    pickles = [name for name in shareable_files(path) if is_pickle(path / name)]
    if pickles:
        problems.append(
            f"{', '.join(pickles)}: pickle file(s), which can run code when loaded; hf-geonorm never loads or pushes "
            "them: remove them (the weights are in safetensors files)"
        )
    tokenizer_config = path / "tokenizer_config.json"
    try:
        tokenizer_map = json.loads(tokenizer_config.read_text(encoding="utf-8")).get("auto_map")
    except (OSError, ValueError, AttributeError):
        tokenizer_map = None
    if tokenizer_map:
        problems.append(
            "tokenizer_config.json has an auto_map: the tokenizer asks for custom code, which hf-geonorm never runs "
            "or shares; save a standard tokenizer in its place (save_pretrained of a transformers tokenizer)"
        )
    return problems


def _remote_code_problems(path: Path, config: dict[str, Any], expected: dict[str, str]) -> list[str]:
    hint = f"add it with hf_geonorm.sharing.folders.add_remote_code({str(path)!r})"
    found = config.get("auto_map")
    if not found:
        return [f"config.json has no auto_map, so the model does not load without hf-geonorm: {hint}"]
    if not isinstance(found, dict):
        return ["config.json: auto_map is not a mapping"]
    wrong = [k for k, v in expected.items() if found.get(k) != v]
    if wrong:
        return [f"config.json: auto_map does not name this family's classes for {', '.join(wrong)}: {hint}"]
    foreign = sorted(set(found) - set(expected))
    if foreign:
        return [
            f"config.json: auto_map also names {', '.join(foreign)}, code that is not GeoNorm's (hf-geonorm never "
            "runs it, and pushed it would point anyone loading the model at it): remove those entries"
        ]
    status = check_remote_code(path, config)
    if status.missing:
        return [f"the remote code is incomplete: {', '.join(status.missing)} missing ({hint})"]
    problems = []
    for name in status.files:
        try:
            compile((path / name).read_text(encoding="utf-8"), name, "exec")
        except (SyntaxError, ValueError, UnicodeDecodeError) as error:
            problems.append(f"the remote code file {name} does not compile ({type(error).__name__}: {error})")
    if not (path / METHOD_SPEC).is_file():
        problems.append(f"the method specification {METHOD_SPEC}, which the card links, is missing ({hint})")
    return problems


def _loading_problems(path: Path, config: dict[str, Any]) -> list[str]:
    """What the folder's own model class reports when it reads these weights: tensors it would leave at random
    values, tensors it would drop, shapes that do not fit. Loaded on the meta device: no tensor data is read, so
    this costs the same for a 135M and a 70B folder."""
    import transformers

    family = family_for(config["model_type"])
    architecture = (config.get("architectures") or [family.causal_class.__name__])[0]
    classes = {cls.__name__: cls for cls in (family.causal_class, family.base_class, *family.head_classes.values())}
    if architecture not in classes:
        return [f"config.json: architectures names {architecture!r}, which is not a class of {config['model_type']}"]
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        _, info = classes[architecture].from_pretrained(path, device_map="meta", output_loading_info=True)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        reason = " ".join(str(error).split())[:300]
        if "CONVERSION" in reason:  # transformers points at its load report, which names no tensor
            reason = f"the tensors are not in the layout of a {family.stock_type} checkpoint (weight conversion failed)"
        return [f"{architecture} cannot load these weights: {reason}; save the model again with save_pretrained"]
    finally:
        transformers.logging.set_verbosity(verbosity)
    problems = []
    for key, what in (("missing_keys", "missing (they would be random)"), ("unexpected_keys", "unexpected"),
                      ("mismatched_keys", "of the wrong shape")):  # fmt: skip
        names = [str(name if isinstance(name, str) else name[0]) for name in info.get(key) or []]
        if names:
            problems.append(
                f"the weights do not match the config's model ({architecture}): {len(names)} tensor(s) {what}: "
                f"{tensor_names(names)}; save the model again with save_pretrained (or hf-geonorm convert)"
            )
    return problems


# Never uploaded: hidden files (the temporary files of an interrupted write), byte code, Trainer state.
PUSH_IGNORED = (".*", "__pycache__", "*.pyc", "optimizer.pt", "scheduler.pt", "rng_state*.pth", "training_args.bin",
                "trainer_state.json", "scaler.pt")  # fmt: skip


def shareable_files(path: str | os.PathLike) -> list[str]:
    """The files of a folder ``push_folder`` uploads (relative POSIX paths, sorted): everything but
    ``PUSH_IGNORED`` (in any folder) and symbolic links that lead out of the folder."""
    root = Path(path).resolve()
    names = []
    for file in sorted(Path(path).rglob("*")):
        relative = file.relative_to(path)
        if any(fnmatch.fnmatch(part, pattern) for part in relative.parts for pattern in PUSH_IGNORED):
            continue
        if file.is_file() and root in file.resolve().parents:
            names.append(relative.as_posix())
    return names
