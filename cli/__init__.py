"""The ``hf-geonorm`` command line: the package ``hf_geonorm_cli``, one module per command or pair of commands over
the library (``main`` is the group), every option generated from its declaration (``options``)."""
