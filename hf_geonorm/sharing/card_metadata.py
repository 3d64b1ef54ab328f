"""A model card's metadata, read (``card_metadata_of``: YAML aliases refused before they are built) and checked
offline (``validate_card``): the rules the Hub applies to the YAML block of a README.md, and for a GeoNorm card the
tags, pipeline tag and library that make it findable. The same rules check the facts a user gives a card
(``license_option_problem``, ``base_model_option_problem``) and those a new model takes from its source's card
(``card_lineage``), so that every card hf-geonorm writes passes ``push``."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

from ..errors import first_line

# The Hub task of each GeoNorm head, by its Auto class (the keys of GeoNormFamily.head_classes).
HEAD_PIPELINE_TAGS = {
    "AutoModelForSequenceClassification": "text-classification",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForQuestionAnswering": "question-answering",
}
ALIASES_REFUSED = (
    "the metadata uses YAML aliases (*name), which a model card does not need and which can expand without end "
    "(a 'billion laughs'); write the values out"
)


def metadata_has_aliases(text: str) -> bool:
    """Whether the YAML metadata block of the card ``text`` uses aliases: read as a stream of events, which costs
    the length of the text, before anything builds the values (nested aliases grow exponentially when built)."""
    import yaml
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    match = REGEX_YAML_BLOCK.search(text)
    if not match:
        return False
    try:
        return any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(match.group(2), Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return False  # reported by whatever parses it next


BYTE_ORDER_MARK = "\ufeff"  # what some editors put at the start of a UTF-8 file


def card_metadata_of(readme: str | Path) -> dict[str, Any]:
    """The metadata of the card file ``readme`` (a local README.md, or one downloaded from the Hub): ``ValueError``
    when it uses YAML aliases, before anything builds them."""
    from huggingface_hub import ModelCard

    text = Path(readme).read_text(encoding="utf-8-sig")  # a byte-order mark is no part of the text
    if metadata_has_aliases(text):
        raise ValueError(f"{readme}: {ALIASES_REFUSED}")
    return ModelCard(text).data.to_dict()


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


HUB_LICENSE_LIST = "https://huggingface.co/docs/hub/repositories-licenses"
LICENSE_FIELDS = ("license", "license_name", "license_link")  # one license: they change together


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


def license_problem(license_: Any, license_name: Any = None) -> str | None:
    """What the Hub refuses in a card's ``license`` (with ``license_name``, which ``other`` needs); None: nothing."""
    if not isinstance(license_, str):
        return f"license must be one license identifier (a string), not {license_!r}"
    if license_ not in HUB_LICENSES:
        return f"license {license_!r} is not a Hub license identifier (e.g. apache-2.0, mit; or other)"
    if license_ == "other" and (not isinstance(license_name, str) or not _LICENSE_NAME.match(license_name)):
        return "license: other needs license_name (lowercase letters, digits, '-', '.', '_')"
    return None


def language_problem(language: Any) -> str | None:
    """What the Hub refuses in a card's ``language``; None: nothing."""
    languages = _string_list(language)
    if languages is None or not all(_LANGUAGE_CODE.match(code) for code in languages):
        return f"language must be ISO 639 codes (e.g. en, or a list of them), not {language!r}"
    return None


def base_model_problem(base_model: Any) -> str | None:
    """What the Hub refuses in a card's ``base_model``; None: nothing."""
    bases = _string_list(base_model)
    if bases is None or not all(_is_repo_id(b) for b in bases):
        return f"base_model must be a Hub model id (or a list of them), not {base_model!r}"
    return None


def license_option_problem(license_: str | None, license_name: str | None) -> str | None:
    """What is wrong with ``--license`` and ``--license-name`` as ``hf-geonorm card`` takes them; None: nothing."""
    if license_ is None:
        return "--license-name names the license of --license other; give both" if license_name else None
    if license_ not in HUB_LICENSES:
        near = license_.strip().lower().replace(" ", "-")
        hint = (f"did you mean {near!r}?" if near in HUB_LICENSES else
                f"e.g. apache-2.0, mit, cc-by-4.0; the Hub's list: {HUB_LICENSE_LIST}; a license not on it: "
                "--license other --license-name NAME")  # fmt: skip
        return f"--license {license_!r} is not a Hub license identifier ({hint})"
    if license_ != "other" and license_name:
        return f"--license-name goes with --license other (a license not on the Hub's list), not with {license_}"
    if license_ == "other" and license_name is None:
        return "--license other needs --license-name NAME (the license's short name, e.g. my-license)"
    if license_name is not None and not _LICENSE_NAME.match(license_name):
        return f"--license-name {license_name!r} must be lowercase letters, digits, '-', '.' and '_'"
    return None


