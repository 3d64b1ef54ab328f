"""Ownership by proof, not by resemblance: ``--force`` replaces a folder only when its marker proves every file in
it is what hf-geonorm wrote there, and a leftover of an interrupted run is removed only when it carries the proof
of the process that made it. Each case of the sixth hostile trial that lost a user's files runs through the command
line, with every user file hashed before and after (``HOME`` and the working folder are temporary: conftest.py's
``machine_left_alone``). The marker stays bounded by what is on disk, also over 80 checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_geonorm._plumbing.ownership import MARKER_NAME, ownership_problem, read_marker, record_paths

from support.helpers import ONE_STEP, fails, invoke, succeeds, train_in
from support.tiny_models import tiny_model

BOOKKEEPING = (".hf-geonorm.lock", MARKER_NAME)


def hashes(folder: Path) -> dict[str, str]:
    """The SHA-256 of every file below ``folder`` (hidden ones too), by relative path."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and not path.is_symlink()}  # fmt: skip


def dead_pid() -> int:
    """The number of a process that has exited (and been reaped)."""
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)  # fmt: skip


@pytest.fixture(scope="module")
def stock(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stock") / "gpt2"
    tiny_model("gpt2").save_pretrained(folder)
    return folder


def fine_tuned_in_place(folder: Path) -> None:
    """What a user does in Python: load the GeoNorm model of ``folder``, change its weights, ``save_pretrained``
    it back (same shapes: same file sizes)."""
    from transformers import AutoModelForCausalLM

    import hf_geonorm  # noqa: F401 - registers the GeoNorm classes

    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.01)
    model.save_pretrained(folder)


# ---- case 1: a same-size replacement is not hf-geonorm's ----


def test_a_copy_fine_tuned_and_saved_at_the_same_size_is_refused(stock, tmp_path):
    g1, g2 = tmp_path / "g1", tmp_path / "g2"
    succeeds("convert", stock, g1, "--bridge", "0")
    shutil.copytree(g1, g2)  # as cp -a: contents and modification times kept
    size = (g2 / "model.safetensors").stat().st_size
    fine_tuned_in_place(g2)
    assert (g2 / "model.safetensors").stat().st_size == size  # the size the marker of g1 recorded
    before = hashes(g2)
    message = fails("convert", stock, g2, "--bridge", "0", "--force")
    assert "did not write there, or changed since" in message, message
    assert hashes(g2) == before


def test_a_model_saved_over_its_own_output_at_the_same_size_is_refused(stock, tmp_path):
    out = tmp_path / "g1"
    succeeds("convert", stock, out, "--bridge", "0")
    fine_tuned_in_place(out)
    before = hashes(out)
    message = fails("convert", stock, out, "--bridge", "0", "--force")
    assert "changed since (blocks.py" in message, message  # save_pretrained wrote every file again
    assert hashes(out) == before


def test_a_same_length_edit_of_the_config_is_refused(tmp_path):
    out = tmp_path / "scratch"
    succeeds("init", "gpt2", out, "--preset", "tiny")
    config = out / "config.json"
    text = config.read_text()
    digit = next(i for i, c in enumerate(text) if c.isdigit())
    edited = text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1:]
    with open(config, "r+") as file:  # in place, the same length: a size-only marker sees no change
        file.write(edited)
    assert len(config.read_bytes()) == len(text.encode())
    before = hashes(out)
    message = fails("init", "gpt2", out, "--preset", "tiny", "--force")
    assert "(config.json)" in message, message
    assert hashes(out) == before


# ---- the hash: what the stat proof cannot see ----


def listed_entry(folder: Path, relative: str) -> list:
    """The entry the marker of ``folder`` lists now for the file ``relative``."""
    return read_marker(folder)["paths"][relative]


def restat_in_marker(folder: Path, relative: str) -> None:
    """Set the stat fields of ``relative``'s entries in the marker of ``folder`` to the file's stat now, keeping
    whatever else they record: an edit that the stat proof missed (a same-length write within the tick of coarse file
    times), modelled without waiting for one."""
    info = (folder / relative).stat()
    lines = []
    for line in (folder / MARKER_NAME).read_text().splitlines():
        record = json.loads(line)
        if relative in record.get("set", {}):
            record["set"][relative][:4] = [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]
        lines.append(json.dumps(record) + "\n")
    (folder / MARKER_NAME).write_text("".join(lines))


