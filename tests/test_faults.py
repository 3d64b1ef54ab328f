"""Faults found by a hostile trial: settings that were accepted and then broke the forward, half-applied patches,
silently wrong loading and misleading messages. Each test compares with an independent computation (a stock
model, a formula written out here) or checks the error a user gets."""

from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import fails
from tiny_models import LAYERS, tiny_model, token_ids

import hf_geonorm
from hf_geonorm.modeling.settings import MAX_FRAME_RISE, MIN_FRAME, GeoNormSettings


def finite_logits_and_gradients(model: torch.nn.Module, ids: torch.Tensor) -> tuple[bool, bool]:
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.isfinite(out.logits).all()), bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)


# ---- 1. geo_frames: every accepted list gives finite outputs ----


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
        ([1.0, 1e7, 1.0, 1e7, 1.0, 1e7], r"rise by at most a factor of 10000"),  # the trial's NaN
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


# ---- 2. no clamp in float16: finite for every accepted alpha ----


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
    from hf_geonorm.modeling.step_switch import set_fused_enabled

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
            out = hf_geonorm.geonorm_step(xs, us, hf_geonorm.StepParams(alpha, max_angle=None))
            out.float().pow(2).sum().backward()
            assert torch.isfinite(out).all() and torch.isfinite(xs.grad).all() and torch.isfinite(us.grad).all()
            torch.testing.assert_close(out.double(), expected, atol=2e-2 * x_norm.max().item(), rtol=0)
    finally:
        set_fused_enabled(True)


# ---- 3. apply_geonorm is all or nothing ----


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


# ---- 4. settings the block layout cannot run are refused where the config meets the layout ----

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


# ---- 6. a calibration text too short to take medians over ----


def test_calibrating_on_a_text_of_two_tokens_is_refused_naming_the_file_and_count(tmp_path):
    from hf_geonorm.conversion import MIN_CALIBRATION_TOKENS

    tiny_model("llama").save_pretrained(tmp_path / "stock")  # no tokenizer: one token per UTF-8 byte
    (tmp_path / "short.txt").write_text("ab")
    line = fails("convert", tmp_path / "stock", tmp_path / "out", "--calibrate", tmp_path / "short.txt")
    assert "short.txt gives 2 token(s)" in line and f"needs at least {MIN_CALIBRATION_TOKENS}" in line
    assert not (tmp_path / "out").exists()


# ---- 7. a GeoNorm checkpoint must hold the tensors its own settings have ----


def saved_without_step_tensors(folder):
    from safetensors.torch import load_file, save_file

    file = folder / "model.safetensors"
    tensors = load_file(file)
    kept = {k: v for k, v in tensors.items() if not k.endswith(("step_scale", "step_bias"))}
    assert len(kept) == len(tensors) - 4 * LAYERS  # scale and bias of two updates per layer
    save_file(kept, file, metadata={"format": "pt"})


def test_learnable_step_tensors_missing_from_a_checkpoint_that_trained_them_are_refused(tmp_path):
    from hf_geonorm.loading import load_model, open_source

    model = hf_geonorm.convert(tiny_model("llama"), geo_learnable_step=True)
    model.save_pretrained(tmp_path / "geo")
    saved_without_step_tensors(tmp_path / "geo")
    with pytest.raises(ValueError, match=r"model\.safetensors: 12 tensor\(s\) missing \(model\.layers\.0\..*step_"):
        load_model(open_source(tmp_path / "geo"))
    line = fails("perplexity", tmp_path / "geo", "--text", __file__, "--max-tokens", "8")
    assert "12 tensor(s) missing" in line


