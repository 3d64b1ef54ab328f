"""What `train --data FOLDER` refuses: an --output inside the data folder or data inside the --output folder. Each
expectation is computed here from the files the test writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import STDLIB, contents, error_lines, train_in


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
