"""``hf-geonorm card`` and the cards the other commands write.

- A README.md that is not exactly what hf-geonorm wrote (edited since, or another tool's) is never re-rendered
  without --force; with it, only its metadata changes and its text is kept.
- The facts a card states are checked as push checks them: a license the Hub does not know and a base model that is
  not a Hub id (a local path) are refused before anything is written.
- Every card convert, train and card write passes push, also where the source's card says ``license: other``.
- train reads the card of its --model as convert does, and says so when it cannot.
"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from hf_geonorm.sharing.card_checks import check_shareable
from hf_geonorm.sharing.card_updates import TRAINER_CARD_MARK

from support.fake_hub import served
from support.helpers import contents, fails, invoke
from support.tiny_models import tiny_model

SMALL = ["--seq-len", "32", "--vocab-size", "300", "--batch-size", "4", "--warmup-steps", "0", "--max-steps", "1",
         "--eval-every", "1", "--eval-blocks", "4"]  # fmt: skip
# A stock model's card as the Hub has many: a license not on the Hub's list, named, and a few languages.
SOURCE_CARD = """---
license: other
license_name: tiny-model-license
license_link: LICENSE
language:
- en
- fr
---
# A tiny stock model
"""


def succeeds(*args: object) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def stock(tmp_path_factory) -> Path:
    """A tiny stock GPT-2 whose card names its own license (license: other + license_name)."""
    folder = tmp_path_factory.mktemp("stock") / "gpt2"
    tiny_model("gpt2", vocab_size=320).save_pretrained(folder)
    (folder / "README.md").write_text(SOURCE_CARD)
    return folder


@pytest.fixture(scope="module")
def converted(stock, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("converted") / "geo"
    succeeds("convert", stock, folder, "--alpha", "0.7")
    return folder


@pytest.fixture
def hub(monkeypatch, tmp_path):
    with served(monkeypatch, tmp_path / "no-login" / "token") as server:
        yield server


def copy_of(folder: Path, target: Path) -> Path:
    shutil.copytree(folder, target)
    return target


def without_fingerprint(text: str) -> str:
    """The card without its last line, hf-geonorm's mark of the text it wrote."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("<!-- hf-geonorm card"))


# ---- a README.md hf-geonorm did not write as it is ----


def test_an_edited_card_is_kept_and_force_changes_only_its_metadata(converted, tmp_path):
    folder = copy_of(converted, tmp_path / "edited")
    readme = folder / "README.md"
    notes = "## My notes\n\nTrained on my data.\n\n"
    edited = readme.read_text().replace("## What GeoNorm is", notes + "## What GeoNorm is")
    assert edited != readme.read_text()
    readme.write_text(edited)
    before = contents(folder)
    message = fails("card", folder, "--license", "apache-2.0")
    assert str(readme) in message and "edited" in message and "--force" in message, message
    assert contents(folder) == before
    succeeds("card", folder, "--license", "apache-2.0", "--force")
    text = readme.read_text()
    assert ModelCard(text).text == ModelCard(edited).text  # the text below the metadata, as the user left it
    assert ModelCard(text).data.license == "apache-2.0" and "## My notes\n\nTrained on my data." in text
    assert json.loads((folder / "geonorm_card.json").read_text())["license"] == "apache-2.0"
    assert check_shareable(folder) == []
    assert "--force" in fails("card", folder, "--license", "mit")  # still the user's text
    # an edit of the metadata alone counts too
    fresh = copy_of(converted, tmp_path / "metadata-edited")
    (fresh / "README.md").write_text((fresh / "README.md").read_text().replace("- geonorm\n", "- geonorm\n- mine\n"))
    assert "edited" in fails("card", fresh, "--license", "mit")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_card_as_hf_geonorm_wrote_it_is_rendered_again(converted, tmp_path):
    assert mode(converted / "README.md") == mode(converted / "config.json")  # written whole, as readable as the rest
    folder = copy_of(converted, tmp_path / "unedited")
    written = (folder / "README.md").read_text()
    (folder / "README.md").chmod(0o640)
    succeeds("card", folder, "--license", "apache-2.0")
    assert mode(folder / "README.md") == 0o640
    rendered = (folder / "README.md").read_text()
    assert ModelCard(rendered).data.license == "apache-2.0"
    expected = written.replace("license: other\nlicense_name: tiny-model-license\nlicense_link: LICENSE\n",
                               "license: apache-2.0\n")  # fmt: skip
    assert expected != written and without_fingerprint(rendered) == without_fingerprint(expected)
    succeeds("card", folder, "--source", "my/notes")  # and again: the new card is hf-geonorm's as written


