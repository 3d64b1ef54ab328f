"""Issue 37: output paths, the files a command reads and writes, and what it refuses for safety, each the way a user
meets it: through the command line, on folders like a user's.

Push's refusals (pickles, custom-code tokenizers, YAML aliases, weight maps outside the folder) are in
test_push.py.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import contents, fails, invoke
from safetensors import safe_open
from tiny_models import tiny_model

from hf_geonorm.files.output_lock import output_lock
from hf_geonorm.files.ownership import mark_folder

TEXT = Path(json.__file__).with_name("decoder.py")  # real text: a Python stdlib source file


def standard_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(TEXT.read_text().splitlines()[:200], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def stock(tmp_path_factory) -> Path:
    """A saved stock tiny LLaMA, as a user downloads one."""
    folder = tmp_path_factory.mktemp("stock") / "llama"
    tiny_model("llama").save_pretrained(folder)
    return folder


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """The user's current folder, holding a file of theirs."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    return here


# ---- data loss 1: empty outputs, the current folder ----


def test_an_empty_output_is_refused_and_the_current_folder_is_left_alone(stock, workdir):
    before = contents(workdir)
    for args in (
        ("convert", stock, "", "--force"),
        ("init", "gpt2", "", "--preset", "tiny", "--force"),
    ):
        message = fails(*args)
        assert "OUTPUT_DIR given is empty" in message and "  " not in message, message
    assert "--output is empty" in fails("train", "--output", "", "--force", "--data", TEXT, code=2)
    assert "--output is empty" in fails("sweep", "--output", "", "--data", TEXT, code=2)
    assert contents(workdir) == before


def test_the_current_folder_or_one_holding_it_is_never_replaced(stock, workdir):
    before = contents(workdir.parent)
    assert "is the current folder" in fails("convert", stock, ".", "--force")
    assert "is the current folder" in fails("init", "gpt2", workdir, "--preset", "tiny", "--force")
    assert "holds the current folder" in fails("convert", stock, "..", "--force")
    assert "holds the current folder" in fails("convert", stock, "../../" + workdir.parent.name, "--force")
    assert "is the current folder" in fails("train", "--output", ".", "--force", "--data", TEXT)
    assert contents(workdir.parent) == before


def test_train_force_refuses_an_output_holding_what_it_reads(tmp_path):
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    shutil.copy(TEXT, run / "data" / "text.txt")
    message = fails("train", "--output", run, "--force", "--data", run / "data" / "text.txt")
    assert "holds the --data" in message
    assert (run / "data" / "text.txt").is_file()


# ---- data loss 5: a run's lock anywhere inside the folder replaced ----


def test_replacing_a_folder_respects_a_run_working_inside_it(stock, tmp_path):
    running = tmp_path / "sweep" / "runs" / "geo-lr1e-3-seed0"
    running.mkdir(parents=True)
    (running / "checkpoint-50").mkdir()
    (running / "checkpoint-50" / "model.safetensors").write_bytes(b"weights")
    mark_folder(tmp_path / "sweep", "sweep")  # outputs of hf-geonorm, which --force replaces when no run is inside
    mark_folder(tmp_path / "sweep" / "runs", "sweep")
    before = contents(tmp_path / "sweep")
    with output_lock(running, "train"):  # as the sweep's run holds it while it trains
        message = fails("convert", stock, tmp_path / "sweep" / "runs", "--force")
        assert "in use by hf-geonorm train" in message and str(running) in message
        assert "in use" in fails("init", "gpt2", tmp_path / "sweep", "--preset", "tiny", "--force")
        assert (running / "checkpoint-50" / "model.safetensors").read_bytes() == b"weights"
    assert contents(tmp_path / "sweep") == before
    # once the run has ended, --force replaces the folder as asked
    result = invoke("convert", stock, tmp_path / "sweep" / "runs", "--force")
    assert result.exit_code == 0, result.output
    assert not running.exists()


# ---- data loss 6: a source whose weights are links into the output ----


