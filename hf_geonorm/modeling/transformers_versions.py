"""The transformers releases the GeoNorm modelling code is tested on, the check of the installed one, and the names
transformers changed within them.

A saved GeoNorm folder runs its remote code under whatever transformers its user has, not under the plugin's pin,
so the modelling code checks the installed release itself when it is imported (by the plugin, or by transformers
loading a folder). Below the oldest release tested it refuses in one line naming the range. Above the newest it
runs, warning once, and refuses a stock decoder layer it cannot take over (``blocks.check_stock_layer_class``):
refusing outright would stop every saved folder on the day transformers releases. ``pyproject.toml`` pins
``SUPPORTED_RANGE`` (``tests/test_transformers_versions.py`` checks that they agree).

Imports only the standard library and transformers (remote code).
"""

from __future__ import annotations

import re
import warnings

import transformers

# The oldest and newest minor releases the modelling, round-trip and remote-code tests pass on (``.ci/run`` runs
# them under both), as (major, minor).
OLDEST_TESTED = (5, 16)
NEWEST_TESTED = (5, 25)
SUPPORTED_RANGE = f">={OLDEST_TESTED[0]}.{OLDEST_TESTED[1]},<{NEWEST_TESTED[0]}.{NEWEST_TESTED[1] + 1}"


class UnsupportedTransformers(ValueError):
    """The installed transformers is not one the GeoNorm code can run on: older than the oldest release tested, or
    (above the newest) with a decoder layer it cannot take over."""


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string (``"5.26.0.dev0"`` is ``(5, 26)``)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"cannot read the transformers version {version!r}")
    return int(found.group(1)), int(found.group(2))


INSTALLED_VERSION = transformers.__version__
INSTALLED = release(INSTALLED_VERSION)
# Newer than the newest release tested: the code runs, warning once, and checks each stock decoder layer class it
# takes over.
UNTESTED_RELEASE = INSTALLED > NEWEST_TESTED

# What transformers renamed within the range, each keyed on the release that renamed it.
# 5.24: the attention of GPT-2 (and every stock attention) takes the KV cache as ``cache``, before as
# ``past_key_values``; the model's outputs name it so too.
CACHE_ARGUMENT = "cache" if INSTALLED >= (5, 24) else "past_key_values"
# 5.24: GPT-J's and CodeGen's models read the hidden states alone from a block, before ``(hidden states, attention
# weights)`` (their attention, rewritten then, had ``_split_heads``).
GPTJ_BLOCK_RETURNS_TUPLE = INSTALLED < (5, 24)
# 5.23: the output-capture registry is keyed by the model, before by the name of its class.
CAPTURE_REGISTRY_BY_MODEL = INSTALLED >= (5, 23)


def check_transformers() -> None:
    """``UnsupportedTransformers`` below the oldest release tested (one line naming the range and the installed
    version); a warning above the newest."""
    if INSTALLED < OLDEST_TESTED:
        raise UnsupportedTransformers(
            f"GeoNorm models need transformers {SUPPORTED_RANGE} (the releases their code is tested on), but "
            f"{INSTALLED_VERSION} is installed: pip install 'transformers{SUPPORTED_RANGE}'"
        )
    if UNTESTED_RELEASE:
        warnings.warn(
            f"transformers {INSTALLED_VERSION} is newer than the releases the GeoNorm code is tested on "
            f"({SUPPORTED_RANGE}): it runs, and refuses a decoder layer it cannot take over; pip install "
            f"'transformers{SUPPORTED_RANGE}' for a tested one",
            stacklevel=2,
        )

