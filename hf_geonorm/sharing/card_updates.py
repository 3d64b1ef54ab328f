"""What ``hf-geonorm card`` does to a folder that may already have a README.md: the GeoNorm card replaces only a
README that no one may miss (none, the card hf-geonorm wrote and nobody edited since, or the generic card Trainer
writes); any other README is the user's, and is changed only with ``force``, and then only in its metadata: the
text below the metadata block stays byte for byte."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._plumbing.ownership import ownership_problem, read_marker, record_paths
from .card_metadata import ALIASES_REFUSED, BYTE_ORDER_MARK, LICENSE_FIELDS, metadata_has_aliases, validate_card
from .model_card import (
    CARD_DATA,
    FINGERPRINT_START,
    CardInfo,
    card_file_text,
    folder_card,
    load_card_info,
    replace_text,
    written_as_is,
)
from .trainer_records import NOT_RECORDED, TRAINED_ELSEWHERE, trainer_training

# The comment transformers' Trainer puts in the card it writes (run_clm.py and the like), and asks whoever edits the
# card to remove: a machine's card no one has completed yet, which `hf-geonorm card` replaces without --force.
TRAINER_CARD_MARK = "This model card has been generated automatically according to the information the Trainer had"
_GEONORM_TAG = re.compile(r"^\s*-\s*geonorm\s*$", flags=re.M)


@dataclass
class WrittenCard:
    """Where ``write_card_for`` wrote the card; ``text_kept``: the README was the user's, so only its metadata
    changed."""

    readme: Path
    text_kept: bool


def replaceable_card(readme: Path) -> bool:
    """Whether ``hf-geonorm card`` may write over ``readme`` without --force: it is missing, the card hf-geonorm
    wrote as it is, or the generic card Trainer writes; anything else may hold the user's lines."""
    if not readme.is_file():
        return True
    text = readme.read_text(encoding="utf-8", errors="replace")
    return written_as_is(text) or TRAINER_CARD_MARK in text


def is_geonorm_card(text: str) -> bool:
    """Whether the card ``text`` is a GeoNorm card (hf-geonorm wrote it, though it may have been edited since)."""
    return FINGERPRINT_START in text or bool(_GEONORM_TAG.search(text))


def write_card_for(path: str | os.PathLike, facts: CardInfo, force: bool = False) -> WrittenCard:
    """Write the GeoNorm card of the folder ``path``: ``facts`` over those stored in the folder (a license given
    comes with its own ``license_name`` and ``license_link``), each file written whole.

    A README.md that ``replaceable_card`` does not pass is the user's: ``FileExistsError`` without ``force``;
    with it, only its metadata changes: the base model, license and language it states stand unless ``facts``
    give others (and are stored as the folder's facts), the card's other fields and tags are added to its own,
    and its text is kept. ``ValueError``, with nothing written, where the card would not pass push's check."""
    path = Path(path)
    readme = path / "README.md"
    if os.path.lexists(readme) and not readme.is_file():
        raise ValueError(f"{readme} is not a file (a folder, or a link to none): the card is written there; move it "
                         "away")  # fmt: skip
    users_readme = not replaceable_card(readme)
    if users_readme and not force:
        raise FileExistsError(f"{readme} {_whose(readme)}: pass --force to update only its metadata (its text is "
                              "kept), or move it away to have the whole GeoNorm card written")  # fmt: skip
    own, body = own_metadata(readme) if users_readme else ({}, "")
    stored = (load_card_info(path) or CardInfo()).to_dict()
    if "license" in own:
        stored.update({key: own.get(key) for key in LICENSE_FIELDS})
    stored.update({key: own[key] for key in ("language", "base_model") if key in own})
    if not isinstance(stored["base_model"], (str, type(None))):  # a list of them: the README keeps it as it is
        stored["base_model"] = None
    given = {key: value for key, value in facts.to_dict().items() if value not in (None, [], {})}
    if facts.license is not None:
        given.update({key: getattr(facts, key) for key in LICENSE_FIELDS})
    info = other_tools_training(path, CardInfo.from_dict({**stored, **given}))
    card = folder_card(path, info)
    text = with_metadata(readme, own, body, card.data.to_dict()) if users_readme else card_file_text(card, path)
    marker = read_marker(path) if not users_readme and ownership_problem(path) is None else None
    replace_text(path / CARD_DATA, json.dumps(info.to_dict(), indent=2, sort_keys=True) + "\n")
    replace_text(readme, text)
    if marker is not None:  # an output of hf-geonorm stays one: the card it holds is again as hf-geonorm wrote it
        record_paths(path, marker["command"], readme, path / CARD_DATA)
    return WrittenCard(readme, users_readme)


