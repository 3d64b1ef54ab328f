"""`hf-geonorm sweep` (hf_geonorm.training.sweep): a 2-style x 2-rate grid trained end to end, resumed after a stop,
refused with other options, its choice checked against a selection written out here, and one run's test loss
recomputed from its saved model and by training it again through `hf-geonorm train`."""

from __future__ import annotations

import json
import math
import sysconfig
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hf_geonorm_cli.main import cli
from transformers import AutoModelForCausalLM

from hf_geonorm.training import sweep as sweep_module
from hf_geonorm.training.options import SweepOptions, TrainOptions
from hf_geonorm.training.pipeline import ArrowBlocks
from hf_geonorm.training.sweep import journal_key, open_journal
from hf_geonorm.training.sweep_report import at_edge, best_rates

STDLIB = Path(sysconfig.get_paths()["stdlib"])
TINY = ["--seq-len", "32", "--batch-size", "4", "--vocab-size", "300", "--max-steps", "3", "--eval-every", "3",
        "--warmup-steps", "0", "--eval-blocks", "8"]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sweep-corpus") / "text.txt"
    path.write_text("".join((STDLIB / name).read_text() for name in ("textwrap.py", "shlex.py", "string.py")))
    return path


def sweep_args(corpus: Path, output: Path, *more: str) -> list[str]:
    return ["sweep", "--output", str(output), "--styles", "pre,geo", "--lrs", "2e-3,8e-3", "--seeds", "0",
            "--data", str(corpus), "--data-cache", str(output.parent / "cache"), *TINY, *more]  # fmt: skip


def journal(output: Path) -> list[str]:
    return (output / "runs.jsonl").read_text().splitlines()


def test_a_sweep_stopped_after_its_first_run_resumes_with_the_rest_only(tmp_path, corpus, monkeypatch):
    output = tmp_path / "sweep"
    trained: list[str] = []
    real_train = sweep_module._train

    def stop_after_one(run, train, folder):
        if trained:
            raise KeyboardInterrupt  # the stop, as Ctrl-C or the end of a session
        trained.append(run.name)
        return real_train(run, train, folder)

    monkeypatch.setattr(sweep_module, "_train", stop_after_one)
    stopped = CliRunner().invoke(cli, sweep_args(corpus, output))
    assert stopped.exit_code != 0 and "run 1/4: pre lr 2e-3 seed 0" in stopped.output
    first = journal(output)
    assert len(first) == 2 and json.loads(first[1])["run"] == "pre-lr2e-3-seed0"

    def counted(run, train, folder):
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
        row = f"| {style} | {sweep_module.rate_text(lr)} | 1 | {cell['val_loss']:.4f} | {cell['test_loss']:.4f} |"
        assert row in report
    assert (output / "sweep.png").read_bytes().startswith(b"\x89PNG")

    again = CliRunner().invoke(cli, sweep_args(corpus, output))
    assert again.exit_code == 0 and "all 4 runs of the sweep are in" in again.output and len(trained) == 4

    # one run's test loss, recomputed: its saved model on the test blocks, by a plain loop (not Trainer's)
    entry = entries[2]
    model = AutoModelForCausalLM.from_pretrained(entry["model"]).eval()
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
        (["--norm-style", "geo"], "give --styles, not --norm-style"),
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


def test_a_journal_started_before_an_option_existed_resumes_at_that_options_default(tmp_path):
    """A header written by an earlier hf-geonorm lacks the options added since; its runs ran as their defaults do."""
    options = TrainOptions(data="corpus.txt", seq_len=32)
    header = {name: value for name, value in json.loads(json.dumps(journal_key(options))).items()
              if name not in ("text_column", "data_split")}  # fmt: skip
    (tmp_path / "runs.jsonl").write_text(json.dumps({"format": 1, "train_options": header}) + "\n")
    assert open_journal(tmp_path, options) == (tmp_path / "runs.jsonl", [])
    with pytest.raises(ValueError, match="text_column 'text' there, 'body' now"):
        open_journal(tmp_path, replace(options, text_column="body"))
