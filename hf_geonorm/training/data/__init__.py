"""The data of ``hf-geonorm train``, in the order it flows: ``corpus`` (what ``--data`` names, as documents; a
folder's files by ``folders``), ``tokenizer`` (the ``--model`` folder's, ``--tokenizer``'s or one trained on the
documents), ``split`` (what validation and test hold out: whole files of a folder, without the near-duplicates of
training text ``duplicates`` finds), ``token_batches`` (the documents tokenized in batches of bounded text, here or
in worker processes), ``pipeline`` (the training, validation and test blocks, cached or streamed, each cache entry
checked by ``cache_checks``) and ``prepare`` (the data step of a run: all of it made ready for Trainer, with the log
that accounts for the tokens)."""
