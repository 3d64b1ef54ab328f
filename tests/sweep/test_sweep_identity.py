"""A sweep run's identity in `hf-geonorm sweep`'s journal: every option that shapes a run and the content of its
data, tokenizer and `--model`. What the journal holds is checked against what this sweep would run, field by field
(``journal.check_record``): a line of another sweep, a hand-written or edited line or header, a journal that is a
link, a model or corpus changed under the same path, are refused naming the line and the field. The journals here
are real ones (one training step a run), then tampered with as a user or a script would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hf_geonorm.sweep import grid as sweep_module
from hf_geonorm.sweep.record import RecordError, check_header, check_record, check_same_sweep, digest

from support.helpers import STDLIB, edited_copy, error_lines, invoke

RUN_OPTIONS = ["--seq-len", "32", "--batch-size", "4", "--max-steps", "1", "--eval-every", "1", "--warmup-steps", "0",
               "--eval-blocks", "8"]  # fmt: skip
ONE_STEP = [*RUN_OPTIONS, "--extend", "0", "--confirm-seeds", "none"]  # the grid given, one seed
VOCAB = ["--vocab-size", "300"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("identity-corpus") / "text.txt"
    path.write_text("".join((STDLIB / name).read_text() for name in ("textwrap.py", "shlex.py")))
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("identity-cache")


def sweep(output: Path, corpus: Path, cache: Path, *more: object, options: list[str] | None = None) -> object:
    return invoke("sweep", "--output", output, "--data", corpus, "--data-cache", cache,
                  *(ONE_STEP + VOCAB if options is None else options), *more)  # fmt: skip


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory, corpus, cache) -> Path:
    """A real sweep's folder: one pre run at 2e-3, one step."""
    output = tmp_path_factory.mktemp("identity-base") / "sweep"
    result = sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3")
    assert result.exit_code == 0, result.output
    return output


@pytest.fixture(scope="module")
def real_journal(real_sweep) -> list[str]:
    """The lines of the real sweep's journal."""
    return (real_sweep / "runs.jsonl").read_text().splitlines()


def journal_of(output: Path) -> list[str]:
    return (output / "runs.jsonl").read_text().splitlines()


def write_journal(output: Path, lines: list[str | dict]) -> Path:
    output.mkdir(parents=True, exist_ok=True)
    path = output / "runs.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def at_rate(line: str | dict, lr: float, seed: int = 0, **changes) -> dict:
    """A copy of the run ``line`` moved to ``lr`` and ``seed`` (its name with them), with ``changes``."""
    run = json.loads(line) if isinstance(line, str) else dict(line)
    run |= {"lr": lr, "seed": seed, "run": sweep_module.Run(run["style"], run["alpha"], lr, seed).name}
    return run | changes


