"""A norm style is declared once (``hf_geonorm/modeling/norm_styles.py``): its residual rule, the modules and
init it adds, its card text and its default rate source. A sixth style added to a copy of the package by its
declaration alone builds, runs and trains a tiny model, gets its card text and a default rate; and each declared
style's card text and rate source are the ones its model card and rate rule use."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf_geonorm.modeling.norm_styles import NORM_STYLE_DECLARATIONS, RATE_SOURCES
from hf_geonorm.training import rate_rule

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hf_geonorm"

SIXTH_STYLE = """        NormStyle(
            "half", "Half-step Pre-Norm, x + F(N(x)) / 2", rule=lambda residual, x, u, norm, first_tokens: x + 0.5 * u
        ),
"""

# Run in a child whose hf_geonorm is the copy: a LLaMA model in the sixth style is the stock model with its two
# output projections halved (x + u/2 with u linear in them, no bias; halving is exact in binary floating point).
SIXTH_STYLE_RUN = """
import sys
import torch
import transformers
import hf_geonorm
from hf_geonorm.modeling.settings import GeoNormSettings
from hf_geonorm.sharing.model_card import render_model_card
from hf_geonorm.training.rate_rule import FALLBACK, pretraining_rate

assert hf_geonorm.__file__.startswith(sys.argv[1]), hf_geonorm.__file__
GeoNormSettings(norm_style="half")
config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2)
torch.manual_seed(0)
stock = transformers.LlamaForCausalLM(config).eval()
half = hf_geonorm.convert(stock, norm_style="half").eval()
with torch.no_grad():
    for layer in stock.model.layers:
        layer.self_attn.o_proj.weight.mul_(0.5)
        layer.mlp.down_proj.weight.mul_(0.5)
ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
torch.testing.assert_close(half(ids).logits, stock(ids).logits, atol=1e-6, rtol=1e-5)
loss = half.train()(ids, labels=ids).loss
loss.backward()
assert torch.isfinite(loss) and half.model.layers[0].mlp.down_proj.weight.grad.abs().sum() > 0
assert "Half-step Pre-Norm" in str(render_model_card(half.config))
assert pretraining_rate("llama", "half", 32, 2).source == FALLBACK
print("ran")
"""


def package_copy(target: Path) -> Path:
    """A copy of the package's source (and, where they sit beside it, its card templates) under ``target``."""
    shutil.copytree(PACKAGE, target / "hf_geonorm", ignore=shutil.ignore_patterns("__pycache__"))
    if (ROOT / "model_cards").is_dir():  # the card template's fallback beside a source checkout
        shutil.copytree(ROOT / "model_cards", target / "model_cards")
    return target / "hf_geonorm"


def changed_files(original: Path, copy: Path) -> list[str]:
    """The files of ``copy`` that differ from ``original``'s or are new there (relative paths)."""
    found = []
    for path in sorted(copy.rglob("*.py")):
        relative = path.relative_to(copy)
        if not (original / relative).is_file() or not filecmp.cmp(path, original / relative, shallow=False):
            found.append(relative.as_posix())
    return found


def test_a_sixth_style_is_its_declaration_alone(tmp_path):
    copy = package_copy(tmp_path)
    declarations = copy / "modeling" / "norm_styles.py"
    text = declarations.read_text(encoding="utf-8")
    end = text.index("    )\n}\n", text.index("NORM_STYLE_DECLARATIONS: dict"))
    declarations.write_text(text[:end] + SIXTH_STYLE + text[end:], encoding="utf-8")
    assert changed_files(PACKAGE, copy) == ["modeling/norm_styles.py"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    child = subprocess.run([sys.executable, "-c", SIXTH_STYLE_RUN, str(tmp_path)], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip
    assert child.returncode == 0 and child.stdout.strip() == "ran", child.stderr[-4000:]


@pytest.mark.parametrize("style", list(NORM_STYLE_DECLARATIONS))
def test_each_style_declares_a_known_rate_source_that_the_rate_rule_follows(style):
    """At a shape no cell measured (GPT-2 at 24 x 2048), pre takes the published recipe and every other style its
    measured ratio to Pre-Norm (phase i measured each beside Pre-Norm on GPT-2): what their declarations say; the
    sixth style above, with no cell, falls back to Pre-Norm's rate."""
    declared = NORM_STYLE_DECLARATIONS[style].rate_source
    assert declared in RATE_SOURCES
    chosen = rate_rule.pretraining_rate("gpt2", style, 2048, 24)
    expected = rate_rule.PUBLISHED if style == "pre" else rate_rule.EXTRAPOLATED
    assert chosen.source == expected