def test_another_tools_readme_keeps_its_text_and_metadata_under_force(converted, tmp_path):
    folder = copy_of(converted, tmp_path / "theirs")
    theirs = "---\nlicense: apache-2.0\ndatasets:\n- org/data\ntags:\n- mine\n---\n# my notes\n\nkeep this\n"
    (folder / "README.md").write_text(theirs)
    message = fails("card", folder, "--base-model", "org/base")
    assert str(folder / "README.md") in message and "--force" in message, message
    assert (folder / "README.md").read_text() == theirs
    succeeds("card", folder, "--base-model", "org/base", "--force")
    card = ModelCard((folder / "README.md").read_text())
    assert card.text == "# my notes\n\nkeep this\n"
    data = card.data.to_dict()
    assert data["datasets"] == ["org/data"] and data["base_model"] == "org/base" and "mine" in data["tags"]
    assert "geonorm" in data["tags"] and data["license"] == "apache-2.0"  # the README's own license stands
    assert json.loads((folder / "geonorm_card.json").read_text())["license"] == "apache-2.0"  # and is the folder's
    assert check_shareable(folder) == []
    # a README whose own metadata push refuses is not written, even with --force, unless the option corrects it
    wrong = theirs.replace("license: apache-2.0", "license: MIT License")
    (folder / "README.md").write_text(wrong)
    message = fails("card", folder, "--force")
    assert "license 'MIT License' is not a Hub license identifier" in message, message
    assert (folder / "README.md").read_text() == wrong
    succeeds("card", folder, "--force", "--license", "mit")
    assert ModelCard.load(folder / "README.md").data.license == "mit"


def test_a_byte_order_mark_is_read_as_the_start_of_the_readme(converted, hub, tmp_path):
    """A README.md saved with a byte-order mark (as some Windows editors save UTF-8): card --force keeps its
    metadata (the license too) and text, and writes the card without the mark, once; push refuses the file with
    the mark, whose metadata neither huggingface_hub nor the Hub would find."""
    folder = copy_of(converted, tmp_path / "bom")
    theirs = "---\nlicense: apache-2.0\ntags:\n- mine\n---\n# my notes\n\nkeep this\n"
    (folder / "README.md").write_bytes(b"\xef\xbb\xbf" + theirs.encode())
    message = fails("push", folder, "me/bom")
    assert "README.md: it starts with a byte-order mark (U+FEFF)" in message, message
    assert hub.requests == []
    succeeds("card", folder, "--force")
    written = (folder / "README.md").read_bytes()
    assert not written.startswith(b"\xef\xbb\xbf") and written.count(b"\n---\n") == 1
    card = ModelCard(written.decode())
    assert card.text == "# my notes\n\nkeep this\n"
    assert card.data.license == "apache-2.0" and "mine" in card.data.tags and "geonorm" in card.data.tags
    assert check_shareable(folder) == []
    assert succeeds("push", folder, "me/bom")


def test_a_readme_that_is_a_folder_is_named(converted, hub, tmp_path):
    folder = copy_of(converted, tmp_path / "folder-readme")
    (folder / "README.md").unlink()
    (folder / "README.md").mkdir()
    for command in (["card", folder, "--force"], ["push", folder, "me/x"]):
        message = fails(*command)
        assert f"{folder / 'README.md'} is not a file" in message, message
    assert hub.requests == [] and (folder / "README.md").is_dir()


# ---- the facts a card states ----


@pytest.mark.parametrize(
    "args, words",
    [
        (["--license", "not-a-license"], ["--license 'not-a-license' is not a Hub license identifier"]),
        (["--license", "MIT"], ["--license 'MIT'", "'mit'"]),
        (["--license", "other"], ["--license other needs --license-name"]),
        (["--base-model", "../../etc/passwd"], ["--base-model '../../etc/passwd'", "not a Hub model id", "local"]),
        (["--base-model", "gpt2"], ["--base-model 'gpt2'", "owner/name"]),
        (["--base-model", "https://huggingface.co/org/m"], ["not a Hub model id", "org/m"]),
    ],
)
def test_card_refuses_facts_the_hub_would_refuse(converted, tmp_path, args, words):
    folder = copy_of(converted, tmp_path / "folder")
    before = contents(folder)
    message = fails("card", folder, *args, code=2)
    assert all(word in message for word in words), message
    assert contents(folder) == before


