"""``apply_geonorm`` is all or nothing: a model whose layers it cannot patch is refused and left as it was, and a
patch failing part way is undone (the stock classes, config and outputs again)."""

from __future__ import annotations

import pytest
import torch

import hf_geonorm

from support.tiny_models import tiny_model, token_ids


class Wrapped(torch.nn.Module):
    """A decoder layer replaced by another module (a wrapper that calls the stock layer)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def snapshot(model: torch.nn.Module) -> tuple:
    return [type(m) for m in model.modules()], type(model.config), model.config.to_dict()


def test_a_replaced_decoder_layer_is_refused_and_leaves_the_model_as_it_was():
    model = tiny_model("llama", perturb=True)
    model.model.layers[2] = Wrapped(model.model.layers[2])
    ids, before = token_ids(), snapshot(model)
    expected = tiny_model("llama", perturb=True)(input_ids=ids).logits  # the same weights, unwrapped
    with pytest.raises(ValueError, match=r"decoder layer 2 \(Wrapped\) has no 'self_attn'"):
        hf_geonorm.apply_geonorm(model, geo_bridge=0.0)
    assert snapshot(model) == before
    assert torch.equal(model(input_ids=ids).logits, expected)


def test_a_deleted_norm_is_refused_and_leaves_the_model_as_it_was():
    model = tiny_model("llama", perturb=True)
    del model.model.layers[1].post_attention_layernorm
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"decoder layer 1 .*has no 'post_attention_layernorm'"):
        hf_geonorm.apply_geonorm(model)
    assert snapshot(model) == before


def test_a_patch_failing_part_way_is_undone(monkeypatch):
    """Any error after validation (here the fourth residual module fails to build, as when memory runs out):
    the model has its stock classes, config and outputs again, and can be patched afterwards."""
    import hf_geonorm.modeling.blocks as blocks

    real, built = blocks.GeoNormResidual, []

    class Failing(real):
        def __init__(self, *args, **kwargs) -> None:
            built.append(1)
            if len(built) == 4:
                raise MemoryError("out of memory")
            super().__init__(*args, **kwargs)

    model, ids = tiny_model("llama", perturb=True), token_ids()
    expected, before = model(input_ids=ids).logits, snapshot(model)
    monkeypatch.setattr(blocks, "GeoNormResidual", Failing)
    with pytest.raises(MemoryError):
        hf_geonorm.apply_geonorm(model, geo_bridge=0.0)
    monkeypatch.undo()
    assert snapshot(model) == before
    assert not any("geonorm" in name for name, _ in model.named_modules())
    assert torch.equal(model(input_ids=ids).logits, expected)
    hf_geonorm.apply_geonorm(model, geo_bridge=0.0)
    torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=0)
