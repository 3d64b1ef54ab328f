"""What ``convert_checkpoint`` (``hf-geonorm convert``) takes besides the settings: ``ConversionOptions``, a plain
dataclass whose fields carry their command-line help (``declarations`` says how), and the dtypes a model is read and
written in.

The command line generates ``convert``'s options from it, and builds ``ConversionOptions`` from the values given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

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

    dtype: Literal[DTYPES] = field(default="auto", metadata={"help": (
        "Weight dtype of the output (auto: the source's; GGUF de-quantises to float32).")})
    force: bool = field(default=False, metadata={"help": "Replace an existing non-empty OUTPUT_DIR."})
    base_model: str | None = field(default=None, metadata={"help": (
        "Hub id (owner/name) of the model this one derives from, for the model card.")})
    license: str | None = field(default=None, metadata={"help": "License for the model card, a Hub license id.",
                                                        "default_text": "the source's, when known"})  # fmt: skip
    repo_id: str | None = field(default=None, metadata={"help": (
        "Hub id the folder will be pushed to, used in the card's loading examples.")})
    eval_text: str | os.PathLike | None = field(default=None, metadata={"help": (
        "Measure perplexity on this text before and after conversion (printed, and put in the card)."),
        "path": "existing file"})  # fmt: skip
    eval_tokens: int = field(default=PERPLEXITY_TOKENS, metadata={"help": (
        "Tokens of --eval-text to use (as perplexity --max-tokens)."), "ge": 2})
    calibrate_text: str | os.PathLike | None = field(default=None, metadata={"help": (
        "Set geo_alpha to one step size per update measured on this text through the Pre-Norm source (and no clamp "
        "unless --max-angle is given), and store the Pre-Norm frames and each update's bridge cost for `train "
        "--bridge-order last-first`; see README, 'Converting a pretrained model'."), "name": "--calibrate",
        "path": "existing file"})  # fmt: skip
    calibrate_tokens: int = field(default=4096, metadata={"help": "Tokens of --calibrate to use.", "ge": 2})
    cost_tokens: int = field(default=1024, metadata={"help": (
        "Tokens of --calibrate the bridge costs are measured on (one forward pass per update)."), "ge": 2})
    allow_missing: bool = field(default=False, metadata={"help": (
        "Load a checkpoint that lacks tensors (they stay random) or has tensors the model has no place for, with a "
        "warning naming them, instead of refusing it.")})  # fmt: skip
