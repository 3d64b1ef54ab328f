"""The corpora users have (hf_geonorm.training.data.corpus): one sentence a line with no blank lines, a huge single
line, `.json` JSON lines, text columns of the wrong type, hidden files, CRLF and a BOM, FIFOs and devices, and
`datasets` folders with a config and a text column. Each expectation is computed here from the file's content."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from hf_geonorm._plumbing.text_files import read_text
from hf_geonorm.training.data.corpus import resolve_corpus
from hf_geonorm.training.data.documents import PIECE_CHARS
from hf_geonorm.training.data.pipeline import ArrowBlocks
from hf_geonorm.training.data.tokenizer import train_tokenizer
from hf_geonorm.training.options import DEFAULT_TOKENIZER_VOCAB
from hf_geonorm_cli.main import cli

from support.helpers import ONE_STEP, STDLIB, error_lines, logged, rows, train, train_in, words


def sentences(count: int) -> str:
    """Numbered sentences, one a line, no blank line: the shape of most text dumps."""
    words = re.findall(r"[a-z]+", (STDLIB / "textwrap.py").read_text())
    return "".join(f"S{n:06d} {' '.join(words[n % 500 : n % 500 + 12])}.\n" for n in range(count))


def test_one_sentence_a_line_trains_and_holds_out_a_few_percent_never_trained(tmp_path):
    data = tmp_path / "lines.txt"
    data.write_text(sentences(5000))  # about 400 KB, no blank line
    assert 300_000 < data.stat().st_size < 600_000
    result = train_in(tmp_path, data)
    assert result.exit_code == 0, result.output
    found = re.findall(r"(\w+): [\d,]+ documents, ([\d,]+) tokens", result.output)
    counted = {name: int(tokens.replace(",", "")) for name, tokens in found}
    total = int(re.search(r"documents, ([\d,]+) tokens \(an end-of-text", result.output).group(1).replace(",", ""))
    assert counted["validation"] + counted["test"] <= 0.05 * total  # a few percent, not half of the data
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / "final")
    [folder] = (tmp_path / "cache").glob("blocks-*")
    decode = lambda name: tokenizer.decode(  # noqa: E731
        [t for view in ArrowBlocks(folder / name, 64).views for t in view.ravel().tolist()]
    )
    held = set(re.findall(r"S\d{6}", decode("val.arrow"))) | set(re.findall(r"S\d{6}", decode("test.arrow")))
    trained = set(re.findall(r"S\d{6}", decode("train.arrow")))
    assert held and not held & trained  # none of it trained on
    # its pieces of 8,000 characters are longer than the 8 blocks of 64 tokens evaluated: cut to what is evaluated
    assert counted["validation"] == counted["test"] == 8 * 64


def test_a_single_huge_line_is_cut_into_bounded_pieces_at_whitespace(tmp_path):
    data = tmp_path / "one-line.txt"
    text = " ".join(f"w{n}" for n in range(2_500_000))  # about 20 MB, no line end at all
    data.write_text(text)
    corpus = resolve_corpus(str(data))
    sizes, joined = [], []
    for piece in corpus.all_documents():
        sizes.append(len(piece))
        if len(joined) < 3:
            joined.append(piece)
    assert max(sizes) <= 2 * PIECE_CHARS and sum(sizes) == len(text) and len(sizes) > 1000
    assert all(piece.endswith(" ") for piece in joined)  # cut after whitespace, never inside a word


def test_a_long_run_of_blank_lines_gives_no_document_of_whitespace(tmp_path):
    data = tmp_path / "gap.txt"
    first, last = sentences(200), sentences(400)[len(sentences(200)) :]
    data.write_text(first + "\n" * (3 * PIECE_CHARS) + last)
    pieces = list(resolve_corpus(str(data)).all_documents())
    assert all(piece.strip() for piece in pieces)
    assert "".join(pieces).split() == (first + last).split()  # every word, in order, once


def test_json_named_jsonl_is_read_as_rows_and_a_json_array_is_refused(tmp_path):
    rows = [{"text": f"row {n}: " + "words and more words " * 20, "id": n} for n in range(400)]
    (tmp_path / "rows.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    corpus = resolve_corpus(str(tmp_path / "rows.json"))
    assert list(corpus.all_documents()) == [row["text"] for row in rows]  # the texts, not `{"text": ...`
    (tmp_path / "array.json").write_text(json.dumps(rows))
    result = train_in(tmp_path, tmp_path / "array.json")
    assert result.exit_code == 1 and "array.json is a JSON array: give JSON lines" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(("values", "kind"), [([b"bytes"] * 50, "binary"), (list(range(50)), "int64"),
                                               ([["a"]] * 50, "list<element: string>")])  # fmt: skip
def test_a_text_column_that_is_not_strings_is_refused_naming_file_column_and_type(tmp_path, values, kind, streaming):
    pq.write_table(pa.table({"text": values}), tmp_path / "bad.parquet")
    result = train_in(tmp_path, tmp_path / "bad.parquet", *(["--streaming"] if streaming else []))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"bad.parquet: column 'text' holds {kind}, not text (string)" in result.output, result.output
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").glob("blocks-*"))  # refused before work


def test_an_empty_parquet_and_a_missing_column_are_named(tmp_path):
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    assert "empty.parquet has no rows" in train_in(tmp_path, tmp_path / "empty.parquet").output
    pq.write_table(pa.table({"body": sentences(2000).splitlines()}), tmp_path / "body.parquet")
    result = train_in(tmp_path, tmp_path / "body.parquet")
    assert "has no 'text' column (it has body); give --text-column" in result.output
    result = train_in(tmp_path, tmp_path / "body.parquet", "--text-column", "body")
    assert result.exit_code == 0, result.output


def test_hidden_files_and_folders_are_skipped_and_counted(tmp_path):
    folder = tmp_path / "data"
    (folder / ".hiddendir").mkdir(parents=True)
    (folder / ".hiddendir" / "secret.txt").write_text("SECRET " * 200)
    (folder / ".hidden.txt").write_text("SECRET " * 200)
    (folder / "visible.txt").write_text(sentences(300))
    with pytest.warns(UserWarning, match=r"skipped 2 hidden file\(s\)"):
        corpus = resolve_corpus(str(folder))
    assert [Path(source).name for _, source in corpus.shards] == ["visible.txt"]
    assert "SECRET" not in "".join(corpus.all_documents())


def test_crlf_and_a_bom_read_as_the_same_text(tmp_path):
    text = sentences(400) + "\n" + sentences(400)
    (tmp_path / "unix.txt").write_text(text, newline="\n")
    (tmp_path / "dos.txt").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    unix, dos = (list(resolve_corpus(str(tmp_path / name)).all_documents()) for name in ("unix.txt", "dos.txt"))
    assert dos == unix and "\r" not in "".join(dos) and not dos[0].startswith("\ufeff")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifos_and_devices_are_refused_as_what_they_are(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    result = train_in(tmp_path, tmp_path / "pipe")
    assert result.exit_code == 1 and "pipe is a FIFO (named pipe), not a file or folder" in result.output
    result = train_in(tmp_path, "/dev/null")
    assert result.exit_code == 1 and "/dev/null is a character device" in result.output


def test_text_column_and_data_config_on_a_local_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "corpus"
    for config in ("small", "other"):
        (folder / config).mkdir(parents=True)
        rows = [{"body": f"{config} row {n}: " + "some words " * 30} for n in range(200)]
        (folder / config / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "README.md").write_text("---\nconfigs:\n- config_name: small\n  data_files: small/*.jsonl\n"
                                      "- config_name: other\n  data_files: other/*.jsonl\n---\n")  # fmt: skip
    corpus = resolve_corpus(str(folder), "body", _source(folder, "other"))
    assert next(corpus.all_documents()).startswith("other row 0:")
    result = train_in(tmp_path, folder, "--data-config", "small", "--text-column", "body")
    assert result.exit_code == 0, result.output
    assert "config small, split train" in result.output
    missing = train_in(tmp_path, folder, "--data-config", "small", name="missing")
    assert missing.exit_code == 1 and "has no 'text' column (it has body); give --text-column" in missing.output
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": [f"saved row {n} " + "text " * 40 for n in range(200)]}).save_to_disk(saved)
    assert next(resolve_corpus(str(saved)).all_documents()).startswith("saved row 0")


def _source(folder: Path, config: str):
    from hf_geonorm.training.data.corpus import HubSource

    return HubSource(str(folder), config)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-tokens", "1"], "--max-tokens 1 is less than one block of --seq-len 64: give at least 64"),
        (["--gradient-accumulation-steps", "100000"], "tokens per optimizer step, beyond the limit of 16,777,216"),
    ],
)
def test_options_beyond_sense_are_refused_before_any_tokenizing(tmp_path, args, message):
    (tmp_path / "text.txt").write_text(sentences(300))
    result = train_in(tmp_path, tmp_path / "text.txt", *args)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "cache").exists()  # nothing tokenized, no tokenizer trained


def test_seq_len_beyond_the_models_positions_is_refused_before_tokenizing(tmp_path):
    init = ["init", "gpt2", str(tmp_path / "cfg"), "--preset", "tiny", "--vocab-size", "320"]
    assert CliRunner().invoke(cli, init).exit_code == 0
    (tmp_path / "text.txt").write_text(sentences(300))
    result = train_in(tmp_path, tmp_path / "text.txt", "--model", str(tmp_path / "cfg"), "--seq-len", "2048")
    assert result.exit_code == 2 and "--seq-len 2048 is beyond the 256 positions of" in result.output, result.output
    assert not (tmp_path / "cache").exists()


def test_too_many_data_workers_are_capped_with_a_line_and_the_device_is_logged(tmp_path):
    (tmp_path / "text.txt").write_text(sentences(3000))
    result = train_in(tmp_path, tmp_path / "text.txt", "--data-workers", "64")
    assert result.exit_code == 0, result.output
    cpus = os.cpu_count()
    assert f"--data-workers 64 is more than this machine's {cpus} CPUs: tokenizing with {cpus}" in result.output
    assert "device: cpu, 1 process(es), precision fp32" in result.output


FITS = ["--seq-len", "64", "--batch-size", "2", "--max-steps", "1", "--eval-every", "1", "--warmup-steps", "0",
        "--eval-blocks", "8"]  # fmt: skip


def test_a_config_with_a_vocabulary_gets_a_tokenizer_of_that_size(tmp_path):
    (tmp_path / "text.txt").write_text(sentences(6000))
    fits = ["--data", str(tmp_path / "text.txt"), *FITS, "--data-cache", str(tmp_path / "cache")]
    assert CliRunner().invoke(cli, ["init", "gpt2", str(tmp_path / "cfg"), "--preset", "tiny", "--vocab-size", "512"]
                              ).exit_code == 0  # fmt: skip
    result = CliRunner().invoke(cli, ["train", "--model", str(tmp_path / "cfg"), *fits, "--output", tmp_path / "a"])
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "a" / "final")
    config = json.loads((tmp_path / "a" / "final" / "config.json").read_text())
    assert len(tokenizer) == config["vocab_size"] == 512  # trained to the config's size, no resize


def test_a_config_whose_vocabulary_the_data_cannot_fill_is_sized_to_the_tokenizer_trained_on_it(tmp_path):
    """init without a tokenizer writes the default vocabulary (50,304, as for the 125m preset); a few MB of text
    gave a tokenizer of 45,501 tokens, and train stopped where docs/training.md says the embedding is sized to it."""
    assert CliRunner().invoke(cli, ["init", "gpt2", str(tmp_path / "cfg"), "--preset", "tiny"]).exit_code == 0
    asked = json.loads((tmp_path / "cfg" / "config.json").read_text())["vocab_size"]
    (tmp_path / "small.txt").write_text(sentences(1500))
    small = ["--data", str(tmp_path / "small.txt"), *FITS, "--data-cache", str(tmp_path / "cache")]
    result = CliRunner().invoke(cli, ["train", "--model", str(tmp_path / "cfg"), *small, "--output", tmp_path / "b"])
    assert result.exit_code == 0, result.output
    tokens = len(AutoTokenizer.from_pretrained(tmp_path / "b" / "final"))
    rows = -(-tokens // 64) * 64  # the next multiple of 64
    assert tokens < asked and rows % 64 == 0 and rows - 64 < tokens <= rows
    assert json.loads((tmp_path / "b" / "final" / "config.json").read_text())["vocab_size"] == rows
    said = " ".join(result.output.split())
    assert f"the tokenizer trained on the data has {tokens:,} tokens, fewer than the vocab_size {asked:,}" in said
    assert f"the model's embedding is sized to it: {rows:,} rows (rounded up to a multiple of 64)" in said


@pytest.mark.slow
def test_the_125m_config_trains_at_the_vocabulary_a_small_corpus_asks_for(tmp_path):
    (tmp_path / "text.txt").write_text(sentences(6000))
    assert CliRunner().invoke(cli, ["init", "gpt2", str(tmp_path / "big"), "--preset", "125m"]).exit_code == 0
    result = CliRunner().invoke(cli, ["train", "--model", str(tmp_path / "big"), "--data", str(tmp_path / "text.txt"),
                                      *FITS, "--vocab-size", "320", "--output", str(tmp_path / "c")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "has vocab_size 50304; the tokenizer has 320 tokens: the model is built with 320 rows" in result.output
    config = json.loads((tmp_path / "c" / "final" / "config.json").read_text())
    assert config["vocab_size"] == len(AutoTokenizer.from_pretrained(tmp_path / "c" / "final")) == 320


ROWS = 320  # the embedding rows of the saved model below


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    """A saved stock GPT-2 with trained weights (random here) of ``ROWS`` embedding rows and no tokenizer."""
    folder = tmp_path_factory.mktemp("saved") / "model"
    config = GPT2Config(vocab_size=ROWS, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def large_tokenizer(tmp_path_factory) -> Path:
    """A tokenizer of more tokens than ``ROWS``."""
    folder = tmp_path_factory.mktemp("tokenizer") / "large"
    train_tokenizer([sentences(3000)], 900).save_pretrained(folder)
    return folder


def test_a_tokenizer_with_more_tokens_than_the_models_embedding_is_refused_before_tokenizing(
    tmp_path, saved_model, large_tokenizer
):
    (tmp_path / "text.txt").write_text(sentences(300))
    tokens = len(AutoTokenizer.from_pretrained(large_tokenizer))
    assert tokens > ROWS
    own = shutil.copytree(saved_model, tmp_path / "own")  # the model with that tokenizer as its own
    for file in large_tokenizer.iterdir():
        shutil.copy(file, own / file.name)
    unsized = [a for a in ONE_STEP if a not in ("--vocab-size", "300")]
    base = ["--data", tmp_path / "text.txt", *unsized, "--data-cache", tmp_path / "cache", "--output", tmp_path / "run"]
    cases = [
        (["--model", saved_model, "--tokenizer", large_tokenizer], [f"{tokens} tokens", f"{ROWS} rows", "resize"]),
        (["--model", own], [f"{tokens} tokens", f"{ROWS} rows", "resize"]),
        (["--model", saved_model, "--vocab-size", "400"], ["400 tokens", f"{ROWS} ", f"--vocab-size {ROWS} or less"]),
        (["--model", saved_model], [f"{DEFAULT_TOKENIZER_VOCAB} tokens", f"--vocab-size {ROWS} or less", "resize"]),
        (["--tokenizer", large_tokenizer, "--vocab-size", "300"], ["--vocab-size 300", f"{tokens} tokens"]),
    ]
    for args, says in cases:
        result = train(*base, *args)
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        [line] = error_lines(result.output)
        assert all(part in line for part in says), (args, line)
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())  # nothing tokenized
    fits = train_in(tmp_path, tmp_path / "text.txt", "--model", saved_model, "--vocab-size", str(ROWS), name="fits")
    assert fits.exit_code == 0, fits.output


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
