"""Faults found by a hostile trial: settings that were accepted and then broke the forward, half-applied patches,
silently wrong loading and misleading messages. Each test compares with an independent computation (a stock
model, a formula written out here) or checks the error a user gets."""

from __future__ import annotations

import pytest
import torch
from tiny_models import LAYERS, tiny_model, token_ids

import hf_geonorm
from hf_geonorm.settings import MAX_FRAME_RISE, MIN_FRAME, GeoNormSettings


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
