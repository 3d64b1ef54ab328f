"""Offline checks of what is about to be shared: a folder's remote code (``check_remote_code``) and a whole GeoNorm
folder (``check_shareable``: weights, config, remote code, method specification, and a card that passes
``card_metadata.validate_card``). ``hub.push_folder`` runs ``check_shareable`` before it contacts the Hub.
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoints.loading_info import tensor_names
from ..checkpoints.patching import family_for
from ..checkpoints.safetensors_files import WeightPathError, safetensors_header, weight_files
from ..modeling.remote_code import METHOD_SPEC, auto_map, module_closure, remote_code_files
from .card_metadata import validate_card
from .card_updates import is_geonorm_card
from .model_card import written_as_is
from .pickles import pickle_reason


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


def modified_remote_code(path: str | os.PathLike, files: list[str]) -> list[str]:
    """Those of the remote code ``files`` of the folder ``path`` that are not, byte for byte, the modelling
    source this hf-geonorm writes (``remote_code.remote_code_files``): edited, or not hf-geonorm's at all."""
    written = {source.name: source for source in remote_code_files()}
    return [name for name in files
            if name not in written or (Path(path) / name).read_bytes() != written[name].read_bytes()]  # fmt: skip


def check_shareable(path: str | os.PathLike, allow_modified_code: bool = False) -> list[str]:
    """Why the folder ``path`` cannot be pushed as a GeoNorm model (an empty list: it can).

    It needs safetensors weights whose headers match their sizes and that its config's model loads whole (every
    tensor it has, nothing left over, every shape right), a ``config.json`` of a GeoNorm type this hf-geonorm
    supports, complete remote code (``auto_map`` for AutoConfig, AutoModel, AutoModelForCausalLM and
    the family's heads naming this family's classes, every file they import present and compiling, and each the
    very source this hf-geonorm writes unless ``allow_modified_code``: whoever loads the model with
    ``trust_remote_code=True`` runs it), the method specification the card links, and a README.md model card that
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
    problems = (_weight_problems(path) + _remote_code_problems(path, config, expected_map, allow_modified_code)
                + _unsafe_files(path))  # fmt: skip
    if not problems:
        problems = _loading_problems(path, config)
    readme = path / "README.md"
    if os.path.lexists(readme) and not readme.is_file():
        problems.append(f"{readme} is not a file (a folder, or a link to none): move it away, then write the card "
                        f"with hf-geonorm card {path}")  # fmt: skip
    elif not readme.is_file():
        problems.append(f"{path} has no README.md model card: write one with hf-geonorm card {path}")
    else:
        card_problems = validate_card(readme)
        problems += [f"README.md: {p}" for p in card_problems]
        text = readme.read_text(encoding="utf-8", errors="replace")
        if card_problems and is_geonorm_card(text):
            force = "" if written_as_is(text) else " --force"
            problems.append(f"correct README.md, or rewrite its metadata with hf-geonorm card {path}{force} (with "
                            "--license, --base-model as they should be)")  # fmt: skip
        elif card_problems:
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
            words = " ".join(str(error).split())
            problems.append(words if words.startswith(f"{file.name} ") else f"{file.name} is damaged: {words}")
    return problems


def _unsafe_files(path: Path) -> list[str]:
    """Pickle files push would upload, and a tokenizer that asks for custom code (an ``auto_map`` in its
    ``tokenizer_config.json``): both would run code on the machine of whoever loads them."""
    problems = []
    reasons = {name: pickle_reason(path / name) for name in shareable_files(path)}
    pickles = [name + (f" ({why})" if why else "") for name, why in reasons.items() if why is not None]
    if pickles:
        problems.append(
            f"{', '.join(pickles)}: pickle file(s), which can run code when loaded; hf-geonorm never loads or pushes "
            "them: remove them (the weights are in safetensors files; arrays of numbers can be saved without objects)"
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


def _remote_code_problems(
    path: Path, config: dict[str, Any], expected: dict[str, str], allow_modified_code: bool
) -> list[str]:
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
    modified = [] if allow_modified_code or problems else modified_remote_code(path, status.files)
    if modified:
        problems.append(
            f"the remote code {', '.join(modified)} is not what hf-geonorm {_version()} writes, and whoever loads the "
            f"model with trust_remote_code=True would run it: restore it with "
            f"hf_geonorm.sharing.folders.add_remote_code({str(path)!r}), or push it knowingly with "
            "--allow-modified-code (the card then says so)"
        )
    if not (path / METHOD_SPEC).is_file():
        problems.append(f"the method specification {METHOD_SPEC}, which the card links, is missing ({hint})")
    return problems


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hf-geonorm")
    except PackageNotFoundError:
        return "(not installed)"


def _loading_problems(path: Path, config: dict[str, Any]) -> list[str]:
    """What the folder's own model class reports when it reads these weights: tensors it would leave at random
    values, tensors it would drop, shapes that do not fit. Loaded on the meta device: no tensor data is read, so
    this costs the same for a 135M and a 70B folder. Without hub kernels (transformers 5.25 swaps them in by
    default, and refuses to on the meta device)."""
    import transformers

    family = family_for(config["model_type"])
    architecture = (config.get("architectures") or [family.causal_class.__name__])[0]
    classes = {cls.__name__: cls for cls in (family.causal_class, family.base_class, *family.head_classes.values())}
    if architecture not in classes:
        return [f"config.json: architectures names {architecture!r}, which is not a class of {config['model_type']}"]
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        _, info = classes[architecture].from_pretrained(
            path, device_map="meta", output_loading_info=True, use_kernels=False
        )
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
