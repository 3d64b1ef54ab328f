"""The model-card template that ``hf_geonorm.export`` renders (installed as package ``hf_geonorm.model_cards``)."""
