"""The config is the one home of a GeoNorm model's settings, and what depends on them at build time.

- Every setting assigned on a built model's config: the model then computes what a fresh model built from a
  config with that setting computes (same weights, loaded from the first model's state_dict), and a
  save/reload gives the same logits; or, for the two settings that decide which modules exist, the assignment
  raises and names ``apply_geonorm``.
- ``apply_geonorm`` validates everything before it touches the model.
- A model built from a config for GeoNorm training has no frozen zero embedding row, and
  DeepNet's init scales the values inside Phi-3's fused q/k/v projection.
"""

from __future__ import annotations

import copy
import gc
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_geonorm

from support.tiny_models import tiny_config, tiny_model, token_ids

# The built model steps hard enough (alpha 6, sqrt decay) that the clamp is reached, so every setting changes
# its logits.
BUILT = {"geo_alpha": 6.0, "geo_decay": "sqrt"}
FOLLOWED = [
    ("geo_alpha", 0.5),
    ("geo_alpha", [0.9, 0.1, 2.0]),
    ("geo_decay", "linear"),
    ("geo_decay", "constant"),
    ("geo_max_angle", None),
    ("geo_max_angle", 0.3),
    ("geo_radius", "sqrt_d"),
    ("geo_bridge", 0.3),
    ("geo_bridge", 0.0),
]
STRUCTURAL = [("norm_style", "pre"), ("norm_style", "sandwich"), ("geo_learnable_step", True)]


def logits(model, ids=None):
    with torch.no_grad():
        return model(ids if ids is not None else token_ids()).logits


def built_model(model_type: str, **settings):
    return hf_geonorm.convert(tiny_model(model_type), **{**BUILT, **settings})


def fresh_model(model_type: str, state_dict, **settings):
    """A model built from a new config that carries ``settings`` from the start, with the given weights."""
    config = hf_geonorm.config_class_for(model_type)(**tiny_config(model_type).to_dict(), **settings)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.load_state_dict(state_dict)
    return model


@pytest.mark.parametrize("learnable", [False, True])
@pytest.mark.parametrize("name,value", FOLLOWED, ids=[f"{n}={v}" for n, v in FOLLOWED])
@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_an_assigned_setting_is_what_the_model_computes_and_saves(model_type, name, value, learnable, tmp_path):
    model = built_model(model_type, geo_learnable_step=learnable)
    if learnable:  # learnable steps away from their identity start, so that they are part of the weights compared
        with torch.no_grad():
            for k, module in enumerate(m for m in model.modules() if isinstance(m, hf_geonorm.GeoNormResidual)):
                module.step_scale.fill_(0.8 + 0.1 * k)
                module.step_bias.fill_(0.01 * k)
    before = logits(model)
    setattr(model.config, name, value)
    after = logits(model)
    assert not torch.allclose(after, before, atol=1e-5), "the setting should change this model's outputs"
    settings = {**BUILT, "geo_learnable_step": learnable, name: value}
    torch.testing.assert_close(after, logits(fresh_model(model_type, model.state_dict(), **settings)), rtol=0, atol=0)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())[name] == value
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(reloaded), after, rtol=0, atol=0)


def test_bridge_zero_through_a_peft_wrapper_is_the_stock_model():
    """The bridge anneal is a plain config assignment, also on a LoRA-wrapped model."""
    from peft import LoraConfig, get_peft_model

    stock = tiny_model("llama")
    wrapped = get_peft_model(hf_geonorm.convert(stock), LoraConfig(r=2))
    assert (logits(wrapped) - logits(stock)).abs().max() > 1e-3
    wrapped.config.geo_bridge = 0.0
    assert (logits(wrapped) - logits(stock)).abs().max() <= 1e-5


@pytest.mark.parametrize("name,value", STRUCTURAL, ids=[f"{n}={v}" for n, v in STRUCTURAL])
def test_a_setting_that_changes_the_modules_is_refused_on_a_built_model(name, value):
    model = built_model("llama")
    expected = logits(model)
    with pytest.raises(ValueError, match=rf"apply_geonorm\(model, {name}={value!r}\)"):
        setattr(model.config, name, value)
    assert getattr(model.config, name) == getattr(hf_geonorm.GeoNormSettings(), name)  # unchanged
    assert torch.equal(logits(model), expected)
    setattr(model.config, name, getattr(model.config, name))  # the value it has is accepted
    clone = copy.deepcopy(model)
    with pytest.raises(ValueError, match="apply_geonorm"):  # also on a copy (copies read their own config)
        setattr(clone.config, name, value)
    # apply_geonorm is the way: the model then computes what a fresh model with that setting computes
    hf_geonorm.apply_geonorm(model, **{name: value})
    assert getattr(model.config, name) == value
    fresh = fresh_model("llama", model.state_dict(), **BUILT, **{name: value})
    torch.testing.assert_close(logits(model), logits(fresh), rtol=0, atol=0)


