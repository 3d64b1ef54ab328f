"""`hf-geonorm sweep` (hf_geonorm.sweep): a 2-style x 2-rate grid trained end to end, resumed after a stop,
refused with other options, its choice checked against a selection written out here, and one run's test loss
recomputed from its saved model and by training it again through `hf-geonorm train`."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM

from hf_geonorm.sweep import grid as sweep_module
from hf_geonorm.sweep.grid import journal_key, open_journal
from hf_geonorm.sweep.journal import check_options, entry_key, header_options, load_journal
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.sweep.protocol import most_left, walk
from hf_geonorm.sweep.record import sweep_header
from hf_geonorm.sweep.report import at_edge, best_rates
from hf_geonorm.training.data.pipeline import ArrowBlocks
from hf_geonorm.training.options import FINE_TUNING_LR, TrainOptions
from hf_geonorm.training.rate_rule import RATE_RULE
from hf_geonorm_cli.main import cli

from support.helpers import FIXED, TINY, write_sweep_journal
from support.tiny_models import tiny_model


def sweep_args(corpus: Path, output: Path, *more: str) -> list[str]:
    return ["sweep", "--output", str(output), "--styles", "pre,geo", "--lrs", "2e-3,8e-3", "--seeds", "0",
            "--data", str(corpus), "--data-cache", str(output.parent / "cache"), *TINY, *FIXED, *more]  # fmt: skip


def journal(output: Path) -> list[str]:
    return (output / "runs.jsonl").read_text().splitlines()


def test_a_sweep_stopped_after_its_first_run_resumes_with_the_rest_only(tmp_path, corpus, monkeypatch):
    output = tmp_path / "sweep"
    trained: list[str] = []
    real_train = sweep_module._train

    def stop_after_one(run, train, folder, thread_note=None):
        if trained:
            raise KeyboardInterrupt  # the stop, as Ctrl-C or the end of a session
        trained.append(run.name)
        return real_train(run, train, folder)

    monkeypatch.setattr(sweep_module, "_train", stop_after_one)
    stopped = CliRunner().invoke(cli, sweep_args(corpus, output))
    assert stopped.exit_code != 0 and "run 1/4: pre lr 2e-3 seed 0" in stopped.output
    first = journal(output)
    assert len(first) == 2 and json.loads(first[1])["run"] == "pre-lr2e-3-seed0"

    def counted(run, train, folder, thread_note=None):
        trained.append(run.name)
        return real_train(run, train, folder)

    monkeypatch.setattr(sweep_module, "_train", counted)
    result = CliRunner().invoke(cli, sweep_args(corpus, output))
    assert result.exit_code == 0, result.output
    assert trained[1:] == ["pre-lr8e-3-seed0", "geo-lr2e-3-seed0", "geo-lr8e-3-seed0"]  # the missing runs only
    lines = journal(output)
    assert lines[:2] == first and len(lines) == 5  # the finished run's line is unchanged
    entries = [json.loads(line) for line in lines[1:]]
    for entry in entries:
        assert {"style", "settings", "lr", "seed", "steps", "tokens", "val_loss", "test_loss"} <= set(entry)
        assert entry["steps"] == 3 and entry["tokens"] == 3 * 4 * 32
        assert entry["settings"]["norm_style"] == entry["style"]
        assert math.isfinite(entry["val_loss"]) and math.isfinite(entry["test_loss"])

    # the choice: each style's lowest validation loss, written out here; test losses play no part
    chosen = {style: min((e for e in entries if e["style"] == style), key=lambda e: e["val_loss"])["lr"]
              for style in ("pre", "geo")}  # fmt: skip
    assert best_rates(entries) == chosen
    report = (output / "sweep.md").read_text()
    for style, lr in chosen.items():
        cell = next(e for e in entries if e["style"] == style and e["lr"] == lr)
        row = (f"| 0 steps | {sweep_module.rate_text(lr)} | 1 | {cell['val_loss']:.4f} | {cell['test_loss']:.4f} | "
               f"0: {cell['test_loss']:.4f} |")  # the arm's name may carry flags (a unigram-level loss)  # fmt: skip
        assert any(line.startswith(f"| {style}") and row in line for line in report.splitlines()), report
    assert (output / "sweep.png").read_bytes().startswith(b"\x89PNG")

    again = CliRunner().invoke(cli, sweep_args(corpus, output))
    assert again.exit_code == 0 and "all 4 runs of the sweep are in" in again.output and len(trained) == 4

    # one run's test loss, recomputed: its saved model on the test blocks, by a plain loop (not Trainer's)
    entry = entries[2]
    model = AutoModelForCausalLM.from_pretrained(output / entry["model"]).eval()  # relative to the sweep's folder
    [folder] = (tmp_path / "cache").glob("blocks-*")
    meta = json.loads((folder / "meta.json").read_text())
    blocks = ArrowBlocks(folder / "test.arrow", 32, meta["test_blocks"])
    with torch.no_grad():
        ids = [blocks[i]["input_ids"][None] for i in range(len(blocks))]
        losses = [model(input_ids=block, labels=block).loss for block in ids]
    assert torch.stack(losses).mean().item() == pytest.approx(entry["test_loss"], abs=1e-5)

    # and by training that run again through `hf-geonorm train`
    retrained = tmp_path / "retrained"
    result = CliRunner().invoke(cli, [
        "train", "--norm-style", entry["style"], "--lr", str(entry["lr"]), "--seed", "0", "--data", str(corpus), *TINY,
        "--data-cache", str(tmp_path / "cache"), "--output", str(retrained),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = json.loads((retrained / "metrics.json").read_text())
    assert metrics["final_test_loss"] == pytest.approx(entry["test_loss"], abs=1e-5)
    assert metrics["final_eval_loss"] == pytest.approx(entry["val_loss"], abs=1e-5)

    # the sweep's folder is its output: --force replaces it, but not with a file of the user's in its logs
    (output / "logs" / "notes.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["init", "gpt2", str(output), "--preset", "tiny", "--force"])
    assert result.exit_code != 0 and "did not write there, or changed since (logs/notes.txt)" in result.output
    assert (output / "logs" / "notes.txt").read_text() == "mine" and len(journal(output)) == 5
    (output / "logs" / "notes.txt").unlink()
    result = CliRunner().invoke(cli, ["init", "gpt2", str(output), "--preset", "tiny", "--force"])
    assert result.exit_code == 0, result.output
    assert not (output / "runs.jsonl").exists() and (output / "config.json").is_file()


def test_a_sweep_with_other_options_is_refused_not_mixed(tmp_path, corpus):
    output = tmp_path / "sweep"
    first = CliRunner().invoke(cli, sweep_args(corpus, output, "--styles", "pre", "--lrs", "2e-3"))
    assert first.exit_code == 0, first.output
    changed = CliRunner().invoke(cli, [*sweep_args(corpus, output, "--styles", "pre", "--lrs", "2e-3"),
                                       "--seq-len", "16"])  # fmt: skip
    assert changed.exit_code == 1 and "holds runs made with other options" in changed.output
    assert "seq_len 32 there, 16 now" in changed.output and "Traceback" not in changed.output
    assert len(journal(output)) == 2
    grown = CliRunner().invoke(cli, sweep_args(corpus, output, "--styles", "pre", "--lrs", "2e-3,4e-3"))
    assert grown.exit_code == 0 and len(journal(output)) == 3  # more rates: the same sweep, grown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--norm-style", "geo"], "No such option '--norm-style'"),  # the grid sets it: sweep does not offer it
        (["--alpha", "0.3", "--alphas", "0.5"], "give --alphas, not --alpha"),
        (["--lrs", "2e-3", "--lr-range", "1e-3", "4e-3"], "give --lrs or --lr-range, not both"),
        (["--styles", "pre,nope"], "unknown norm style 'nope'"),
        (["--styles", "pre", "--alphas", "0.5"], "add geo to --styles"),
        (["--lrs", "2e-3,,4e-3"], "has an empty item"),
        (["--seeds", "0,0"], "names a value twice"),
    ],
)
def test_bad_sweep_options_are_one_line_errors(tmp_path, args, message):
    result = CliRunner().invoke(cli, ["sweep", "--output", str(tmp_path / "s"), *args])
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "s").exists()


def test_the_choice_compares_rates_on_their_common_seeds_and_flags_edges():
    def run(style, lr, seed, val):
        return {"style": style, "alpha": None, "lr": lr, "seed": seed, "val_loss": val, "test_loss": val}

    runs = [run("pre", 1e-3, 0, 5.0), run("pre", 2e-3, 0, 4.9), run("pre", 4e-3, 0, 5.2),
            run("pre", 2e-3, 1, 5.5), run("pre", 2e-3, 2, 5.6),  # seeded later: seed 0 decides, 4.9 < 5.0
            run("geo", 1e-3, 0, 5.0), run("geo", 2e-3, 0, 4.8), run("geo", 4e-3, 0, None)]  # fmt: skip
    assert best_rates(runs) == {"pre": 2e-3, "geo": 2e-3}
    assert at_edge(runs) == {}
    runs.append(run("geo", 8e-3, 0, 4.0))  # a diverged rate below a better one: still the edge
    assert best_rates(runs)["geo"] == 8e-3 and at_edge(runs) == {"geo": "highest"}


def test_lr_range_doubles_from_low_to_high():
    assert SweepOptions(lr_range=(1e-3, 32e-3)).rates() == tuple(1e-3 * 2**i for i in range(6))
    assert SweepOptions(lr_range=(1e-3, 5e-3)).rates() == (1e-3, 2e-3, 4e-3)


@pytest.mark.parametrize(("arch", "width", "depth"), [("gpt2", 128, 4), ("llama", 128, 4)])
def test_the_default_grid_is_each_styles_default_rate_from_a_half_to_twice(arch, width, depth):
    """Without --lrs or --lr-range each style's grid centres on the rate train would give it (at the tiny preset, a
    cell the study measured: its best rate, read from the rule's file here; LLaMA GeoNorm, until phase i measures it
    at 4 x 128, the geometric mean of its cells at widths 64 and 256) at 1/2, 1 and 2 times (the walk extends it at
    an edge); a rate no cell measured gets a wider grid (tests/training/test_default_rates.py)."""
    table = json.loads(RATE_RULE.read_text())
    best = {(c["arch"], c["style"], c["width"], c["layers"]): c["lr"] for c in table["cells"]}
    logged: list[str] = []
    grids = sweep_module.style_grids(SweepOptions(styles=("pre", "geo")), TrainOptions(arch=arch), logged.append)
    assert (arch, "pre", width, depth) in best
    for style in ("pre", "geo"):
        if (arch, style, width, depth) in best:
            centre, source = best[(arch, style, width, depth)], f"measured cell: {style}'s best rate at {arch}"
        else:
            low, high = best[(arch, style, width // 2, depth)], best[(arch, style, width * 2, depth)]
            centre, source = float(f"{math.sqrt(low * high):.2g}"), f"between measured cells: {style}'s best rates"
        assert grids[style] == (centre / 2, centre, centre * 2)
        assert any(line.startswith(f"{style}: starting rates ") and source in line for line in logged), logged
    given = sweep_module.style_grids(SweepOptions(styles=("pre", "geo"), lrs=(1e-3,)), TrainOptions(), logged.append)
    assert given == {"pre": (1e-3,), "geo": (1e-3,)}


def test_the_default_grid_of_a_fine_tune_centres_on_the_fine_tuning_rate(tmp_path):
    tiny_model("gpt2").save_pretrained(tmp_path / "trained")
    grids = sweep_module.style_grids(SweepOptions(styles=("geo",)), TrainOptions(model=str(tmp_path / "trained")),
                                     lambda _: None)  # fmt: skip
    assert grids["geo"] == tuple(FINE_TUNING_LR * factor for factor in (0.5, 1, 2))


def test_a_journal_started_before_an_option_existed_resumes_at_that_options_default(tmp_path):
    """A header written by an earlier hf-geonorm lacks the options added since; its runs ran as their defaults do
    (a header of either format)."""
    options = TrainOptions(data="corpus.txt", seq_len=32)
    key = {name: value for name, value in json.loads(json.dumps(journal_key(options))).items()
           if name not in ("text_column", "data_split")}  # fmt: skip
    identity = {"train_options": key, "settings": {}, "fingerprints": {"data": "d", "tokenizer": "t", "model": None}}
    for header in ({"format": 1, "train_options": key}, sweep_header(identity, {})):
        (tmp_path / "runs.jsonl").write_text(json.dumps(header) + "\n")
        assert open_journal(tmp_path, options) == (tmp_path / "runs.jsonl", [])
    with pytest.raises(ValueError, match="text_column 'text' there, 'body' now"):
        open_journal(tmp_path, replace(options, text_column="body"))


# --- the study's protocol in one command and the journal's checks ---


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """One data cache for the tests below: the corpus is tokenized once."""
    return tmp_path_factory.mktemp("sweep-cache")


def user_sweep(corpus: Path, output: Path, cache: Path, *more: str) -> list[str]:
    return ["sweep", "--output", str(output), "--data", str(corpus), "--data-cache", str(cache), *TINY, *FIXED,
            *more]  # fmt: skip


def entries_of(output: Path) -> list[dict]:
    return [json.loads(line) for line in journal(output)[1:]]


def test_extend_and_confirm_seeds_run_the_studys_protocol_and_resume(tmp_path, corpus, shared_cache):
    """Two rates: each arm's best is at an edge, so --extend 1 adds one rate beyond it; --confirm-seeds 1 runs seed
    1 at the best rate only. The choice is recomputed here from the journal's seed-0 losses."""
    output = tmp_path / "sweep"
    args = user_sweep(corpus, output, shared_cache, "--styles", "pre,geo", "--lrs", "1e-5,2e-5", "--seeds", "0",
                      "--extend", "1", "--confirm-seeds", "1")  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "To train: 4 run(s) now, at most 8 with the steps and confirmation runs" in result.output
    assert "up to 1 rate(s) beyond an edge" in result.output
    assert "time estimate: about" in result.output
    entries = entries_of(output)
    expected = {}
    for style in ("pre", "geo"):
        mine = [e for e in entries if e["style"] == style]
        grid = {e["lr"]: e["val_loss"] for e in mine if e["role"] == "grid"}
        assert sorted(grid) == [1e-5, 2e-5] and {e["seed"] for e in mine if e["role"] == "grid"} == {0}
        best = min(grid, key=lambda lr: (grid[lr], lr))
        beyond = 4e-5 if best == 2e-5 else 5e-6  # one grid step (a factor 2) beyond the edge it is at
        [extension] = [e for e in mine if e["role"] == "extension"]
        assert (extension["lr"], extension["seed"]) == (beyond, 0)
        grid[beyond] = extension["val_loss"]
        chosen = min(grid, key=lambda lr: (grid[lr], lr))
        [confirmation] = [e for e in mine if e["role"] == "confirmation"]
        assert (confirmation["lr"], confirmation["seed"]) == (chosen, 1)
        assert len(mine) == 4
        expected[style] = chosen
    assert best_rates(entries) == expected
    report = (output / "sweep.md").read_text()
    for style, lr in expected.items():
        # the test table: two seeds (these rates barely train: the arms are flagged beside the unigram row)
        assert any(line.startswith(f"| {style} (") and f"| 0 steps | {sweep_module.rate_text(lr)} | 2 |" in line
                   and "not yet learning from context" in line for line in report.splitlines())  # fmt: skip
    assert "## What was swept" in report and "3 steps x 128 tokens = 384 tokens" in report
    # --warmup-steps fixed the warm-up and two seeds ran at each chosen cell: sweep.md says so first
    assert report.splitlines()[2].startswith("**Not tuned: the warm-up.**")
    assert report.splitlines()[4].startswith("**2 seeds** at the chosen cell of geo and pre")
    header = json.loads(journal(output)[0])
    assert f"data fingerprint and tokenizer hash: fingerprint {header['fingerprints']['data'][:16]}" in report
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "all 8 runs of the sweep are in" in again.output, again.output
    assert len(entries_of(output)) == 8


