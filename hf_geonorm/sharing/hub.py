"""Sharing GeoNorm models on the Hugging Face Hub: a folder ready to push (``save_shareable``: weights, remote
code, tokenizer, model card), the upload of a checked folder in one commit (``push_folder``, what
``hf-geonorm push`` runs) and ``push_to_hub`` for a model in memory (``push_model_to_hub`` is what
``model.push_to_hub`` routes to). How a push commits is one ``PushOptions``.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .card_checks import check_remote_code, check_shareable, modified_remote_code, shareable_files
from .model_card import CARD_REPO_PLACEHOLDER, CardInfo, write_model_card


class NotShareable(ValueError):
    """A folder that is not complete enough to push, or a push that cannot start (no token, bad repo id)."""


@dataclass
class PushOptions:
    """How a push commits: the keyword arguments of transformers' ``PreTrainedModel.push_to_hub`` that apply to a
    GeoNorm model. ``private`` applies when the repository is created; ``revision`` names a branch (created from
    main when missing); ``create_pr`` opens a pull request instead of committing; ``token`` is the usual login when
    None (HF_TOKEN, ``hf auth login``). ``max_shard_size`` and ``tags`` apply to a model in memory
    (``push_to_hub``): the size of its weight files, and the card's tags besides the model's ``model_tags``.
    ``allow_modified_code`` pushes remote code that is not what this hf-geonorm writes (refused otherwise: anyone
    loading the model with ``trust_remote_code=True`` runs it); the pushed card then says which files differ."""

    commit_message: str | None = None
    commit_description: str | None = None
    private: bool | None = None
    token: str | None = None
    revision: str | None = None
    create_pr: bool = False
    max_shard_size: int | str | None = "50GB"
    tags: list[str] | None = None
    allow_modified_code: bool = False


@dataclass
class PushResult:
    """Where ``push_folder`` put the files."""

    repo_id: str
    revision: str
    commit_url: str
    commit_oid: str
    files: list[str]
    pr_url: str | None = None
    modified_code: list[str] = field(default_factory=list)  # remote code pushed with allow_modified_code


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


def _card_for_repo(path: Path, repo_id: str, modified_code: list[str]) -> bytes:
    """README.md with the placeholder in its loading examples replaced by the repository id, and a warning after
    its metadata when the remote code is pushed modified (``modified_code``: the files that differ)."""
    card = (path / "README.md").read_bytes().replace(f'"{CARD_REPO_PLACEHOLDER}"'.encode(), f'"{repo_id}"'.encode())
    if not modified_code:
        return card
    warning = (
        f"> **Modified remote code.** {', '.join(modified_code)} in this repository is not the code hf-geonorm writes: "
        "it was changed and pushed knowingly (`hf-geonorm push --allow-modified-code`). Read it before loading the "
        "model with `trust_remote_code=True`, which runs it.\n\n"
    ).encode()
    start = card.find(b"---", 3) if card.startswith(b"---") else -1
    body = card.find(b"\n", start) + 1 if start >= 0 else 0
    return card[:body] + b"\n" + warning + card[body:].lstrip(b"\n")


def push_folder(path: str | os.PathLike, repo_id: str, options: PushOptions | None = None) -> PushResult:
    """Upload the GeoNorm folder ``path`` to the Hub model repository ``repo_id`` in one commit, as ``options``
    say (``PushOptions``).

    Refuses (``NotShareable``) a folder ``check_shareable`` finds incomplete (or with remote code hf-geonorm did not
    write, unless ``options.allow_modified_code``), a malformed repository id and a missing token before anything
    is sent. Creates the repository when missing and the branch ``revision`` when it
    names a missing one. The endpoint is huggingface_hub's (``HF_ENDPOINT``). Files in ``PUSH_IGNORED`` are not
    uploaded; the README's placeholder repository id becomes ``repo_id``.
    """
    from huggingface_hub import CommitOperationAdd, HfApi

    options = options or PushOptions()
    check_repo_id(repo_id)
    path = Path(path)
    problems = check_shareable(path, options.allow_modified_code)
    if problems:
        more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:])})" if len(problems) > 1 else ""
        raise NotShareable(problems[0] + more)
    token = resolve_token(options.token)
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    modified_code = modified_remote_code(path, check_remote_code(path, config).files)
    api = HfApi(token=token)
    repo_id = _prepare_target(api, repo_id, options.private, options.revision)
    files = shareable_files(path)
    operations = [
        CommitOperationAdd(
            path_in_repo=name,
            path_or_fileobj=_card_for_repo(path, repo_id, modified_code) if name == "README.md" else str(path / name),
        )
        for name in files
    ]
    message = options.commit_message or f"Upload {config['model_type']} model (GeoNorm) with hf-geonorm"
    info = api.create_commit(
        repo_id,
        operations,
        commit_message=message,
        commit_description=options.commit_description,
        repo_type="model",
        revision=options.revision,
        create_pr=options.create_pr,
    )
    return PushResult(repo_id, options.revision or "main", info.commit_url, info.oid, files, info.pr_url,
                      modified_code)  # fmt: skip


def save_shareable(
    model: Any,
    path: str | os.PathLike,
    tokenizer: Any = None,
    card_info: CardInfo | None = None,
    **save_kwargs: Any,
) -> Path:
    """Save a GeoNorm model as a folder ready to push: ``model.save_pretrained`` (safetensors weights,
    ``config.json`` with ``auto_map``, the flat source, the method specification), the tokenizer when given and a
    ``README.md`` model card rendered from ``card_info`` (stored as ``geonorm_card.json``). Files already in
    ``path`` are overwritten (use ``folders.atomic_directory`` for an all-or-nothing write)."""
    if type(model).__module__.startswith("peft"):
        raise ValueError("save_shareable saves full models; merge the adapters first (merge_and_unload())")
    model_type = model.config.model_type
    if not model_type.startswith("geonorm_"):
        raise ValueError(
            f"save_shareable writes GeoNorm models; this one is {model_type!r} "
            "(convert it first: hf_geonorm.convert(model) or apply_geonorm(model))"
        )
    if getattr(model, "hf_quantizer", None) is not None:
        raise ValueError(
            "the model is marked quantised; de-quantise it first (a GGUF-loaded model: set model.hf_quantizer = None "
            "and delete config.quantization_config)"
        )
    path = Path(path)
    model.save_pretrained(path, **save_kwargs)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    write_model_card(path, card_info or CardInfo())
    return path


def push_to_hub(
    model: Any,
    repo_id: str,
    options: PushOptions | None = None,
    *,
    tokenizer: Any = None,
    card_info: CardInfo | None = None,
) -> PushResult:
    """Push a GeoNorm model (and ``tokenizer``) to the Hub with its remote code and model card, as ``options`` say.

    What transformers' ``PreTrainedModel.push_to_hub`` does not do: it replaces the README with a generic card.
    This writes the folder with ``save_shareable`` into a temporary folder (the card from ``card_info``, plus
    ``options.tags`` and the model's ``model_tags``; its loading examples name the repository pushed to) and
    uploads it with ``push_folder``, which checks it like ``hf-geonorm push``. The model is left unchanged.
    """
    if type(model).__module__.startswith("peft"):
        raise ValueError("push_to_hub pushes full GeoNorm models; merge the adapters first (merge_and_unload())")
    if not model.config.model_type.startswith("geonorm_"):
        raise ValueError(f"push_to_hub pushes GeoNorm models; this one is {model.config.model_type!r}")
    options = options or PushOptions()
    check_repo_id(repo_id)
    options = replace(options, token=resolve_token(options.token))
    info = copy.deepcopy(card_info) if card_info is not None else CardInfo()
    extra = list(options.tags or []) + list(getattr(model, "model_tags", None) or [])
    info.tags = info.tags + [t for t in extra if t not in info.tags]
    with tempfile.TemporaryDirectory(prefix="geonorm-push-") as tmp:
        save_shareable(model, tmp, tokenizer=tokenizer, card_info=info, max_shard_size=options.max_shard_size)
        return push_folder(tmp, repo_id, options)


def push_model_to_hub(model: Any, repo_id: str, **kwargs: Any) -> PushResult:
    """What a GeoNorm model's ``push_to_hub(repo_id, **kwargs)`` runs: transformers' keyword arguments (the fields
    of ``PushOptions``; another one is a ``TypeError``), plus ``tokenizer`` and ``card_info``, into
    ``push_to_hub``."""
    tokenizer, card_info = kwargs.pop("tokenizer", None), kwargs.pop("card_info", None)
    return push_to_hub(model, repo_id, PushOptions(**kwargs), tokenizer=tokenizer, card_info=card_info)