def same_length_edit(path: Path) -> None:
    """Change one digit of ``path`` in place: the same size, other bytes."""
    data = path.read_bytes()
    digit = next(i for i, byte in enumerate(data) if chr(byte).isdigit())
    with open(path, "r+b") as file:
        file.seek(digit)
        file.write(str((int(chr(data[digit])) + 1) % 10).encode())
    assert path.read_bytes() != data and len(path.read_bytes()) == len(data)


def test_the_marker_records_the_sha256_of_the_bytes_written(tmp_path):
    out = tmp_path / "scratch"
    succeeds("init", "gpt2", out, "--preset", "tiny")
    files = [path for path in out.rglob("*") if path.is_file() and path.name not in BOOKKEEPING]
    assert len(files) >= 3
    for path in files:
        relative = path.relative_to(out).as_posix()
        assert listed_entry(out, relative)[4] == hashlib.sha256(path.read_bytes()).hexdigest(), relative
    config = out / "config.json"
    written = b'{"written": "by the test"}\n'
    config.write_bytes(written)
    record_paths(out, "init", config)
    assert listed_entry(out, "config.json")[4] == hashlib.sha256(written).hexdigest()


def test_an_edit_the_stat_proof_missed_is_caught_by_the_hash_before_force_replaces(tmp_path):
    out = tmp_path / "scratch"
    succeeds("init", "gpt2", out, "--preset", "tiny")
    same_length_edit(out / "config.json")
    restat_in_marker(out, "config.json")
    assert ownership_problem(out) is None  # the stat proof alone takes the folder for hf-geonorm's
    before = hashes(out)
    message = fails("init", "gpt2", out, "--preset", "tiny", "--force")
    assert "config.json, which changed since hf-geonorm wrote it" in message, message
    assert hashes(out) == before


def test_an_edit_the_stat_proof_missed_is_caught_before_train_force_clears_the_run(tmp_path, data_file):
    run = tmp_path / "run"
    assert train_in(tmp_path, data_file).exit_code == 0
    same_length_edit(run / "final" / "config.json")
    restat_in_marker(run / "final", "config.json")
    assert ownership_problem(run) is None
    before = hashes(run)
    message = fails("train", "--data", data_file, *ONE_STEP, "--data-cache", tmp_path / "cache", "--output", run,
                    "--force")  # fmt: skip
    assert "final/config.json, which changed since hf-geonorm wrote it" in message, message
    assert hashes(run) == before


def test_a_checkpoint_changed_since_the_run_wrote_it_is_left_in_place(tmp_path, data_file):
    from hf_geonorm.training.run.checkpoints import kept_checkpoints

    run = tmp_path / "run"
    assert train_in(tmp_path, data_file, "--keep-checkpoints").exit_code == 0
    state = run / "checkpoint-1" / "trainer_state.json"
    same_length_edit(state)
    restat_in_marker(run, "checkpoint-1/trainer_state.json")
    before = hashes(run)
    with pytest.warns(UserWarning, match="trainer_state.json changed since hf-geonorm wrote it"):
        assert kept_checkpoints(run, remove=True).startswith("no checkpoints removed")
    assert hashes(run) == before


# ---- case 2: a folder saved from Python is the user's ----


def test_a_folder_saved_with_save_pretrained_is_refused_naming_a_file(stock, tmp_path):
    from hf_geonorm import GeoNormGPT2Config, GeoNormGPT2ForCausalLM

    project = tmp_path / "userproj"
    model = GeoNormGPT2ForCausalLM(GeoNormGPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=99, n_positions=64))
    model.save_pretrained(project)  # writes remote code and a card where the library does: no ownership
    (project / "README.md").write_text("# my project\n")
    (project / "my_finetune_script.py").write_text("print('mine')\n")
    before = hashes(project)
    for command in (["init", "gpt2", project, "--preset", "tiny", "--force"], ["convert", stock, project, "--force"]):
        message = fails(*command)
        assert "was not written by hf-geonorm (it holds README.md" in message, message
        assert "config.json" in message and "--force replaces only" in message, message
        assert hashes(project) == before


# ---- case 3: a nested repository makes the whole folder the user's ----


