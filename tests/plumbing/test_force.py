"""What ``--force`` replaces: an empty folder, or an output that hf-geonorm wrote (``convert``, ``init``, ``train``,
``sweep``) holding nothing beside what it wrote there. Any other folder is refused before anything moves, and
``/``, the home folder, a folder holding it and a repository are never replaced. Paths are taken as given: a ``~``
that the shell did not expand names a folder ``~``.

Every test runs with ``HOME`` and its working folder in temporary folders (tests/conftest.py), so a command that
reached the home folder here could only reach a temporary one; the tests check it was left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import hf_geonorm
from hf_geonorm._plumbing.ownership import mark_folder

from support.helpers import contents, fails, invoke, train_in
from support.tiny_models import tiny_model, token_ids

MARKER = ".hf-geonorm-output.json"  # what every output carries: its name is part of the documented format
TEXT = Path(json.__file__).with_name("decoder.py")  # real text: a Python stdlib source file


@pytest.fixture(scope="module")
def stock(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stock") / "gpt2"
    tiny_model("gpt2").save_pretrained(folder)
    return folder


def home() -> Path:
    return Path(os.environ["HOME"])


def model_type(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["model_type"]


def test_a_tilde_the_shell_did_not_expand_names_a_folder_called_tilde(stock):
    before = contents(home())
    for given in ("~", "~/"):
        result = invoke("convert", stock, given, "--force")
        assert result.exit_code == 0, result.output
        assert (Path.cwd() / "~" / "model.safetensors").is_file()
        assert contents(home()) == before
    result = invoke("init", "gpt2", "~", "--preset", "tiny", "--force")  # replaces convert's output: an output
    assert result.exit_code == 0, result.output
    assert model_type(Path.cwd() / "~") == "geonorm_gpt2" and not (Path.cwd() / "~" / "model.safetensors").exists()
    assert contents(home()) == before


def test_the_home_folder_named_through_an_empty_variable_is_never_replaced(stock, data_file):
    before = contents(home())
    given = f"{home()}/"  # "$HOME/$UNSET": the separator after an empty variable names the home folder itself
    commands = [
        ["convert", stock, given, "--force"],
        ["init", "gpt2", given, "--preset", "tiny", "--force"],
        ["train", "--data", data_file, "--max-steps", "1", "--output", given, "--force"],
    ]
    for command in commands:
        message = fails(*command)
        assert "is your home folder" in message and "never" in message, message
    assert contents(home()) == before


def test_the_root_a_folder_holding_home_and_a_repository_are_never_replaced(stock, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a working folder outside the home's parent: the rule itself must refuse
    assert "is the root folder" in fails("convert", stock, "/", "--force")
    assert "holds your home folder" in fails("convert", stock, home().parent, "--force")
    out = tmp_path / "out"
    assert invoke("convert", stock, out).exit_code == 0
    (out / ".git").mkdir()  # an output the user made a repository of
    before = contents(out)
    assert "holds .git" in fails("convert", stock, out, "--force")
    assert contents(out) == before


def test_a_folder_of_the_users_is_refused_even_with_force_naming_five_entries(stock, data_file, tmp_path):
    models = tmp_path / "models"  # "convert model ~/models --force", meant as "put it in ~/models"
    for name in ("llama", "mistral", "phi", "qwen", "smollm", "gpt2"):
        (models / name).mkdir(parents=True)
        (models / name / "model.safetensors").write_bytes(b"someone's weights")
    (models / "notes.txt").write_text("mine")
    before = contents(models)
    for command in (
        ["convert", stock, models, "--force"],
        ["init", "gpt2", models, "--preset", "tiny", "--force"],
        ["train", "--data", data_file, "--max-steps", "1", "--output", models, "--force"],
    ):
        message = fails(*command)
        assert "was not written by hf-geonorm" in message, message
        assert "gpt2, llama, mistral, notes.txt, phi and 2 more" in message, message
        assert "give another folder, or empty it yourself" in message
    assert contents(models) == before


def test_force_replaces_an_earlier_output_that_holds_nothing_else(stock, tmp_path):
    out = tmp_path / "out"
    assert invoke("convert", stock, out).exit_code == 0
    result = invoke("init", "llama", out, "--preset", "tiny", "--force")  # force keeps its use
    assert result.exit_code == 0, result.output
    assert model_type(out) == "geonorm_llama" and not (out / "model.safetensors").exists()
    result = invoke("convert", stock, out, "--force")
    assert result.exit_code == 0, result.output
    assert model_type(out) == "geonorm_gpt2"

    (out / "notes.txt").write_text("the user's")  # a file put beside the output
    before = contents(out)
    message = fails("convert", stock, out, "--force")
    assert "did not write there, or changed since (notes.txt)" in message, message
    assert contents(out) == before
    (out / "notes.txt").unlink()
    with open(out / "README.md", "a") as card:  # the card, edited by hand
        card.write("\nmy own notes on this model\n")
    before = contents(out)
    assert "(README.md)" in fails("init", "gpt2", out, "--preset", "tiny", "--force")
    assert contents(out) == before


def test_an_output_whose_card_hf_geonorm_rewrote_is_still_its_output(stock, tmp_path):
    out = tmp_path / "out"
    assert invoke("convert", stock, out).exit_code == 0
    result = invoke("card", out, "--license", "mit")  # the card re-rendered by hf-geonorm, not edited by hand
    assert result.exit_code == 0, result.output
    result = invoke("init", "gpt2", out, "--preset", "tiny", "--force")
    assert result.exit_code == 0, result.output


def test_a_folder_without_the_marker_is_the_users_whatever_it_holds(stock, tmp_path):
    """No resemblance rule: a GeoNorm model and nothing else, as an hf-geonorm of before the marker wrote it or as
    save_pretrained writes it, is the user's; --force refuses it, naming its files."""
    out = tmp_path / "out"
    assert invoke("convert", stock, out).exit_code == 0
    (out / MARKER).unlink()
    before = contents(out)
    message = fails("init", "gpt2", out, "--preset", "tiny", "--force")
    assert "was not written by hf-geonorm (it holds README.md, blocks.py" in message, message
    assert contents(out) == before