def test_a_local_folder_is_no_base_model(converted, tmp_path):
    folder = copy_of(converted, tmp_path / "folder")
    message = fails("card", folder, "--base-model", str(converted), code=2)
    assert f"--base-model '{converted}' is a local folder, not a Hub model id" in message and "--source" in message
    message = fails("convert", tmp_path / "folder", tmp_path / "out", "--base-model", str(converted), code=2)
    assert "is a local folder, not a Hub model id" in message
    assert "not-a-license" in fails("convert", folder, tmp_path / "out", "--license", "not-a-license", code=2)
    assert not (tmp_path / "out").exists()


def test_a_card_hf_geonorm_wrote_and_the_user_broke_is_not_called_another_tools(converted, tmp_path):
    folder = copy_of(converted, tmp_path / "folder")
    readme = folder / "README.md"
    readme.write_text(readme.read_text().replace("license: other\n", "license: Other License\n"))
    problems = check_shareable(folder)
    assert any("license 'Other License' is not a Hub license identifier" in p for p in problems), problems
    assert not any("another tool" in p for p in problems), problems
    assert any(f"hf-geonorm card {folder} --force" in p for p in problems), problems


# ---- every card hf-geonorm writes is one push accepts ----


def test_push_accepts_the_cards_of_convert_card_and_train(converted, hub, tmp_path, data_file):
    front = ModelCard.load(converted / "README.md").data.to_dict()
    assert (front["license"], front["license_name"], front["license_link"]) == ("other", "tiny-model-license",
                                                                              "LICENSE")  # fmt: skip
    assert front["language"] == ["en", "fr"]
    succeeds("push", converted, "me/converted")
    # card on a folder Trainer left (its generic card), facts from the folder it was trained from
    trained = copy_of(converted, tmp_path / "trained")
    (trained / "geonorm_card.json").unlink()
    (trained / "README.md").write_text("---\ntags:\n- generated_from_trainer\n---\n\n<!-- This model card has been "
                                       "generated automatically according to the information the Trainer had "
                                       "access to. -->\n# run\n")  # fmt: skip
    succeeds("card", trained, "--from", converted)
    assert ModelCard.load(trained / "README.md").data.to_dict()["license_name"] == "tiny-model-license"
    succeeds("push", trained, "me/carded")
    # card with a named license of the user's own
    succeeds("card", trained, "--license", "other", "--license-name", "my-license")
    data = ModelCard.load(trained / "README.md").data.to_dict()
    assert (data["license"], data["license_name"], data.get("license_link")) == ("other", "my-license", None)
    succeeds("card", trained, "--license", "mit")
    data = ModelCard.load(trained / "README.md").data.to_dict()
    assert data["license"] == "mit" and "license_name" not in data and "license_link" not in data
    succeeds("push", trained, "me/carded")
    # train's final model
    succeeds("train", "--model", converted, "--data", data_file, *SMALL, "--output", tmp_path / "run")
    data = ModelCard.load(tmp_path / "run" / "final" / "README.md").data.to_dict()
    assert (data["license"], data["license_name"]) == ("other", "tiny-model-license")
    succeeds("push", tmp_path / "run" / "final", "me/trained")
    assert set(hub.repos) == {"me/converted", "me/carded", "me/trained"}


def test_a_source_cards_facts_the_hub_refuses_are_left_out_with_a_warning(stock, tmp_path):
    source = copy_of(stock, tmp_path / "stock")
    (source / "README.md").write_text("---\nlicense: Apache License 2.0\nlanguage: English\n---\n# stock\n")
    output = succeeds("convert", source, tmp_path / "out")
    assert "license 'Apache License 2.0' is not a Hub license identifier" in output
    assert "language must be ISO 639 codes" in output and "not carried" in output
    data = ModelCard.load(tmp_path / "out" / "README.md").data.to_dict()
    assert "license" not in data and "language" not in data
    assert check_shareable(tmp_path / "out") == []


# ---- train reads its --model's card as convert does ----


