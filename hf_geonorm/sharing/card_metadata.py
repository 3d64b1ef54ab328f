"""A model card's metadata checked offline (``validate_card``): the rules the Hub applies to the YAML block of a
README.md, and for a GeoNorm card the tags, pipeline tag and library that make it findable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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