def test_train_force_starts_anew_only_over_its_own_output(data_file, tmp_path):
    run = tmp_path / "run"
    result = train_in(tmp_path, data_file, "--keep-checkpoints")  # as every run kept them before the marker existed
    assert result.exit_code == 0, result.output
    (run / "checkpoint-7").mkdir()  # a user's folder of a checkpoint's name, which --force once removed
    (run / "checkpoint-7" / "notes.txt").write_text("mine")
    before = contents(run)
    message = fails(*train_args(tmp_path, data_file, "--force"))
    assert "did not write there, or changed since (checkpoint-7/)" in message, message
    assert contents(run) == before
    shutil.rmtree(run / "checkpoint-7")
    result = train_in(tmp_path, data_file, "--force", "--seed", "1")
    assert result.exit_code == 0, result.output
    assert "--force: removed the earlier output's checkpoint-1, final, loss_curve.png, metrics.json" in result.output
    assert json.loads((run / "metrics.json").read_text())["options"]["seed"] == 1


def train_args(tmp_path: Path, data: Path, *more: str) -> list:
    """The arguments ``train_in`` gives (one step into ``tmp_path / "run"``), for ``fails``."""
    from support.helpers import ONE_STEP

    return ["train", "--data", data, *ONE_STEP, "--data-cache", tmp_path / "cache", "--output", tmp_path / "run",
            *more]  # fmt: skip


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
    model = hf_geonorm.checkpoints.loading.load_model(hf_geonorm.checkpoints.loading.open_source(tmp_path / "link"))
    ids = token_ids()
    torch.testing.assert_close(model(input_ids=ids).logits, tiny_model("llama")(input_ids=ids).logits)


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """The user's current folder, holding a file of theirs."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    return here


def test_an_empty_output_is_refused_and_the_current_folder_is_left_alone(stock_llama, workdir):
    before = contents(workdir)
    for args in (
        ("convert", stock_llama, "", "--force"),
        ("init", "gpt2", "", "--preset", "tiny", "--force"),
    ):
        message = fails(*args)
        assert "OUTPUT_DIR given is empty" in message and "  " not in message, message
    assert "--output is empty" in fails("train", "--output", "", "--force", "--data", TEXT, code=2)
    assert "--output is empty" in fails("sweep", "--output", "", "--data", TEXT, code=2)
    assert contents(workdir) == before


def test_the_current_folder_or_one_holding_it_is_never_replaced(stock_llama, workdir):
    before = contents(workdir.parent)
    assert "is the current folder" in fails("convert", stock_llama, ".", "--force")
    assert "is the current folder" in fails("init", "gpt2", workdir, "--preset", "tiny", "--force")
    assert "holds the current folder" in fails("convert", stock_llama, "..", "--force")
    assert "holds the current folder" in fails("convert", stock_llama, "../../" + workdir.parent.name, "--force")
    assert "is the current folder" in fails("train", "--output", ".", "--force", "--data", TEXT)
    assert contents(workdir.parent) == before


def test_train_force_refuses_an_output_holding_what_it_reads(tmp_path):
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    shutil.copy(TEXT, run / "data" / "text.txt")
    message = fails("train", "--output", run, "--force", "--data", run / "data" / "text.txt")
    assert "holds the --data" in message
    assert (run / "data" / "text.txt").is_file()


def test_a_source_linked_into_the_output_is_refused(stock_llama, tmp_path):
    holder = tmp_path / "holder"
    holder.mkdir()
    shutil.copy(stock_llama / "model.safetensors", holder / "model.safetensors")
    mark_folder(holder, "convert")  # an output --force may replace, but not while the source's weights are in it
    source = tmp_path / "src2"  # as a Hub cache snapshot: config and links to the weights kept elsewhere
    source.mkdir()
    shutil.copy(stock_llama / "config.json", source / "config.json")
    (source / "model.safetensors").symlink_to(holder / "model.safetensors")
    before = contents(holder)
    message = fails("convert", source, holder, "--force")
    assert "symbolic link into the output" in message and "model.safetensors" in message
    assert contents(holder) == before
    result = invoke("convert", source, tmp_path / "elsewhere")  # the same source converts anywhere else
    assert result.exit_code == 0, result.output
