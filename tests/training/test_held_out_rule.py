"""How many files validation and test take (hf_geonorm.training.data.split, held-out rule 2): the files dealt in the
order of their content's hash, each split taking its candidates until it holds its evaluation (--eval-blocks x
--seq-len tokens), a file longer than that too (its pieces past the evaluation neither train nor are evaluated), but
never one of more than a twentieth of the data; and the rule before (1: path order, no file longer than the
evaluation), which the sweeps, runs and data caches begun under it keep.

The files are those of test_held_out_split.py: paragraphs of random words, each a piece of its own that starts with
a marker naming its file and place, so that where each piece went is read from the decoded blocks. What is expected
is computed here from the files as written and the rule written out (``ranked``, ``expected_split``)."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from hf_geonorm.sweep.grid import run_sweep
from hf_geonorm.sweep.journal import header_options
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.sweep.record import RecordError, check_same_sweep, sweep_header, sweep_identity
from hf_geonorm.training.data import token_batches
from hf_geonorm.training.data.corpus import FORMAT, resolve_corpus
from hf_geonorm.training.data.pipeline import (
    ArrowBlocks,
    blocks_key,
    prepare_blocks,
    streaming_blocks,
    streaming_holdout,
    tokenizer_digest,
)
from hf_geonorm.training.data.prepare import data_request, data_source, training_data
from hf_geonorm.training.data.split import PAST, held_out_plan
from hf_geonorm.training.data.tokenizer import TOKENIZER_SAMPLE
from hf_geonorm.training.options import TOKENIZER_SAMPLE_CHARS, TrainOptions
from hf_geonorm.training.run.record import RECORD_NAME
from hf_geonorm.training.run.trainer import run_training

from support.held_out import EVAL, file_paragraphs, files_of, markers, near_copy, paragraph, ranked, write
from support.helpers import bpe_tokenizer, reference_documents, train, train_in, write_sweep_journal

BUDGET = 32 * 64  # EVAL's 32 blocks of train_in's 64 tokens
SHORT = ("00", "10")  # the rule before's first validation and test candidates (path order): one paragraph each
SWEEPS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "sweeps"


def write_folder(folder: Path, paragraphs: dict[str, int], default: int = 8) -> Path:
    """A folder of 40 files, ``00.txt`` to ``39.txt``, of ``default`` paragraphs each but those ``paragraphs`` names."""
    folder.mkdir()
    for number in range(40):
        write(folder / f"{number:02d}.txt", file_paragraphs(number, paragraphs.get(f"{number:02d}", default)))
    return folder


def expected_split(folder: Path, tokenizer, budget: int) -> dict[str, tuple[set[str], set[str]]]:
    """Per split, the markers it holds and those past its budget, by the rule written out: its candidates (every
    20th of ``ranked`` from 0 for validation, from 10 for test) in that order, each file's pieces (a paragraph each)
    held out until the split holds ``budget`` tokens (each piece's tokens and its end-of-text token); the pieces of
    a file taken that come after are past it."""
    order = ranked(folder)
    result = {}
    for split, first in (("val", 0), ("test", 10)):
        held, past, before = set(), set(), 0
        for name in order[first::20]:
            if before >= budget:
                break
            for piece in reference_documents((folder / f"{name}.txt").read_text()):
                marker = re.match(r"M\d{4}", piece).group()
                if before >= budget:
                    past.add(marker)
                    continue
                held.add(marker)
                before += len(tokenizer(piece, add_special_tokens=False)["input_ids"]) + 1
        result[split] = held, past
    return result


@pytest.fixture(scope="module")
def long_files(tmp_path_factory) -> tuple[Path, dict[str, set[str]], str]:
    """One training step on a folder of 40 files of eight paragraphs (about 6,000 tokens each, three times the
    evaluation), but for two of one paragraph: files 00 and 10, the rule before's first candidates. The folder the
    run's data, output (``run``) and cache are in, the markers each split holds, and the log."""
    tmp = tmp_path_factory.mktemp("long")
    write_folder(tmp / "files", dict.fromkeys(SHORT, 1))
    result = train_in(tmp, tmp / "files", *EVAL)
    assert result.exit_code == 0, result.output
    return tmp, markers(tmp / "run", tmp / "cache"), result.output


def test_validation_and_test_reach_their_evaluation_with_files_longer_than_it(long_files):
    tmp, found, output = long_files
    order = ranked(tmp / "files")
    assert not {*order[0::20]} <= {*SHORT} and not {*order[10::20]} <= {*SHORT}  # each split has a long candidate
    tokenizer = AutoTokenizer.from_pretrained(tmp / "run" / "final")
    expected = expected_split(tmp / "files", tokenizer, BUDGET)
    assert found["val"] == expected["val"][0] and found["test"] == expected["test"][0]
    [entry] = (tmp / "cache").glob("blocks-*")
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["held_out_rule"] == 2 and meta["val_blocks"] == meta["test_blocks"] == 32  # the whole evaluation
    assert meta["val_tokens"] >= BUDGET and meta["test_tokens"] >= BUDGET
    files = len(files_of(expected["val"][0]))
    assert re.search(rf"validation: {files} files? \({len(expected['val'][0])} pieces\), {meta['val_tokens']:,} tokens",
                     output), output  # fmt: skip
    assert "come after what validation and test hold out" in output


def test_no_piece_of_a_held_out_file_trains_not_even_past_the_evaluation(long_files):
    tmp, found, _ = long_files
    held = found["val"] | found["test"]
    assert held and not files_of(held) & files_of(found["train"])
    tokenizer = AutoTokenizer.from_pretrained(tmp / "run" / "final")
    past = set().union(*(past for _, past in expected_split(tmp / "files", tokenizer, BUDGET).values()))
    assert past and not past & (found["train"] | held)  # past the budget: neither trained nor evaluated


def test_the_rule_before_held_out_too_little_of_the_same_files_and_is_kept_by_its_cache(long_files):
    """Under rule 1 (what a sweep, run or cache begun before rule 2 keeps) the same folder holds out files 00 and 10
    only, fewer blocks than the 32 evaluated: the longer candidates (20, 30) train. Its blocks and tokenizer are
    cached under the keys written before rule 2 (written out here), so a resumed sweep finds them."""
    tmp, _, _ = long_files
    options = TrainOptions(data=str(tmp / "files"), data_cache=str(tmp / "cache"), seq_len=64, vocab_size=300,
                           eval_blocks=32, held_out_rule=1)  # fmt: skip
    request = data_request(options)
    source = data_source(request, lambda _: None)
    data = training_data(source, request, lambda _: None)
    decoded = {split: set(re.findall(r"M\d{4}", source.tokenizer.decode(blocks.blocks.flatten().tolist())))
               for split, blocks in (("val", data.val), ("test", data.test))}  # fmt: skip
    assert decoded == {"val": {"M0000"}, "test": {"M1000"}}
    assert data.facts["val_blocks"] < 32 and data.facts["val_tokens"] < BUDGET
    corpus = source.corpus
    tokenizer_parts = [FORMAT, corpus.fingerprint, 300, TOKENIZER_SAMPLE_CHARS, TOKENIZER_SAMPLE]
    assert (tmp / "cache" / f"tokenizer-{hashlib.sha256(json.dumps(tokenizer_parts).encode()).hexdigest()[:24]}.json"
            ).is_file()  # fmt: skip
    old_parts = [FORMAT, corpus.fingerprint, tokenizer_digest(source.tokenizer), 64, 20, 32, 3]
    old_key = hashlib.sha256(json.dumps(old_parts).encode()).hexdigest()[:24]
    assert blocks_key(corpus, source.tokenizer, 64, 32, 1) == old_key != blocks_key(corpus, source.tokenizer, 64, 32, 2)
    assert json.loads((tmp / "cache" / f"blocks-{old_key}" / "meta.json").read_text())["held_out_rule"] == 1


def held_contents(folder: Path, rule: int) -> dict[int, set[tuple[str, int, int]]]:
    """Per code of the plan (validation, test, removed, past), each document it holds as (its file's SHA-256, its
    place in the file, the tokens taken): what is held out, whatever the files are named."""
    corpus = resolve_corpus(str(folder))
    plan = held_out_plan(corpus, bpe_tokenizer(), 64, 32, rule)
    digests = [hashlib.sha256(Path(path).read_bytes()).hexdigest() for _, path in corpus.shards]
    found: dict[int, set[tuple[str, int, int]]] = {}
    for number, (code, kept) in plan.held.items():
        shard, place = plan.key(number)
        found.setdefault(code, set()).add((digests[shard], place, kept))
    return found


def test_the_split_is_deterministic_and_the_same_whatever_the_files_are_named(tmp_path):
    """The same 40 files under names in another order hold out the same text under rule 2; under rule 1 (path
    order: the control) they do not."""
    lengths = {f"{n:02d}": 1 + n % 9 for n in range(40)}
    first = write_folder(tmp_path / "first", lengths)
    second = tmp_path / "second"
    second.mkdir()
    for number in range(40):  # file n's text under the name 3n + 1 mod 40 (no candidate of path order stays one)
        (second / f"{(number * 3 + 1) % 40:02d}.txt").write_bytes((first / f"{number:02d}.txt").read_bytes())
    assert held_contents(first, 2) == held_contents(second, 2) == held_contents(first, 2)
    assert held_contents(first, 1) != held_contents(second, 1)


def test_a_file_of_more_than_a_twentieth_of_the_data_is_never_held_out(tmp_path):
    """A validation candidate of 80 paragraphs (about a fifth of the data) trains, and the next candidate takes its
    place; three files of a third of the data each give no candidate, and the folder is held out by pieces, saying
    why."""
    folder = write_folder(tmp_path / "files", {})
    draw = random.Random(0)
    while ranked(folder)[0] != "39":  # file 39's 80 paragraphs drawn again until it ranks first
        write(folder / "39.txt", [paragraph(f"M39{n:02d}", draw) for n in range(80)])
    plan = held_out_plan(resolve_corpus(str(folder)), bpe_tokenizer(), 64, 32)
    held_files = {Path(resolve_corpus(str(folder)).shards[plan.key(n)[0]][1]).stem for n in plan.held}
    assert "39" not in held_files and ranked(folder)[20] in held_files

    three = tmp_path / "three"
    three.mkdir()
    for number in range(3):
        write(three / f"{number}.txt", file_paragraphs(number, 30))
    plan = held_out_plan(resolve_corpus(str(three)), bpe_tokenizer(), 64, 32)
    assert not plan.files and "larger than a twentieth of the data are never held out whole" in plan.why_not_files


def test_the_unread_rest_of_a_long_file_held_out_neither_trains_nor_streams(tmp_path, monkeypatch):
    """With batches of 3,000 characters (three pieces) a long candidate is read only until its split's pool holds
    twice the evaluation: its other pieces are past it unread, and neither the cached nor the streamed training
    blocks hold them; the streamed validation and test blocks are the cached ones."""
    monkeypatch.setattr(token_batches, "BATCH_CHARS", 3_000)
    folder = write_folder(tmp_path / "files", {}, default=20)
    corpus, tokenizer = resolve_corpus(str(folder)), bpe_tokenizer()
    plan = held_out_plan(corpus, tokenizer, 64, 16)
    unread = [n for n, (code, kept) in plan.held.items() if code == PAST and kept == 0]
    assert unread  # pieces past the pool, not read by the split
    held_files = {plan.key(n)[0] for n in plan.held}
    prepared = prepare_blocks(corpus, tokenizer, 64, tmp_path / "cache", 16)
    held_blocks, held, _ = streaming_holdout(corpus, tokenizer, 64, 16)
    for split in ("val", "test"):
        assert held_blocks[split].blocks.tolist() == getattr(prepared, split)().blocks.tolist()
    streamed = [t for block in streaming_blocks(corpus, tokenizer, 64, held, seed=0) for t in block["input_ids"]]
    cached = [t for view in ArrowBlocks(prepared.folder / "train.arrow", 64).views for t in view.ravel().tolist()]
    names = {f"{Path(corpus.shards[shard][1]).stem}" for shard in held_files}
    for trained in (streamed, cached):
        assert files_of(set(re.findall(r"M\d{4}", tokenizer.decode(trained)))) & names == set()
    assert prepared.meta["past_documents"] >= len(unread)


def legacy_header(options: TrainOptions, journal: Path) -> None:
    """Rewrite the header of ``journal`` (written by ``write_sweep_journal``) as hf-geonorm wrote it before the
    held-out rule was recorded: without it, its digest made again."""
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    del header["train_options"]["held_out_rule"]
    identity = {name: header[name] for name in ("train_options", "settings", "fingerprints")}
    journal.write_text("\n".join([json.dumps(sweep_header(identity, header["sweep_options"])), *lines[1:]]) + "\n")


class Captured:
    """A sweep's runner that trains nothing: it keeps the train options ``run_sweep`` hands it."""

    seen: list[TrainOptions] = []

    def __init__(self, sweep, train, folder, journal, log) -> None:
        Captured.seen.append(train)

    def run(self) -> list:
        return []


def test_a_sweep_begun_before_the_rule_was_recorded_resumes_with_the_rule_before(tmp_path):
    """A journal whose header records no held-out rule (as every committed one) resumes with rule 1, and says so;
    one that records rule 2 keeps it. A machine that would join such a study with rule 2 is refused naming it."""
    folder = write_folder(tmp_path / "files", dict.fromkeys(SHORT, 1))
    options = TrainOptions(data=str(folder), data_cache=str(tmp_path / "cache"), seq_len=64, vocab_size=300,
                           eval_blocks=32, max_steps=2)  # fmt: skip
    for name, legacy in (("old", True), ("new", False)):
        journal = tmp_path / name / "runs.jsonl"
        journal.parent.mkdir()
        write_sweep_journal(journal, options, [])
        if legacy:
            legacy_header(options, journal)
        lines: list[str] = []
        run_sweep(SweepOptions(output=str(journal.parent)), options, log=lines.append, runner=Captured)
        assert Captured.seen[-1].held_out_rule == (1 if legacy else 2)
        assert any("held-out rule 1, an earlier hf-geonorm's" in line for line in lines) == legacy, lines
    header = json.loads((tmp_path / "old" / "runs.jsonl").read_text().splitlines()[0])
    identity = sweep_identity(options, header["fingerprints"]["data"], header["fingerprints"]["tokenizer"])
    with pytest.raises(RecordError, match=r"train_options.held_out_rule: expected 1, found 2"):
        check_same_sweep(header, identity)


def test_every_committed_journal_keeps_the_rule_before():
    """The study's journals were written under rule 1 and record no rule: they read as rule 1."""
    headers = [json.loads(path.read_text().splitlines()[0]) for path in sorted(SWEEPS.glob("*/runs.jsonl"))]
    recorded = [header for header in headers if isinstance(header.get("train_options"), dict)]
    assert len(recorded) >= 20
    assert {header_options(header)["held_out_rule"] for header in recorded} == {1}


def test_a_run_resumed_from_a_checkpoint_without_the_rule_keeps_the_rule_before(long_files, tmp_path):
    """A run of rule 1 whose checkpoint's record names no held-out rule (as an earlier hf-geonorm wrote it) resumes
    on rule 1's held-out text (its validation: file 00 alone) and says so; its next record names rule 1."""
    data, _, _ = long_files
    out = tmp_path / "run"
    given = {"data": str(data / "files"), "seq_len": 64, "vocab_size": 300, "batch_size": 4, "warmup_steps": 0,
             "lr": 1e-3, "eval_blocks": 32, "eval_every": 1, "keep_checkpoints": True,
             "data_cache": str(tmp_path / "cache"), "max_steps": 2, "output": str(out)}  # fmt: skip
    run_training(TrainOptions(**given, held_out_rule=1), log=lambda _: None)
    record_path = out / "checkpoint-1" / RECORD_NAME
    record = json.loads(record_path.read_text())
    assert record["options"].pop("held_out_rule") == 1
    record_path.write_text(json.dumps(record))
    for name in ("checkpoint-2", "final", "metrics.json", "loss_curve.png"):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    result = train(*(f"--{name.replace('_', '-')}" if value is True else f"--{name.replace('_', '-')}={value}"
                     for name, value in given.items()), "--resume")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "by the rule of an earlier hf-geonorm (held-out rule 1" in result.output
    assert json.loads((out / "checkpoint-2" / RECORD_NAME).read_text())["options"]["held_out_rule"] == 1
    request = data_request(TrainOptions(**{**given, "keep_checkpoints": False}, held_out_rule=1))
    expected = training_data(data_source(request, lambda _: None), request, lambda _: None).facts
    val_tokens = json.loads((out / "metrics.json").read_text())["data_facts"]["val_tokens"]
    assert val_tokens == expected["val_tokens"] < BUDGET


def test_a_split_whose_first_candidates_copy_training_files_reads_more_until_it_holds_its_evaluation(tmp_path):
    """Of 80 files of four paragraphs, validation's first two candidates (ranks 0 and 20) are near-copied by
    training files: removed, they train, and validation reads its next candidates (the data read against them
    again) until it holds its budget, from the file of rank 40; no near-duplicate is kept."""
    folder = write_folder(tmp_path / "files", {}, default=4)
    for number in range(40, 80):
        write(folder / f"{number:02d}.txt", file_paragraphs(number, 4))
    draw = random.Random(5)
    while True:
        order = ranked(folder)
        partners = [name for name in order if name not in order[::10]][:2]  # training files
        for partner, copied in zip(partners, (order[0], order[20]), strict=True):
            text = (folder / f"{copied}.txt").read_text().split("\n\n")
            write(folder / f"{partner}.txt", near_copy([piece.strip() for piece in text], int(partner), draw))
        now = ranked(folder)
        if now[0:41:20] == order[0:41:20] and not set(partners) & set(now[::10]):
            break
        for partner in partners:  # drawn again
            write(folder / f"{partner}.txt", file_paragraphs(int(partner), 4))
    plan = held_out_plan(resolve_corpus(str(folder)), bpe_tokenizer(), 64, 32)
    corpus = resolve_corpus(str(folder))
    names = {number: Path(corpus.shards[plan.key(number)[0]][1]).stem for number in plan.held}
    validation = {names[number] for number, (code, _) in plan.held.items() if code == 1}
    assert validation == {order[40]}
    assert sum(kept for code, kept in plan.held.values() if code == 1) >= BUDGET
    assert not plan.duplicates_kept[1] and not {order[0], order[20]} & set(names.values())
