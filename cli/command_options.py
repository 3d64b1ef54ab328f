"""The options of the commands other than ``train``, ``sweep`` and ``convert``, declared once as plain dataclasses
(``hf_geonorm._plumbing.declarations`` says how), from which ``options.options_from`` generates the click
options."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from hf_geonorm.analysis import defaults as MEASURES  # the tokens perplexity and the angles are measured on
from hf_geonorm.conversion.options import DTYPES, ConversionOptions
from hf_geonorm.training import presets as SIZES  # the presets' shapes and the default vocabulary
from hf_geonorm.training.options import PRESET_NAMES


def same_as(declaration: type, name: str, **default: Any) -> Any:
    """A field declaring the same option as ``declaration``'s field ``name``, with its default unless ``default``
    says, for another command that takes it."""
    declared = next(spec for spec in fields(declaration) if spec.name == name)
    return field(default=default.get("default", declared.default), metadata=declared.metadata)


@dataclass
class GroupOptions:
    """``hf-geonorm``'s own, before the command."""

    debug: bool = field(default=False, metadata={"help": "Show tracebacks of unexpected errors.",
                                                 "envvar": "HF_GEONORM_DEBUG"})  # fmt: skip


@dataclass
class JSONOptions:
    """``info``: its output as JSON."""

    as_json: bool = field(default=False, metadata={"help": "Print JSON.", "name": "--json"})


@dataclass
class TableOptions:
    """``architectures`` and ``angles``: a table, or JSON."""

    as_json: bool = field(default=False, metadata={"help": "Print JSON instead of a table.", "name": "--json"})


def _preset_help() -> str:
    """``init --preset``'s help: each preset's layers, width and heads, as ``presets.PRESETS`` declares them."""
    shapes = [f"{name} ({size['num_hidden_layers']}/{size['hidden_size']}/{size['num_attention_heads']})"
              for name, size in SIZES.PRESETS.items()]  # fmt: skip
    return f"Model size, as layers/width/heads: {', '.join(shapes)}."


@dataclass
class InitOptions:
    """``init``: a from-scratch config (``write_scratch_config`` takes the fields by name)."""

    preset: Literal[PRESET_NAMES] | None = field(default=None, metadata={"help": _preset_help()})
    tokenizer: str | None = field(default=None, metadata={"help": (
        "Tokenizer folder or Hub id; sets the vocabulary and special tokens.")})
    vocab_size: int | None = field(default=None, metadata={"help": "Vocabulary size.", "ge": 1, "default_text": (
        f"the tokenizer's, rounded up to 64; else {SIZES.DEFAULT_VOCAB}")})  # fmt: skip
    max_length: int | None = field(default=None, metadata={"help": "max_position_embeddings.", "ge": 1,
        "default_text": f"{SIZES.DEFAULT_POSITIONS}; {SIZES.preset_positions('tiny')} for tiny"})  # fmt: skip
    tie_embeddings: bool = field(default=True, metadata={"help": (
        "Share the input embedding and the output head (as the paper's GPT-3-shaped models count).")})
    force: bool = same_as(ConversionOptions, "force")


@dataclass
class PlotOptions:
    """``angles``: where its plot goes."""

    plot_path: str | None = field(default=None, metadata={"help": "Also draw the angles into this PNG.",
                                                           "name": "--plot", "path": "file"})  # fmt: skip


@dataclass
class MeasuringOptions:
    """The commands that run a model on a text (``perplexity``; ``angles`` measures on fewer tokens)."""

    text_path: str = field(metadata={"help": "A UTF-8 text file to run the model on.", "name": "--text",
                                     "path": "existing file"})  # fmt: skip
    max_tokens: int = field(default=MEASURES.PERPLEXITY_TOKENS, metadata={"help": "Tokens of the text to use.",
                                                                          "ge": 2})  # fmt: skip
    window: int | None = field(default=None, metadata={"help": "Tokens per forward pass.", "ge": 2,
                                                       "default_text": "the model's context, at most --max-tokens"})
    dtype: Literal[DTYPES] = field(default="float32", metadata={"help": "Dtype to run the model in."})
    device: str = field(default="cpu", metadata={"help": "torch device to run on."})
    allow_missing: bool = same_as(ConversionOptions, "allow_missing")


@dataclass
class AngleMeasuringOptions(MeasuringOptions):
    """``angles``: the measuring options, on fewer tokens by default."""

    max_tokens: int = same_as(MeasuringOptions, "max_tokens", default=MEASURES.ANGLE_TOKENS)


@dataclass
class CardOptions:
    """``card``: the facts of a folder's card that the folder does not hold."""

    base_model: str | None = field(default=None, metadata={"help": (
        "Hub id (owner/name) of the model this one derives from.")})
    license: str | None = field(default=None, metadata={"help": (
        "The model's license: a Hub license id (e.g. apache-2.0), or other.")})
    license_name: str | None = field(default=None, metadata={"help": (
        "With --license other: the license's short name (e.g. my-license).")})
    source: str | None = field(default=None, metadata={"help": (
        "Where the model came from (a folder, file or Hub id), for the card's first line.")})
    from_folder: str | None = field(default=None, metadata={"help": (
        "The GeoNorm folder this one was trained from: its card's base model, license, language and source carry "
        "over."), "name": "--from", "path": "existing folder"})  # fmt: skip
    force: bool = field(default=False, metadata={"help": (
        "Update the metadata of a README.md that is not hf-geonorm's card as written (edited since, or another "
        "tool's), keeping its text.")})  # fmt: skip


@dataclass
class PushCommandOptions:
    """``push``: how it commits (the fields of the library's ``PushOptions`` of the same names)."""

    private: bool = field(default=False, metadata={"help": (
        "Create the repository private (a repository that exists keeps its visibility).")})
    revision: str | None = field(default=None, metadata={"help": (
        "Push to this branch, created from main when missing."), "metavar": "BRANCH", "default_text": "main"})
    commit_message: str | None = field(default=None, metadata={"help": "The commit message.", "default_text": (
        "'Upload geonorm_<type> model (GeoNorm) ...'")})  # fmt: skip
    commit_description: str | None = field(default=None, metadata={"help": "A longer description for the commit."})
    create_pr: bool = field(default=False, metadata={"help": (
        "Open a pull request with the files instead of committing to the branch.")})
    allow_modified_code: bool = field(default=False, metadata={"help": (
        "Push remote code that is not what this hf-geonorm writes (refused otherwise: loading the model with "
        "trust_remote_code=True runs it); the pushed card says which files differ.")})  # fmt: skip
