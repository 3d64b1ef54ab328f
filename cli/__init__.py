"""The ``hf-geonorm`` command line: the package ``hf_geonorm_cli``, one module per command or pair of commands over
the library (``main`` is the group), every option generated from its declaration (``options``)."""

from __future__ import annotations

import sys


def run() -> None:
    """The ``hf-geonorm`` console script: the group of ``main``. Importing it imports the library, which refuses a
    transformers release its modelling code is not tested on as it is imported (a ``ValueError``,
    ``transformers_versions.UnsupportedTransformers``): that refusal ends in one line and exit status 1 too, as the
    library's errors do once a command runs."""
    try:
        from .main import cli
    except ValueError as error:
        sys.exit(f"Error: {str(error).strip().splitlines()[0]}")
    cli(prog_name="hf-geonorm")
