"""Training GeoNorm models (``hf-geonorm train``, ``init`` and ``sweep``), one job a module, in reading order:

- ``options``: what a run and a sweep take (``TrainOptions``, ``SweepOptions``), declared once and checked first;
- ``transformers_internals``: the private transformers attributes the package relies on, named;
- the data, in the order it flows: ``corpus`` (the documents of ``--data``), ``tokenizer`` (the model folder's,
  ``--tokenizer``'s or one trained on the documents), ``token_batches`` (the documents tokenized in batches of
  bounded text, here or in worker processes), ``pipeline`` (the blocks, cached or streamed) and
  ``prepare`` (made ready for Trainer, with the log that accounts for the tokens);
- ``presets``, ``model``: the one from-scratch config recipe and the model to train;
- ``optim``: the one optimizer recipe and learning-rate schedule;
- ``bridge``: the bridge anneal of an uptraining run;
- ``checkpoints``, ``outputs``: checkpoints that are whole or absent, and what the output folder holds;
- ``trainer``: the run itself (``run_training``), over transformers' Trainer;
- ``sweep``, ``sweep_report``: a grid of runs and its report.
"""
