"""One run of ``hf-geonorm train`` (``trainer.run_training``) and what it is made of: ``model`` (the model to train),
``optim`` (the optimizer recipe and learning-rate schedule), ``bridge`` (the bridge anneal of an uptraining run),
``checkpoints`` (whole or absent), ``record`` (what a checkpoint records of its run, which ``--resume`` checks),
``outputs`` (what the output folder holds) and ``transformers_internals`` (the private transformers attributes the
run relies on, named)."""
