"""Measuring a model on text without holding what is not needed: the logits and the loss of a window are computed
a chunk of positions at a time (the numbers as the whole window's), the memory of a large measurement is stated
before it starts, and the perplexity's token count has one default."""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import shutil

import pytest
import torch

import hf_geonorm
from hf_geonorm.analysis import evaluation
from hf_geonorm.conversion.convert import ConversionOptions

from support.helpers import fails, invoke, succeeds
from support.tiny_models import tiny_model, token_ids


def whole_window_nll(model, window):
    """The summed next-token negative log-likelihood of one window, written out from the model's whole logits."""
    ids = torch.tensor([window])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].double()
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -float(log_probs[torch.arange(len(window) - 1), ids[0, 1:]].sum())


def expected_perplexity(model, windows):
    total = sum(whole_window_nll(model, w) for w in windows)
    return math.exp(total / sum(len(w) - 1 for w in windows))


WINDOWS = [[(7 * i + 3) % 120 + 3 for i in range(40)], [(5 * i + 1) % 110 + 3 for i in range(23)]]


def head_positions(model, run):
    """The most positions the model's output head computed logits for at once while ``run()`` ran."""
    seen = []
    handle = model.get_output_embeddings().register_forward_hook(lambda m, a, o: seen.append(a[0].shape[-2]))
    try:
        run()
    finally:
        handle.remove()
    return max(seen)


def test_chunked_logits_give_the_whole_windows_perplexity():
    model = tiny_model("llama", perturb=True)
    expected = expected_perplexity(model, WINDOWS)
    assert evaluation.head_is_plain(model, WINDOWS[0])
    chunked = []
    most = head_positions(model, lambda: chunked.append(evaluation.perplexity(model, WINDOWS, chunk=5)))
    assert chunked[0] == pytest.approx(expected, rel=1e-6)
    assert most <= max(5, evaluation.PROBE_TOKENS) < len(WINDOWS[0]) - 1  # never a whole window's logits at once
    assert evaluation.perplexity(model, WINDOWS, chunk=None) == pytest.approx(expected, rel=1e-6)
    assert evaluation.perplexity(model, WINDOWS) == pytest.approx(expected, rel=1e-6)  # the default chunk


def test_a_model_that_scales_its_logits_is_measured_on_its_own_logits():
    model = tiny_model("cohere", perturb=True, logit_scale=0.25)  # logits = head(states) x 0.25
    assert not evaluation.head_is_plain(model, WINDOWS[0])
    expected = expected_perplexity(model, WINDOWS)
    assert evaluation.perplexity(model, WINDOWS, chunk=5) == pytest.approx(expected, rel=1e-6)


def test_a_measurement_keeps_no_key_value_cache():
    model = tiny_model("llama", perturb=True)
    calls = []
    model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(kwargs.get("use_cache")), with_kwargs=True)
    evaluation.perplexity(model, WINDOWS, chunk=None)
    assert calls and all(value is False for value in calls)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval") / "llama"
    tiny_model("llama", perturb=True, vocab_size=300, max_position_embeddings=512).save_pretrained(folder)
    return folder