def other_tools_training(path: Path, info: CardInfo) -> CardInfo:
    """``info`` with the training another tool recorded in the folder ``path`` (``trainer_records``): read again
    each time where it came from there, never in place of what ``hf-geonorm train`` recorded; where nothing records
    it, a folder without stored card facts (hf-geonorm never wrote this one's) says that it is unknown, while one
    hf-geonorm wrote without training (a conversion) says nothing of training."""
    if info.training is not None and info.trained_with not in (TRAINED_ELSEWHERE, NOT_RECORDED):
        return info
    facts, trained_with = trainer_training(path)
    if facts is None and info.trained_with is None and (path / CARD_DATA).is_file():
        return info
    return replace(info, training=facts, trained_with=trained_with)


def _whose(readme: Path) -> str:
    """Why ``readme`` may hold the user's lines, in words."""
    text = readme.read_text(encoding="utf-8", errors="replace")
    if FINGERPRINT_START in text:
        return "was edited since hf-geonorm wrote it"
    if is_geonorm_card(text):
        return "is a GeoNorm card without the fingerprint of an unedited one (edited, or from an older hf-geonorm)"
    return "is not a card hf-geonorm wrote (it may be yours, or another tool's)"


def own_metadata(readme: Path) -> tuple[dict[str, Any], str]:
    """The metadata of the card file ``readme`` as its YAML says it, and the text below it (a byte-order mark
    read as the start of the file, and dropped); ``ValueError`` when it cannot be read (not UTF-8; YAML aliases,
    which are not built; YAML that does not parse; not a mapping)."""
    import yaml
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    try:
        text = readme.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"{readme} is not UTF-8 text ({error.reason} at byte {error.start}); a card is") from None
    text = text.removeprefix(BYTE_ORDER_MARK)
    match = REGEX_YAML_BLOCK.search(text)
    if not match:
        return {}, text
    if metadata_has_aliases(text):
        raise ValueError(f"{readme}: {ALIASES_REFUSED}")
    try:
        own = yaml.safe_load(match.group(2)) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{readme}: its metadata is not valid YAML ({' '.join(str(error).split())[:200]}); "
                         "correct it, or move the file away") from None  # fmt: skip
    if not isinstance(own, dict):
        raise ValueError(f"{readme}: its metadata is a YAML {type(own).__name__}, not a mapping of fields")
    return own, text[match.end() :]


def with_metadata(readme: Path, own: dict[str, Any], body: str, metadata: dict[str, Any]) -> str:
    """The card file ``readme`` (its metadata ``own``, its text ``body``) with ``metadata`` over its own fields
    (a license replaces the whole license), its own tags after the card's, and ``body`` as it is. ``ValueError``
    when the result would not pass push's check."""
    import yaml

    if "license" in metadata:
        own = {key: value for key, value in own.items() if key not in LICENSE_FIELDS}
    tags = list(metadata.get("tags") or [])
    own_tags = own.get("tags") if isinstance(own.get("tags"), list) else []
    merged = {**own, **metadata, "tags": tags + [tag for tag in own_tags if tag not in tags]}
    updated = f"---\n{yaml.safe_dump(merged, sort_keys=False, allow_unicode=True, width=1000)}---\n{body}"
    problems = validate_card(updated)
    if problems:
        raise ValueError(f"{readme}: with hf-geonorm's fields its metadata would still not pass push's check: "
                         f"{'; '.join(problems)}; correct it, or move the file away")  # fmt: skip
    return updated
