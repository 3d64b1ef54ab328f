"""The model-card template that ``hf_geonorm.sharing.model_card`` renders (installed as package
``hf_geonorm.model_cards``)."""
