"""Sharing GeoNorm models: folders complete with their remote code (``folders``), the model card (``model_card``),
the checks a folder passes before it is pushed (``card_checks``) and the Hugging Face Hub upload (``hub``)."""