def test_a_large_measurement_states_its_memory_first(llama_folder, tmp_path, monkeypatch):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    result = invoke("perplexity", llama_folder, "--text", text, "--max-tokens", 256)
    assert result.exit_code == 0, result.output
    assert "memory:" not in result.output  # small: nothing said
    monkeypatch.setattr(evaluation, "LARGE_MEMORY_BYTES", 0)
    result = invoke("perplexity", llama_folder, "--text", text, "--max-tokens", 256)
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("memory:"))
    assert result.output.index("memory:") < result.output.index("perplexity:")
    weights = json.loads((llama_folder / "config.json").read_text())
    d, layers, vocab, inter = (weights["hidden_size"], weights["num_hidden_layers"], weights["vocab_size"],
                               weights["intermediate_size"])  # fmt: skip
    kv = weights["num_key_value_heads"] * weights["head_dim"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * inter + 2 * d  # q, o; k, v; gate, up, down; two norms
    parameters = vocab * d * (1 if weights["tie_word_embeddings"] else 2) + layers * per_layer + d
    assert f"weights {parameters * 4:,} bytes" in line
    assert "256-token window" in line


def test_perplexity_and_conversion_measure_the_same_number_of_tokens_by_default():
    from hf_geonorm.analysis import defaults

    tokens = defaults.PERPLEXITY_TOKENS
    for command in ("perplexity", "convert"):
        help_text = " ".join(invoke(command, "--help").output.split())
        option = "--max-tokens" if command == "perplexity" else "--eval-tokens"
        assert re.search(rf"{option} INTEGER .*?\[default: {tokens}\]", help_text), (command, help_text)
    assert inspect.signature(evaluation.measure_perplexity).parameters["max_tokens"].default == tokens
    assert ConversionOptions().eval_tokens == tokens


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


def test_calibrating_on_a_text_of_two_tokens_is_refused_naming_the_file_and_count(tmp_path):
    from hf_geonorm.conversion.convert import MIN_CALIBRATION_TOKENS

    tiny_model("llama").save_pretrained(tmp_path / "stock")  # no tokenizer: one token per UTF-8 byte
    (tmp_path / "short.txt").write_text("ab")
    line = fails("convert", tmp_path / "stock", tmp_path / "out", "--calibrate", tmp_path / "short.txt")
    assert "short.txt gives 2 token(s)" in line and f"needs at least {MIN_CALIBRATION_TOKENS}" in line
    assert not (tmp_path / "out").exists()


def test_text_that_is_not_a_regular_file_is_refused(stock_llama, tmp_path):
    assert "is a character device, not a file" in fails("perplexity", stock_llama, "--text", "/dev/zero")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert "is a FIFO (named pipe), not a file" in fails("angles", stock_llama, "--text", fifo)
    assert "is a character device" in fails("convert", stock_llama, tmp_path / "out", "--eval-text", "/dev/zero")


def test_angles_reports_the_share_of_updates_at_the_clamp(short_run, data_file):
    output = succeeds("angles", short_run[0] / "final", "--text", data_file, "--max-tokens", 64)
    line = next(line for line in output.splitlines() if line.startswith("at the clamp:"))
    assert "--alpha" in line and "%" in line
    result = invoke("angles", short_run[0] / "final", "--text", data_file, "--max-tokens", 64, "--json")
    data = json.loads(result.stdout)
    assert 0 <= data["summary"]["at_clamp_share"] <= 1
    assert all(row["at_clamp_share"] is not None for row in data["sublayers"])


BROKEN_TOKENIZERS = {
    "corrupt": ("tokenizer.json", lambda folder: (folder / "tokenizer.json").write_text("{ not json")),
    "missing": ("tokenizer_config.json", lambda folder: (folder / "tokenizer.json").unlink()),
    "unknown_model": ("tokenizer.json", lambda folder: (folder / "tokenizer.json").write_text(
        (folder / "tokenizer.json").read_text().replace('"type": "BPE"', '"type": "NoSuchModel"', 1))),
}


@pytest.fixture(scope="module")
def with_tokenizer(llama_folder, tmp_path_factory):
    from support.helpers import bpe_tokenizer

    folder = tmp_path_factory.mktemp("tokenized") / "llama"
    shutil.copytree(llama_folder, folder)
    bpe_tokenizer().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("how", list(BROKEN_TOKENIZERS))
def test_a_tokenizer_that_does_not_load_is_an_error_not_bytes(with_tokenizer, tmp_path, how):
    """A tokenizer there but broken (corrupt, its tokenizer.json missing beside its config, a model type the
    tokenizers library does not know) is an error naming its files and the cause, for perplexity and for
    convert --eval-text (which writes nothing): never a figure measured on raw bytes."""
    named, damage = BROKEN_TOKENIZERS[how]
    folder = tmp_path / "llama"
    shutil.copytree(with_tokenizer, folder)
    damage(folder)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    message = fails("perplexity", folder, "--text", text, "--max-tokens", 64)
    assert f"the tokenizer of {folder} (" in message and str(folder / named) in message, message
    assert "does not load: " in message and "raw UTF-8" not in message, message
    message = fails("convert", folder, tmp_path / "out", "--eval-text", text, "--eval-tokens", 64)
    assert str(folder / named) in message and "does not load: " in message, message
    assert not (tmp_path / "out").exists()


def test_a_source_without_a_tokenizer_says_so(llama_folder, tmp_path):
    """A folder with no tokenizer file at all is measured on UTF-8 bytes, and perplexity's line and the converted
    card say so; the conversion warns that the output has no tokenizer."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    assert "windows, raw UTF-8 bytes modulo the vocabulary size (the source has no tokenizer))" in succeeds(
        "perplexity", llama_folder, "--text", text, "--max-tokens", 64
    )
    result = invoke("convert", llama_folder, tmp_path / "out", "--eval-text", text, "--eval-tokens", 64)
    assert result.exit_code == 0, result.output
    assert f"has no tokenizer, so {tmp_path / 'out'} has none either" in result.output
    card = (tmp_path / "out" / "README.md").read_text()
    assert "raw UTF-8 bytes modulo the vocabulary size (the source has no tokenizer)" in card
    assert not any((tmp_path / "out" / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
