"""Settings at the edge of what a model accepts: every accepted value gives finite logits and gradients, a value
beyond is refused with the bound and why, also where the config meets a block layout that cannot run it. Each
test compares with an independent computation (a formula written out here, the sequence run alone) or checks the
error a user gets."""

from __future__ import annotations

import json
import math

import pytest
import torch

import hf_geonorm
from hf_geonorm.modeling.settings import MAX_FRAME_RISE, MIN_FRAME, GeoNormSettings

from support.helpers import fails
from support.tiny_models import LAYERS, tiny_model, token_ids


def finite_logits_and_gradients(model: torch.nn.Module, ids: torch.Tensor) -> tuple[bool, bool]:
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.isfinite(out.logits).all()), bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)


# ---- geo_frames: every accepted list gives finite outputs ----


@pytest.mark.parametrize(
    "frames",
    [
        [1.0] + [MAX_FRAME_RISE] * (2 * LAYERS - 1),  # the whole rise between the first two updates
        [1.0, 100.0, 1.0, 100.0, 1.0, 1.0],  # rises that compound: 100 * 100
        [1.0] + [MIN_FRAME] * (2 * LAYERS - 1),  # the smallest frame
    ],
)
def test_the_largest_accepted_frame_rise_gives_finite_logits_and_gradients(frames):
    model = hf_geonorm.convert(tiny_model("llama", perturb=True), geo_bridge=0.5, geo_frames=frames)
    assert finite_logits_and_gradients(model, token_ids()) == (True, True)


@pytest.mark.parametrize(
    "frames,match",
    [
        ([1.0, MAX_FRAME_RISE * 1.001, 1.0, 1.0, 1.0, 1.0], r"rise by at most a factor of 10000.*overflow"),
        ([1.0, 1e7, 1.0, 1e7, 1.0, 1e7], r"rise by at most a factor of 10000"),  # NaN in the forward unbounded
        ([1.0, 101.0, 1.0, 100.0, 1.0, 1.0], r"rise by at most"),  # compounded just beyond
        ([MAX_FRAME_RISE * 1.001] * 6, r"rise by at most"),  # the first frame counts from 1
        ([1.0, MIN_FRAME / 2, 1.0, 1.0, 1.0, 1.0], r"at least 1e-09"),
    ],
)
def test_frames_beyond_the_bound_are_refused_with_the_bound_and_why(frames, match):
    with pytest.raises(ValueError, match=match):
        GeoNormSettings(geo_frames=frames)
    model = tiny_model("llama")
    with pytest.raises(ValueError, match=match):
        hf_geonorm.apply_geonorm(model, geo_bridge=0.5, geo_frames=frames)


# ---- no clamp in float16: finite for every accepted alpha ----


@pytest.mark.parametrize("alpha", [1e3, 1e4, 1e6])
def test_no_clamp_float16_gives_finite_logits_and_gradients(alpha):
    model = tiny_model("llama", perturb=True).to(torch.float16)
    hf_geonorm.apply_geonorm(model, geo_alpha=alpha, geo_max_angle=None)
    assert finite_logits_and_gradients(model, token_ids()) == (True, True)


@pytest.mark.parametrize("fused", [True, False])
def test_no_clamp_step_stops_at_the_antipode_in_float16(fused):
    """The step in float16, against the formula written out in float64: x turns towards t = u - <u,x>/|x|^2 x by
    theta = min(alpha |t|/|x|, pi) (pi: the antipode, beyond which the circle winds back), keeping |x|. Base
    angles 0.01-10: rows turned by less than pi have gradients of order alpha, which float16 cannot hold."""
    from hf_geonorm.modeling.fused import set_fused_enabled

    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 16, generator=g, dtype=torch.float64)
    u = torch.randn(6, 16, generator=g, dtype=torch.float64) * torch.logspace(-2, 1, 6, dtype=torch.float64)[:, None]
    t = u - (u * x).sum(-1, keepdim=True) / (x * x).sum(-1, keepdim=True) * x
    x_norm, t_norm = x.norm(dim=-1, keepdim=True), t.norm(dim=-1, keepdim=True)
    set_fused_enabled(fused)
    try:
        for alpha in (1e3, 1e4, 1e6):
            theta = (alpha * t_norm / x_norm).clamp_max(math.pi)
            expected = torch.cos(theta) * x + torch.sin(theta) * x_norm * t / t_norm
            xs, us = x.half().requires_grad_(), u.half().requires_grad_()
            out = hf_geonorm.geodesic_step(xs, us, alpha, max_angle=None)
            out.float().pow(2).sum().backward()
            assert torch.isfinite(out).all() and torch.isfinite(xs.grad).all() and torch.isfinite(us.grad).all()
            torch.testing.assert_close(out.double(), expected, atol=2e-2 * x_norm.max().item(), rtol=0)
    finally:
        set_fused_enabled(True)


# ---- settings the block layout cannot run are refused where the config meets the layout ----


PARALLEL = ["gptj", "codegen", "cohere", "gpt_neox-parallel", "falcon", "falcon-new", "phi", "stablelm-parallel"]


@pytest.mark.parametrize("case", PARALLEL)
@pytest.mark.parametrize("name", ["geo_bridge", "geo_frames"])
def test_per_update_lists_on_parallel_blocks_are_refused_by_apply_geonorm(case, name):
    model = tiny_model(case)
    before = [type(m) for m in model.modules()]
    match = rf"{name} given as a list must have one value per layer \({LAYERS}\).*parallel"
    with pytest.raises(ValueError, match=match):
        hf_geonorm.apply_geonorm(model, **{name: [0.5] * (2 * LAYERS)})
    assert [type(m) for m in model.modules()] == before
    hf_geonorm.apply_geonorm(model, **{name: [0.5] * LAYERS})  # one per layer is what they take
    assert torch.isfinite(model(input_ids=token_ids()).logits).all()


