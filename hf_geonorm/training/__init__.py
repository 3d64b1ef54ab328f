"""Training GeoNorm models (``hf-geonorm train`` and ``init``; ``hf_geonorm.sweep`` runs grids of them), one job a
module, in reading order:

- ``options``: what a run takes (``TrainOptions``), declared once and checked first, with ``presets`` (the model
  sizes) and ``rate_rule`` (the default learning rate);
- ``data``: the data in the order it flows: ``corpus`` and ``documents`` (what ``--data`` names, and its documents),
  ``tokenizer``, ``token_batches``, ``pipeline`` (the blocks, cached or streamed) and ``prepare`` (the run's data
  step, with the log that accounts for the tokens);
- ``run``: one run (``run.trainer.run_training``, a sequence of named steps over transformers' Trainer) and what it
  is made of: ``model``, ``optim``, ``bridge``, ``checkpoints``, ``record``, ``outputs`` and the transformers
  internals it relies on;
- ``liger``: Liger-Kernel's patches of a stock type for the ``geonorm_X`` types (Trainer's ``use_liger_kernel``),
  registered by ``import hf_geonorm``.
"""