@pytest.mark.parametrize("name,value", STRUCTURAL, ids=[f"{n}={v}" for n, v in STRUCTURAL])
def test_a_config_without_a_model_accepts_every_setting(name, value, tmp_path):
    config = hf_geonorm.config_class_for("llama")(**tiny_config("llama").to_dict())
    setattr(config, name, value)
    assert getattr(config, name) == value
    model = built_model("llama")
    config = model.config
    del model
    gc.collect()
    setattr(config, name, value)  # its model is gone
    assert getattr(config, name) == value
    built_model("llama").save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, **{name: value})  # set before the model is built
    assert getattr(loaded.config, name) == value


def test_reapplying_geonorm_keeps_the_parameters_that_fit():
    """Trained learnable steps survive apply_geonorm with new step sizes (before, every module was replaced)."""
    model = built_model("llama", geo_learnable_step=True)
    with torch.no_grad():
        model.model.layers[1].geonorm_mlp_residual.step_scale.fill_(0.5)
    hf_geonorm.apply_geonorm(model, geo_alpha=0.7)
    assert model.model.layers[1].geonorm_mlp_residual.step_scale.item() == 0.5
    assert model.config.geo_alpha == 0.7 and model.config.geo_learnable_step


# ---- apply_geonorm validates before it patches ----


BAD_PATCHES = [
    ("llama", {"num_hidden_layers": 2}, {"geo_alpha": [1.0, 2.0, 3.0]}, "one value per layer"),
    ("olmo2", {}, {"norm_style": "sandwich"}, "only norm_style 'pre'"),
    ("llama", {}, {"geo_bridge": 3.0}, "geo_bridge"),
    ("llama", {}, {"geo_step": 1.0}, "unknown GeoNorm setting"),
]


@pytest.mark.parametrize("model_type,sizes,settings,message", BAD_PATCHES)
def test_a_refused_patch_leaves_the_model_as_it_was(model_type, sizes, settings, message):
    model = tiny_model(model_type, **sizes)
    classes = (type(model), type(model.model), type(model.config), [type(layer) for layer in model.model.layers])
    config = model.config.to_dict()
    expected = logits(model)
    with pytest.raises(ValueError, match=message):
        hf_geonorm.apply_geonorm(model, **settings)
    assert (type(model), type(model.model), type(model.config), [type(layer) for layer in model.model.layers]) == (
        classes
    )
    assert model.config.to_dict() == config
    assert not any(isinstance(m, hf_geonorm.GeoNormResidual) for m in model.modules())
    assert torch.equal(logits(model), expected)


def test_a_refused_patch_leaves_a_geonorm_model_as_it_was():
    model = built_model("llama")
    settings = model.config.geonorm_settings()
    expected = logits(model)
    with pytest.raises(ValueError, match="one value per layer"):
        hf_geonorm.apply_geonorm(model, geo_alpha=[1.0, 2.0])
    assert model.config.geonorm_settings() == settings
    assert torch.equal(logits(model), expected)


# ---- what a model built from a config starts with ----


def embedding_of(model):
    return model.get_input_embeddings()


def test_a_geo_model_built_from_a_config_has_no_dead_padding_token():
    """Stock LLaMA zeroes and freezes the pad row; under geo a zero state never moves, so every next-token
    logit of that position is equal. A GeoNorm geo model draws the row like the others and trains it."""
    pad = 2  # the end-of-text id as pad, as is common
    stock = tiny_model("llama", pad_token_id=pad)
    assert torch.count_nonzero(embedding_of(stock).weight[pad]) == 0  # the premise: stock zeroes it
    dead = hf_geonorm.convert(stock)
    ids = torch.tensor([[5, pad, 7, pad]])
    assert logits(dead, ids)[0, 1].unique().numel() == 1  # converted weights are kept: this row stays dead

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_geonorm.config_class_for("llama")(**stock.config.to_dict()))
    weight = embedding_of(model).weight
    assert embedding_of(model).padding_idx is None
    others = torch.cat([weight[:pad], weight[pad + 1 :]])
    assert 0.5 < weight[pad].norm() / others.norm(dim=-1).mean() < 2.0  # drawn like the others
    out = model(ids, labels=ids)
    assert out.logits[0, 1].std() > 1e-4  # the pad position predicts
    out.loss.backward()
    assert weight.grad[pad].abs().max() > 0  # and its row trains

    base = hf_geonorm.family_for("llama").base_class(model.config)  # the base model built on its own too
    assert embedding_of(base).padding_idx is None and embedding_of(base).weight[pad].norm() > 0


def test_converted_and_pre_models_keep_their_embedding_weights():
    stock = tiny_model("llama", pad_token_id=2)
    geo = hf_geonorm.convert(stock)
    assert torch.equal(embedding_of(geo).weight, embedding_of(stock).weight)  # converted: weights kept
    assert embedding_of(geo).padding_idx is None  # but the row is no longer frozen
    pre_config = hf_geonorm.config_class_for("llama")(**stock.config.to_dict(), norm_style="pre")
    pre = AutoModelForCausalLM.from_config(pre_config)
    assert embedding_of(pre).padding_idx == 2 and torch.count_nonzero(embedding_of(pre).weight[2]) == 0
