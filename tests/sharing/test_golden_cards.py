"""The cards in model_cards/golden/ are what ``hf-geonorm card`` writes today for a tiny GPT-2, a tiny LLaMA and a
LLaMA converted from a GGUF file (tests/support/golden_cards.py makes each model and writes its card; run
``PYTHONPATH=tests python -m support.golden_cards`` from the repository root to write them again after a change to
the card that is meant, and read ``git diff model_cards/golden``).

Before the comparison, what depends on where and when a card is written is replaced on both sides
(``golden_cards.normalised``): the hf-geonorm version, the folder the model was written in, and the fingerprint,
which is checked on the card as written instead."""

from __future__ import annotations

import pytest

from hf_geonorm.sharing.model_card import written_as_is

from support.golden_cards import GOLDEN, MODELS, normalised, written_card
from support.tiny_models import tiny_config


@pytest.mark.parametrize("name", MODELS)
def test_the_card_command_writes_the_golden_card(name, tmp_path):
    readme = written_card(name, tmp_path)
    text = readme.read_text(encoding="utf-8")
    assert written_as_is(text)  # its fingerprint is the sha256 of the text above it
    golden = (GOLDEN / f"{name}.md").read_text(encoding="utf-8")
    assert normalised(text, readme.parent) == golden, f"run PYTHONPATH=tests python -m support.golden_cards ({name})"


@pytest.mark.parametrize("name", MODELS)
def test_the_golden_cards_state_their_models(name):
    """What each golden card says of its model, against the model's own config (a golden card written from a
    wrong model would fail here, not only differ)."""
    kind, facts = MODELS[name]
    config = tiny_config("llama", hidden_size=32, num_hidden_layers=2) if kind == "gguf" else tiny_config(kind)
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    golden = (GOLDEN / f"{name}.md").read_text(encoding="utf-8")
    assert f"It has {layers} decoder layers, hidden size {hidden} and " in golden
    assert f"base_model: {facts[facts.index('--base-model') + 1]}\n" in golden
    assert f"model_type` | `geonorm_{config.model_type}` |" in golden
    assert "`hf-geonorm` VERSION" in golden and "sha256 of the text above: SHA256 -->" in golden
