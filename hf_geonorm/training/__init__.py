"""Training GeoNorm models (``hf-geonorm train`` and ``hf-geonorm init``), one job a module, in reading order:

- ``options``: what a run takes (``TrainOptions``), checked first;
- ``data``: the text, the tokenizer and the token blocks;
- ``presets``, ``model``: the one from-scratch config recipe and the model to train;
- ``optim``: the one optimizer and learning-rate schedule (the benchmarks train with it too);
- ``bridge``: the bridge anneal of an uptraining run;
- ``trainer``: the run itself (``run_training``), over transformers' Trainer;
- ``checkpoints``, ``outputs``: checkpoints that are whole or absent, and what the output folder holds.
"""
