"""LoRA's default target modules for the ``geonorm_X`` types, put into PEFT's table when a family is built.

PEFT finds the modules ``LoraConfig()`` without ``target_modules`` wraps by the model's ``config.model_type`` in one
dict, ``peft.utils.constants.TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`` (its LoRA tuner keeps a reference
to that same dict), and reads nothing of the model for them. A family's classes are built before any model of it
exists, so the family puts its entry there then, importing PEFT if it is installed (a tenth of a second once torch
and transformers are loaded): whichever of the model and peft a script imports first, the entry is there when
``get_peft_model`` reads it. This module is part of the remote code (it imports only the standard library; PEFT by
name when a family is built), so a folder loaded with ``trust_remote_code=True`` gets the same default targets as
the plugin; importing ``hf_geonorm`` imports no PEFT.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable

PEFT_CONSTANTS = "peft.utils.constants"  # the module holding PEFT's table of LoRA's default targets


def register_lora_targets(model_type: str, targets: Iterable[str]) -> None:
    """Give ``model_type`` its LoRA targets in PEFT's table (an entry already there is kept); nothing where PEFT is
    not installed."""
    if importlib.util.find_spec("peft") is None:
        return
    table = importlib.import_module(PEFT_CONSTANTS).TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
    table.setdefault(model_type, list(targets))
