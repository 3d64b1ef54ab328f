"""Every private attribute of transformers that hf-geonorm touches, and the few functions it relies on that
transformers does not export, each with what hf-geonorm needs of it: a minor release may rename any of them.

``tests/training/test_transformers_internals.py`` checks each against the installed transformers (and that the package
touches no other private attribute), so an upgrade fails there, in one named place; the pin in ``pyproject.toml``
is the range that test passed on. ``CheckedTrainer`` checks the Trainer methods ``AtomicCheckpointTrainer``
overrides when it is built, since an override of a renamed method would silently never run. The modelling code
(remote code, which imports only its own package) uses the ones it needs by name; they are listed here too.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Internal:
    """``owner`` (a module, or a class in one, by dotted name) has ``name``. A method or function has
    ``parameters``, its parameter names in order; an attribute transformers sets on instances only has ``read_by``
    instead, the transformers function (dotted name) that reads it. ``used_in``: where hf-geonorm uses it, and how."""

    owner: str
    name: str
    used_in: str
    parameters: tuple[str, ...] | None = None
    read_by: str | None = None


OVERRIDDEN_BY_TRAINER = (
    Internal("transformers.Trainer", "_load_from_checkpoint",
             "training/run/checkpoints.py overrides it (a whole model resumes through load_checkpoint_weights, "
             "strictly); training/run/trainer.py calls it for a run killed after its last checkpoint",
             parameters=("self", "resume_from_checkpoint", "model")),
    Internal("transformers.Trainer", "_get_output_dir",
             "training/run/checkpoints.py overrides it: the Trainer's own save writes into the staging folder",
             parameters=("self", "trial")),
    Internal("transformers.Trainer", "_save_checkpoint",
             "training/run/checkpoints.py overrides it: the checkpoint moves into place whole once every process saved",
             parameters=("self", "model", "trial")),
    Internal("transformers.Trainer", "_load_callback_state",
             "training/run/checkpoints.py overrides it: a resume applies the intervals the command gives, not the "
             "saved",
             parameters=("self",)),
    Internal("transformers.Trainer", "_load_rng_state",
             "training/run/checkpoints.py overrides it: the file is checked to hold tensors only (no pickle) first",
             parameters=("self", "checkpoint")),
    Internal("transformers.Trainer", "_load_optimizer_and_scheduler",
             "training/run/checkpoints.py overrides it: the files are checked to hold tensors only (no pickle) first",
             parameters=("self", "checkpoint")),
    Internal("transformers.Trainer", "_load_scaler",
             "training/run/checkpoints.py overrides it: the file is checked to hold tensors only (no pickle) first",
             parameters=("self", "checkpoint")),
)  # fmt: skip

INTERNALS = (
    *OVERRIDDEN_BY_TRAINER,
    Internal("transformers.PreTrainedModel", "_init_weights",
             "modeling/model_mixins.py overrides it: GeoNorm's learnable step starts at scale 1 and bias 0",
             parameters=("self", "module")),
    Internal("transformers.PreTrainedModel", "_can_record_outputs",
             "modeling/families.py names the GeoNorm decoder layer in it (hidden states are captured by isinstance); "
             "modeling/blocks.py registers it for a base model whose class was swapped after __init__"),
    Internal("transformers.utils.output_capturing", "_CAN_RECORD_REGISTRY",
             "modeling/blocks.py: output_hidden_states is captured by the class registered in __init__"),
    Internal("transformers.PreTrainedModel", "_no_split_modules",
             "modeling/families.py, modeling/blocks.py and patching.py add the GeoNorm decoder layer's class name "
             "(device_map and FSDP keep modules whole by name)"),
    Internal("transformers.PreTrainedModel", "_hf_peft_config_loaded",
             "modeling/model_mixins.py: a model carrying PEFT adapters saves the adapters alone, without remote code"),
    Internal("transformers.PreTrainedModel", "_weight_conversions",
             "modeling/model_mixins.py: the stock checkpoint conversion of a converted model, guarded before saving",
             read_by="transformers.core_model_loading.revert_weight_conversion"),
    Internal("transformers.conversion_mapping", "get_checkpoint_conversion_mapping",
             "modeling/checkpoint_layout.py: a GeoNorm type takes its stock type's checkpoint conversion",
             parameters=("model_type",)),
    Internal("transformers.conversion_mapping", "register_checkpoint_conversion_mapping",
             "modeling/checkpoint_layout.py registers it by name, also for the classes loaded as remote code",
             parameters=("model_type_or_class_name", "mapping", "overwrite")),
    Internal("transformers.conversion_mapping", "WeightRenaming",
             "modeling/checkpoint_layout.py: GeoNorm's own tensor names hidden from the stock renamings",
             parameters=("source_patterns", "target_patterns")),
    Internal("transformers.integrations.integration_utils.TensorBoardCallback", "logging_dir",
             "training/run/outputs.py: RunOutputs.finish records the event files of the folder TensorBoard wrote in",
             read_by="transformers.integrations.integration_utils.TensorBoardCallback._init_summary_writer"),
)  # fmt: skip


def resolve(dotted: str) -> Any:
    """The module or attribute named by ``dotted`` (``transformers.Trainer``), importing the longest module
    prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ImportError(dotted)


def problems(internals: tuple[Internal, ...] = INTERNALS) -> list[str]:
    """What the installed transformers no longer has of ``internals``, one line each (empty: all there)."""
    found = []
    for internal in internals:
        where = f"{internal.owner}.{internal.name}"
        try:
            value = getattr(resolve(internal.owner), internal.name) if internal.read_by is None else None
        except (ImportError, AttributeError):
            found.append(f"{where} is gone ({internal.used_in})")
            continue
        if internal.read_by is not None:
            reader = resolve(internal.read_by)
            if internal.name not in inspect.getsource(reader):
                found.append(f"{internal.read_by} no longer reads {internal.name} ({internal.used_in})")
        elif internal.parameters is not None:
            names = tuple(inspect.signature(value).parameters)[: len(internal.parameters)]
            if names != internal.parameters:
                found.append(f"{where} takes ({', '.join(names)}), not ({', '.join(internal.parameters)})")
    return found


def check_trainer_overrides() -> None:
    """``RuntimeError`` naming them when transformers renamed or changed a Trainer method hf-geonorm overrides."""
    missing = problems(OVERRIDDEN_BY_TRAINER)
    if missing:
        import transformers

        raise RuntimeError(
            f"transformers {transformers.__version__} changed what hf-geonorm's checkpoints rely on: "
            f"{'; '.join(missing)}; install the transformers version pyproject.toml names"
        )