def test_learnable_step_tensors_new_to_a_checkpoint_may_be_missing(tmp_path):
    """A stock checkpoint, or a GeoNorm one without learnable steps, converted to learnable steps: the step
    tensors start at scale 1, bias 0 (as a formula: the step of a model with no learnable step)."""
    from hf_geonorm.loading import load_model, open_source

    stock = tiny_model("llama", perturb=True)
    stock.save_pretrained(tmp_path / "stock")
    hf_geonorm.convert(stock, geo_alpha=0.3).save_pretrained(tmp_path / "geo")
    ids = token_ids()
    expected = hf_geonorm.convert(stock, geo_alpha=0.3)(input_ids=ids).logits
    for folder in ("stock", "geo"):
        source = open_source(tmp_path / folder)
        config = hf_geonorm.config_class_for("llama").from_pretrained(
            tmp_path / folder, norm_style="geo", geo_alpha=0.3, geo_learnable_step=True
        )
        model = load_model(source, config=config)
        torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=1e-6)


# ---- 8. messages that name what happened ----


def test_a_nan_perplexity_is_called_nan():
    from hf_geonorm.analysis.evaluation import check_finite, perplexity
    from hf_geonorm.errors import NonFiniteError

    model = hf_geonorm.convert(tiny_model("llama"), norm_style="pre")
    with torch.no_grad():
        model.lm_head.weight[3] = math.nan
    windows = token_ids(1).tolist()
    value = perplexity(model, windows)
    assert math.isnan(value)
    with pytest.raises(NonFiniteError, match=r"^the perplexity is NaN: the weights hold non-finite values"):
        check_finite(value, "the perplexity", model, windows)


def test_a_tensor_missing_from_a_sharded_checkpoint_names_the_index(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from hf_geonorm.loading import load_model, open_source

    tiny_model("llama").save_pretrained(tmp_path, max_shard_size="20KB")
    index_file = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    key = "model.layers.1.mlp.up_proj.weight"
    shard = tmp_path / index["weight_map"].pop(key)
    index_file.write_text(json.dumps(index))
    save_file({k: v for k, v in load_file(shard).items() if k != key}, shard, metadata={"format": "pt"})
    assert not (tmp_path / "model.safetensors").exists()
    with pytest.raises(ValueError, match=rf"^{index_file}: 1 tensor\(s\) missing \({key}\)"):
        load_model(open_source(tmp_path))


def test_an_output_name_of_240_characters_is_written(tmp_path):
    from hf_geonorm.files.atomic import atomic_directory, remove_stale_partials

    output = tmp_path / ("m" * 240)
    with atomic_directory(output) as tmp:
        assert len(tmp.name) < 160
        (tmp / "weights").write_text("w")
    assert (output / "weights").read_text() == "w"
    # a killed run's partial folder of that output is found and removed by the next run
    with atomic_directory(tmp_path / ("m" * 240 + "2")) as other:
        stale = other.parent / other.name.replace(f"-{os.getpid()}-", "-999999999-")
        other.rename(stale)
        other.mkdir()
    assert remove_stale_partials(tmp_path / ("m" * 240 + "2")) and not stale.exists()


def test_converting_to_a_link_to_an_empty_folder_writes_into_that_folder(tmp_path):
    """A careful user who points OUT at an empty folder through a link expects the model there: the new folder
    takes the empty folder's place, and the link, untouched, leads to it."""
    tiny_model("llama").save_pretrained(tmp_path / "stock")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty", target_is_directory=True)
    from click.testing import CliRunner

    from hf_geonorm_cli.main import cli

    result = CliRunner().invoke(cli, ["convert", str(tmp_path / "stock"), str(tmp_path / "link"), "--bridge", "0"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "link").is_symlink() and (tmp_path / "empty" / "config.json").is_file()
    model = hf_geonorm.loading.load_model(hf_geonorm.loading.open_source(tmp_path / "link"))
    ids = token_ids()
    torch.testing.assert_close(model(input_ids=ids).logits, tiny_model("llama")(input_ids=ids).logits)


@pytest.mark.parametrize("value", ["1,,2", "1,", ",1", "1, ,2"])
def test_an_alpha_list_with_an_empty_item_is_refused(value, tmp_path):
    line = fails("convert", tmp_path / "source", tmp_path / "out", "--alpha", value, code=2)
    assert "empty item" in line and repr(value) in line


# ---- 5. the first token of a left-padded batch without position ids ----


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
