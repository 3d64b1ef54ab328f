"""Issue 38, the first hour of a new user: each point tested the way the user met it, through the command line (and,
for the folders, through transformers and PEFT where the plugin is not installed)."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import conftest
import pytest
import torch
from helpers import STDLIB, fails, invoke, stdlib_text
from huggingface_hub import ModelCard

import hf_geonorm
from hf_geonorm.sharing.card_checks import check_shareable
from hf_geonorm.sharing.card_updates import TRAINER_CARD_MARK
from hf_geonorm.sharing.hub import save_shareable
from hf_geonorm.sharing.model_card import CardInfo
from hf_geonorm.training.data.prepare import evaluation_size
from hf_geonorm.training.options import EVAL_BLOCKS, TrainOptions

SMALL = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "2", "--warmup-steps", "0", "--lr", "1e-3"]
LINEAGE = {"license": "mit", "source": "some/original", "base_model": "org/base-model", "language": "en"}


def succeeds(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    return stdlib_text(tmp_path_factory, "json/decoder.py", "textwrap.py")


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, data_file) -> tuple[Path, str]:
    """A short run as a new user makes one: 4 steps, evaluated at step 0, at the end and on test."""
    out = tmp_path_factory.mktemp("runs") / "run"
    output = succeeds("train", "--data", data_file, *SMALL, "--max-steps", 4, "--output", out)
    return out, output


# ---- 1. evaluation ----


def test_the_default_evaluation_is_sized_to_the_run_and_the_held_out_documents_are_not():
    assert evaluation_size(TrainOptions()) == EVAL_BLOCKS  # train's default run: as before
    assert evaluation_size(TrainOptions(max_steps=20)) == 32  # the 20-step fine-tune
    assert evaluation_size(TrainOptions(max_steps=4, batch_size=2)) == 8  # the floor
    assert evaluation_size(TrainOptions(max_steps=4, eval_blocks=100)) == 100  # given: kept
    assert TrainOptions(max_steps=4).held_out_blocks() == TrainOptions().held_out_blocks() == EVAL_BLOCKS


def test_a_short_run_shows_its_evaluation_and_leaves_it_out_of_tokens_per_second(short_run):
    out, output = short_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["evaluated_blocks"] == {"validation": 8, "test": 8}, metrics["data_facts"]
    assert metrics["options"]["eval_blocks"] is None  # the default: the documents held out are 64 blocks' worth
    assert 0 < metrics["evaluation_seconds"] < metrics["train_seconds"] + metrics["evaluation_seconds"]
    assert "evaluating" in output  # the evaluation's own progress bar
    assert "left out" in output and "tokens/s" in output
    assert metrics["tokens_per_second"] == pytest.approx(metrics["tokens"] / metrics["training_seconds"])
    assert metrics["training_seconds"] < metrics["train_seconds"]  # the evaluations inside train() are left out


# ---- 9. the checkpoints a run keeps ----


def test_the_end_of_a_run_says_what_its_checkpoints_held_when_it_removes_them(short_run, tmp_path, data_file):
    out, output = short_run
    assert "removed checkpoint-4" in output and "--keep-checkpoints keeps them" in output
    assert not list(out.glob("checkpoint-*")) and (out / "final" / "model.safetensors").is_file()
    kept = tmp_path / "kept"
    output = succeeds("train", "--data", data_file, *SMALL, "--max-steps", 2, "--keep-checkpoints", "--output", kept)
    assert "checkpoint-2 kept beside final/ (--keep-checkpoints)" in output and (kept / "checkpoint-2").is_dir()


# ---- 2. the card's lineage through train ----


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator((STDLIB / "textwrap.py").read_text().splitlines(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A GeoNorm folder whose card knows its license, source, base model and language (as convert writes it)."""
    folder = tmp_path_factory.mktemp("converted") / "geo"
    config = hf_geonorm.GeoNormGPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=320, n_positions=64,
                                          bos_token_id=0, eos_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    model = hf_geonorm.GeoNormGPT2ForCausalLM(config)
    save_shareable(model, folder, tokenizer=tokenizer(), card_info=CardInfo(**LINEAGE))
    return folder