@pytest.mark.parametrize("case", ["gptj", "gpt_neox-parallel"])
@pytest.mark.parametrize("name", ["geo_bridge", "geo_frames"])
def test_convert_refuses_a_folder_with_per_update_lists_on_parallel_blocks(case, name, tmp_path):
    import json

    folder = tmp_path / "geo"
    hf_geonorm.convert(tiny_model(case), geo_bridge=0.0).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config[name] = [0.5] * (2 * LAYERS)
    (folder / "config.json").write_text(json.dumps(config))
    line = fails("convert", folder, tmp_path / "out", "--bridge", "0")
    assert f"{name} given as a list must have one value per layer ({LAYERS})" in line and "config.json" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["gpt_neo", "gpt_bigcode"])
def test_first_token_prenorm_is_refused_where_layers_cannot_find_the_first_token(case, tmp_path):
    tiny_model(case).save_pretrained(tmp_path / "stock")
    line = fails("convert", tmp_path / "stock", tmp_path / "out", "--bridge", "0", "--first-token-prenorm", code=2)
    assert "--first-token-prenorm needs each sequence's first token" in line
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="geo_first_token_prenorm needs each sequence's first token"):
        hf_geonorm.apply_geonorm(tiny_model(case), geo_first_token_prenorm=True)


# ---- the first token of a left-padded batch without position ids ----


@pytest.mark.parametrize("bridge", [0.5, 1.0])
def test_first_token_prenorm_finds_the_first_real_token_of_a_left_padded_batch(bridge):
    """Left padding with an attention mask and no position ids: the real positions give the logits of each
    sequence run alone (RoPE sees only relative positions; the first real token takes the Pre-Norm update)."""
    model = hf_geonorm.convert(tiny_model("llama", perturb=True), geo_bridge=bridge, geo_first_token_prenorm=True)
    ids = token_ids(2, 7)
    pads = [3, 1]
    padded = torch.zeros(2, 10, dtype=torch.long)
    mask = torch.zeros(2, 10, dtype=torch.long)
    for row, pad in enumerate(pads):
        padded[row, pad : pad + 7], mask[row, pad : pad + 7] = ids[row], 1
    with torch.no_grad():
        batch = model(input_ids=padded, attention_mask=mask).logits
        for row, pad in enumerate(pads):
            alone = model(input_ids=ids[row : row + 1]).logits[0]
            torch.testing.assert_close(batch[row, pad : pad + 7], alone, rtol=1e-4, atol=1e-5)
        # decoding one more token with the cache and the extended mask, still without position ids
        out = model(input_ids=padded[:, :-1], attention_mask=mask[:, :-1], use_cache=True)
        step = model(input_ids=padded[:, -1:], attention_mask=mask, past_key_values=out.past_key_values).logits
        torch.testing.assert_close(step[:, 0], batch[:, -1], rtol=1e-4, atol=1e-5)


def test_first_token_prenorm_on_layers_without_keyword_arguments_needs_position_ids_with_padding():
    """Falcon's model does not pass its keyword arguments on to its layers, so they cannot be told the first real
    token of a left-padded batch: without position ids such a batch is refused in one line naming them; unpadded,
    the mask says what the position ids say; with position ids the padded batch runs."""
    model = hf_geonorm.convert(tiny_model("falcon"), geo_first_token_prenorm=True).eval()
    ids = token_ids(2, 7)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.equal(model(ids, attention_mask=mask).logits, model(ids).logits)
        mask[0, :2] = 0
        with pytest.raises(ValueError, match="pass position_ids with a left-padded batch"):
            model(ids, attention_mask=mask)
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        assert torch.isfinite(model(ids, attention_mask=mask, position_ids=positions).logits).all()


# ---- lists of values on the command line ----


@pytest.mark.parametrize("value", ["1,,2", "1,", ",1", "1, ,2"])
def test_an_alpha_list_with_an_empty_item_is_refused(value, tmp_path):
    line = fails("convert", tmp_path / "source", tmp_path / "out", "--alpha", value, code=2)
    assert "empty item" in line and repr(value) in line


# ---- per-layer lists against the depth a config ends with ----


@pytest.mark.parametrize("arch, depth_name", [("gpt2", "n_layer"), ("gpt2", "num_hidden_layers"),
                                              ("llama", "num_hidden_layers")])  # fmt: skip
def test_a_per_layer_list_is_checked_against_the_depth_given_with_it(arch, depth_name, tmp_path):
    # transformers sets a mapped name (GPT-2's num_hidden_layers for n_layer) after the fields: the list must still
    # meet the depth given, not the class default (12 for GPT-2, 32 for LLaMA)
    config_class = hf_geonorm.config_class_for(arch)
    config = config_class(**{depth_name: 3}, geo_alpha=[0.1, 0.2, 0.3], geo_bridge=[1.0] * 6)
    assert (config.num_hidden_layers, config.geo_alpha, config.geo_bridge) == (3, [0.1, 0.2, 0.3], [1.0] * 6)
    for length in (2, 4, 12, 32):
        with pytest.raises(ValueError, match=rf"one value per layer \(3\).*got {length}"):
            config_class(**{depth_name: 3}, geo_alpha=[0.1] * length)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not [key for key in saved if key.startswith("_")]  # nothing of the check is saved
    assert config_class.from_pretrained(tmp_path).geo_alpha == [0.1, 0.2, 0.3]