def base_model_option_problem(base_model: str, local_hint: str) -> str | None:
    """What is wrong with ``--base-model``: it must be the Hub id, ``owner/name``, of the model this one derives
    from; a local path is refused (``local_hint``: how the command names a local folder). None: nothing."""
    example = "owner/name, e.g. HuggingFaceTB/SmolLM2-135M"
    if base_model.startswith(("http://", "https://")):
        tail = base_model.split("huggingface.co/", 1)[-1].strip("/") if "huggingface.co/" in base_model else ""
        hint = f" (that is {tail!r})" if tail.count("/") == 1 and _is_repo_id(tail) else ""
        return f"--base-model {base_model!r} is not a Hub model id but an address: give the id{hint}, {example}"
    if base_model.count("/") == 1 and _is_repo_id(base_model):
        return None
    local = Path(base_model).expanduser()
    if local.exists():
        return (f"--base-model {base_model!r} is a local {'folder' if local.is_dir() else 'file'}, not a Hub model id: "
                f"base_model names the model on the Hub this one derives from ({example}); {local_hint}")  # fmt: skip
    if _is_repo_id(base_model):
        return f"--base-model {base_model!r}: give the Hub id with its owner, {example}"
    return f"--base-model {base_model!r} is not a Hub model id ({example}), and a local path is no base model"


def card_lineage(readme: str | Path) -> dict[str, Any]:
    """What a model made from the folder (or Hub repository) of the card ``readme`` carries of it: its license
    (with ``license_name`` and ``license_link``), its language and, where it is a GeoNorm card, its base model.

    A card whose metadata cannot be read (YAML aliases, which are not built; YAML that does not parse) is not
    read, and facts the Hub would refuse are left out: each with a warning, so no license is dropped unsaid."""
    try:
        data = card_metadata_of(readme)
    except Exception as error:  # noqa: BLE001 - any card another tool wrote: its facts are unknown, and said so
        aliases = ALIASES_REFUSED in str(error)
        reason = str(error) if aliases else f"{readme}: the metadata does not parse ({first_line(error)})"
        warnings.warn(f"{reason}; its card is not read", stacklevel=2)
        return {}
    found = {key: data[key] for key in ("license", "license_name", "license_link", "language") if data.get(key)}
    if data.get("base_model") and "geonorm" in (data.get("tags") or []):  # a GeoNorm card names its own base model
        found["base_model"] = data["base_model"]
    return usable_lineage(found, str(readme))


def usable_lineage(facts: dict[str, Any], source: str) -> dict[str, Any]:
    """``facts`` (``base_model``, the license fields, ``language``) without those the Hub refuses in a card, each
    left out with a warning that names ``source``."""
    kept = {key: value for key, value in facts.items() if value is not None and key not in LICENSE_FIELDS}
    problems = []
    license_, name, link = (facts.get(key) for key in LICENSE_FIELDS)
    if license_ is not None:
        problem = license_problem(license_, name)
        if problem is None and link is not None and not isinstance(link, str):
            problem = f"license_link must be a string (a URL or a file in the repository), not {link!r}"
        if problem:
            problems.append(problem)
        else:
            kept.update({"license": license_, "license_name": name if license_ == "other" else None,
                         "license_link": link})  # fmt: skip
    for key, check in (("language", language_problem), ("base_model", base_model_problem)):
        if key in kept and (problem := check(kept[key])):
            problems.append(problem)
            del kept[key]
    if isinstance(kept.get("base_model"), list):  # CardInfo names one base model: the first
        kept["base_model"] = kept["base_model"][0]
    if problems:
        warnings.warn(f"{source}: {'; '.join(problems)}; not carried into this model's card", stacklevel=3)
    return {key: value for key, value in kept.items() if value is not None}


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
    if text.startswith(BYTE_ORDER_MARK):
        return ["it starts with a byte-order mark (U+FEFF), behind which huggingface_hub and the Hub find no "
                "metadata: save it as UTF-8 without one (hf-geonorm card writes it so)"]  # fmt: skip
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
    if license_ is not None and (problem := license_problem(license_, raw.get("license_name"))):
        problems.append(problem)
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
    for key, check in (("language", language_problem), ("base_model", base_model_problem)):
        if key in raw and (problem := check(raw[key])):
            problems.append(problem)
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