def refused(result: object, *parts: str) -> str:
    """The one ``Error:`` line of a refused sweep, holding every one of ``parts``."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    [line] = error_lines(result.output)
    for part in parts:
        assert part in line, line
    return line


def test_a_line_of_a_sweep_with_another_seq_len_or_batch_size_is_refused(tmp_path, corpus, cache, real_journal):
    """A line copied in from a sweep that ran with --seq-len 16 --batch-size 2 is not averaged into this one."""
    other = tmp_path / "other"
    options = ["--seq-len", "16", "--batch-size", "2", *ONE_STEP[4:], *VOCAB]
    result = sweep(other, corpus, cache, "--styles", "pre", "--lrs", "4e-3", options=options)
    assert result.exit_code == 0, result.output
    output = tmp_path / "sweep"
    path = write_journal(output, [*real_journal, journal_of(other)[1]])
    before = path.read_bytes()
    result = sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3,4e-3")
    refused(result, "runs.jsonl, line 3: batch_size: expected 4, found 2")  # the first field that differs
    assert path.read_bytes() == before and not (output / "sweep.md").exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"settings": "drop"}, "line 3: a run without settings"),
        ({"settings": None}, "line 3: settings: expected"),
        ({"steps": None}, "line 3: steps: expected 1, found None"),
        ({"tokens": None}, "line 3: tokens: expected"),
        ({"val_loss": None, "test_loss": None}, "line 3: a diverged run"),
        ({"val_loss": -1.0}, "line 3: val_loss: expected a finite loss >= 0, found -1.0"),
        ({"test_loss": -0.5}, "line 3: test_loss: expected a finite loss >= 0, found -0.5"),
    ],
    ids=["no-settings", "null-settings", "null-steps", "null-tokens", "null-losses", "negative-val", "negative-test"],
)
def test_a_hand_written_line_with_missing_null_or_negative_values_is_refused(tmp_path, corpus, cache, real_journal,
                                                                            changes, message):  # fmt: skip
    run = at_rate(real_journal[1], 4e-3, **{k: v for k, v in changes.items() if v != "drop"})
    for name in [k for k, v in changes.items() if v == "drop"]:
        del run[name]
    output = tmp_path / "sweep"
    path = write_journal(output, [*real_journal, run])
    before = path.read_bytes()
    refused(sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3"), message)
    assert path.read_bytes() == before and not (output / "sweep.md").exists()


def test_an_edited_header_is_refused(tmp_path, corpus, cache, real_journal):
    """The header edited to --seq-len 16, the sweep run with --seq-len 16: the line run at 32 must not count."""
    header = json.loads(real_journal[0])
    header["train_options"]["seq_len"] = 16
    output = tmp_path / "sweep"
    path = write_journal(output, [header, *real_journal[1:]])
    before = path.read_bytes()
    options = ["--seq-len", "16", *ONE_STEP[2:], *VOCAB]
    line = refused(sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3", options=options), "line 1")
    assert "edited" in line
    assert path.read_bytes() == before and not (output / "sweep.md").exists()


def test_a_line_with_an_edited_geo_decay_is_refused(tmp_path, corpus, cache, real_journal):
    run = json.loads(real_journal[1])
    assert run["settings"]["geo_decay"] == "harmonic"  # the library's default, which this sweep runs
    run["settings"]["geo_decay"] = "sqrt"
    output = tmp_path / "sweep"
    write_journal(output, [real_journal[0], run])
    refused(sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3"),
            "line 2: settings.geo_decay: expected 'harmonic', found 'sqrt'")  # fmt: skip


def test_a_journal_that_is_a_symbolic_link_is_refused_not_appended_through(tmp_path, corpus, cache, real_journal):
    """Another sweep's journal linked in: the sweep would append its runs into that one."""
    theirs = write_journal(tmp_path / "theirs", real_journal)
    before = theirs.read_bytes()
    output = tmp_path / "sweep"
    output.mkdir()
    (output / "runs.jsonl").symlink_to(theirs)
    result = sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3,4e-3")
    refused(result, f"{output / 'runs.jsonl'} is a symbolic link", "remove the link")
    assert theirs.read_bytes() == before and not (output / "runs").exists()


def model_sweep(tmp_path: Path, corpus: Path, cache: Path, model: object, lrs: str,
                options: list[str] | None = None) -> object:  # fmt: skip
    return sweep(tmp_path / "sweep", corpus, cache, "--model", model, "--styles", "pre", "--lrs", lrs, options=options)


