"""The data, cache and resume defects of issue 37, each through the command line on files like a user's: a resume
without ``scheduler.pt``, an edited cached tokenizer, JSON lines after a BOM or a blank line or not in UTF-8,
``--streaming`` over files shorter than a block, long held-out documents, CSV tables and ``--text-column``, the files
of a folder that are not read, a saved ``DatasetDict``, a wrong ``meta.json``, UTF-16 and compressed files."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import STDLIB, train_in
from test_data_pipeline import held_out
from transformers import AutoTokenizer

from hf_geonorm.files.text_files import read_text
from hf_geonorm.training.data.corpus import resolve_corpus
from hf_geonorm.training.data.pipeline import ArrowBlocks, tokenizer_digest
from hf_geonorm.training.data.tokenizer import train_tokenizer


def logged(output: str, pattern: str) -> int:
    """The number the log line matching ``pattern`` gives (its first group, with thousands separators)."""
    return int(re.search(pattern, output).group(1).replace(",", ""))


def words(count: int, start: int = 0) -> str:
    """``count`` words of the standard library's prose, from ``start`` on (wrapping around)."""
    found = re.findall(r"[a-z]+", (STDLIB / "textwrap.py").read_text())
    return " ".join(found[(start + n) % len(found)] for n in range(count))


def rows(count: int, size: int = 300) -> list[str]:
    return [f"row {n}: {words(size // 6, 7 * n)}" for n in range(count)]


# Silent wrong 2: a checkpoint without scheduler.pt restarted the warm-up without a word.


def test_a_checkpoint_without_its_scheduler_is_skipped_for_an_earlier_one_or_refused(tmp_path, data_file):
    args = ["--warmup-steps", "3", "--lr", "1e-2", "--logging-steps", "1", "--max-steps", "4", "--eval-every", "2",
            "--keep-checkpoints"]  # fmt: skip
    whole = train_in(tmp_path, data_file, *args)
    assert whole.exit_code == 0, whole.output
    out = shutil.copytree(tmp_path / "run", tmp_path / "stopped")
    shutil.rmtree(out / "final")
    (out / "metrics.json").unlink()
    (out / "checkpoint-4" / "scheduler.pt").unlink()
    resumed = train_in(tmp_path, data_file, *args, "--resume", name="stopped")
    assert resumed.exit_code == 0, resumed.output
    assert "checkpoint-4/scheduler.pt is missing" in resumed.output and "resuming from checkpoint-2" in resumed.output

    def rates(folder: Path) -> dict[int, float]:
        history = json.loads((folder / "metrics.json").read_text())["log_history"]
        return {entry["step"]: entry["learning_rate"] for entry in history if "learning_rate" in entry}

    assert rates(out)[3] == rates(tmp_path / "run")[3] and rates(out)[4] == rates(tmp_path / "run")[4]
    for checkpoint in ("checkpoint-2", "checkpoint-4"):
        (out / checkpoint / "scheduler.pt").unlink(missing_ok=True)
    shutil.rmtree(out / "final")
    refused = train_in(tmp_path, data_file, *args, "--resume", name="stopped")
    assert refused.exit_code == 1 and "no whole checkpoint" in refused.output
    assert "scheduler.pt is missing (the learning-rate schedule would restart its warm-up)" in refused.output


# Silent wrong 5: an edited but loadable tokenizer-*.json in the cache was used.


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


# Silent wrong 6: a .json of JSON lines after a blank line or a BOM was trained on as raw JSON; bad bytes unsaid.


