"""The data cache is verified, not trusted (hf_geonorm.training.data.cache_checks): a corpus whose content
changed under the same size and modification time is tokenized again; an entry whose Arrow files or meta.json were
changed, cut short or removed is rebuilt with one warning naming it; a storage error is one line naming the cache
and the fix, and leaves nothing half-written. The expected blocks are computed from the documented rules
(tests/support/helpers.py, ``reference_blocks``)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from hf_geonorm.training.data import pipeline
from hf_geonorm.training.data.corpus import resolve_corpus
from hf_geonorm.training.data.pipeline import tokenizer_digest
from hf_geonorm.training.data.prepare import DataSource, data_request, training_data
from hf_geonorm.training.data.tokenizer import train_tokenizer
from hf_geonorm.training.options import DATA_CACHE_ENV, TrainOptions
from hf_geonorm_cli.main import cli

from support.helpers import reference_blocks, reference_documents, train_in

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TEXT = (STDLIB / "textwrap.py").read_text()


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([(STDLIB / "shlex.py").read_text()], 300)


def prepare(path: Path, cache: Path, tokenizer) -> tuple[list[list[int]], str]:
    """The training blocks of ``path`` as a run gets them, and what the run logged."""
    lines: list[str] = []
    options = TrainOptions(data=str(path), seq_len=32, data_cache=str(cache), max_steps=1)
    source = DataSource(resolve_corpus(str(path)), tokenizer, False, tokenizer_digest(tokenizer))
    data = training_data(source, replace(data_request(options), evaluated_blocks=None), lines.append)
    return [data.train[i]["input_ids"].tolist() for i in range(len(data.train))], "\n".join(lines)


def expected_blocks(tokenizer, text: str) -> list[list[int]]:
    return reference_blocks(tokenizer, reference_documents(text), 32)[0]


def entries(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(("blocks-", ".blocks-")))


def test_a_corpus_changed_under_the_same_size_and_mtime_is_tokenized_again(tmp_path, tokenizer):
    data, cache = tmp_path / "text.txt", tmp_path / "cache"
    data.write_text(TEXT)
    blocks, log = prepare(data, cache, tokenizer)
    assert "tokenized in" in log and blocks == expected_blocks(tokenizer, TEXT)
    before = data.stat()
    changed = TEXT.replace("width", "WIDTH")  # what `sed -i` does, then `touch -r` keeps the time
    assert changed != TEXT and len(changed) == len(TEXT)
    data.write_text(changed)
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (data.stat().st_size, data.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    blocks, log = prepare(data, cache, tokenizer)
    assert "tokenized by an earlier run" not in log and "tokenized in" in log, log
    assert blocks == expected_blocks(tokenizer, changed)
    assert len(entries(cache)) == 2
    _, again = prepare(data, cache, tokenizer)  # unchanged since: read from the cache
    assert "tokenized by an earlier run" in again


def _change_bytes(folder: Path) -> None:
    path = folder / "train.arrow"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one token id becomes another: still a valid file
    path.write_bytes(bytes(raw))


DAMAGE = {
    "a token changed": _change_bytes,
    "cut short": lambda f: (f / "train.arrow").write_bytes((f / "train.arrow").read_bytes()[:1000]),
    "header overwritten": lambda f: (f / "val.arrow").write_bytes(b"\0" * 16 + (f / "val.arrow").read_bytes()[16:]),
    "file removed": lambda f: (f / "test.arrow").unlink(),
    "meta.json missing": lambda f: (f / "meta.json").unlink(),
    "meta.json broken": lambda f: (f / "meta.json").write_text((f / "meta.json").read_text()[:-10]),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tokenizer) -> tuple[Path, Path]:
    """A corpus and a cache holding its entry, copied by each test."""
    root = tmp_path_factory.mktemp("built")
    (root / "text.txt").write_text(TEXT)
    prepare(root / "text.txt", root / "cache", tokenizer)
    return root / "text.txt", root / "cache"


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_cache_entry_is_rebuilt_with_one_warning_naming_it(tmp_path, built, tokenizer, damage):
    data, cache = built[0], shutil.copytree(built[1], tmp_path / "cache")
    [entry] = entries(cache)
    DAMAGE[damage](cache / entry)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        blocks, log = prepare(data, cache, tokenizer)
    said = [str(w.message) for w in caught if "does not verify" in str(w.message)]
    assert len(said) == 1 and str(cache / entry) in said[0] and "does not verify, so it is rebuilt: " in said[0], said
    assert "tokenized in" in log and blocks == expected_blocks(tokenizer, TEXT)
    assert entries(cache) == [entry]  # rebuilt in place; the damaged one removed
    _, again = prepare(data, cache, tokenizer)
    assert "tokenized by an earlier run" in again


def test_a_data_cache_that_is_a_file_is_one_line_naming_it(tmp_path, monkeypatch):
    data, cache = tmp_path / "text.txt", tmp_path / "not-a-folder"
    data.write_text(TEXT)
    cache.write_text("a file")
    monkeypatch.setenv(DATA_CACHE_ENV, str(cache))
    result = CliRunner().invoke(cli, ["train", "--data", str(data), "--output", str(tmp_path / "run"),
                                      "--vocab-size", "300", "--max-steps", "1"])  # fmt: skip
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.exit_code != 0 and len(errors) == 1, result.output
    assert f"the data cache {cache} is a file, not a folder" in errors[0] and f"${DATA_CACHE_ENV}" in errors[0]
    assert cache.read_text() == "a file" and not (tmp_path / "run").exists()


def test_a_full_device_while_the_blocks_are_built_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, tokenizer):
    data, cache = tmp_path / "text.txt", tmp_path / "cache"
    data.write_text(TEXT)
    add = pipeline._Packer.add

    def device_fills(packer, ids):  # the first blocks are written, then the device is full
        add(packer, ids)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pipeline._Packer, "add", device_fills)
    with pytest.raises(ValueError, match=re.escape(f"cannot write the data cache {cache}: no space left")) as raised:
        prepare(data, cache, tokenizer)
    assert "--data-cache" in str(raised.value) and "\n" not in str(raised.value)
    assert not cache.exists()  # no entry, whole or partial: not even the cache folder the build created


@pytest.mark.parametrize(
    "error, says",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on its device"),
        (OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device"), "no space"),
        (Exception("Read-only file system (os error 30)"), "it is on a read-only file system"),
        (PermissionError(errno.EACCES, "Permission denied", "CACHE/blocks-x/train.arrow"), "permission denied"),
    ],
)
def test_storage_errors_name_the_cache_and_the_fix(tmp_path, error, says):
    from hf_geonorm.training.data.cache_checks import storage_errors

    cache = tmp_path / "cache"
    if getattr(error, "filename", None):
        error.filename = error.filename.replace("CACHE", str(cache))
    with pytest.raises(ValueError) as raised, storage_errors(cache):
        raise error
    message = str(raised.value)
    assert message.startswith(f"cannot write the data cache {cache}: {says}") and "--data-cache" in message


def test_an_error_reading_the_data_is_not_taken_for_one_of_the_cache(tmp_path):
    from hf_geonorm.training.data.cache_checks import storage_errors

    unreadable = PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "data.txt"))
    with pytest.raises(PermissionError), storage_errors(tmp_path / "cache"):
        raise unreadable


def test_an_edited_cached_tokenizer_is_trained_again_and_one_without_checksum_is_checked(tmp_path, data_file):
    first = train_in(tmp_path, data_file)
    assert first.exit_code == 0, first.output
    [cached] = (tmp_path / "cache").glob("tokenizer-*.json")
    trained = cached.read_bytes()
    assert Path(f"{cached}.sha256").read_text().strip() == hashlib.sha256(trained).hexdigest()
    edited = json.loads(trained)
    edited["model"]["merges"] = edited["model"]["merges"][:-20]  # still loads: fewer merges, more tokens
    cached.write_text(json.dumps(edited))
    again = train_in(tmp_path, data_file, name="again")
    assert again.exit_code == 0, again.output
    assert f"the cached tokenizer {cached} changed since it was trained (its checksum differs)" in again.output
    assert cached.read_bytes() == trained
    digest = tokenizer_digest(AutoTokenizer.from_pretrained(tmp_path / "run" / "final"))
    assert tokenizer_digest(AutoTokenizer.from_pretrained(tmp_path / "again" / "final")) == digest

    Path(f"{cached}.sha256").unlink()  # as an earlier version left it
    unchecked = train_in(tmp_path, data_file, name="unchecked")
    assert unchecked.exit_code == 0, unchecked.output
    assert "has no checksum (written by an earlier version): training it again" in unchecked.output
    assert "byte for byte: kept, its checksum written" in unchecked.output and "warning" not in unchecked.output
    assert cached.read_bytes() == trained and Path(f"{cached}.sha256").is_file()

    Path(f"{cached}.sha256").unlink()
    cached.write_text(json.dumps(edited))
    replaced = train_in(tmp_path, data_file, name="replaced")
    assert "(without a checksum) differs from the one this data trains: replaced" in replaced.output
    assert cached.read_bytes() == trained


def test_training_the_tokenizer_twice_on_the_same_documents_gives_the_same_digest(tmp_path):
    """A cached tokenizer without a checksum is kept only when training gives it again: training must be
    deterministic, also in another process (the tokenizers library's hash maps are seeded per process)."""
    docs = list(resolve_corpus(None).tokenizer_sample(400_000)[0])
    digests = {tokenizer_digest(train_tokenizer(docs, 500)) for _ in range(2)}
    (tmp_path / "docs.json").write_text(json.dumps(docs))
    code = ("import json, sys; from hf_geonorm.training.data.pipeline import tokenizer_digest; "
            "from hf_geonorm.training.data.tokenizer import train_tokenizer; "
            "print(tokenizer_digest(train_tokenizer(json.loads(open(sys.argv[1]).read()), 500)))")  # fmt: skip
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path / "docs.json")], capture_output=True, text=True,
                           check=True)  # fmt: skip
    assert digests == {child.stdout.strip()}


def test_a_wrong_but_valid_meta_json_is_rebuilt(tmp_path, data_file):
    first = train_in(tmp_path, data_file)
    assert first.exit_code == 0, first.output
    [entry] = (tmp_path / "cache").glob("blocks-*")
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, "val_blocks": meta["val_blocks"] // 2}))
    again = train_in(tmp_path, data_file, name="again")
    assert again.exit_code == 0, again.output
    assert f"the cached data {entry} does not verify, so it is rebuilt" in again.output
    assert f"({meta['val_blocks']} blocks held out)" in again.output
    other = tmp_path / "other.txt"
    other.write_text(data_file.read_text() + "\n\nmore\n")
    assert train_in(tmp_path, other, name="other").exit_code == 0
    [second] = set((tmp_path / "cache").glob("blocks-*")) - {entry}
    shutil.copy(second / "meta.json", entry / "meta.json")  # valid, verified files, another entry's
    copied = train_in(tmp_path, data_file, name="copied")
    assert f"the cached data {entry} does not verify, so it is rebuilt: its meta.json is of another entry" in (
        copied.output
    )