def test_train_from_a_converted_folder_keeps_its_license_source_and_base_model(converted, tmp_path, data_file):
    out = tmp_path / "tuned"
    succeeds("train", "--model", converted, "--data", data_file, "--seq-len", 32, "--batch-size", 2, "--max-steps", 1,
             "--output", out)  # fmt: skip
    stored = json.loads((out / "final" / "geonorm_card.json").read_text())
    assert {key: stored[key] for key in LINEAGE} == LINEAGE
    front = ModelCard.load(out / "final" / "README.md").data.to_dict()
    assert front["license"] == "mit" and front["base_model"] == "org/base-model"
    assert "some/original" in (out / "final" / "README.md").read_text()


# ---- 3. folders another tool saved ----


def resaved_by_trainer(final: Path, target: Path) -> Path:
    """``final`` as run_clm.py's Trainer leaves it: the same files, Trainer's generic card, no GeoNorm card data."""
    shutil.copytree(final, target)
    (target / "geonorm_card.json").unlink()
    (target / "README.md").write_text(f"---\nlibrary_name: transformers\ntags:\n- generated_from_trainer\n---\n\n"
                                      f"<!-- {TRAINER_CARD_MARK} access to. -->\n\n# run\n")  # fmt: skip
    return target


def test_push_and_info_say_how_to_write_the_card_and_card_writes_it(short_run, tmp_path):
    folder = resaved_by_trainer(short_run[0] / "final", tmp_path / "clm-out")
    problems = check_shareable(folder)
    assert problems and f"write one with hf-geonorm card {folder}" in problems[-1]
    assert f"hf-geonorm card {folder}" in succeeds("info", folder)
    succeeds("card", folder, "--license", "apache-2.0", "--base-model", "org/base")
    assert check_shareable(folder) == []
    assert ModelCard.load(folder / "README.md").data.to_dict()["license"] == "apache-2.0"
    hidden = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert hidden == [".hf-geonorm-output.json"]  # final/'s marker, copied with it; no temporary file left


def test_card_never_overwrites_a_users_readme_without_force(short_run, tmp_path):
    folder = resaved_by_trainer(short_run[0] / "final", tmp_path / "mine")
    (folder / "README.md").write_text("# my notes\n")
    assert "--force" in fails("card", folder)
    assert (folder / "README.md").read_text() == "# my notes\n"
    succeeds("card", folder, "--force")
    assert check_shareable(folder) == []


# ---- 4. without the plugin: the tokenizer and LoRA's default targets ----

WITHOUT_PLUGIN = """
if job["peft_first"]:
    import peft  # imported first, as a LoRA script does
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

tokenizer = PreTrainedTokenizerFast.from_pretrained(job["folder"])  # the card's line: no trust prompt
report["tokenizer"] = type(tokenizer).__name__
model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=True)
from peft import LoraConfig, get_peft_model  # noqa: E402  (imported here when not above)

model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", r=4))  # PEFT's default targets, as with the plugin
report["wrapped"] = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")})
"""
CARD_TARGETS = """
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(job["folder"], trust_remote_code=True)
from peft import LoraConfig, get_peft_model  # imported after the model: the card's targets still work
model = get_peft_model(model, LoraConfig(r=4, target_modules=job["targets"], fan_in_fan_out=True))
report["lora"] = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
"""


@pytest.mark.parametrize("peft_first", [True, False], ids=["peft-before-the-model", "peft-after-the-model"])
def test_without_the_plugin_the_tokenizer_asks_nothing_and_lora_finds_targets(converted, tmp_path, plugin_free_python,
                                                                              peft_first):  # fmt: skip
    """LoRA's default targets are PEFT's own for the stock type (GPT-2: c_attn) whether the script imports peft
    before or after the model's remote code runs."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS

    card = (converted / "README.md").read_text()
    assert 'PreTrainedTokenizerFast.from_pretrained("path/to/this/folder")' in card
    assert "target_modules=['c_attn']" in card and "fan_in_fan_out=True" in card
    job = {"folder": str(converted), "peft_first": peft_first}
    report, _ = plugin_free_python.run(WITHOUT_PLUGIN, job, tmp_path / "a")
    assert report["tokenizer"] in ("TokenizersBackend", "PreTrainedTokenizerFast")
    assert report["wrapped"] == sorted(PEFT_TARGETS["gpt2"])
    report, _ = plugin_free_python.run(CARD_TARGETS, {"folder": str(converted), "targets": ["c_attn"]}, tmp_path / "b")
    assert report["lora"] > 0


TWO_FOLDERS = """
from transformers import AutoModelForCausalLM

models = {name: AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
          for name, folder in job["folders"].items()}  # two copies of the remote code, each waiting for peft
