"""What is particular to each decoder layout (hf_geonorm/layouts.py), on the registered cases of
tests/support/tiny_models.py; the properties every case shares are in tests/modeling/test_models.py.

- ``sandwich`` adds output norms that start as the plain normalisation, and is refused where the layout
  cannot take them; the layouts that already norm their outputs accept only ``pre`` and ``geo``;
- ``pre`` keeps the stock residual dropouts (same random numbers in training) and the attention weights of
  layers that return them;
- the Falcon variants whose stock block does not work are refused with a clear error;
- each block shape is a class written out in hf_geonorm/modeling/decoder_layers.py, which a stack trace names;
- ``LLAMA_LAYOUT_TYPES`` is exactly the LLaMA-identical causal LMs of the installed transformers
  (benchmarks/scan_layouts.py finds them);
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path

import pytest
import torch

import hf_geonorm
from hf_geonorm.modeling import decoder_layers
from hf_geonorm.modeling.decoder_layers import DECODER_LAYERS
from hf_geonorm.modeling.layouts import LAYOUTS, LLAMA, LLAMA_LAYOUT_TYPES

from support.tiny_models import CASES, NO_HEAD_DIM, layers_of, stock_model, tiny_model, token_ids

ROOT = Path(__file__).resolve().parents[2]
IDS = list(CASES)


def logits(model, ids=None, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(ids if ids is not None else token_ids(), **kwargs).logits


def test_each_block_shape_is_a_class_written_out_and_every_shape_has_a_case():
    """The table's classes are the GeoNorm decoder layers declared by ``class`` statements in decoder_layers.py
    (none is made at runtime; tests/modeling/test_models.py checks each case's layers are its layout's class), and the
    registered cases run every one of them."""
    source = Path(decoder_layers.__file__).read_text(encoding="utf-8")
    declared = set(re.findall(r"^class (\w+)\(GeoNormDecoderLayer\):", source, flags=re.MULTILINE))
    assert {cls.__name__ for cls in DECODER_LAYERS.values()} == declared
    assert all(getattr(decoder_layers, cls.__name__) is cls for cls in DECODER_LAYERS.values())
    assert {LAYOUTS[case.model_type].block for case in CASES.values()} == set(DECODER_LAYERS)


def test_a_stack_trace_through_a_layer_points_into_its_class():
    """An error inside a sublayer shows the line of the GeoNorm LLaMA decoder layer's ``forward`` that called it."""
    model = hf_geonorm.convert(tiny_model("llama"))

    def fail(*args):
        raise RuntimeError("in the feed-forward")

    layers_of(model)[1].mlp.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="in the feed-forward") as raised:
        model(token_ids())
    layer_class = DECODER_LAYERS["llama"]
    lines, start = inspect.getsourcelines(layer_class)
    mlp_call = start + next(i for i, line in enumerate(lines) if "self.mlp(" in line)
    shown = [(frame.filename, frame.lineno, frame.name) for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert (inspect.getsourcefile(layer_class), mlp_call, "forward") in shown, shown


@pytest.mark.parametrize("case", IDS)
def test_sandwich_output_norms_start_as_plain_normalisation(case):
    """identity_norm_like relies on the layout's norm kind: a fresh output norm must give unit RMS."""
    stock = stock_model(case)
    layout = LAYOUTS[CASES[case].model_type]
    if layout.has_out_norms or not layout.has_input_norms or not layout.plain_norms:
        with pytest.raises(ValueError, match="sandwich"):
            hf_geonorm.convert(stock, norm_style="sandwich")
        return
    model = hf_geonorm.convert(stock, norm_style="sandwich")
    v = torch.randn(5, stock.config.hidden_size, generator=torch.Generator().manual_seed(3)) * 3 + 1
    out_norms = [m.output_norm for m in model.modules() if getattr(m, "norm_style", None) == "sandwich"]
    assert out_norms
    for norm in out_norms:
        torch.testing.assert_close(norm(v).pow(2).mean(-1), torch.ones(5), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("case", ["olmo2", "exaone4", "gemma2", "glm4"])
@pytest.mark.parametrize("style", ["post", "sandwich", "deepnorm"])
def test_output_norm_families_refuse_other_styles(case, style):
    with pytest.raises(ValueError, match="only norm_style 'pre'"):
        hf_geonorm.convert(stock_model(case), norm_style=style)


@pytest.mark.parametrize(
    "case", ["gpt_neox-parallel", "gpt_neox-sequential", "phi", "falcon", "falcon-sequential", "persimmon"]
)
def test_pre_keeps_the_stock_dropout_in_training(case):
    """Residual dropouts sit where the stock block has them and draw the same random numbers."""
    stock = tiny_model(case, hidden_dropout=0.3, attention_dropout=0.2, resid_pdrop=0.3).train()
    pre = hf_geonorm.convert(stock, norm_style="pre").train()
    ids = token_ids()
    torch.manual_seed(5)
    expected = stock(ids).logits
    torch.manual_seed(5)
    got = pre(ids).logits
    assert (got - expected).abs().max() <= 1e-6
    torch.manual_seed(6)
    assert (stock(ids).logits - expected).abs().max() > 1e-4  # dropout does act


@pytest.mark.parametrize("case", ["falcon", "gpt_neo"])
def test_tuple_layers_return_their_attention_weights(case):
    stock = tiny_model(case, attn_implementation="eager")
    assert stock.config._attn_implementation == "eager"
    pre = hf_geonorm.convert(stock, norm_style="pre")
    with torch.no_grad():
        expected = stock(token_ids(), output_attentions=True).attentions
        got = pre(token_ids(), output_attentions=True).attentions
    assert len(got) == len(expected) == stock.config.num_hidden_layers
    for a, b in zip(got, expected, strict=True):
        assert a is not None and torch.equal(a, b)


@pytest.mark.parametrize(
    "variant",
    [
        dict(new_decoder_architecture=True, parallel_attn=False),
        dict(new_decoder_architecture=False, parallel_attn=True, num_ln_in_parallel_attn=2),
    ],
)
def test_falcon_variants_without_a_working_stock_block_are_refused(variant):
    family = hf_geonorm.family_for("falcon")
    stock = tiny_model("falcon", **variant)
    with pytest.raises(Exception):  # noqa: B017 - the stock block itself fails (AttributeError/UnboundLocalError)
        logits(stock)
    with pytest.raises(ValueError, match="falcon with new_decoder_architecture"):
        hf_geonorm.convert(stock, norm_style="geo")
    geo_config = family.config_class(**NO_HEAD_DIM, **variant)
    with pytest.raises(ValueError, match="falcon with new_decoder_architecture"):
        family.causal_class(geo_config)


def _scan_module():
    if "scan_layouts" not in sys.modules:
        spec = importlib.util.spec_from_file_location("scan_layouts", ROOT / "benchmarks" / "scan_layouts.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["scan_layouts"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["scan_layouts"]


def test_llama_layout_types_match_the_installed_transformers():
    """Every causal LM whose decoder layer is LLaMA's (token for token, used the same way) is covered, and
    every covered one still is: this fails when transformers adds or changes such a model."""
    identical = set(_scan_module().llama_identical_types())
    assert "llama" in identical and "mistral" in identical  # the scan works at all
    missing = identical - set(LLAMA_LAYOUT_TYPES)
    assert not missing, f"LLaMA-identical types missing from LLAMA_LAYOUT_TYPES: {sorted(missing)}"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    installed = set(LLAMA_LAYOUT_TYPES) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    changed = installed - identical
    assert not changed, f"LLAMA_LAYOUT_TYPES entries no longer LLaMA-identical: {sorted(changed)}"
    for model_type in LLAMA_LAYOUT_TYPES:
        layout = LAYOUTS[model_type]
        assert layout == LLAMA or (layout.layers, layout.attn_norm, layout.mlp_norm) == (
            LLAMA.layers,
            LLAMA.attn_norm,
            LLAMA.mlp_norm,
        )
