"""The library behind the command line, called directly: loading sources strictly (hf_geonorm.checkpoints.loading,
GGUF), conversion (hf_geonorm.conversion.convert), text, perplexity and the reasons for a non-finite one
(hf_geonorm.analysis.evaluation), angles (hf_geonorm.analysis.angles), folder facts (hf_geonorm.conversion.inspection)
and from-scratch configs (hf_geonorm.training.run.model).

No tensor is filled with random values in silence, and every mistake is one
ValueError that names the file and the fix.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm import errors
from hf_geonorm._plumbing import text_files
from hf_geonorm.analysis import angles, evaluation
from hf_geonorm.checkpoints import loading
from hf_geonorm.conversion import convert as conversion
from hf_geonorm.conversion import inspection
from hf_geonorm.training.run.model import write_scratch_config

from support.helpers import edited_copy
from support.tiny_gguf import write_tiny_gguf
from support.tiny_models import tiny_model, token_ids

TEXT = Path(json.__file__).with_name("decoder.py")  # real text: a Python stdlib source file


@pytest.fixture(scope="module")
def stock_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lib") / "stock_llama"
    tiny_model("llama", vocab_size=300).save_pretrained(folder)
    return folder


def logits(model, ids=None):
    with torch.no_grad():
        return model(ids if ids is not None else token_ids()).logits


# ---- loading: nothing random in silence ----

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


def test_a_missing_tensor_is_an_error_naming_it(stock_llama, tmp_path):
    broken = edited_copy(stock_llama, tmp_path / "missing", lambda t: t.pop(Q_PROJ))
    source = loading.open_source(broken)
    with pytest.raises(ValueError, match=rf"model.safetensors: 1 tensor\(s\) missing \({Q_PROJ}\)"):
        loading.load_model(source)
    _, info = AutoModelForCausalLM.from_pretrained(broken, output_loading_info=True)  # transformers: random q_proj
    assert info["missing_keys"] == {Q_PROJ}
    with pytest.warns(UserWarning, match=Q_PROJ):
        model = loading.load_model(source, allow_missing=True)
    stock = AutoModelForCausalLM.from_pretrained(stock_llama)
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, stock.model.layers[0].mlp.up_proj.weight)


def test_an_unexpected_tensor_is_an_error_naming_it(stock_llama, tmp_path):
    extra = edited_copy(stock_llama, tmp_path / "extra", lambda t: t.update({"model.extra.weight": torch.zeros(3)}))
    with pytest.raises(ValueError, match=r"1 unexpected tensor\(s\) \(model.extra.weight\)"):
        loading.load_model(loading.open_source(extra))


def test_the_tensors_geonorm_adds_may_be_missing(stock_llama):
    """A stock checkpoint loaded into a GeoNorm config with learnable steps: those start at their identity."""
    config = hf_geonorm.GeoNormLlamaConfig.from_pretrained(stock_llama, geo_learnable_step=True)
    model = loading.load_model(loading.open_source(stock_llama), config=config)
    expected = {f"model.layers.{k}.geonorm_{s}_residual.step_{p}" for k in range(3) for s in ("attn", "mlp")
                for p in ("scale", "bias")}  # fmt: skip
    assert loading.geonorm_keys(model) == expected
    reference = AutoModelForCausalLM.from_pretrained(stock_llama, config=config)
    assert torch.equal(logits(model), logits(reference))


def test_a_wrong_shape_names_the_tensor_the_shapes_and_the_file(stock_llama, tmp_path):
    wrong = edited_copy(stock_llama, tmp_path / "wrong", lambda t: t.update({Q_PROJ: torch.zeros(5, 5)}))
    with pytest.raises(ValueError) as caught:
        loading.load_model(loading.open_source(wrong), allow_missing=True)  # never allowed
    message = str(caught.value)
    assert f"{wrong / 'model.safetensors'}: tensor {Q_PROJ} has shape [5, 5], but config.json asks for [32, 32]" in (
        message
    )
    assert "above report" not in message


def test_damaged_pickle_only_and_weightless_folders(stock_llama, tmp_path):
    truncated = tmp_path / "truncated"
    shutil.copytree(stock_llama, truncated)
    data = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"{truncated / 'model.safetensors'} is damaged .*save the model again"):
        loading.load_model(loading.open_source(truncated))
    pickled = tmp_path / "pickled"
    shutil.copytree(stock_llama, pickled)
    (pickled / "model.safetensors").unlink()
    (pickled / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match=r"pickle weights only \(pytorch_model.bin\)"):
        loading.load_model(loading.open_source(pickled))
    (pickled / "pytorch_model.bin").unlink()
    with pytest.raises(ValueError, match="has a config.json but no weights"):
        loading.load_model(loading.open_source(pickled))
    assert loading.open_source(pickled).weight_files == []


def test_open_source_errors_name_the_path(tmp_path, stock_llama):
    with pytest.raises(ValueError, match="no such file or folder"):
        loading.open_source(tmp_path / "nothing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a .gguf checkpoint"):
        loading.open_source(tmp_path / "notes.txt")
    bad = tmp_path / "bad"
    shutil.copytree(stock_llama, bad)
    (bad / "config.json").write_text("{")
    with pytest.raises(ValueError, match=rf"{bad / 'config.json'} is corrupt"):
        loading.open_source(bad)


def test_gguf_is_dequantised_and_a_missing_tensor_refused(tmp_path):
    pytest.importorskip("gguf")
    write_tiny_gguf(tmp_path / "tiny.gguf")
    model = loading.load_model(loading.open_source(tmp_path / "tiny.gguf"))
    assert getattr(model, "hf_quantizer", None) is None and "quantization_config" not in vars(model.config)
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").eval()
    ids = token_ids(length=7) % 300
    assert torch.equal(logits(model, ids), logits(direct, ids))
    assert conversion.card_metadata(loading.open_source(tmp_path / "tiny.gguf"))["license"] == "apache-2.0"
    write_tiny_gguf(tmp_path / "short.gguf", skip="blk.1.attn_q.weight")
    with pytest.raises(ValueError, match=r"short.gguf: 1 tensor\(s\) missing \(model.layers.1.self_attn.q_proj"):
        loading.load_model(loading.open_source(tmp_path / "short.gguf"))


# ---- settings ----


def test_settings_errors_tell_a_bad_argument_from_a_bad_file(stock_llama, tmp_path):
    source = loading.open_source(stock_llama)
    assert loading.resolve_settings({"geo_alpha": 0.5}, source)["geo_alpha"] == 0.5
    with pytest.raises(errors.SettingsError, match=r"one value per layer \(3\)"):
        loading.resolve_settings({"geo_alpha": [1.0, 2.0]}, source)
    geo = tmp_path / "geo"
    shutil.copytree(stock_llama, geo)
    config = json.loads((geo / "config.json").read_text())
    config.update(model_type="geonorm_llama", norm_style="geo", geo_decay="fast")
    (geo / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"{geo / 'config.json'}: geo_decay must be one of") as caught:
        loading.resolve_settings({}, loading.open_source(geo))
    assert not isinstance(caught.value, errors.SettingsError)
    assert loading.resolve_settings({"geo_decay": "sqrt"}, loading.open_source(geo))["geo_decay"] == "sqrt"
    with pytest.raises(ValueError, match=rf"{geo / 'config.json'}: geo_decay must be one of"):
        inspection.describe_folder(geo)


# ---- conversion ----


def test_convert_checkpoint_writes_what_convert_computes(stock_llama, tmp_path):
    progress = []
    options = conversion.ConversionOptions(eval_text=TEXT, eval_tokens=64)
    result = conversion.convert_checkpoint(stock_llama, tmp_path / "out", {"geo_alpha": 0.7}, options, progress.append)
    assert result.model_type == "geonorm_llama" and result.settings["geo_alpha"] == 0.7 and result.num_layers == 3
    assert [line[:5] for line in progress] == ["[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"]
    assert {"model.safetensors", "config.json", "README.md"} <= set(result.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    reference = hf_geonorm.convert(AutoModelForCausalLM.from_pretrained(stock_llama), geo_alpha=0.7).eval()
    assert torch.equal(logits(reloaded), logits(reference))
    assert result.perplexity_after != pytest.approx(result.perplexity_before, rel=1e-3)
    assert "before conversion" in (tmp_path / "out" / "README.md").read_text()


def test_convert_checkpoint_refuses_before_writing(stock_llama, tmp_path):
    broken = edited_copy(stock_llama, tmp_path / "broken", lambda t: t.pop(Q_PROJ))
    with pytest.raises(ValueError, match=Q_PROJ):
        conversion.convert_checkpoint(broken, tmp_path / "out")
    with pytest.raises(errors.SettingsError):
        conversion.convert_checkpoint(stock_llama, tmp_path / "out", {"geo_bridge": 2.0})
    with pytest.raises(ValueError, match="overlaps the source"):
        conversion.convert_checkpoint(stock_llama, stock_llama / "inside")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        conversion.convert_checkpoint(stock_llama, tmp_path / "full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "full"]


# ---- text, perplexity, non-finite metrics ----


def test_read_text_refuses_binary_and_warns_on_non_utf8(tmp_path):
    (tmp_path / "binary.bin").write_bytes(b"abc\x00\x01\x02" * 10)
    with pytest.raises(ValueError, match=r"binary.bin is a binary file \(it holds NUL bytes\)"):
        text_files.read_text(tmp_path / "binary.bin")
    (tmp_path / "latin1.txt").write_bytes("café crème, déjà vu\n".encode("latin-1"))
    with pytest.warns(UserWarning, match=r"latin1.txt is not valid UTF-8: 4 byte\(s\) were replaced"):
        assert text_files.read_text(tmp_path / "latin1.txt") == "caf\ufffd cr\ufffdme, d\ufffdj\ufffd vu\n"
    (tmp_path / "utf8.txt").write_text("é" * 100, encoding="utf-8")
    assert text_files.read_text(tmp_path / "utf8.txt", max_chars=10) == "é" * 10  # a cut character is no error
    # a limit far beyond the file (the benchmarks' "no cap") reads it whole, without allocating the limit
    assert text_files.read_text(tmp_path / "utf8.txt", max_chars=10**12) == "é" * 100


def test_token_ids_beyond_the_vocabulary_are_refused():
    class Tokenizer:
        def __call__(self, text):
            return {"input_ids": [5, 299, 300]}

    with pytest.raises(ValueError, match="token id 300, but config.json has vocab_size 300"):
        evaluation.encode("text", Tokenizer(), 300, "some/model")


def test_measure_perplexity_is_the_models_mean_loss(stock_llama):
    report = evaluation.measure_perplexity(stock_llama, TEXT, max_tokens=96, window=48)
    model = AutoModelForCausalLM.from_pretrained(stock_llama).eval()
    ids = [b % 300 for b in TEXT.read_text().encode("utf-8")][:96]  # no tokenizer: bytes modulo the vocabulary
    nll = 0.0
    with torch.no_grad():
        for start in (0, 48):
            window = torch.tensor([ids[start : start + 48]])
            nll += model(window, labels=window).loss.item() * 47
    assert report.tokenization == evaluation.BYTES_TOKENIZATION and (report.tokens, report.windows) == (96, 2)
    assert report.perplexity == pytest.approx(math.exp(nll / 94), rel=1e-5)


def test_a_non_finite_perplexity_says_where_and_which_setting(stock_llama, tmp_path):
    nan_weights = edited_copy(
        stock_llama, tmp_path / "nan", lambda t: t["model.layers.1.mlp.down_proj.weight"].fill_(float("nan"))
    )
    with pytest.raises(errors.NonFiniteError, match="non-finite values: model.layers.1.mlp.down_proj.weight"):
        evaluation.measure_perplexity(nan_weights, TEXT, max_tokens=32)

    def huge_mlp(tensors):  # fine in float32, beyond float16's range (65504) after the second layer's MLP
        for name in ("up_proj", "down_proj"):
            tensors[f"model.layers.1.mlp.{name}.weight"].mul_(1e4)

    huge = edited_copy(stock_llama, tmp_path / "huge", huge_mlp)
    assert math.isfinite(evaluation.measure_perplexity(huge, TEXT, max_tokens=32).perplexity)
    with pytest.raises(errors.NonFiniteError, match=r"the mlp update of layer 2 .*float16 \(use dtype float32\)"):
        evaluation.measure_perplexity(huge, TEXT, max_tokens=32, dtype="float16")
    confident = edited_copy(stock_llama, tmp_path / "confident", lambda t: t["lm_head.weight"].mul_(1e5))
    with pytest.raises(errors.NonFiniteError, match="is infinite: the outputs are finite, but the mean loss"):
        evaluation.measure_perplexity(confident, TEXT, max_tokens=32)  # exp(mean loss) overflows


# ---- angles ----


def test_analyse_angles_of_a_stock_model_are_its_prenorm_rotations(stock_llama, tmp_path):
    report = angles.analyse_angles(stock_llama, TEXT, max_tokens=64, plot=tmp_path / "a.png")
    assert report.regime == "pre-norm" and report.tokens == 64 and (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    model = AutoModelForCausalLM.from_pretrained(stock_llama).eval()
    expected = {}
    hooks = []
    for k, layer in enumerate(model.model.layers, start=1):  # Pre-Norm's h -> h + u, seen on the stock modules
        for name, norm, sublayer in (
            ("attn", layer.input_layernorm, layer.self_attn),
            ("mlp", layer.post_attention_layernorm, layer.mlp),
        ):
            seen = {}
            hooks.append(norm.register_forward_pre_hook(lambda m, a, seen=seen: seen.update(h=a[0])))
            hooks.append(sublayer.register_forward_hook(
                lambda m, a, o, seen=seen, key=(k, name): expected.__setitem__(
                    key, hf_geonorm.prenorm_angle(seen["h"], o[0] if isinstance(o, tuple) else o).mean().item()
                )
            ))  # fmt: skip
    with torch.no_grad():
        model(torch.tensor([[b % 300 for b in TEXT.read_text().encode("utf-8")][:64]]))
    for hook in hooks:
        hook.remove()
    assert [(row.layer, row.sublayer) for row in report.sublayers] == list(expected)
    for row in report.sublayers:
        assert row.angle == pytest.approx(expected[(row.layer, row.sublayer)], rel=1e-5)


# ---- folder facts, from-scratch configs ----


def test_describe_folder_counts_the_saved_parameters(stock_llama):
    data = inspection.describe_folder(stock_llama)
    model = AutoModelForCausalLM.from_pretrained(stock_llama)
    assert data["parameters"] == sum(p.numel() for p in model.parameters())
    assert (data["model_type"], data["geonorm"], data["num_layers"]) == ("llama", False, 3)


def test_write_scratch_config_sizes_and_counts(tmp_path):
    result = write_scratch_config("gpt2", tmp_path / "fresh", "tiny", {"geo_alpha": 0.4}, vocab_size=512)
    model = AutoModelForCausalLM.from_config(result.config)
    assert result.parameters == sum(p.numel() for p in model.parameters())
    assert (result.config.n_layer, result.config.n_embd, result.config.geo_alpha) == (4, 128, 0.4)
    assert json.loads((tmp_path / "fresh" / "config.json").read_text())["model_type"] == "geonorm_gpt2"
    with pytest.raises(errors.SettingsError):
        write_scratch_config("gpt2", tmp_path / "bad", "tiny", {"geo_alpha": [1.0, 2.0]})
    with pytest.raises(ValueError, match="unsupported architecture 'bert'"):
        write_scratch_config("bert", tmp_path / "bad", "tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh"]


def test_bridge_costs_need_frames_and_leave_the_bridge_as_it_was():
    from hf_geonorm.analysis.calibration import bridge_costs

    windows = [token_ids(16, seed=s)[0].tolist() for s in range(2)]
    with pytest.raises(ValueError, match="geo_frames.*--calibrate"):
        bridge_costs(hf_geonorm.convert(tiny_model("llama"), geo_bridge=0.0), windows)
    frames = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]
    model = hf_geonorm.convert(tiny_model("llama"), geo_bridge=[0.5] * 6, geo_frames=frames, geo_max_angle=None).eval()
    costs = bridge_costs(model, windows)
    assert model.config.geo_bridge == [0.5] * 6 and len(costs) == 6
    model.config.geo_bridge = [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # the fourth update alone, against all at 0
    alone = evaluation.perplexity(model, windows)
    model.config.geo_bridge = 0.0
    assert costs[3] == pytest.approx(math.log(alone) - math.log(evaluation.perplexity(model, windows)), abs=1e-6)
