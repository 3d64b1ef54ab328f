"""The options of the commands other than ``train`` and ``sweep``, declared once as dataclasses whose fields carry
them (``hf_geonorm._plumbing.declarations.option``), from which ``options.command_options`` generates the click options:
``convert``'s are the library's ``ConversionOptions``, the others' are declared here."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from hf_geonorm._plumbing.declarations import option
from hf_geonorm.analysis import defaults as MEASURES  # the tokens perplexity and the angles are measured on
from hf_geonorm.conversion.options import DTYPES, ConversionOptions
from hf_geonorm.training import presets as SIZES  # the presets' shapes and the default vocabulary


def declared_as(declaration: type, name: str, **default: Any) -> Any:
    """A field declaring the option of ``declaration``'s field ``name``, with its default unless ``default`` says,
    for another command that takes the same option."""
    spec = next(spec for spec in fields(declaration) if spec.name == name)
    return field(default=default.get("default", spec.default), metadata=spec.metadata)


@dataclass
class GroupOptions:
    """``hf-geonorm``'s own, before the command."""

    debug: bool = field(default=False, metadata=option(
        "Show tracebacks of unexpected errors.", flag=True, envvar="HF_GEONORM_DEBUG"))


@dataclass
class JSONOptions:
    """``info``: its output as JSON."""

    as_json: bool = field(default=False, metadata=option("Print JSON.", name="--json", flag=True))


@dataclass
class TableOptions:
    """``architectures`` and ``angles``: a table, or JSON."""

    as_json: bool = field(default=False, metadata=option("Print JSON instead of a table.", name="--json", flag=True))


def _preset_help() -> str:
    """``init --preset``'s help: each preset's layers, width and heads, as ``presets.PRESETS`` declares them."""
    shapes = [f"{name} ({size['num_hidden_layers']}/{size['hidden_size']}/{size['num_attention_heads']})"
              for name, size in SIZES.PRESETS.items()]  # fmt: skip
    return f"Model size, as layers/width/heads: {', '.join(shapes)}."


@dataclass
class InitOptions:
    """``init``: a from-scratch config (``write_scratch_config`` takes the fields by name)."""

    preset: str | None = field(default=None, metadata=option(
        _preset_help(), choices=tuple(SIZES.PRESETS), settings_follow=True))
    tokenizer: str | None = field(default=None, metadata=option(
        "Tokenizer folder or Hub id; sets the vocabulary and special tokens."))
    vocab_size: int | None = field(default=None, metadata=option(
        f"Vocabulary size [default: the tokenizer's, rounded up to 64; else {SIZES.DEFAULT_VOCAB}].", minimum=1))
    max_length: int | None = field(default=None, metadata=option(
        f"max_position_embeddings [default: {SIZES.DEFAULT_POSITIONS}; {SIZES.preset_positions('tiny')} for tiny].",
        minimum=1))  # fmt: skip
    tie_embeddings: bool = field(default=True, metadata=option(
        "Share the input embedding and the output head (as the paper's GPT-3-shaped models count).", flag=True,
        switch=True, show_default=True))  # fmt: skip
    force: bool = declared_as(ConversionOptions, "force")


@dataclass
class PlotOptions:
    """``angles``: where its plot goes."""

    plot_path: str | None = field(default=None, metadata=option(
        "Also draw the angles into this PNG.", name="--plot", file="any"))


@dataclass
class MeasuringOptions:
    """The commands that run a model on a text (``perplexity``; ``angles`` measures on fewer tokens)."""

    text_path: str = field(default=None, metadata=option(
        "A UTF-8 text file to run the model on.", name="--text", file="existing", required=True))
    max_tokens: int = field(default=MEASURES.PERPLEXITY_TOKENS, metadata=option(
        "Tokens of the text to use.", minimum=2, show_default=True))
    window: int | None = field(default=None, metadata=option(
        "Tokens per forward pass [default: the model's context, at most --max-tokens].", minimum=2))
    dtype: str = field(default="float32", metadata=option(
        "Dtype to run the model in.", choices=DTYPES, show_default=True))
    device: str = field(default="cpu", metadata=option(
        "torch device to run on.", show_default=True, settings_follow=True))
    allow_missing: bool = declared_as(ConversionOptions, "allow_missing")


@dataclass
class AngleMeasuringOptions(MeasuringOptions):
    """``angles``: the measuring options, on fewer tokens by default."""

    max_tokens: int = declared_as(MeasuringOptions, "max_tokens", default=MEASURES.ANGLE_TOKENS)


@dataclass
class CardOptions:
    """``card``: the facts of a folder's card that the folder does not hold."""

    base_model: str | None = field(default=None, metadata=option(
        "Hub id (owner/name) of the model this one derives from."))
    license: str | None = field(default=None, metadata=option(
        "The model's license: a Hub license id (e.g. apache-2.0), or other."))
    license_name: str | None = field(default=None, metadata=option(
        "With --license other: the license's short name (e.g. my-license)."))
    source: str | None = field(default=None, metadata=option(
        "Where the model came from (a folder, file or Hub id), for the card's first line."))
    from_folder: str | None = field(default=None, metadata=option(
        "The GeoNorm folder this one was trained from: its card's base model, license, language and source carry "
        "over.", name="--from", folder="existing"))  # fmt: skip
    force: bool = field(default=False, metadata=option(
        "Update the metadata of a README.md that is not hf-geonorm's card as written (edited since, or another "
        "tool's), keeping its text.", flag=True))  # fmt: skip


@dataclass
class PushCommandOptions:
    """``push``: how it commits (the fields of the library's ``PushOptions`` of the same names)."""

    private: bool = field(default=False, metadata=option(
        "Create the repository private (a repository that exists keeps its visibility).", flag=True))
    revision: str | None = field(default=None, metadata=option(
        "Push to this branch, created from main when missing [default: main].", metavar="BRANCH"))
    commit_message: str | None = field(default=None, metadata=option(
        "The commit message [default: 'Upload geonorm_<type> model (GeoNorm) ...']."))
    commit_description: str | None = field(default=None, metadata=option("A longer description for the commit."))
    create_pr: bool = field(default=False, metadata=option(
        "Open a pull request with the files instead of committing to the branch.", flag=True))
    allow_modified_code: bool = field(default=False, metadata=option(
        "Push remote code that is not what this hf-geonorm writes (refused otherwise: loading the model with "
        "trust_remote_code=True runs it); the pushed card says which files differ.", flag=True))