def test_an_earlier_run_holding_a_repository_in_runs_is_refused(stock, tmp_path):
    project = tmp_path / "proj2"
    succeeds("convert", stock, project / "final")  # final/ + metrics.json: what an earlier run looked like
    (project / "metrics.json").write_text(json.dumps({"steps": 1}))
    (project / "runs" / "myrepo" / ".git").mkdir(parents=True)
    (project / "runs" / "myrepo" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / "runs" / "myrepo" / "notes.md").write_text("mine\n")
    before = hashes(project)
    message = fails("init", "gpt2", project, "--preset", "tiny", "--force")
    assert "was not written by hf-geonorm" in message, message
    assert hashes(project) == before


# ---- cases 4 and 5: leftovers are removed by proof, never by name and process number ----


def test_hidden_siblings_named_like_leftovers_stay_and_nothing_is_moved_into_the_output(stock, tmp_path):
    pid = dead_pid()
    users = tmp_path / "users"
    users.mkdir()
    siblings = [users / ".mC.old-2023-archive", users / f".mC.partial-{pid}-draft", users / f".mD.old-{pid}-backup"]
    for folder in siblings:
        folder.mkdir()
        (folder / "thesis.tex").write_text(f"{folder.name}: mine\n")
    before = hashes(users)
    succeeds("convert", stock, users / "mC")  # a missing OUTPUT_DIR beside folders named like leftovers
    succeeds("init", "gpt2", users / "mD", "--preset", "tiny")  # .mD.old-...: never renamed into mD
    assert json.loads((users / "mD" / "config.json").read_text())["model_type"] == "geonorm_gpt2"
    assert not (users / "mD" / "thesis.tex").exists()
    assert {name: digest for name, digest in hashes(users).items() if not name.startswith(("mC/", "mD/"))} == before


def test_hidden_entries_named_like_leftovers_inside_an_output_are_refused_with_force(stock, tmp_path):
    pid = dead_pid()
    out = tmp_path / "mB"
    succeeds("convert", stock, out)
    (out / ".env.old-2024-01").write_text("SECRET=mine\n")
    (out / ".thesis.partial-1-draft").mkdir()
    (out / ".thesis.partial-1-draft" / "chapter1.tex").write_text("mine\n")
    (out / f".notes.old-{pid}-x").mkdir()
    (out / f".notes.old-{pid}-x" / "notes.txt").write_text("mine\n")
    before = hashes(out)
    for command in (["convert", stock, out, "--force"], ["init", "gpt2", out, "--preset", "tiny", "--force"]):
        message = fails(*command)
        assert ".env.old-2024-01" in message and "changed since" in message, message
        assert hashes(out) == before


def test_train_leaves_entries_named_like_leftovers_in_its_output(tmp_path, data_file):
    run = tmp_path / "run"
    assert train_in(tmp_path, data_file, "--keep-checkpoints").exit_code == 0
    pid = dead_pid()
    mine = [run / f".notes.old-{pid}-x", run / f".checkpoint-1.partial-{pid}-staging"]
    for folder in mine:
        folder.mkdir()
        (folder / "notes.txt").write_text("mine\n")
    before = hashes(run)
    message = fails("train", "--data", data_file, *ONE_STEP, "--data-cache", tmp_path / "cache", "--output", run,
                    "--force")  # fmt: skip
    assert f".checkpoint-1.partial-{pid}-staging/" in message and "changed since" in message, message
    assert hashes(run) == before


# ---- case 13: TensorBoard's files are recorded ----