def test_train_warns_as_convert_does_when_the_source_card_uses_yaml_aliases(tmp_path, data_file):
    source = tmp_path / "stock"
    tiny_model("gpt2", vocab_size=320).save_pretrained(source)
    (source / "README.md").write_text("---\nlicense: &terms mit\nlicense_link: *terms\n---\n# a model\n")
    converted = invoke("convert", source, tmp_path / "converted")
    assert converted.exit_code == 0, converted.output
    warning = [line for line in converted.output.splitlines() if "YAML aliases" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: ") and "its card is not read" in warning[0]
    trained = invoke("train", "--model", source, "--data", data_file, *SMALL, "--output", tmp_path / "run")
    assert trained.exit_code == 0, trained.output
    assert [line for line in trained.output.splitlines() if "YAML aliases" in line] == warning


# ---- the training another tool did ----


class WritesWhenUnpickled:
    """Unpickled, it creates the file it names: a training_args.bin that shows whether anything loaded it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def trl_output(converted: Path, target: Path) -> Path:
    """A folder laid out as TRL's SFTTrainer leaves ``output_dir`` after ``trainer.save_model()``: the model as
    ``save_pretrained`` writes it, ``training_args.bin`` (a pickle) beside it, and the checkpoint of the last step
    with its ``trainer_state.json``; no card."""
    import pickle

    from transformers import AutoModelForCausalLM, TrainerState

    import hf_geonorm  # noqa: F401  (the GeoNorm classes)

    model = AutoModelForCausalLM.from_pretrained(converted)
    model.save_pretrained(target)
    model.save_pretrained(target / "checkpoint-2")
    history = [
        {"loss": 5.5, "learning_rate": 0.01, "grad_norm": 1.0, "epoch": 0.5, "step": 1},
        {"eval_loss": 5.25, "epoch": 0.5, "step": 1},
        {"loss": 5.0, "learning_rate": 0.005, "grad_norm": 0.9, "epoch": 1.0, "step": 2},
        {"train_runtime": 1.5, "train_loss": 5.25, "epoch": 1.0, "step": 2},
    ]
    state = TrainerState(epoch=1.0, global_step=2, max_steps=2, num_train_epochs=1, train_batch_size=2,
                         log_history=history)
    state.save_to_json(str(target / "checkpoint-2" / "trainer_state.json"))
    for folder in (target, target / "checkpoint-2"):
        (folder / "training_args.bin").write_bytes(pickle.dumps(WritesWhenUnpickled(target.parent / "UNPICKLED")))
    return target


def test_card_from_reads_the_training_a_trl_output_records_without_unpickling(converted, tmp_path):
    folder = trl_output(converted, tmp_path / "sft")
    succeeds("card", folder, "--from", converted)
    assert not (tmp_path / "UNPICKLED").exists()  # training_args.bin was never loaded
    stored = json.loads((folder / "geonorm_card.json").read_text())
    training = stored["training"]
    assert training is not None and stored["license_name"] == "tiny-model-license"  # and --from's lineage
    assert training["steps"] == "2 of 2" and training["recorded in"] == "checkpoint-2/trainer_state.json"
    assert training["training loss"] == "5.5 at step 1, 5 at step 2 (logged)"
    assert training["validation loss"] == "5.25 at step 1"
    assert training["peak learning rate"] == "0.01 (the highest logged)"
    assert "training_args.bin" in training["not read"] and "pickle" in training["not read"]
    text = " ".join((folder / "README.md").read_text().split())
    assert "## Training" in text and "another tool" in text and "- steps: 2 of 2" in text
    assert check_shareable(folder) == []


def test_card_says_plainly_when_nothing_records_how_a_model_was_trained(converted, tmp_path):
    from transformers import AutoModelForCausalLM

    import hf_geonorm  # noqa: F401  (the GeoNorm classes)

    AutoModelForCausalLM.from_pretrained(converted).save_pretrained(tmp_path / "saved")
    succeeds("card", tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "geonorm_card.json").read_text())["training"] is None
    text = " ".join((tmp_path / "saved" / "README.md").read_text().split())
    assert "## Training" in text and "is unknown" in text and "trainer_state.json" in text
    # a folder hf-geonorm wrote and did not train (a conversion) says nothing of training
    assert "## Training" not in (converted / "README.md").read_text()


# ---- folders another tool saved ----


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