def test_a_sweep_refuses_a_non_empty_folder_without_a_journal(tmp_path):
    """The user's own sweep.md and runs/ stay as they were."""
    output = tmp_path / "mine"
    (output / "runs" / "pre-lr1e-3-seed0").mkdir(parents=True)
    (output / "sweep.md").write_text("my notes")
    (output / "runs" / "pre-lr1e-3-seed0" / "model.safetensors").write_bytes(b"weights")
    result = CliRunner().invoke(cli, ["sweep", "--output", str(output), "--lrs", "1e-3"])
    assert result.exit_code == 2 and "is not empty (runs, sweep.md) and holds no sweep journal" in result.output
    assert (output / "sweep.md").read_text() == "my notes" and not (output / "runs.jsonl").exists()
    assert (output / "runs" / "pre-lr1e-3-seed0" / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize("journal_text", ["", "\n", '{"my": "own log"}\n'], ids=["empty", "blank", "foreign"])
def test_a_journal_without_a_sweep_header_does_not_make_a_folder_a_sweep(tmp_path, corpus, journal_text):
    """An empty runs.jsonl made a folder count as a sweep's, and the user's sweep.md beside it was overwritten."""
    output = tmp_path / "mine"
    output.mkdir()
    (output / "runs.jsonl").write_text(journal_text)
    (output / "sweep.md").write_text("my notes")
    result = CliRunner().invoke(cli, sweep_args(corpus, output))
    assert result.exit_code != 0, result.output
    assert "holds no sweep journal" in result.output or "not the header of an hf-geonorm sweep journal" in result.output
    assert (output / "sweep.md").read_text() == "my notes" and (output / "runs.jsonl").read_text() == journal_text
    assert sorted(p.name for p in output.iterdir()) == ["runs.jsonl", "sweep.md"]


def test_a_journal_line_cut_short_by_a_stop_is_dropped_its_run_retrained_and_the_file_repaired(
    tmp_path, corpus, shared_cache
):
    """The rerun drops the half line (and says so) instead of appending onto it, and the run after
    that reads a whole journal."""
    output = tmp_path / "sweep"
    args = user_sweep(corpus, output, shared_cache, "--styles", "pre", "--lrs", "2e-3")
    assert CliRunner().invoke(cli, args).exit_code == 0
    path = output / "runs.jsonl"
    whole = path.read_text()
    path.write_text(whole[: len(whole) - 40])  # the stop came while the run's line was being written
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "line 2 was cut short when the sweep was stopped: dropped (its run trains again)" in result.output
    assert "run 1/1: pre lr 2e-3 seed 0" in result.output
    lines = journal(output)
    assert len(lines) == 2 and json.loads(lines[1])["run"] == "pre-lr2e-3-seed0"
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "all 1 runs of the sweep are in" in again.output, again.output


def test_rates_that_round_alike_get_their_own_runs_and_the_report_states_how_rates_are_written(
    tmp_path, corpus, shared_cache
):
    """1.6e-2 and 1.6000001e-2 no longer share a folder; 16e-3 as typed is written 1.6e-2,
    and the report says so with its value."""
    output = tmp_path / "sweep"
    args = user_sweep(corpus, output, shared_cache, "--styles", "pre", "--lrs", "16e-3,1.6000001e-2")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    names = sorted(entry["run"] for entry in entries_of(output))
    assert names == ["pre-lr1.6000001e-2-seed0", "pre-lr1.6e-2-seed0"]
    assert sorted(p.name for p in (output / "runs").iterdir()) == names
    report = (output / "sweep.md").read_text()
    assert "| arm | 1.6e-2 | 1.6000001e-2 |" in report and "16e-3 is 1.6e-2" in report
    assert "1.6e-2 (0.016)" in report
    # the ordinary rates keep the names of the committed journals; alphas that round alike do not collide either
    assert [sweep_module.rate_text(lr) for lr in (1e-3, 2.5e-4, 1.25e-4, 3.2e-2, 1e-3 * 2**5)] == [
        "1e-3", "2.5e-4", "1.25e-4", "3.2e-2", "3.2e-2"]  # fmt: skip
    assert sweep_module.Run("geo", 0.5, 1e-3, 0).name != sweep_module.Run("geo", 0.5000001, 1e-3, 0).name


def test_the_journal_keys_the_data_by_content_not_by_the_paths_spelling(tmp_path, corpus, shared_cache, monkeypatch):
    """An edited corpus is refused (its runs would average with the earlier file's); the same file
    named from another folder, relative, is the same data."""
    data = tmp_path / "work" / "corpus.txt"
    data.parent.mkdir()
    data.write_text(corpus.read_text())
    output = tmp_path / "sweep"
    first = CliRunner().invoke(cli, user_sweep(data, output, shared_cache, "--styles", "pre", "--lrs", "2e-3"))
    assert first.exit_code == 0, first.output
    data.write_text(corpus.read_text() + "\nan edit the user made later\n")
    edited = CliRunner().invoke(cli, user_sweep(data, output, shared_cache, "--styles", "pre", "--lrs", "2e-3,4e-3"))
    assert edited.exit_code == 1 and "holds runs on other data: the fingerprint" in edited.output, edited.output
    assert len(journal(output)) == 2
    data.write_text(corpus.read_text())
    monkeypatch.chdir(tmp_path / "work")
    relative = CliRunner().invoke(cli, user_sweep(Path("corpus.txt"), output, shared_cache, "--styles", "pre",
                                                  "--lrs", "2e-3,4e-3"))  # fmt: skip
    assert relative.exit_code == 0, relative.output
    assert [e["lr"] for e in entries_of(output)] == [2e-3, 4e-3]


def user_journal(output: Path, corpus: Path, lines: list[dict | str]) -> None:
    """A journal as a sweep with ``user_sweep``'s options writes it, with ``lines`` after its header."""
    options = TrainOptions(data=str(corpus), seq_len=32, batch_size=4, vocab_size=300, max_steps=3, eval_every=3,
                           warmup_steps=0, eval_blocks=8)  # fmt: skip
    write_sweep_journal(output / "runs.jsonl", options, lines)


def user_run(rate: float, val: float | None = 5.0, seed: int = 0, **changes) -> dict:
    """A finished run's line, as ``_train`` writes it, at ``rate`` (``changes``: fields as a damaged line has them;
    ``write_sweep_journal`` adds the sweep's identity)."""
    trained = val is not None
    entry = {"run": sweep_module.Run("pre", None, rate, seed).name, "style": "pre", "alpha": None, "lr": rate,
             "seed": seed, "settings": {"norm_style": "pre"}, "steps": 3 if trained else None,
             "tokens": 384 if trained else None, "val_loss": val, "test_loss": val, "train_seconds": 1.0}  # fmt: skip
    return {**entry, **changes}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([user_run(2e-3), user_run(2e-3)], "line 3: run pre-lr2e-3-seed0 again (first on line 2)"),
        ([user_run(2e-3), user_run(4e-3, val_loss=math.nan)], "line 3: val_loss: expected a finite loss >= 0, "
                                                                 "found nan"),  # fmt: skip
        ([user_run(2e-3, steps=300)], "line 2: steps: expected 3, found 300"),
        ([user_run(2e-3, lr=4e-3)], "line 2: run 'pre-lr2e-3-seed0' is not the name of its own run (pre-lr4e-3-seed0)"),
        ([user_run(2e-3, settings={"norm_style": "geo"})], "line 2: settings.norm_style: expected 'pre', found 'geo'"),
        (["not json", user_run(2e-3)], "line 2: not a line of JSON"),
        ([[1, 2]], "line 2: not a run (a JSON object)"),
        ([{"run": "x"}], "line 2: a run without style, alpha, lr, seed, val_loss, test_loss"),
        ([user_run(2e-3, train_options="x")], "line 2: train_options: expected a JSON object, found 'x'"),
        ([user_run(2e-3, lr="2e-3")], "line 2: lr '2e-3' is not a positive finite number"),
        ([user_run(2e-3, seed=True)], "line 2: seed True is not a whole number"),
        ([user_run(2e-3, test_loss=None)], "line 2: val_loss 5.0, test_loss None: one loss null, not both"),
        ([user_run(2e-3, warmup_steps="six")], "line 2: warmup_steps 'six' is not a whole number >= 0"),
        ([user_run(2e-3, evaluated_blocks={"validation": 8})], "line 2: evaluated_blocks {'validation': 8} is not"),
        ([user_run(2e-3, training_seconds=-1.0)], "line 2: training_seconds -1.0 is not a finite number of seconds"),
    ],
)
def test_journal_lines_that_do_not_hold_a_run_of_this_sweep_are_refused_by_line(tmp_path, corpus, lines, message):
    """Duplicates, NaN, another sweep's steps or rate, other settings and
    malformed lines are named with their line number, never a TypeError or KeyError, and nothing trains."""
    output = tmp_path / "sweep"
    user_journal(output, corpus, lines)
    before = (output / "runs.jsonl").read_text()
    result = CliRunner().invoke(cli, user_sweep(corpus, output, tmp_path / "cache", "--styles", "pre", "--lrs",
                                                "2e-3,4e-3"))  # fmt: skip
    assert result.exit_code == 1 and message in result.output, result.output
    assert "Error" in result.output and "runs.jsonl, line" in result.output
    for word in ("Traceback", "TypeError", "KeyError"):
        assert word not in result.output
    assert (output / "runs.jsonl").read_text() == before and not (output / "runs").exists()