def test_a_source_linked_into_the_output_is_refused(stock, tmp_path):
    holder = tmp_path / "holder"
    holder.mkdir()
    shutil.copy(stock / "model.safetensors", holder / "model.safetensors")
    mark_folder(holder, "convert")  # an output --force may replace, but not while the source's weights are in it
    source = tmp_path / "src2"  # as a Hub cache snapshot: config and links to the weights kept elsewhere
    source.mkdir()
    shutil.copy(stock / "config.json", source / "config.json")
    (source / "model.safetensors").symlink_to(holder / "model.safetensors")
    before = contents(holder)
    message = fails("convert", source, holder, "--force")
    assert "symbolic link into the output" in message and "model.safetensors" in message
    assert contents(holder) == before
    result = invoke("convert", source, tmp_path / "elsewhere")  # the same source converts anywhere else
    assert result.exit_code == 0, result.output


# ---- silent wrong 10 and security 3: weight files read with the same checks everywhere ----


def write_safetensors(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_info_refuses_a_header_that_claims_impossible_sizes(stock, tmp_path):
    folder = tmp_path / "absurd"
    folder.mkdir()
    shutil.copy(stock / "config.json", folder / "config.json")
    write_safetensors(folder / "model.safetensors",
                      {"lm_head.weight": {"dtype": "F32", "shape": [10**8, 10**8], "data_offsets": [0, 4]}},
                      b"\0" * 4)  # fmt: skip
    message = fails("info", folder)
    assert "lm_head.weight" in message and "4" in message and "damaged" in message
    assert "damaged" in fails("convert", folder, tmp_path / "out")


@pytest.mark.parametrize("how", ["parent", "absolute", "link"])
def test_weight_files_outside_the_folder_are_refused(stock, tmp_path, how):
    other = tmp_path / "other"
    shutil.copytree(stock, other)
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(stock / "config.json", folder / "config.json")
    with safe_open(stock / "model.safetensors", "pt") as f:
        keys = list(f.keys())
    shard = {"parent": "../other/model.safetensors", "absolute": str(other / "model.safetensors"),
             "link": "model-00001-of-00001.safetensors"}[how]  # fmt: skip
    if how == "link":
        (folder / shard).symlink_to(other / "model.safetensors")
    index = {"metadata": {}, "weight_map": {key: shard for key in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    for args in (("convert", folder, tmp_path / "out"), ("perplexity", folder, "--text", TEXT), ("info", folder)):
        message = fails(*args)
        assert "outside" in message and "weight files must lie in the model's folder" in message, (args, message)
    assert not (tmp_path / "out").exists()


# ---- security 1: tokenizers that need custom code ----


@pytest.fixture(scope="module")
def custom_code_tokenizer(tmp_path_factory) -> Path:
    """A tokenizer folder whose tokenizer_config.json points at code of its own (its tokenizer.json is standard, so
    transformers loads a standard class in its place without a word)."""
    folder = tmp_path_factory.mktemp("tokenizers") / "custom"
    standard_tokenizer().save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_evil.py").write_text("raise SystemExit('custom code ran')\n")
    return folder


def test_a_custom_code_tokenizer_is_refused_by_convert_init_and_train(stock, custom_code_tokenizer, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(stock, source)
    for name in os.listdir(custom_code_tokenizer):
        shutil.copy(custom_code_tokenizer / name, source / name)
    for args in (
        ("convert", source, tmp_path / "converted"),
        ("init", "gpt2", tmp_path / "init", "--preset", "tiny", "--tokenizer", custom_code_tokenizer),
        ("train", "--tokenizer", custom_code_tokenizer, "--data", TEXT, "--max-steps", "1", "--output",
         tmp_path / "run"),
    ):  # fmt: skip
        message = fails(*args)
        assert "needs custom code" in message and "auto_map" in message, (args, message)
    assert not any((tmp_path / name).exists() for name in ("converted", "init"))


# ---- unbounded reads and allocations ----


def test_text_that_is_not_a_regular_file_is_refused(stock, tmp_path):
    assert "is a character device, not a file" in fails("perplexity", stock, "--text", "/dev/zero")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert "is a FIFO (named pipe), not a file" in fails("angles", stock, "--text", fifo)
    assert "is a character device" in fails("convert", stock, tmp_path / "out", "--eval-text", "/dev/zero")


def test_a_yaml_alias_bomb_in_a_source_card_does_not_hang(stock, tmp_path):
    folder = tmp_path / "bomb"
    shutil.copytree(stock, folder)
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
    (folder / "README.md").write_text("---\n" + "\n".join(lines) + "\nlicense: mit\n---\n# a model\n")
    started = time.monotonic()
    result = invoke("info", folder)
    assert result.exit_code == 0, result.output
    assert "YAML aliases" in result.output
    result = invoke("convert", folder, tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 120


def test_a_yaml_alias_bomb_in_a_hub_models_card_is_refused_before_it_is_built(stock, tmp_path):
    """A Hub id's card is downloaded (here from a pre-filled offline cache) and checked like a local one."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hf" / "hub" / "models--someone--bomb"
    shutil.copytree(stock, snapshot / "snapshots" / revision)
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text(revision)
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
    (snapshot / "snapshots" / revision / "README.md").write_text("---\n" + "\n".join(lines) + "\n---\n# a model\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", "from hf_geonorm_cli.main import cli; cli()"]
    result = subprocess.run([*command, "convert", "someone/bomb", str(tmp_path / "out"), "--bridge", "0"],
                            capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "README.md: the metadata uses YAML aliases" in result.stderr and "its card is not read" in result.stderr
    assert "base_model: someone/bomb" in (tmp_path / "out" / "README.md").read_text()


def config_only(tmp_path: Path, name: str, **changes) -> Path:
    folder = tmp_path / name
    result = invoke("init", "gpt2", folder, "--preset", "tiny")
    assert result.exit_code == 0, result.output
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_info_on_a_very_deep_config_reads_it_quickly(tmp_path):
    folder = config_only(tmp_path, "deep", n_layer=100_000)
    started = time.monotonic()
    result = invoke("info", folder)
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 60
    assert "100000 layers" in result.output
    parameters = next(line for line in result.output.splitlines() if line.startswith("parameters:"))
    per_layer = 12 * 128 * 128 + 13 * 128  # GPT-2: attention and MLP weights and biases, two layer norms
    assert int(parameters.split()[1].replace(",", "")) > 100_000 * per_layer
    assert len(result.output) < 5_000  # the step sizes: the first and the last, not 100,000 of them


def test_init_refuses_a_model_beyond_the_machine_memory(tmp_path):
    message = fails("init", "gpt2", tmp_path / "huge", "--preset", "1.3b", "--vocab-size", 10**10)
    assert "parameters" in message and "GB in float32" in message and "machine's" in message and "memory" in message
    assert not (tmp_path / "huge").exists()


# ---- unclear messages ----


def test_a_head_count_of_zero_is_named(stock, tmp_path):
    folder = tmp_path / "heads"
    shutil.copytree(stock, folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_attention_heads"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    for args in (("info", folder), ("convert", folder, tmp_path / "out")):
        message = fails(*args)
        assert "num_attention_heads is 0" in message and "config.json" in message, message


def test_non_finite_rates_and_two_precisions_are_usage_errors(tmp_path):
    message = fails("train", "--lr", "nan", "--output", tmp_path / "run", code=2)
    assert "'--lr'" in message and "not a finite number" in message
    assert "'--lr'" in fails("train", "--lr", "inf", "--output", tmp_path / "run", code=2)
    assert "'--lrs'" in fails("sweep", "--lrs", "1e-3,nan", "--output", tmp_path / "sweep", code=2)
    message = fails("train", "--bf16", "--fp16", "--output", tmp_path / "run", code=2)
    assert "--bf16 and --fp16 exclude each other" in message
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_a_full_device_is_one_clear_line(stock, tmp_path):
    """On a 100 kB tmpfs mounted in a user namespace (skipped where unprivileged namespaces are not allowed)."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-r", "-m", "true"]).returncode != 0:
        pytest.skip("unprivileged user namespaces are not available")
    small = tmp_path / "small"
    small.mkdir()
    command = (
        f"mount -t tmpfs -o size=100k tmpfs {small} && {sys.executable} -m hf_geonorm_cli.main convert {stock} "
        f"{small / 'out'}; ls -A {small}"
    )
    done = subprocess.run(["unshare", "-r", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=300)
    errors = done.stderr.strip().splitlines()
    assert errors[-1] == f"Error: cannot write {small / 'out'}: No space left on device", done.stderr
    assert "SafetensorError" not in done.stderr and "Traceback" not in done.stderr
    assert done.stdout.strip() == ""  # nothing left behind on the full device
