"""``hf-geonorm push`` and ``hf_geonorm.sharing.hub.push_to_hub`` against a local Hub (tests/support/fake_hub.py).

huggingface_hub reads HF_ENDPOINT into ``constants.ENDPOINT`` (and the download URL template) when imported, so
in-process tests set those constants (``HfApi()`` reads ENDPOINT when created); the subprocess test sets
HF_ENDPOINT itself. Offline mode (HF_HUB_OFFLINE=1, as an offline user has it set) is turned off for the local Hub
the same ways, and Xet is disabled (the local Hub speaks the plain LFS protocol), as is the token file of the user
running the tests.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub import ModelCard, constants
from transformers import AutoModelForCausalLM

import hf_geonorm
from hf_geonorm.modeling.remote_code import METHOD_SPEC, remote_code_files
from hf_geonorm.sharing.card_checks import auto_map_for
from hf_geonorm.sharing.card_metadata import validate_card
from hf_geonorm.sharing.hub import PushOptions, push_to_hub, shareable_files
from hf_geonorm.sharing.model_card import CardInfo
from hf_geonorm_cli.main import cli

from support.fake_hub import FakeHub, served
from support.helpers import fails
from support.tiny_models import tiny_model

SCRIPT = Path(sys.executable).with_name("hf-geonorm")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A running local Hub; huggingface_hub pointed at it with a valid token, online; no stored login, no Xet."""
    with served(monkeypatch, tmp_path / "no-login" / "token") as server:
        yield server


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A stock tiny LLaMA and its conversion by `hf-geonorm convert` (license and base model in the card)."""
    root = tmp_path_factory.mktemp("push")
    tiny_model("llama").save_pretrained(root / "stock")
    out = root / "converted"
    result = CliRunner().invoke(
        cli,
        ["convert", str(root / "stock"), str(out), "--alpha", "0.7", "--license", "mit", "--base-model", "org/base"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return out


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def push(*args):
    return CliRunner().invoke(cli, ["push", *map(str, args)])


def refused(*args, code=1):
    """A push that must fail with a one-line error and no traceback (exit 1; 2 for a usage error)."""
    last = fails("push", *args, code=code)
    assert last.startswith("Error: "), last
    return last


def refused_before_sending(hub, converted: Path, folder: Path, change: Callable[[Path], None], repo_id: str) -> str:
    """Push a copy of ``converted`` that ``change`` made: it must be refused before a request reaches the Hub."""
    shutil.copytree(converted, folder)
    change(folder)
    message = refused(folder, repo_id)
    assert message.startswith("Error: not pushed: "), message
    assert hub.requests == [] and hub.repos == {}
    return message


# ---- a successful push ----


def test_push_uploads_the_checked_folder_in_one_commit(hub, converted):
    result = push(converted, "me/tiny-geonorm", "--commit-message", "GeoNorm tiny llama", "--private")
    assert result.exit_code == 0, result.output
    local = {name: (converted / name).read_bytes() for name in shareable_files(converted)}
    assert {"model.safetensors", "config.json", "README.md", "geonorm_card.json", METHOD_SPEC} <= set(local)
    assert {p.name for p in remote_code_files()} <= set(local)
    # the calls huggingface_hub made, in order: create the repo, validate the card, ask upload modes, LFS, commit
    calls = [c for c in hub.api_calls() if not c.startswith("PUT /lfs-upload/")]
    assert calls == [
        "POST /api/repos/create",
        "POST /api/validate-yaml",
        "POST /api/models/me/tiny-geonorm/preupload/main",
        "POST /me/tiny-geonorm.git/info/lfs/objects/batch",
        "POST /lfs-verify",
        "POST /api/models/me/tiny-geonorm/commit/main",
    ]
    assert hub.repos["me/tiny-geonorm"].private
    (commit,) = hub.commits
    assert commit["repo_id"] == "me/tiny-geonorm" and commit["revision"] == "main"
    assert commit["summary"] == "GeoNorm tiny llama"
    assert set(commit["files"]) == set(local)
    card = local["README.md"].replace(b'"path/to/this/folder"', b'"me/tiny-geonorm"')
    assert card != local["README.md"]  # the loading examples name the repository
    for name, data in local.items():
        expected = card if name == "README.md" else data
        assert commit["files"][name]["sha256"] == sha(expected), name
        assert commit["files"][name]["mode"] == ("lfs" if name == "model.safetensors" else "regular"), name
    assert hub.files("me/tiny-geonorm")["model.safetensors"] == local["model.safetensors"]
    assert hub.validated == [card.decode()]  # huggingface_hub validated the card it committed
    assert f"commit {commit['oid']}" in result.output
    assert f"pushed {len(local)} files to me/tiny-geonorm (main)" in result.output
    # the folder was not touched
    assert (converted / "README.md").read_bytes() == local["README.md"]


def test_push_to_a_branch_creates_it_and_leaves_main_alone(hub, converted, tmp_path):
    assert push(converted, "geo").exit_code == 0  # a bare name goes to the token's namespace
    main_head = hub.repos["tester/geo"].branches["main"].head
    folder = tmp_path / "changed"
    shutil.copytree(converted, folder)
    (folder / "notes.txt").write_text("a note\n")
    result = push(folder, "tester/geo", "--revision", "dev/try-1", "--commit-message", "to dev")
    assert result.exit_code == 0, result.output
    assert "POST /api/models/tester/geo/branch/dev%2Ftry-1" in hub.api_calls()  # created from main
    commit = hub.commits[-1]
    assert commit["revision"] == "dev/try-1" and commit["summary"] == "to dev"
    assert set(commit["files"]) == {"notes.txt"}  # the files main already has are not sent again
    assert hub.repos["tester/geo"].branches["main"].head == main_head
    assert "notes.txt" not in hub.files("tester/geo") and "notes.txt" in hub.files("tester/geo", "dev/try-1")
    # pushing unchanged files again makes no commit (and the existing branch is no error)
    commits = len(hub.commits)
    again = push(folder, "tester/geo", "--revision", "dev/try-1")
    assert again.exit_code == 0, again.output
    assert len(hub.commits) == commits


def test_push_can_open_a_pull_request(hub, converted):
    assert push(converted, "me/pr").exit_code == 0
    (converted / "extra_notes.txt").write_text("notes\n")
    try:
        result = push(converted, "me/pr", "--create-pr")
    finally:
        (converted / "extra_notes.txt").unlink()
    assert result.exit_code == 0, result.output
    assert hub.commits[-1]["revision"] == "refs/pr/1" and set(hub.commits[-1]["files"]) == {"extra_notes.txt"}
    assert "extra_notes.txt" not in hub.files("me/pr", "main")
    assert "pull request" in result.output
    assert "cannot be combined" in refused(converted, "me/pr", "--create-pr", "--revision", "dev", code=2)


def test_token_from_the_login_file(hub, converted, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    login = tmp_path / "home" / "token"
    login.parent.mkdir()
    login.write_text(hub.token)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(login))
    assert push(converted, "me/from-login").exit_code == 0
    assert hub.commits[-1]["repo_id"] == "me/from-login"


def test_the_console_script_reads_hf_endpoint_and_hf_token(converted, tmp_path):
    """The installed command in a fresh process: HF_ENDPOINT and HF_TOKEN from the environment."""
    if not SCRIPT.exists():
        pytest.skip("the hf-geonorm console script is not installed")
    with FakeHub() as server:
        env = {**os.environ, "HF_ENDPOINT": server.url, "HF_TOKEN": server.token, "HF_HUB_DISABLE_XET": "1",
               "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf_home"),
               "HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # fmt: skip
        run = subprocess.run(
            [str(SCRIPT), "push", str(converted), "me/subprocess", "--revision", "v1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert server.commits[-1]["repo_id"] == "me/subprocess" and server.commits[-1]["revision"] == "v1"
        assert not server.unhandled


# ---- refusals: nothing is sent ----


def mutate(folder: Path, how: str) -> None:
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if how == "no_config":
        config_path.unlink()
    elif how == "corrupt_config":
        config_path.write_text("{ not json")
    elif how == "stock":
        config["model_type"] = "llama"
        config_path.write_text(json.dumps(config))
    elif how == "unsupported":
        config["model_type"] = "geonorm_bert"
        config_path.write_text(json.dumps(config))
    elif how == "no_weights":
        (folder / "model.safetensors").unlink()
    elif how == "pickle_weights":
        (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    elif how == "truncated_weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif how == "missing_shard":
        index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
        (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    elif how == "no_auto_map":
        del config["auto_map"]
        config_path.write_text(json.dumps(config))
    elif how == "foreign_auto_map":
        config["auto_map"]["AutoModelForCausalLM"] = "modeling_geonorm.GeoNormGPT2ForCausalLM"
        config_path.write_text(json.dumps(config))
    elif how == "missing_code":
        (folder / "residual.py").unlink()
    elif how == "missing_spec":
        (folder / METHOD_SPEC).unlink()
    elif how == "broken_code":
        with open(folder / "geometry.py", "a") as f:
            f.write("\ndef broken(:\n")
    elif how == "edited_code":
        with open(folder / "modeling_geonorm.py", "a") as f:
            f.write("\nimport os\nos.system('touch /tmp/hf-geonorm-remote-code-ran')\n")
    elif how == "no_card":
        (folder / "README.md").unlink()
    elif how in ("bad_license", "no_metadata", "wrong_pipeline", "no_geonorm_tag"):
        text = (folder / "README.md").read_text()
        text = {
            "bad_license": text.replace("license: mit", "license: Apache 2.0"),
            "no_metadata": text.split("---", 2)[2],
            "wrong_pipeline": text.replace("pipeline_tag: text-generation", "pipeline_tag: text-gen"),
            "no_geonorm_tag": text.replace("- geonorm\n", ""),
        }[how]
        (folder / "README.md").write_text(text)
    else:
        raise AssertionError(how)


REFUSALS = {
    "no_config": "has no config.json",
    "corrupt_config": "is not valid JSON",
    "stock": "not a GeoNorm one: convert it first",
    "unsupported": "which this hf-geonorm does not support",
    "no_weights": "has no weights",
    "pickle_weights": "pickle weights only",
    "truncated_weights": "model.safetensors is truncated or damaged: ",
    "missing_shard": "model-00002-of-00002.safetensors (named by model.safetensors.index.json) missing",
    "no_auto_map": "no auto_map, so the model does not load without hf-geonorm",
    "foreign_auto_map": "auto_map does not name this family's classes for AutoModelForCausalLM",
    "missing_code": "the remote code is incomplete: residual.py missing",
    "missing_spec": f"the method specification {METHOD_SPEC}, which the card links, is missing",
    "broken_code": "geometry.py does not compile",
    "edited_code": "the remote code modeling_geonorm.py is not what hf-geonorm ",
    "no_card": "has no README.md model card",
    "bad_license": "README.md: license 'Apache 2.0' is not a Hub license identifier",
    "no_metadata": "README.md: no YAML metadata block",
    "wrong_pipeline": "pipeline_tag 'text-gen' is not a Hub task",
    "no_geonorm_tag": "a GeoNorm card needs the tag geonorm",
}


@pytest.mark.parametrize("how", list(REFUSALS))
def test_incomplete_folders_are_refused_before_anything_is_sent(hub, converted, tmp_path, how):
    message = refused_before_sending(hub, converted, tmp_path / "folder", lambda f: mutate(f, how), "me/incomplete")
    assert REFUSALS[how] in message, message


def test_edited_remote_code_is_pushed_only_knowingly_and_the_card_says_so(hub, converted, tmp_path):
    """The remote code is compared, byte for byte, with the modelling source this hf-geonorm copies into a folder:
    an edit that compiles is refused by default (above), and --allow-modified-code pushes it with a warning in the
    card, naming the file; the folder's own README.md is left as it was."""
    folder = tmp_path / "folder"
    shutil.copytree(converted, folder)
    mutate(folder, "edited_code")
    (folder / "notes.py").write_text("print('a script of the user, not remote code')\n")
    readme = (folder / "README.md").read_bytes()
    written = {source.name: source.read_bytes() for source in remote_code_files()}
    assert (folder / "modeling_geonorm.py").read_bytes() != written["modeling_geonorm.py"]
    result = push(folder, "me/modified", "--allow-modified-code")
    assert result.exit_code == 0, result.output
    assert "with modified remote code (modeling_geonorm.py)" in result.output
    pushed = hub.files("me/modified")
    assert pushed["modeling_geonorm.py"] == (folder / "modeling_geonorm.py").read_bytes()
    card = pushed["README.md"].decode()
    metadata, body = card.split("---\n", 2)[1:]
    assert "Modified remote code" not in metadata
    assert body.lstrip().startswith("> **Modified remote code.** modeling_geonorm.py in this repository")
    assert (folder / "README.md").read_bytes() == readme
    assert not validate_card(card_file(tmp_path, pushed["README.md"]))
    restored = tmp_path / "restored"
    shutil.copytree(converted, restored)
    assert push(restored, "me/restored").exit_code == 0
    assert "Modified remote code" not in hub.files("me/restored")["README.md"].decode()
    assert not Path("/tmp/hf-geonorm-remote-code-ran").exists()


