"""What `train --data FOLDER` reads, follows, skips and refuses (hf_geonorm.training.data.folders): an --output inside
the data folder or data inside the --output folder, folder links (followed once; a loop named), FIFOs and links to
devices among the files (named, never opened), and parquet rows whose text is null (counted). Each expectation is
computed here from the files the test writes."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hf_geonorm.training.data.corpus import resolve_corpus

from support.helpers import STDLIB, contents, error_lines, train_in, words


def prose(count: int, tag: str) -> str:
    """``count`` numbered lines of standard-library words, each with ``tag``: text whose origin a test can find."""
    words = re.findall(r"[a-z]+", (STDLIB / "textwrap.py").read_text())
    return "".join(f"{tag}{n:05d} {' '.join(words[n % 400 : n % 400 + 10])}.\n" for n in range(count))


@pytest.fixture
def corpus_folder(tmp_path) -> Path:
    folder = tmp_path / "corp"
    folder.mkdir()
    (folder / "own.txt").write_text(prose(600, "OWN"))
    return folder


def refused(result) -> str:
    """The one ``Error:`` line of a command that failed without a traceback."""
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    [line] = error_lines(result.output)
    return line


def test_an_output_inside_the_data_folder_is_refused_before_anything_is_written(tmp_path, corpus_folder):
    before = contents(corpus_folder)
    line = refused(train_in(tmp_path, corpus_folder, name="corp/run"))
    assert f"--output {tmp_path / 'corp' / 'run'} is inside the --data folder {corpus_folder}" in line, line
    assert "give another --output" in line
    (tmp_path / "through").symlink_to(corpus_folder)  # the same folder by a link: the same refusal
    line = refused(train_in(tmp_path, corpus_folder, name="through/run"))
    assert "is inside the --data folder" in line, line
    (tmp_path / "data-link").symlink_to(corpus_folder)
    line = refused(train_in(tmp_path, tmp_path / "data-link", name="corp"))  # the data folder itself, by its link
    assert f"--output {corpus_folder} is the --data folder {tmp_path / 'data-link'}" in line, line
    assert contents(corpus_folder) == before and sorted(p.name for p in corpus_folder.iterdir()) == ["own.txt"]
    assert not (tmp_path / "cache").exists()  # refused before the data was read


def test_data_inside_the_output_folder_is_refused_before_anything_is_written(tmp_path):
    output = tmp_path / "run"
    (output / "texts").mkdir(parents=True)
    (output / "notes.txt").write_text(prose(600, "NOTE"))
    (output / "texts" / "more.txt").write_text(prose(600, "MORE"))
    before = contents(output)
    for given in (output / "notes.txt", output / "texts"):
        line = refused(train_in(tmp_path, given, "--resume"))
        assert f"--data {given} is inside the --output folder {output}" in line, line
        assert "give another --output" in line
    assert contents(output) == before and sorted(p.name for p in output.iterdir()) == ["notes.txt", "texts"]


def test_a_linked_folder_is_read_as_its_files_would_be(tmp_path, corpus_folder):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "linked.txt").write_text(prose(600, "LINKED"))
    (corpus_folder / "more").symlink_to(outside)
    result = train_in(tmp_path, corpus_folder)
    assert result.exit_code == 0, result.output
    assert f"data: 2 files under {corpus_folder}" in result.output
    copy = tmp_path / "copy"  # the same files, with a real folder where the link is
    shutil.copytree(corpus_folder, copy, symlinks=False)
    assert not (copy / "more").is_symlink()
    linked, copied = resolve_corpus(str(corpus_folder)), resolve_corpus(str(copy))
    assert linked.fingerprint == copied.fingerprint  # what keys the cache: the files read, wherever they lie
    assert "LINKED00000" in "".join(linked.all_documents())
    (outside / "linked.txt").write_text(prose(600, "EDITED"))
    assert resolve_corpus(str(corpus_folder)).fingerprint != linked.fingerprint  # an edit behind the link counts


def test_a_link_loop_and_a_second_link_to_a_folder_are_skipped_naming_the_link(tmp_path, corpus_folder):
    sub = corpus_folder / "sub"
    sub.mkdir()
    (sub / "inner.txt").write_text(prose(300, "INNER"))
    (sub / "back").symlink_to(corpus_folder)  # a loop: the folder that holds it
    (corpus_folder / "again").symlink_to(sub)  # the folder sub, a second time
    result = train_in(tmp_path, corpus_folder)
    assert result.exit_code == 0, result.output
    assert f"skipped {sub / 'back'}: a link to {corpus_folder}, a folder that holds it (a loop)" in result.output
    assert f"skipped {corpus_folder / 'again'}: a link to {sub}, a folder read already" in result.output
    assert f"data: 2 files under {corpus_folder}" in result.output  # own.txt and sub/inner.txt, once each


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifos_and_links_to_devices_in_a_folder_are_named_and_never_opened(tmp_path, corpus_folder):
    fifo = corpus_folder / "pipe.txt"
    os.mkfifo(fifo)  # opened for reading, it would block until a writer came
    os.mkfifo(corpus_folder / "pipe")
    (corpus_folder / "zero.txt").symlink_to("/dev/zero")  # read, it would never end
    (corpus_folder / "gone.txt").symlink_to(tmp_path / "missing.txt")
    opened = threading.Event()

    def writer() -> None:  # its open returns once a reader opens the FIFO: the run then reads an end, not a hang
        with open(fifo, "wb"):
            opened.set()

    waiting = threading.Thread(target=writer, daemon=True)
    waiting.start()
    result = train_in(tmp_path, corpus_folder)
    read = opened.is_set()
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # lets the writer go
    waiting.join()
    assert not read, "the run opened the FIFO"
    assert result.exit_code == 0, result.output
    for name, kind in (("pipe.txt", "a FIFO (named pipe)"), ("pipe", "a FIFO (named pipe)"),
                       ("zero.txt", "a character device (/dev/zero)")):  # fmt: skip
        assert f"skipped {corpus_folder / name}: {kind}, not a regular file" in result.output, result.output
    assert f"skipped {corpus_folder / 'gone.txt'}: a link to {tmp_path / 'missing.txt'}, which does not exist" in (
        result.output
    )
    assert f"data: 1 files under {corpus_folder}" in result.output


@pytest.mark.parametrize("in_folder", [False, True])
def test_parquet_rows_whose_text_is_null_are_counted(tmp_path, in_folder):
    texts = prose(400, "ROW").splitlines()
    nulls = {3, 50, 51, 399}
    column = pa.array([None if n in nulls else text for n, text in enumerate(texts)], pa.string())
    folder = tmp_path / "rows"
    folder.mkdir()
    # in a folder, a file without statistics (whose nulls are counted by reading the column)
    pq.write_table(pa.table({"text": column}), folder / "rows.parquet", row_group_size=128,
                   write_statistics=not in_folder)  # fmt: skip
    result = train_in(tmp_path, folder if in_folder else folder / "rows.parquet")
    assert result.exit_code == 0, result.output
    assert f"skipped {len(nulls)} of the {len(texts)} rows of {folder / 'rows.parquet'}: their 'text' is null" in (
        result.output
    )
    documents = re.search(r": ([\d,]+) documents, [\d,]+ tokens \(an end-of-text", result.output).group(1)
    assert int(documents) == len(texts) - len(nulls)


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