def test_a_run_reporting_to_tensorboard_is_resumed_and_replaced(tmp_path, data_file):
    run = tmp_path / "run"
    flat = ["--report-to", "tensorboard", "--keep-checkpoints", "--min-lr-ratio", "1"]  # a longer run may resume
    result = train_in(tmp_path, data_file, *flat)
    assert result.exit_code == 0, result.output
    events = [path for path in (run / "runs").rglob("*") if path.is_file()]
    assert events and all(path.name.startswith("events.out.tfevents.") for path in events)
    assert ownership_problem(run) is None
    result = train_in(tmp_path, data_file, *flat, "--resume", "--max-steps", "2")
    assert result.exit_code == 0, result.output
    assert json.loads((run / "metrics.json").read_text())["steps"] == 2
    assert ownership_problem(run) is None
    (run / "runs" / "myrepo" / ".git").mkdir(parents=True)  # case 3 in a proven run: a repository in runs/
    (run / "runs" / "myrepo" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    before = hashes(run)
    message = fails("train", "--data", data_file, *ONE_STEP, "--data-cache", tmp_path / "cache", "--output", run,
                    "--force")  # fmt: skip
    assert "(runs/myrepo/)" in message, message
    assert hashes(run) == before
    shutil.rmtree(run / "runs" / "myrepo")
    result = train_in(tmp_path, data_file, *flat, "--force", "--seed", "1")
    assert result.exit_code == 0, result.output
    assert json.loads((run / "metrics.json").read_text())["options"]["seed"] == 1
    assert ownership_problem(run) is None


# ---- case 14: the marker stays small ----


def on_disk(folder: Path) -> set[str]:
    """Every path below ``folder`` but hf-geonorm's bookkeeping, as relative paths; an inner folder with its own
    marker (``final/``) counts as one path."""
    found = set()
    for root, dirs, files in os.walk(folder):
        relative = Path(root).relative_to(folder)
        for name in list(dirs):
            if (Path(root, name) / MARKER_NAME).exists():
                dirs.remove(name)
            found.add((relative / name).as_posix())
        found.update((relative / name).as_posix() for name in files if name not in BOOKKEEPING)
    return found


def check_marker_bounded(run: Path) -> None:
    """The marker lists only what is on disk, proves all of it, and its size is bounded by that listing: at most
    400 bytes per path on disk (a path, four numbers and a SHA-256 take about 170), plus 8 kB."""
    assert ownership_problem(run) is None
    listed = set(read_marker(run)["paths"])
    paths = on_disk(run)
    assert listed == paths, sorted(listed ^ paths)
    size = (run / MARKER_NAME).stat().st_size
    assert size <= 400 * len(paths) + 8192, (size, len(paths))


def bounded_run(tmp_path: Path, data_file: Path, steps: int, every: int) -> Path:
    result = invoke("train", "--data", data_file, "--seq-len", "16", "--vocab-size", "260", "--batch-size", "1",
                    "--warmup-steps", "0", "--max-steps", steps, "--eval-every", steps, "--eval-blocks", "2",
                    "--save-every", every, "--logging-steps", steps, "--keep-checkpoints", "--data-cache",
                    tmp_path / "cache", "--output", tmp_path / "run")  # fmt: skip
    assert result.exit_code == 0, result.output
    return tmp_path / "run"


def test_the_marker_is_bounded_by_what_is_on_disk_over_many_checkpoints(tmp_path, data_file):
    check_marker_bounded(bounded_run(tmp_path, data_file, steps=24, every=2))  # 12 checkpoints, 2 kept


@pytest.mark.slow
def test_the_marker_after_400_steps_saved_every_5_is_bounded_by_what_is_on_disk(tmp_path, data_file):
    check_marker_bounded(bounded_run(tmp_path, data_file, steps=400, every=5))  # 80 checkpoints, 2 kept


def test_the_marker_is_appended_to_and_rewritten_only_when_it_outgrows_its_listing(tmp_path):
    """120 saves of a checkpoint of 12 files, the two newest kept, as a run rotates them: each save appends one
    line; the whole file is rewritten (a new inode) only when its lines outgrow twice what they list, so the bytes
    written over the run grow with the saves, not with their square."""
    out = tmp_path / "run"
    out.mkdir()
    record_paths(out, "train")
    rewrites, written, inode, size = 0, 0, (out / MARKER_NAME).stat().st_ino, (out / MARKER_NAME).stat().st_size
    for step in range(1, 121):
        checkpoint = out / f"checkpoint-{step}"
        checkpoint.mkdir()
        for number in range(12):
            (checkpoint / f"file-{number}.bin").write_bytes(b"x" * number)
        if step > 2:
            shutil.rmtree(out / f"checkpoint-{step - 2}")
        record_paths(out, "train", checkpoint)
        info = (out / MARKER_NAME).stat()
        rewritten = info.st_ino != inode
        rewrites += rewritten
        written += info.st_size if rewritten else info.st_size - size
        inode, size = info.st_ino, info.st_size
        assert set(read_marker(out)["paths"]) == on_disk(out)
    assert rewrites <= 24, rewrites  # about one save in ten; rewritten at every save, it would be 120
    assert written <= 120 * 4096, written  # a few kB a save; a marker keeping every checkpoint writes megabytes
    assert size <= 400 * len(on_disk(out)) + 8192