from peft import LoraConfig, get_peft_model  # noqa: E402

report["wrapped"] = {
    name: sorted({n.rsplit(".", 1)[-1] for n, m in get_peft_model(model, LoraConfig(r=2)).named_modules()
                  if hasattr(m, "lora_A")})
    for name, model in models.items()
}
"""


def test_two_folders_loaded_as_remote_code_before_peft_both_get_loras_default_targets(converted, tmp_path,
                                                                                      plugin_free_python):  # fmt: skip
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_TARGETS
    from tiny_models import tiny_model

    llama = tmp_path / "llama"
    hf_geonorm.convert(tiny_model("llama")).save_pretrained(llama)
    job = {"folders": {"gpt2": str(converted), "llama": str(llama)}}
    report, _ = plugin_free_python.run(TWO_FOLDERS, job, tmp_path / "child")
    assert report["wrapped"] == {name: sorted(PEFT_TARGETS[name]) for name in ("gpt2", "llama")}


# ---- 5. the context length ----


def test_info_and_the_card_state_the_positions_and_generate_beyond_them_names_the_limit(converted):
    assert "positions:    64 " in succeeds("info", converted)
    assert "Its context is 64 positions" in (converted / "README.md").read_text()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(converted)
    prompt = torch.zeros((1, 8), dtype=torch.long)
    fill = {"do_sample": False, "pad_token_id": 0}
    assert model.generate(prompt, max_new_tokens=8, min_new_tokens=8, **fill).shape[-1] == 16
    with pytest.raises(ValueError, match=r"beyond this model's 64 learned positions.*max_new_tokens"):
        model.generate(prompt, max_new_tokens=200, min_new_tokens=200, **fill)


# ---- 6. info on a run folder and on a GGUF file ----


def test_info_on_a_run_folder_summarises_it_and_points_to_its_model(short_run):
    out = short_run[0]
    output = succeeds("info", out)
    assert f"hf-geonorm info {out / 'final'}" in output and "steps:" in output


def test_info_reads_a_gguf_file(tmp_path):
    pytest.importorskip("gguf")
    from tiny_gguf import write_tiny_gguf

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    output = succeeds("info", path)
    assert "(GGUF)" in output and "llama" in output and "positions:    64" in output
    assert "license apache-2.0" in output and "parameters:" in output


# ---- 7. angles at the clamp ----


def test_angles_reports_the_share_of_updates_at_the_clamp(short_run, data_file):
    output = succeeds("angles", short_run[0] / "final", "--text", data_file, "--max-tokens", 64)
    line = next(line for line in output.splitlines() if line.startswith("at the clamp:"))
    assert "--alpha" in line and "%" in line
    result = invoke("angles", short_run[0] / "final", "--text", data_file, "--max-tokens", 64, "--json")
    data = json.loads(result.stdout)
    assert 0 <= data["summary"]["at_clamp_share"] <= 1
    assert all(row["at_clamp_share"] is not None for row in data["sublayers"])


# ---- 8. numbers a user can compare ----


def test_the_readme_says_what_a_default_runs_test_loss_compares_with_and_how_long_things_take():
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "cannot be compared with the study's" in readme and "1024 blocks of another corpus" in readme
    assert re.search(r"\d+:\d\d on one core", readme), "the README says how long the default run takes"
    timing = re.search(r"about (\d+) minutes on a two-core machine \((\d+) s in CI", readme)
    assert timing, "the README says how long the test command takes, and as measured in CI"
    assert abs(int(timing[1]) * 60 - int(timing[2])) <= 60, "the minutes round the measured seconds"


# ---- 9. skipped tests and the dev extra ----


def test_pytest_says_why_tests_were_skipped(tmp_path):
    hook = inspect.getsource(conftest.pytest_terminal_summary)
    (tmp_path / "conftest.py").write_text("from collections import Counter\nfrom typing import Any\n\nimport pytest\n\n"
                                          + hook)  # fmt: skip
    (tmp_path / "test_probe.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.skip(reason="needs a GPU")
        def test_gpu():
            pass

        def test_runs():
            pass
    """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert "skipped, by reason" in done.stdout and "1  needs a GPU" in done.stdout, done.stdout


def test_the_dev_extra_says_why_it_installs_triton():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    before = pyproject[: pyproject.index('"triton>=')]
    assert "Triton's interpreter on CPU" in before[before.rindex("# triton") :]
