"""The GeoNorm model card's template (``geonorm_model_card.md``), which ``hf_geonorm.sharing.model_card`` renders:
installed as the package ``hf_geonorm.model_cards`` (pyproject.toml's ``package-dir``). ``golden/`` holds cards
rendered for tiny models, which tests/sharing/test_golden_cards.py compares with what ``hf-geonorm card`` writes;
they are not installed."""