@pytest.mark.parametrize("start", [b"\n", b"\xef\xbb\xbf", b"\xef\xbb\xbf\r\n\r\n"])
def test_json_lines_after_a_blank_line_or_a_bom_are_rows(tmp_path, start):
    texts = rows(200)
    (tmp_path / "rows.json").write_bytes(start + "".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    result = train_in(tmp_path, tmp_path / "rows.json")
    assert result.exit_code == 0, result.output
    assert logged(result.output, r": ([\d,]+) documents, [\d,]+ tokens \(an end-of-text") == len(texts)


def test_json_lines_that_are_not_utf8_warn_as_text_files_do(tmp_path):
    lines = [json.dumps({"text": t}).encode() for t in rows(200)]
    lines[5] = b'{"text": "caf\xe9 ' + words(50).encode() + b'"}'  # Latin-1
    (tmp_path / "rows.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    result = train_in(tmp_path, tmp_path / "rows.jsonl")
    assert result.exit_code == 0, result.output
    assert "rows.jsonl is not valid UTF-8: 1 byte(s) were replaced by U+FFFD" in result.output


# Silent wrong 7: --streaming over files each shorter than a block trained 0 steps and exited 0.


def test_streaming_files_each_shorter_than_a_block_is_refused(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for n in range(100):
        (folder / f"note-{n:03d}.txt").write_text(words(15, 11 * n) + "\n")
    result = train_in(tmp_path, folder, "--streaming", "--seq-len", "128", "--eval-blocks", "1")
    assert result.exit_code == 1, result.output
    assert "--streaming packs each of the 100 file(s)" in result.output
    assert "none gives a training block of --seq-len 128 tokens" in result.output
    assert "drop --streaming" in result.output
    assert not (tmp_path / "run" / "final").exists()
    cached = train_in(tmp_path, folder, "--seq-len", "128", "--eval-blocks", "1", name="cached")
    assert cached.exit_code == 0, cached.output  # the cached data packs across files


# Silent wrong 8: three JSON lines of 90k characters held out 68% of their tokens for 128 evaluated.


def test_a_held_out_document_longer_than_the_evaluation_is_cut(tmp_path):
    texts = [words(15_000, 1000 * n) for n in range(3)]  # about 90k characters each
    (tmp_path / "long.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    result = train_in(tmp_path, tmp_path / "long.jsonl", "--eval-blocks", "2")
    assert result.exit_code == 0, result.output
    total = logged(result.output, r"documents, ([\d,]+) tokens \(an end-of-text")
    val, test = (logged(result.output, rf"{name}: 1 documents, ([\d,]+) tokens") for name in ("validation", "test"))
    assert val == test == 2 * 64  # what the evaluation uses, not the documents' tens of thousands
    assert logged(result.output, r"training on ([\d,]+) tokens") == (total - val - test) // 64 * 64
    assert "held-out documents longer than the evaluation" in result.output and "were cut" in result.output


def test_ordinary_text_shards_hold_out_the_very_documents_they_did(tmp_path):
    """Documents of a few KB, shorter than the evaluation (as the study's are): held out whole, the same ones."""
    folder = tmp_path / "shards"
    folder.mkdir()
    sources = sorted(STDLIB.glob("*.py"))[:60]
    for shard in range(4):
        (folder / f"shard-{shard}.txt").write_text("\n\n".join(p.read_text() for p in sources[shard::4]))
    result = train_in(tmp_path, folder, "--eval-blocks", "128")
    assert result.exit_code == 0, result.output
    assert "were cut" not in result.output
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "final")
    documents = resolve_corpus(str(folder)).all_documents()
    ids = [tokenizer(doc)["input_ids"] + [tokenizer.eos_token_id] for doc in documents]
    lengths = [len(doc) for doc in ids]
    assert max(lengths) < 128 * 64  # every document is shorter than the evaluation
    [entry] = (tmp_path / "cache").glob("blocks-*")
    for split, first in (("val", 0), ("test", 10)):
        whole = [t for index in held_out(lengths, first, 128 * 64) for t in ids[index]]  # the whole-document rule
        blocks = [t for view in ArrowBlocks(entry / f"{split}.arrow", 64).views for t in view.ravel().tolist()]
        assert blocks == whole[: len(whole) // 64 * 64]


# Silent wrong 9: --text-column ignored for .csv and .txt; the other files of a folder dropped with a count.


def test_a_csv_is_read_as_a_table_and_its_column_named(tmp_path):
    texts = [f'{t}, "quoted", and\na second line' for t in rows(150)]
    with open(tmp_path / "table.csv", "w", newline="") as f:
        f.write("id,text\r\n" + "".join(f'{n},"{t.replace(chr(34), chr(34) * 2)}"\r\n' for n, t in enumerate(texts)))
    result = train_in(tmp_path, tmp_path / "table.csv")
    assert result.exit_code == 0, result.output
    assert logged(result.output, r": ([\d,]+) documents, [\d,]+ tokens \(an end-of-text") == len(texts)
    [entry] = (tmp_path / "cache").glob("blocks-*")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "final")
    trained = tokenizer.decode([t for view in ArrowBlocks(entry / "train.arrow", 64).views for t in view.ravel()])
    assert "id,text" not in trained and '""quoted""' not in trained and '"quoted"' in trained
    (tmp_path / "body.csv").write_text("id,body\n1,some text\n")
    missing = train_in(tmp_path, tmp_path / "body.csv", name="missing")
    assert missing.exit_code == 1
    assert "body.csv is read as a CSV table and has no 'text' column (its header: id, body)" in missing.output


def test_a_text_column_on_plain_text_is_refused(tmp_path, data_file):
    result = train_in(tmp_path, data_file, "--text-column", "body")
    assert result.exit_code == 1
    assert "--text-column body: " in result.output and "holds plain text files only" in result.output


def test_the_files_a_folder_does_not_read_are_named_with_why(tmp_path, data_file):
    folder = tmp_path / "data"
    folder.mkdir()
    shutil.copy(data_file, folder / "text.txt")
    for name in ("server.log", "notes.text", "README"):
        (folder / name).write_text(words(400))
    (folder / "more.txt.gz").write_bytes(gzip.compress(words(400).encode()))
    result = train_in(tmp_path, folder)
    assert result.exit_code == 0, result.output
    assert f"skipped {folder / 'server.log'}: .log is not an extension read as text: rename it" in result.output
    assert f"skipped {folder / 'notes.text'}: .text is not an extension read as text" in result.output
    assert f"skipped {folder / 'README'}: no extension: name it README.txt" in result.output
    assert f"skipped {folder / 'more.txt.gz'}: compressed: decompress it" in result.output
    assert "data: 1 files under" in result.output


# Unclear messages: a saved DatasetDict, a wrong-but-valid meta.json, UTF-16 and compressed files.


def test_a_saved_dataset_dict_trains_on_its_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    splits = {"train": rows(200), "validation": rows(30, 200)}
    datasets.DatasetDict({k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}).save_to_disk(folder)
    result = train_in(tmp_path, folder)
    assert result.exit_code == 0, result.output
    assert "split train" in result.output and logged(result.output, r": ([\d,]+) documents, ") == 200
    other = train_in(tmp_path, folder, "--data-split", "test", name="other")
    assert other.exit_code == 1
    assert "is a saved DatasetDict with the splits train, validation, not 'test': give one with --data-split" in (
        other.output
    )


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


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (lambda text: text.encode("utf-16"), "is UTF-16 text, not UTF-8: re-encode it first (iconv -f utf-16"),
        (lambda text: text.encode("utf-16-le"), "is UTF-16 text, not UTF-8"),
        (lambda text: gzip.compress(text.encode()), "is gzip-compressed, not text: decompress it first (gunzip"),
        (lambda text: bz2.compress(text.encode()), "is bzip2-compressed, not text: decompress it first (bunzip2"),
    ],
)
def test_utf16_and_compressed_files_are_named_with_the_fix(tmp_path, data_file, content, says):
    (tmp_path / "corpus.txt").write_bytes(content(data_file.read_text()))
    result = train_in(tmp_path, tmp_path / "corpus.txt")
    assert result.exit_code == 1 and f"corpus.txt {says}" in result.output, result.output
    with pytest.raises(ValueError, match=re.escape(says)):  # what perplexity --text reads
        read_text(tmp_path / "corpus.txt")