def test_a_run_log_that_is_a_symbolic_link_is_refused_not_written_through(tmp_path, corpus, shared_cache):
    """``logs/NAME.log`` linked to a file of the user's: the sweep stops before that run, naming the link, and the
    file is as it was."""
    output = tmp_path / "sweep"
    user_journal(output, corpus, [user_run(2e-3)])
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    (output / "logs").mkdir()
    (output / "logs" / "pre-lr4e-3-seed0.log").symlink_to(mine)
    result = CliRunner().invoke(cli, user_sweep(corpus, output, shared_cache, "--styles", "pre", "--lrs",
                                                "2e-3,4e-3"))  # fmt: skip
    assert result.exit_code == 1, result.output
    last = result.output.rstrip().splitlines()[-1]
    assert last.startswith(f"Error: {output / 'logs' / 'pre-lr4e-3-seed0.log'} is a symbolic link"), last
    assert "remove the link" in last
    assert mine.read_text() == "my notes\n" and (output / "logs" / "pre-lr4e-3-seed0.log").is_symlink()
    assert len(journal(output)) == 2 and not (output / "runs" / "pre-lr4e-3-seed0").exists()


def test_a_sweep_where_every_rate_diverged_says_no_rate_trained(tmp_path, corpus):
    """A journal whose every run diverged gets a report with no bold best and no "by nan": it says
    that no rate trained."""
    output = tmp_path / "sweep"
    diverged = {"diverged": "the training loss is nan at step 2"}
    geo = {"style": "geo", "settings": {"norm_style": "geo"}, **diverged}
    user_journal(output, corpus, [
        user_run(2e-3, None, **diverged), user_run(4e-3, None, **diverged),
        user_run(2e-3, None, **geo, run="geo-lr2e-3-seed0"), user_run(4e-3, None, **geo, run="geo-lr4e-3-seed0"),
    ])  # fmt: skip
    result = CliRunner().invoke(cli, user_sweep(corpus, output, tmp_path / "cache", "--styles", "pre,geo", "--lrs",
                                                "2e-3,4e-3"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "every run of pre diverged: no rate trained" in result.output
    report = (output / "sweep.md").read_text()
    assert "**" not in report.split("## The arms")[0].split("bold**")[-1] and "nan" not in report
    assert "| pre | none: no rate trained |" in report and "| geo | none: no rate trained |" in report
    assert "No rate trained: every run of every arm diverged" in report and "lowest on test" not in report


def test_the_ctrl_c_message_is_true_no_checkpoint_of_the_stopped_run_is_left(tmp_path, corpus, monkeypatch):
    """A run stopped after writing a checkpoint: the sweep removes it (it resumes by whole runs) and says so."""
    output = tmp_path / "sweep"

    def stopped_after_a_checkpoint(options, log):
        (Path(options.output) / "checkpoint-2").mkdir(parents=True)
        (Path(options.output) / "checkpoint-2" / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "run_training", stopped_after_a_checkpoint)
    result = CliRunner().invoke(cli, user_sweep(corpus, output, tmp_path / "cache", "--styles", "pre", "--lrs", "2e-3"))
    assert result.exit_code == 130 and "the run that was training left no checkpoint" in result.output, result.output
    assert "no partial output is left" not in result.output
    assert not list(output.glob("runs/*/checkpoint-*"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "-1"], "--seeds: seed -1 is not a whole number from 0 to 4294967295"),
        (["--seeds", "0,99999999999999999999"], "--seeds: seed 99999999999999999999 is not a whole number"),
        (["--confirm-seeds", "-3"], "--confirm-seeds: seed -3 is not"),
        (["--confirm-seeds", "0"], "--confirm-seeds names 0, already in --seeds"),
        (["--lr-range", "1e-300", "1e300"], "spans 1994 rates a factor 2 apart; a sweep takes at most 64"),
        (["--extend", "100"], "Invalid value for '--extend'"),
        (["--output", ""], "--output is empty"),
    ],
)
def test_bad_seeds_ranges_and_outputs_are_refused_up_front_naming_the_option(tmp_path, args, message):
    output = tmp_path / "s"
    result = CliRunner().invoke(cli, ["sweep", "--output", str(output), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output and "OverflowError" not in result.output and not output.exists()


COMMITTED = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "sweeps").glob("*/runs.jsonl"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: path.parent.name)
def test_every_committed_journal_reads_and_its_sweep_planned_again_has_nothing_left_to_train(path):
    """The study's journals (format 1) read with this code: they pass the line checks their lines allow, their
    options match a sweep given the header's, and the grid each arm ran (seed 0) and the seeds at each rate are all
    found done. A study in progress commits its journal's header before the first run ends, so a journal may hold
    a header alone."""
    journal_read = load_journal(path)
    assert journal_read.header is not None and journal_read.cut_line is None
    train = TrainOptions(**header_options(journal_read.header))
    check_options(journal_read, train)
    plan = journal_read.header.get("sweep_options", {})  # none in a format-1 header
    if "warmup_shares" in plan:  # a sweep of the default protocol (phase j, maybe in progress): every run it holds
        # is one its protocol reaches from its plan, so the same command resumes it
        begun, _ = SweepOptions().as_begun(plan, given=())
        grids = sweep_module.style_grids(begun, train, lambda _: None, journal_read.header)
        reached = set(walk(begun.resolved(), grids, journal_read.entries).reached)
        assert {entry_key(entry) for entry in journal_read.entries} <= reached, path
        return
    by_arm: dict[tuple, dict[float, set[int]]] = {}
    for entry in journal_read.entries:
        by_arm.setdefault((entry["style"], entry["alpha"]), {}).setdefault(entry["lr"], set()).add(entry["seed"])
    for (style, alpha), rates in by_arm.items():
        alphas = None if alpha is None else (alpha,)
        grid = tuple(lr for lr, seeds in rates.items() if 0 in seeds)
        before = {"warmup_shares": None, "confirm_seeds": (), "extend": 0}  # the protocol these journals ran
        sweeps = [SweepOptions(styles=(style,), alphas=alphas, lrs=grid, seeds=(0,), **before)] if grid else []
        sweeps += [SweepOptions(styles=(style,), alphas=alphas, lrs=(lr,), seeds=tuple(sorted(seeds)), **before)
                   for lr, seeds in rates.items()]  # fmt: skip
        for sweep in sweeps:
            assert most_left(sweep, {style: sweep.rates()}, journal_read.entries) == 0, (path, sweep)


# --- the journal and --extend as the messages name them ---


def test_a_journal_that_is_a_folder_is_a_one_line_error_naming_it(tmp_path, corpus):
    output = tmp_path / "sweep"
    (output / "runs.jsonl").mkdir(parents=True)
    result = CliRunner().invoke(cli, user_sweep(corpus, output, tmp_path / "cache", "--styles", "pre", "--lrs", "2e-3"))
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == (
        f"Error: {output / 'runs.jsonl'} is a folder, not a sweep journal: move it away, or give another --output"
    )
    assert "Traceback" not in result.output and "IsADirectoryError" not in result.output
    assert not (output / "runs").exists() and not any((output / "runs.jsonl").iterdir())


def test_a_journal_saved_with_a_byte_order_mark_reads_and_resumes(tmp_path, corpus):
    """An editor that saves "UTF-8 with BOM" puts EF BB BF before the header: the journal is read as it was."""
    output = tmp_path / "sweep"
    user_journal(output, corpus, [user_run(2e-3), user_run(4e-3, 4.5)])
    path = output / "runs.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    before = path.read_bytes()
    result = CliRunner().invoke(cli, user_sweep(corpus, output, tmp_path / "cache", "--styles", "pre", "--lrs",
                                                "2e-3,4e-3"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "all 2 runs of the sweep are in" in result.output and "not a line of JSON" not in result.output
    assert path.read_bytes() == before
    # the arm's name carries the flags of the unigram reference, measured now: an earlier sweep did not write it
    assert "| 0 steps | 4e-3 | 1 | 4.5000 |" in (output / "sweep.md").read_text()


def test_a_byte_order_mark_inside_a_journal_is_named(tmp_path, corpus):
    """A mark on a later line (files joined end to end) is no journal line: the error says what it is."""
    output = tmp_path / "sweep"
    user_journal(output, corpus, ["\ufeff" + json.dumps(user_run(2e-3))])
    result = CliRunner().invoke(cli, user_sweep(corpus, output, tmp_path / "cache", "--styles", "pre", "--lrs", "2e-3"))
    assert result.exit_code == 1 and "line 2: it starts with a UTF-8 byte order mark" in result.output, result.output


def test_extend_over_an_arm_where_every_run_diverged_says_so_and_adds_no_rate(tmp_path, corpus):
    """Every run diverged: no rate is best, so none is at an edge to extend from (the lowest rate would be chosen
    as if it were, and a rate below it trained)."""
    output = tmp_path / "sweep"
    diverged = {"diverged": "the training loss is nan at step 2"}
    user_journal(output, corpus, [user_run(2e-3, None, **diverged), user_run(4e-3, None, **diverged)])
    before = (output / "runs.jsonl").read_text()
    result = CliRunner().invoke(cli, user_sweep(corpus, output, tmp_path / "cache", "--styles", "pre", "--lrs",
                                                "2e-3,4e-3", "--extend", "1"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "pre: every run diverged (no rate trained): the grid is not extended" in result.output
    assert "extending" not in result.output and "at the edge" not in result.output
    assert (output / "runs.jsonl").read_text() == before and not (output / "runs").exists()


@pytest.mark.parametrize(
    ("rates", "losses", "why"),
    [
        ((5e-324, 1e-323), (5.0, 6.0), "the next rate below, 5e-324 / 2, underflows to 0"),
        ((1e308, 1.7e308), (6.0, 5.0), "the next rate above, 1.7e308 x 1.7, overflows"),
    ],
)
def test_extend_says_why_no_rate_was_added_when_the_next_one_leaves_the_numbers(tmp_path, corpus, rates, losses,
                                                                               why):  # fmt: skip
    output = tmp_path / "sweep"
    user_journal(output, corpus, [user_run(rate, loss) for rate, loss in zip(rates, losses, strict=True)])
    before = (output / "runs.jsonl").read_text()
    lrs = ",".join(repr(rate) for rate in rates)
    result = CliRunner().invoke(cli, user_sweep(corpus, output, tmp_path / "cache", "--styles", "pre", "--lrs", lrs,
                                                "--extend", "1"))  # fmt: skip
    assert result.exit_code == 0, result.output
    best = sweep_module.rate_text(rates[losses.index(min(losses))])
    assert f"pre: best rate {best} is at the edge of its grid, but {why}: no rate added" in result.output
    assert (output / "runs.jsonl").read_text() == before


def test_a_sweep_inside_its_data_folder_is_refused_before_it_writes(tmp_path, corpus):
    data = tmp_path / "corp"
    data.mkdir()
    shutil.copy(corpus, data / "text.txt")
    before = sorted(p.name for p in data.iterdir())
    result = CliRunner().invoke(cli, sweep_args(data, data / "sweep"))
    assert result.exit_code != 0 and "is inside the --data folder" in result.output, result.output
    assert sorted(p.name for p in data.iterdir()) == before  # no journal, no logs, no runs
