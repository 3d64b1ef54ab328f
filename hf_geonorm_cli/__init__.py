"""The ``hf-geonorm`` command line (installed as the ``hf_geonorm_cli`` package)."""
