"""Which text `hf-geonorm train` holds out for validation and test (hf_geonorm.training.data.split): whole files of a
folder, never pieces of a file that also trains; pieces whose text training holds anyway (a copied or near-copied
file, a repeated paragraph of one file) removed from the held-out side; a folder of too few files split by pieces.
(How many files each split takes, and the rule before: test_held_out_rule.py.)

Each folder's files are paragraphs of random words, each paragraph a piece of its own (over 1,000 characters, then a
blank line) that starts with a marker naming its file and place (``M0712``: file 07, paragraph 12), so that where
each piece went is read from the decoded blocks. What is expected is computed here from the files as written."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from hf_geonorm.training.data.corpus import resolve_corpus
from hf_geonorm.training.data.pipeline import ArrowBlocks, streaming_blocks, streaming_holdout

from support.held_out import EVAL, file_paragraphs, files_of, markers, near_copy, ranked, write
from support.helpers import train_in


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory) -> tuple[dict[str, set[str]], str, Path]:
    """One training step on a folder of 40 files of two pieces each, whose file 00, the first validation candidate
    (``ranked``: its words are drawn again until it ranks first), near-copies file 05 (a training file): the markers
    each split holds, the log, and the folder the run's data, output (``run``) and cache are in."""
    tmp = tmp_path_factory.mktemp("folder")
    folder = tmp / "files"
    folder.mkdir()
    for number in range(40):
        write(folder / f"{number:02d}.txt", file_paragraphs(number))
    draw = random.Random(99)
    write(folder / "00.txt", near_copy(file_paragraphs(5), 0, draw))
    while ranked(folder)[0] != "00" or "05" in ranked(folder)[::10]:
        write(folder / "00.txt", near_copy(file_paragraphs(5), 0, draw))
    result = train_in(tmp, folder, *EVAL)
    assert result.exit_code == 0, result.output
    return markers(tmp / "run", tmp / "cache"), result.output, tmp


def test_held_out_files_are_whole_files_never_trained_on(folder_run):
    found, output, _ = folder_run
    held = found["val"] | found["test"]
    assert files_of(found["val"]) and files_of(found["test"])  # both splits hold files
    assert not files_of(held) & files_of(found["train"]), sorted(held)  # no piece of a held-out file trains
    assert not files_of(found["val"]) & files_of(found["test"])
    assert re.search(r"validation: \d+ files? \(\d+ pieces\)", output), output


def test_a_held_out_file_that_copies_a_training_file_is_removed(folder_run):
    found, output, tmp = folder_run
    held = found["val"] | found["test"]
    assert "00" not in files_of(held)  # file 00 near-copies file 05, which trains
    assert "05" in files_of(found["train"])
    assert ranked(tmp / "files")[20] in files_of(found["val"])  # the next validation candidate took its place
    assert re.search(r"removed as near-duplicates of training text: 2 validation", output), output


def test_streaming_holds_out_the_same_whole_files(folder_run):
    """--streaming's held-out blocks are the cached ones, and its training stream holds no piece of them nor of
    the removed copy."""
    found, _, tmp = folder_run
    tokenizer = AutoTokenizer.from_pretrained(tmp / "run" / "final")
    corpus = resolve_corpus(str(tmp / "files"))
    held_blocks, held, _ = streaming_holdout(corpus, tokenizer, 64, 32)
    [entry] = (tmp / "cache").glob("blocks-*")
    for split in ("val", "test"):
        cached = [b.tolist() for view in ArrowBlocks(entry / f"{split}.arrow", 64).views for b in view]
        assert held_blocks[split].blocks.tolist() == cached[: len(held_blocks[split])]
    streamed = [t for block in streaming_blocks(corpus, tokenizer, 64, held, seed=0) for t in block["input_ids"]]
    trained = set(re.findall(r"M\d{4}", tokenizer.decode(streamed)))
    assert not files_of(found["val"] | found["test"]) & files_of(trained) and files_of(trained)


def test_a_single_file_is_split_by_pieces_with_a_repeated_piece_removed(tmp_path):
    """Pieces 0, 20, 40 ... are validation candidates; piece 0 repeats piece 7 (which trains) with a few words
    changed, so validation takes pieces 20 and 40 only."""
    paragraphs = file_paragraphs(1, 60)
    paragraphs[0] = near_copy([paragraphs[7]], 1, random.Random(3))[0]
    write(tmp_path / "one.txt", paragraphs)
    result = train_in(tmp_path, tmp_path / "one.txt", *EVAL)
    assert result.exit_code == 0, result.output
    found = markers(tmp_path / "run", tmp_path / "cache")
    assert "M0100" not in found["val"] and {"M0120", "M0140"} <= found["val"]
    assert "M0100" in found["train"] and "M0107" in found["train"]
    assert {"M0110", "M0130"} <= found["test"]


def test_a_folder_of_too_few_files_is_split_by_pieces_and_says_so(tmp_path):
    folder = tmp_path / "two"
    folder.mkdir()
    for number in range(2):
        write(folder / f"{number:02d}.txt", file_paragraphs(number, 30))
    result = train_in(tmp_path, folder, *EVAL)
    assert result.exit_code == 0, result.output
    assert "held out by pieces of files" in result.output
    found = markers(tmp_path / "run", tmp_path / "cache")
    assert "M0000" in found["val"] and "M0020" in found["val"]  # pieces 0 and 20 of the corpus, in file 00
