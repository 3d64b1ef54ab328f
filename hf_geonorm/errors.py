"""The errors the library raises for its user (a setting out of range, a non-finite metric, what would need custom
code), and how a message is cut to the one line the command line prints.

The command line formats its own messages with ``first_line`` too, so that they read as the library's.
"""

from __future__ import annotations


class SettingsError(ValueError):
    """A GeoNorm setting given by the caller is out of range (the message names the setting)."""


class NonFiniteError(ValueError):
    """A metric came out NaN or infinite; the message says where the first non-finite value appeared and why."""


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an error message, at most ``limit`` characters."""
    text = str(error).strip() or type(error).__name__
    line = text.splitlines()[0].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


def needs_custom_code(error: BaseException) -> bool:
    """Whether transformers refused to load something because it needs the code shipped with it."""
    return isinstance(error, ValueError) and "trust_remote_code" in str(error)


def custom_code_error(what: str, where: str, fix: str) -> ValueError:
    """The one-line refusal of ``what`` (a tokenizer, a config) in ``where`` that needs custom code."""
    return ValueError(
        f"the {what} of {where} needs custom code (an auto_map in its tokenizer_config.json or config.json), which "
        f"hf-geonorm never runs; {fix}"
    )