def test_a_model_is_keyed_by_its_content_not_by_the_spelling_of_its_path(tmp_path, corpus, cache, monkeypatch):
    """`./m/` and the absolute path of the same folder are the same sweep; a LLaMA put under the same name as the
    GPT-2 the runs trained is not averaged with them as another rate of one arm."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert invoke("init", "gpt2", "m", "--preset", "tiny").exit_code == 0
    first = model_sweep(tmp_path, corpus, cache, "m", "2e-3")
    assert first.exit_code == 0, first.output
    for spelling in ("./m/", work / "m"):
        again = model_sweep(tmp_path, corpus, cache, spelling, "2e-3")
        assert again.exit_code == 0 and "all 1 runs of the sweep are in" in again.output, again.output
    shutil.rmtree(work / "m")
    assert invoke("init", "llama", "m", "--preset", "tiny").exit_code == 0
    before = journal_of(tmp_path / "sweep")
    refused(model_sweep(tmp_path, corpus, cache, "m", "2e-3,4e-3"), "model fingerprint")
    assert journal_of(tmp_path / "sweep") == before


def test_a_model_whose_weights_were_zeroed_under_the_same_path_is_refused(tmp_path, corpus, cache, real_sweep,
                                                                          real_journal):  # fmt: skip
    trained = real_sweep / json.loads(real_journal[1])["model"]  # the real sweep's final model, relative to it
    model = tmp_path / "model"
    shutil.copytree(trained, model)
    options = ONE_STEP  # the folder has its own tokenizer
    first = model_sweep(tmp_path, corpus, cache, model, "1e-4", options=options)
    assert first.exit_code == 0, first.output
    edited_copy(trained, tmp_path / "zeroed", lambda tensors: [t.zero_() for t in tensors.values()])
    shutil.rmtree(model)
    (tmp_path / "zeroed").rename(model)
    before = journal_of(tmp_path / "sweep")
    refused(model_sweep(tmp_path, corpus, cache, model, "1e-4,2e-4", options=options), "model fingerprint")
    assert journal_of(tmp_path / "sweep") == before


def test_a_corpus_overwritten_while_a_run_trains_is_caught_before_the_next_run(tmp_path, corpus, cache, monkeypatch):
    data = tmp_path / "corpus.txt"
    data.write_text(corpus.read_text())
    real_train, trained = sweep_module._train, []

    def overwritten_during_the_run(run, train, folder, thread_note=None):
        trained.append(run.name)
        entry = real_train(run, train, folder)
        data.write_text(corpus.read_text() + "\nan edit made while the run trained\n")
        return entry

    monkeypatch.setattr(sweep_module, "_train", overwritten_during_the_run)
    output = tmp_path / "sweep"
    result = sweep(output, data, cache, "--styles", "pre", "--lrs", "2e-3,4e-3")
    refused(result, "holds runs on other data", "fingerprint")
    assert trained == ["pre-lr2e-3-seed0"] and len(journal_of(output)) == 2


def test_a_rerun_without_extend_finishes_the_sweep_as_it_began(tmp_path, corpus, cache, real_journal, monkeypatch):
    """Stopped after --extend 1 added 4e-5 (the best), before the confirmation run: the same command without
    --extend confirms at 4e-5, the rate the report names, not at the grid's best; without any sweep option, it finds
    the sweep done. Training is stood in for by the real run's line at each rate, with losses set here."""
    template = json.loads(real_journal[1])
    losses = {(1e-5, 0): 5.0, (2e-5, 0): 4.9, (4e-5, 0): 4.8, (4e-5, 1): 4.85, (2e-5, 1): 4.95}
    trained: list[str] = []
    stop_at = [4]

    def stand_in(run, train, folder, thread_note=None):
        trained.append(run.name)
        if len(trained) == stop_at[0]:
            raise KeyboardInterrupt
        loss = losses[(run.lr, run.seed)]
        return at_rate(template, run.lr, run.seed, val_loss=loss, test_loss=loss)

    monkeypatch.setattr(sweep_module, "_train", stand_in)
    output = tmp_path / "sweep"
    grid = ["--styles", "pre", "--lrs", "1e-5,2e-5", "--confirm-seeds", "1"]
    bare_options = RUN_OPTIONS + VOCAB  # the sweep options are the ones given below, or the journal's
    stopped = sweep(output, corpus, cache, *grid, "--extend", "1", options=bare_options)
    assert stopped.exit_code == 130, stopped.output
    assert [json.loads(line)["lr"] for line in journal_of(output)[1:]] == [1e-5, 2e-5, 4e-5]
    trained.clear()
    stop_at[0] = 0
    result = sweep(output, corpus, cache, *grid, options=bare_options)
    assert result.exit_code == 0, result.output
    assert trained == ["pre-lr4e-5-seed1"]
    assert "| 0 steps | 4e-5 | 2 |" in (output / "sweep.md").read_text()
    bare = sweep(output, corpus, cache, options=bare_options)
    assert bare.exit_code == 0 and "all 4 runs of the sweep are in" in bare.output, bare.output
    assert trained == ["pre-lr4e-5-seed1"]


def test_each_line_carries_the_options_and_fingerprints_of_its_run(real_journal):
    """Each line carries the options that shaped it and the fingerprints of its data, tokenizer and model."""
    header, run = json.loads(real_journal[0]), json.loads(real_journal[1])
    assert run["train_options"]["seq_len"] == 32 and run["train_options"]["batch_size"] == 4
    assert run["fingerprints"]["data"] == header["fingerprints"]["data"] == run["data"]["fingerprint"]
    assert run["fingerprints"]["tokenizer"] == run["data"]["tokenizer"] and run["fingerprints"]["model"] is None