def card_file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "pushed-card" / "README.md"
    path.parent.mkdir()
    path.write_bytes(data)
    return path


class Payload:
    """Unpickling this runs a shell command: what a pickle file from someone else can do."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/hf-geonorm-pickle-ran",))


def make_unsafe(folder: Path, how: str) -> None:
    """Add to a complete GeoNorm folder what push must not share."""
    import pickle

    import torch

    if how == "pickle_bin":
        (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    elif how == "torch_pt":
        torch.save({"step": 1}, folder / "extra_state.pt")
    elif how == "pkl":
        (folder / "sub").mkdir()
        (folder / "sub" / "stats.pkl").write_bytes(pickle.dumps({"a": 1}))
    elif how == "tokenizer_auto_map":
        (folder / "tokenizer_config.json").write_text(
            json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}})
        )
    elif how == "extra_auto_map":
        config = json.loads((folder / "config.json").read_text())
        config["auto_map"]["AutoTokenizer"] = ["tokenization_x.XTokenizer", None]
        (folder / "config.json").write_text(json.dumps(config))
    elif how == "alias_bomb":
        text = (folder / "README.md").read_text()
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 12)]
        (folder / "README.md").write_text(text.replace("---\n", "---\n" + "\n".join(lines) + "\n", 1))
    elif how == "index_outside":
        outside = folder.parent / "elsewhere"
        outside.mkdir()
        (folder / "model.safetensors").rename(outside / "model.safetensors")
        from safetensors import safe_open

        with safe_open(outside / "model.safetensors", "pt") as f:
            keys = list(f.keys())
        index = {"metadata": {}, "weight_map": {key: "../elsewhere/model.safetensors" for key in keys}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        raise AssertionError(how)


UNSAFE = {
    "pickle_bin": "pytorch_model.bin: pickle file(s), which can run code when loaded",
    "torch_pt": "extra_state.pt: pickle file(s)",
    "pkl": "sub/stats.pkl: pickle file(s)",
    "tokenizer_auto_map": "tokenizer_config.json has an auto_map: the tokenizer asks for custom code",
    "extra_auto_map": "auto_map also names AutoTokenizer, code that is not GeoNorm's",
    "alias_bomb": "README.md: the metadata uses YAML aliases",
    "index_outside": "names the weight file '../elsewhere/model.safetensors', outside",
}


@pytest.mark.parametrize("how", list(UNSAFE))
def test_unsafe_files_are_refused_before_anything_is_sent(hub, converted, tmp_path, how):
    message = refused_before_sending(hub, converted, tmp_path / "folder", lambda f: make_unsafe(f, how), "me/unsafe")
    assert UNSAFE[how] in message, message
    assert not Path("/tmp/hf-geonorm-pickle-ran").exists()


def test_trainer_state_pickles_are_left_out_not_refused(hub, converted, tmp_path):
    """optimizer.pt, scheduler.pt and the like are the Trainer's state: never uploaded (PUSH_IGNORED), so a final
    folder that holds them still pushes, without them."""
    import torch

    folder = tmp_path / "folder"
    shutil.copytree(converted, folder)
    torch.save({"state": {}}, folder / "optimizer.pt")
    result = push(folder, "me/with-state")
    assert result.exit_code == 0, result.output
    assert "optimizer.pt" not in hub.commits[0]["files"]


def test_bad_arguments_and_a_missing_token_are_refused(hub, converted, tmp_path, monkeypatch):
    assert "no such folder" in refused(tmp_path / "missing", "me/x")
    (tmp_path / "file.txt").write_text("x")
    assert "is a file; push takes a model folder" in refused(tmp_path / "file.txt", "me/x")
    for bad in ("me/with space", "a/b/c", "me/-x", "me/x--y", "https://huggingface.co/me/x"):
        assert "is not a" in refused(converted, bad) and "repository id" in refused(converted, bad), bad
    assert "Missing argument 'REPO_ID'" in push(converted).output
    monkeypatch.delenv("HF_TOKEN")
    assert "no Hugging Face token: set HF_TOKEN or log in" in refused(converted, "me/x")
    assert hub.requests == []


def test_hub_errors_are_one_line(hub, converted, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_the_right_one")
    message = refused(converted, "me/x")
    assert "the Hub refused the push (401): Invalid credentials in Authorization header" in message
    assert "write access" in message
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_TOKEN", hub.token)
    message = refused(converted, "me/x")
    assert "http://127.0.0.1:9" in message and ("cannot reach" in message or "failed" in message), message


# ---- the card, validated the way huggingface_hub does it ----


def test_model_card_validate_against_the_local_hub(hub, converted):
    """``ModelCard.validate()`` posts to /api/validate-yaml; the local Hub answers with validate_card's rules."""
    card = ModelCard.load(converted / "README.md")
    card.validate()  # no exception
    assert hub.validated == [str(card)]
    bad = ModelCard(str(card).replace("license: mit", "license: my-own"))
    with pytest.raises(ValueError, match="license 'my-own' is not a Hub license identifier"):
        bad.validate()


