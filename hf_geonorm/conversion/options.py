"""What ``convert_checkpoint`` (``hf-geonorm convert``) takes besides the settings: ``ConversionOptions``, each field
declaring its command-line option (``declarations.option``), and the dtypes a model is read and written in.

The command line generates ``convert``'s options from it, and builds ``ConversionOptions`` from the values given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .._plumbing.declarations import option
from ..analysis.defaults import PERPLEXITY_TOKENS
from ..checkpoints.loading import DTYPES


@dataclass
class ConversionOptions:
    """How ``convert_checkpoint`` converts, besides the settings. ``dtype``: of the weights written (``auto``: the
    source's; GGUF de-quantises to float32); ``force``: replace a non-empty output; ``base_model``, ``license``,
    ``repo_id``: the model card's (defaults from the source's card or GGUF metadata); ``eval_text``: perplexity on
    its first ``eval_tokens`` tokens before and after conversion, into the card; ``calibrate_text`` (a Pre-Norm
    source, ``geo`` settings): ``geo_alpha`` one step size per update and ``geo_frames`` the Pre-Norm frames,
    measured on its first ``calibrate_tokens`` tokens (``calibration.calibrate``), ``geo_max_angle`` None unless
    the settings name one, and ``geo_bridge_costs`` what each update costs alone at bridge 1 on its first
    ``cost_tokens`` tokens (``calibration.bridge_costs``: one forward pass over them per update);
    ``allow_missing``: load weights with missing or unexpected tensors, with a warning."""

    dtype: str = field(default="auto", metadata=option(
        "Weight dtype of the output (auto: the source's; GGUF de-quantises to float32).", choices=DTYPES,
        show_default=True))  # fmt: skip
    force: bool = field(default=False, metadata=option("Replace an existing non-empty OUTPUT_DIR.", flag=True))
    base_model: str | None = field(default=None, metadata=option(
        "Hub id (owner/name) of the model this one derives from, for the model card."))
    license: str | None = field(default=None, metadata=option(
        "License for the model card, a Hub license id (default: the source's, when known)."))
    repo_id: str | None = field(default=None, metadata=option(
        "Hub id the folder will be pushed to, used in the card's loading examples."))
    eval_text: str | os.PathLike | None = field(default=None, metadata=option(
        "Measure perplexity on this text before and after conversion (printed, and put in the card).",
        file="existing"))  # fmt: skip
    eval_tokens: int = field(default=PERPLEXITY_TOKENS, metadata=option(
        "Tokens of --eval-text to use (as perplexity --max-tokens).", minimum=2, show_default=True))
    calibrate_text: str | os.PathLike | None = field(default=None, metadata=option(
        "Set geo_alpha to one step size per update measured on this text through the Pre-Norm source (and no clamp "
        "unless --max-angle is given), and store the Pre-Norm frames and each update's bridge cost for `train "
        "--bridge-order last-first`; see README, 'Converting a pretrained model'.", name="--calibrate",
        file="existing"))  # fmt: skip
    calibrate_tokens: int = field(default=4096, metadata=option(
        "Tokens of --calibrate to use.", minimum=2, show_default=True))
    cost_tokens: int = field(default=1024, metadata=option(
        "Tokens of --calibrate the bridge costs are measured on (one forward pass per update).", minimum=2,
        show_default=True))  # fmt: skip
    allow_missing: bool = field(default=False, metadata=option(
        "Load a checkpoint that lacks tensors (they stay random) or has tensors the model has no place for, with a "
        "warning naming them, instead of refusing it.", flag=True))  # fmt: skip