def test_a_journal_of_an_earlier_hf_geonorm_is_read_but_not_appended_to(tmp_path, corpus, cache):
    """A format-1 journal (the study's): its lines record neither their options nor the model's content, so a sweep
    cannot check them; `info` still reads it."""
    committed = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "sweeps" / "b_gcide" / "runs.jsonl"
    output = tmp_path / "sweep"
    path = write_journal(output, committed.read_text().splitlines())
    before = path.read_bytes()
    refused(sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3"), "earlier hf-geonorm (format 1)")
    assert path.read_bytes() == before
    described = invoke("info", output)
    assert described.exit_code == 0 and "sweep" in described.output, described.output


def test_a_journal_naming_the_removed_save_final_only_resumes(tmp_path, corpus, cache, real_journal):
    """The study's journals name ``save_final_only`` (false) in their header and in every line: an option since
    removed. Such a journal resumes: the next rate trains and its line, which no longer names it, is appended."""
    header, run = json.loads(real_journal[0]), json.loads(real_journal[1])
    assert "save_final_only" not in header["train_options"]
    header["train_options"]["save_final_only"] = False  # as an earlier hf-geonorm wrote it, its digest with it
    header["digest"] = digest(header)
    run["train_options"]["save_final_only"] = False
    output = tmp_path / "sweep"
    path = write_journal(output, [header, run])
    result = sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3,4e-3")
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[:2] == [header, run]
    assert [line["run"] for line in lines[1:]] == ["pre-lr2e-3-seed0", "pre-lr4e-3-seed0"]
    assert "save_final_only" not in lines[2]["train_options"]
    with pytest.raises(RecordError, match=r"^a record: seq_len: expected 32, found 16$"):  # other options still count
        check_record({**lines[2], "train_options": {**lines[2]["train_options"], "seq_len": 16}}, header)


def test_check_record_and_check_same_sweep_validate_records_from_any_store(real_journal):
    """The checks a store other than the journal (a database) makes of a run and of its sweep: the real sweep's
    header and line pass; one field changed is named, with where the caller says the record is."""
    header, run = json.loads(real_journal[0]), json.loads(real_journal[1])
    check_header(header, where="row 1")
    check_record(run, header, where="row 7")
    with pytest.raises(RecordError, match=r"^row 7: seq_len: expected 32, found 16$"):
        check_record({**run, "train_options": {**run["train_options"], "seq_len": 16}}, header, where="row 7")
    with pytest.raises(RecordError, match=r"^row 7: fingerprints.model: expected None, found 'abc'$"):
        check_record({**run, "fingerprints": {**run["fingerprints"], "model": "abc"}}, header, where="row 7")
    with pytest.raises(RecordError, match=r"^row 1: the header was edited"):
        check_header({**header, "sweep_options": {"extend": 2}}, where="row 1")
    identity = {name: header[name] for name in ("train_options", "settings", "fingerprints")}
    check_same_sweep(header, {**identity, "train_options": {**identity["train_options"], "data": "./elsewhere"}})
    moved = {**identity, "fingerprints": {**identity["fingerprints"], "data": "0" * 64}}
    with pytest.raises(RecordError, match="the header: fingerprints.data: expected '"):
        check_same_sweep(header, moved)


def test_a_run_whose_record_shows_other_data_is_not_appended(tmp_path, corpus, cache, real_journal, monkeypatch):
    """The data changed between the check before the run and the run's own read of it: the run's record names
    other data, and the journal is left as it was."""
    template = json.loads(real_journal[1])
    other = {**template["data"], "fingerprint": "0" * 64}
    monkeypatch.setattr(sweep_module, "_train",
                        lambda run, train, folder, thread_note=None: at_rate(template, run.lr, data=other))
    output = tmp_path / "sweep"
    path = write_journal(output, real_journal)
    before = path.read_bytes()
    refused(sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3,4e-3"),
            "run pre lr 4e-3 seed 0 is not recorded", f"data.fingerprint: expected '{template['data']['fingerprint']}'")
    assert path.read_bytes() == before


def test_a_diverged_run_is_recorded_with_its_identity_and_resumes(tmp_path, corpus, cache, real_journal, monkeypatch):
    """A run whose loss stops being finite: its line has null losses, steps and tokens, its reason, and the
    settings its model was built with; the next sweep reads it as a run of the sweep."""
    from hf_geonorm.errors import NonFiniteError

    def diverges(options, log):
        raise NonFiniteError("the training loss is nan at step 1")

    monkeypatch.setattr(sweep_module, "run_training", diverges)
    output = tmp_path / "sweep"
    write_journal(output, real_journal)
    result = sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3,4e-3")
    assert result.exit_code == 0, result.output
    line = json.loads(journal_of(output)[2])
    assert (line["val_loss"], line["steps"], line["tokens"]) == (None, None, None)
    assert "nan at step 1" in line["diverged"] and line["settings"] == json.loads(real_journal[1])["settings"]
    again = sweep(output, corpus, cache, "--styles", "pre", "--lrs", "2e-3,4e-3")
    assert again.exit_code == 0 and "all 2 runs of the sweep are in" in again.output, again.output