# ---- pushing from Python ----


def tiny_geonorm():
    return hf_geonorm.convert(tiny_model("llama"), geo_alpha=0.75, geo_decay="sqrt").eval()


def check_pushed_repo(hub, repo_id, revision="main"):
    files = hub.files(repo_id, revision)
    config = json.loads(files["config.json"])
    assert config["model_type"] == "geonorm_llama" and config["geo_alpha"] == 0.75
    assert config["auto_map"] == auto_map_for("geonorm_llama")
    for path in remote_code_files():
        assert files[path.name] == path.read_bytes(), path.name
    assert METHOD_SPEC in files
    card = ModelCard(files["README.md"].decode())
    assert not validate_card(card)
    assert f'from_pretrained("{repo_id}", trust_remote_code=True)' in card.text
    return card


def test_hub_push_to_hub_pushes_code_and_card(hub):
    model = tiny_geonorm()
    model.add_model_tags(["my-experiment"])
    result = push_to_hub(model, "py-geo", PushOptions(revision="exp"), card_info=CardInfo(license="apache-2.0"))
    assert result.repo_id == "tester/py-geo" and result.revision == "exp"
    card = check_pushed_repo(hub, "tester/py-geo", "exp")
    data = card.data.to_dict()
    assert data["license"] == "apache-2.0" and {"geonorm", "llama", "my-experiment"} <= set(data["tags"])
    assert hub.commits[-1]["summary"] == "Upload geonorm_llama model (GeoNorm) with hf-geonorm"
    assert "auto_map" not in vars(model.config)  # the model is left as it was
    with pytest.raises(ValueError, match="GeoNorm models"):
        push_to_hub(tiny_model("llama"), "me/stock")
    assert "me/stock" not in hub.repos


def test_model_push_to_hub_pushes_code_and_card(hub):
    model = tiny_geonorm()
    model.push_to_hub("me/method", commit_message="via the model")
    check_pushed_repo(hub, "me/method")
    assert hub.commits[-1]["summary"] == "via the model"


def test_transformers_push_carries_complete_remote_code(hub, tmp_path):
    """transformers' own push_to_hub (save_pretrained into a temporary folder, then its generic card) pushes
    auto_map together with the code it names and the specification, for a model built in this process and for
    one loaded from a folder."""
    model = tiny_geonorm()
    model.save_pretrained(tmp_path / "saved")
    from transformers import PreTrainedModel

    for repo_id, source in (("me/plain-push", model), ("me/reloaded-push", tmp_path / "saved")):
        if isinstance(source, Path):
            source = AutoModelForCausalLM.from_pretrained(source)
        PreTrainedModel.push_to_hub(source, repo_id)
        files = hub.files(repo_id)
        config = json.loads(files["config.json"])
        assert config["auto_map"] == auto_map_for("geonorm_llama"), repo_id
        for path in remote_code_files():
            assert files[path.name] == path.read_bytes(), (repo_id, path.name)
        assert METHOD_SPEC in files, repo_id
