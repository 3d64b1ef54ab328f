"""The errors the library raises for its user (a setting out of range, a non-finite metric, what would need custom
code, a job whose extra is not installed), and how a message is cut to the one line the command line prints.

The command line formats its own messages with ``first_line`` too, so that they read as the library's.
"""

from __future__ import annotations

import importlib.util

# The packages (import names) of each extra of pyproject.toml that a job of hf-geonorm needs beyond the core install
EXTRAS = {"train": ("datasets", "datasketch", "matplotlib", "scipy")}


class SettingsError(ValueError):
    """A GeoNorm setting given by the caller is out of range (the message names the setting)."""


class NonFiniteError(ValueError):
    """A metric came out NaN or infinite; the message says where the first non-finite value appeared and why."""


class MissingExtraError(ImportError):
    """A job needs an extra of hf-geonorm that is not installed (the message names the extra and how to install it)."""


def require_extra(extra: str, job: str) -> None:
    """``MissingExtraError`` naming ``extra`` when a package of it is not installed: ``job`` needs it, before it
    starts (a run would otherwise fail at its end, drawing its loss curve)."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(f"{job} needs the {extra} extra ({', '.join(missing)} not installed): pip install "
                                f"'hf-geonorm[{extra}]'")  # fmt: skip


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
