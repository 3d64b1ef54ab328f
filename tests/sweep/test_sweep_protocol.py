"""The sweep's default protocol (issue 54): every arm's rate and warm-up tuned on one rule, three seeds at the chosen
cell. The walk (``protocol.walk``) is checked against the rule written out here, serially and with workers whose
runs end in every order; the command with no tuning option against it on a tiny model; the report's first lines
where the sweep tuned less."""

from __future__ import annotations

import json
import math
import statistics
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from hf_geonorm.sweep import evidence
from hf_geonorm.sweep import grid as grid_module
from hf_geonorm.sweep.journal import read_journal
from hf_geonorm.sweep.options import SweepOptions
from hf_geonorm.sweep.protocol import walk
from hf_geonorm.sweep.table import best_rates
from hf_geonorm_cli.main import cli

LADDER = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
# each style's loss surface: its best rate and share, so that the walk steps a rate beyond an edge (pre, from 2e-3
# to 8e-3), up the share ladder twice (pre: 0.3 -> 0.5 -> 0.7 tried) and down it once (geo: 0.1 -> 0 tried)
OPTIMUM = {"pre": (8e-3, 0.5), "geo": (8e-3, 0.1)}
START = {"pre": (1e-3, 2e-3, 4e-3), "geo": (4e-3, 8e-3, 1.6e-2)}


def loss(style: str, lr: float, share: float | None, seed: int) -> float:
    """A smooth bowl in log2(rate) and share with a minimum per style, and a small seed offset."""
    best_lr, best_share = OPTIMUM[style]
    warmup = 0.0 if share is None else (share - best_share) ** 2
    return 3.0 + 0.1 * math.log2(lr / best_lr) ** 2 + warmup + 1e-3 * seed  # well below the tiny data's unigram


def key(style: str, share: float | None, lr: float, seed: int) -> tuple:
    return (style, share, f"{lr:.6g}", seed)


def written_protocol(style: str, rates: tuple[float, ...], ladder=LADDER, start=(0.1, 0.3), extend=2, seeds=(0,),
                     confirm=(1, 2)) -> tuple[set[tuple], tuple[float, float]]:  # fmt: skip
    """The rule as docs/training.md states it, serially: the rates at each starting share; while the best cell (lowest
    mean validation loss on ``seeds``; the lower share, then the lower rate, on a tie) is the lowest or highest rate
    of its share, the next rate a factor 2 beyond (``extend`` times at most); while its share is the lowest or highest
    share run, the next share of the ladder at half, once and twice its rate; then ``confirm`` at the best cell.
    Returns the runs and the chosen cell."""
    cells = [(share, lr) for share in start for lr in rates]
    steps = 0
    while True:
        share, lr = min(cells, key=lambda c: (statistics.fmean(loss(style, c[1], c[0], s) for s in seeds), c[0], c[1]))
        row = sorted(r for s, r in cells if s == share)
        added = []
        if steps < extend and lr in (row[0], row[-1]):
            added.append((share, lr / 2 if lr == row[0] else lr * 2))
            steps += 1
        shares = sorted({s for s, _ in cells})
        step = ladder.index(share)
        if share == shares[0] and step > 0:
            added += [(ladder[step - 1], lr * f) for f in (0.5, 1, 2)]
        elif share == shares[-1] and step < len(ladder) - 1:
            added += [(ladder[step + 1], lr * f) for f in (0.5, 1, 2)]
        if not added:
            break
        cells += added
    runs = {key(style, s, r, seed) for s, r in cells for seed in seeds}
    runs |= {key(style, share, lr, seed) for seed in confirm}
    return runs, (share, lr)


def entry(run) -> dict:
    value = loss(run.style, run.lr, run.warmup_share, run.seed)
    return {"run": run.name, "style": run.style, "alpha": None, "lr": run.lr, "seed": run.seed,
            "warmup_share": run.warmup_share, "val_loss": value, "test_loss": value + 0.1}  # fmt: skip


SWEEP = SweepOptions(styles=("pre", "geo")).resolved()


def test_the_default_is_rate_and_warm_up_on_one_rule_and_three_seeds():
    assert SWEEP.warmup_shares == LADDER and SWEEP.start_shares() == (0.1, 0.3)
    assert SWEEP.seeds == (0,) and SWEEP.confirm_seeds == (1, 2) and SWEEP.extend == 2
    assert SweepOptions(seeds=(0, 1)).resolved().confirm_seeds == (2,)
    assert SweepOptions(seeds=(3, 4, 5)).resolved().confirm_seeds == ()


def test_the_serial_walk_takes_the_runs_of_the_written_protocol():
    entries: list[dict] = []
    while (found := walk(SWEEP, START, entries)).due:
        entries.append(entry(found.due[0].run))
    expected = set()
    for style in SWEEP.styles:
        runs, chosen = written_protocol(style, START[style])
        expected |= runs
        assert chosen == (OPTIMUM[style][1], OPTIMUM[style][0])  # the bowl's minimum is found
    assert {key(e["style"], e["warmup_share"], e["lr"], e["seed"]) for e in entries} == expected
    assert len(entries) == len(expected)
    shares = {style: {e["warmup_share"] for e in entries if e["style"] == style} for style in SWEEP.styles}
    assert shares == {"pre": {0.1, 0.3, 0.5, 0.7}, "geo": {0.0, 0.1, 0.3}}


@pytest.mark.parametrize("workers", [2, 3])
def test_the_walk_with_workers_takes_the_same_runs_in_every_order_they_end(workers):
    """Every order in which the runs in flight may end, explored whole (states merged): the workers take what
    ``walk(...).next_due`` names, as ``engine.LocalBoard`` does, and the runs in the end are the written protocol's,
    none trained twice."""
    expected = set().union(*(written_protocol(style, START[style])[0] for style in SWEEP.styles))
    finals: set[frozenset] = set()

    @cache
    def explore(done: frozenset, running: frozenset) -> None:
        entries = [entry(run) for run in sorted(done, key=lambda r: r.key().__repr__())]
        running = set(running)
        while len(running) < workers:
            task = walk(SWEEP, START, entries).next_due({run.key() for run in running})
            if task is None:
                break
            assert task.run not in done and task.run not in running
            running.add(task.run)
        if not running:
            assert walk(SWEEP, START, entries).finished
            finals.add(frozenset(key(r.style, r.warmup_share, r.lr, r.seed) for r in done))
            return
        for run in running:
            explore(done | {run}, frozenset(running - {run}))

    explore(frozenset(), frozenset())
    assert finals == {frozenset(expected)}


def test_a_fixed_warm_up_walks_the_rate_alone():
    sweep = SweepOptions(styles=("pre",), warmup_shares=None).resolved()
    entries: list[dict] = []
    while (found := walk(sweep, START, entries)).due:
        entries.append(entry(found.due[0].run))
    # the rate bowl alone (share None): 1e-3, 2e-3, 4e-3, then 8e-3 and 1.6e-2 beyond the top edge; 8e-3 confirmed
    assert sorted({e["lr"] for e in entries}) == [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2]
    assert {e["warmup_share"] for e in entries} == {None}
    assert sorted(e["seed"] for e in entries if e["lr"] == 8e-3) == [0, 1, 2]


# --- the command with no tuning option, on a tiny model ---

TINY = ["--seq-len", "32", "--batch-size", "4", "--vocab-size", "300", "--max-steps", "10", "--eval-every", "10",
        "--eval-blocks", "8"]  # fmt: skip


@pytest.fixture(scope="module")
def default_sweep(tmp_path_factory, corpus):  # noqa: F811 - the corpus fixture
    """``hf-geonorm sweep`` with no tuning option, each run's losses taken from ``loss`` (the first run trains the
    tiny model for real, and every other run's record is its record with its own cell and losses: the protocol, the
    journal's checks and the report are the sweep's own, at a fraction of the time)."""
    folder = tmp_path_factory.mktemp("default-sweep")
    real = grid_module._train
    template: dict = {}

    def fake_train(run, train, output, thread_note=None):
        if not template:
            template.update(real(run, train, output))
        value = loss(run.style, run.lr, run.warmup_share, run.seed)
        steps = run.warmup_steps(train.max_steps)
        made = {**template, "run": run.name, "style": run.style, "lr": run.lr, "seed": run.seed,
                "settings": {**template["settings"], "norm_style": run.style}, "warmup_share": run.warmup_share,
                "warmup_steps": steps, "val_loss": value, "test_loss": value + 0.1, "model": f"runs/{run.name}/final"}
        return made  # fmt: skip

    patch = pytest.MonkeyPatch()
    patch.setattr(grid_module, "_train", fake_train)
    patch.setattr(grid_module, "style_grids", lambda sweep, train, log, header=None: dict(START))
    try:
        result = CliRunner().invoke(cli, ["sweep", "--output", str(folder / "sweep"), "--data", str(corpus),
                                          "--data-cache", str(folder / "cache"), *TINY])  # fmt: skip
    finally:
        patch.undo()
    return folder / "sweep", result


def test_the_command_with_no_tuning_option_tunes_rate_and_warm_up_and_confirms_three_seeds(default_sweep):
    folder, result = default_sweep
    assert result.exit_code == 0, result.output
    header, entries = read_journal(folder / "runs.jsonl")
    assert header["sweep_options"]["warmup_shares"] == list(LADDER)
    assert header["sweep_options"]["confirm_seeds"] == [1, 2]
    for style in ("pre", "geo"):
        mine = [e for e in entries if e["style"] == style]
        assert len({e["warmup_share"] for e in mine}) >= 2 and len({e["lr"] for e in mine}) >= 3
        seed_0 = {(e["warmup_share"], e["lr"]): e["val_loss"] for e in mine if e["seed"] == 0}
        chosen = min(seed_0, key=lambda cell: (seed_0[cell], cell))
        assert sorted(e["seed"] for e in mine if (e["warmup_share"], e["lr"]) == chosen) == [0, 1, 2]
        assert {e["warmup_steps"] for e in mine if e["warmup_share"] == chosen[0]} == {round(chosen[0] * 10)}
        runs, written = written_protocol(style, START[style])
        assert {key(style, e["warmup_share"], e["lr"], e["seed"]) for e in mine} == runs and chosen == written
    assert "the sweep tunes each arm on one rule" in result.output and "at most" in result.output
    report = (folder / "sweep.md").read_text()
    assert "Not tuned" not in report and "One seed" not in report
    assert "| pre warm-up 50% | 50% | 8e-3 | 3 |" in report and "| geo warm-up 10% | 10% | 8e-3 | 3 |" in report
    assert all(not e.get("model", "").startswith("/") for e in entries)  # no path of this machine in the journal


# --- the report's first lines where the sweep tuned less ---


def report_of(runs: list[dict]) -> str:
    from hf_geonorm.sweep.report import report_text

    return report_text(runs)[0]


def plain(style: str, lr: float, seed: int, share: float | None = None) -> dict:
    value = loss(style, lr, share, seed)
    return {"run": "r", "style": style, "alpha": None, "lr": lr, "seed": seed, "warmup_share": share,
            "val_loss": value, "test_loss": value + 0.1, "role": "grid"}  # fmt: skip


def test_a_fixed_warm_up_or_one_seed_puts_the_caveat_first():
    fixed = [plain(style, lr, seed) for style in ("pre", "geo") for lr in (4e-3, 8e-3) for seed in (0, 1, 2)]
    lines = report_of(fixed).splitlines()
    assert lines[2].startswith("**Not tuned: the warm-up.**") and "One seed" not in report_of(fixed)
    assert "3.2-3.5x" in lines[2] and "as a lead of 0.839" in lines[2]
    one_seed = [plain(style, lr, 0, share) for style in ("pre", "geo") for lr in (4e-3, 8e-3) for share in (0.1, 0.3)]
    lines = report_of(one_seed).splitlines()
    assert lines[2].startswith("**One seed** at the chosen cell of geo warm-up 10% and pre warm-up 30%")
    assert "Not tuned" not in report_of(one_seed)
    two = [*one_seed, *(plain(style, 8e-3, 1, share) for style, share in (("pre", 0.3), ("geo", 0.1)))]
    assert "p below is from a t with 1-2 degrees of freedom" in report_of(two).splitlines()[2]


COMMITTED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "sweeps"


def phase_i_cells(arch: str) -> dict[tuple, dict[int, tuple]]:
    cells: dict[tuple, dict[int, tuple]] = {}
    for folder in sorted(COMMITTED.glob(f"i_{arch}_w*")):
        share = int(folder.name[-2:]) / 100
        for run in read_journal(folder / "runs.jsonl")[1]:
            cells.setdefault((run["style"], share, run["lr"]), {})[run["seed"]] = (run["val_loss"], run["test_loss"])
    return cells


def test_the_caveats_figures_are_phase_is_journals():
    """Recomputed from the committed phase i journals: at a tenth (rate chosen on seed 0's validation there) the
    lead on test seed 0; tuned (the cell lowest on seed 0's validation over every share) the mean over its seeds."""
    for arch, ratio in evidence.WARMUP_OVERSTATEMENT.items():
        cells = phase_i_cells(arch)
        at_tenth = [{"style": s, "alpha": None, "lr": lr, "seed": 0, "val_loss": seeds[0][0], "test_loss": 0.0}
                    for (s, share, lr), seeds in cells.items() if share == 0.1 and 0 in seeds]  # fmt: skip
        tenth = {style: cells[(style, 0.1, lr)][0][1] for style, lr in best_rates(at_tenth).items()}
        tuned = {}
        for style in {cell[0] for cell in cells}:
            own = [c for c in cells if c[0] == style and cells[c].get(0, (None,))[0] is not None]
            best = min(own, key=lambda c: (cells[c][0][0], c[1], c[2]))
            tuned[style] = statistics.fmean(test for _, test in cells[best].values())
        told, fair = tenth["pre"] - tenth["geo"], tuned["pre"] - tuned["geo"]
        assert round(told / fair, 2) == ratio
        if arch == "gpt2":
            assert round(tenth["deepnorm"] - tenth["geo"], 3) == evidence.DEEPNORM_AT_A_TENTH
            assert round(tuned["deepnorm"] - tuned["geo"], 3) == evidence.DEEPNORM_TUNED
    seeded, failed, spreads = 0, 0, []
    for arch in ("gpt2", "llama"):
        for seeds in phase_i_cells(arch).values():
            if len(seeds) >= 3:
                tests = [test for _, test in seeds.values()]
                seeded += 1
                if max(tests) - statistics.median(tests) > evidence.FAILED_SEED:
                    failed += 1
                else:
                    spreads.append(max(tests) - min(tests))
    assert (seeded, failed, round(max(spreads), 2)) == (evidence.SEEDED_CELLS, evidence.FAILED_CELLS,
                                                         evidence.SEEDED_SPREAD)  # fmt: skip


# --- what the report says of its choices besides the seed statistics ---


def hand(style: str, lr: float, seed: int, val: float | None, share: float | None = 0.3) -> dict:
    test = None if val is None else val + 0.1
    return {"run": "r", "style": style, "alpha": None, "lr": lr, "seed": seed, "warmup_share": share,
            "val_loss": val, "test_loss": test, "role": "grid"}  # fmt: skip


def test_the_unigram_row_flags_an_arm_not_yet_learning_and_a_cliff_and_a_hole_are_named():
    """geo chose 4e-3 beside 8e-3, which diverged (a cliff); pre chose 2e-3 with 8e-3 its only neighbour above (a
    factor-4 hole) and sits within 0.1 of the unigram loss on test (not yet learning from context)."""
    runs = [hand("geo", 2e-3, 0, 4.5), hand("geo", 4e-3, 0, 4.2), hand("geo", 8e-3, 0, None)]
    runs += [hand("geo", 4e-3, seed, 4.2 + 0.01 * seed) for seed in (1, 2)]
    runs += [hand("pre", 1e-3, 0, 6.3), hand("pre", 2e-3, 0, 6.2), hand("pre", 8e-3, 0, 6.4)]
    runs += [hand("pre", 2e-3, seed, 6.2 + 0.01 * seed) for seed in (1, 2)]
    unigram = {"unigram_validation": 6.25, "unigram_test": 6.31}
    report, warnings = report_text_with(runs, unigram)
    rows = {line.split(" |")[0].lstrip("| "): line for line in report.splitlines() if line.startswith("| ")}
    reference = "unigram: the held-out text's tokens at their training frequencies, no context"
    assert "| – | – | – | 6.2500 | 6.3100 | – |" in rows[reference]
    assert any(name.startswith("pre warm-up 30% (") and "not yet learning from context" in name for name in rows)
    assert any(name.startswith("geo warm-up 30% (next to a cliff: 8e-3 at the same warm-up diverged)")
               for name in rows)  # fmt: skip
    assert not any(name.startswith("geo warm-up 30% (") and "not yet learning" in name for name in rows)
    assert any("pre warm-up 30%: the chosen rate 2e-3 and its neighbour 8e-3 are a factor 4 apart" in w
               for w in warnings)  # fmt: skip
    assert not any(w.startswith("geo warm-up 30%: the chosen rate") for w in warnings)  # 2e-3, 4e-3, 8e-3: no hole
    tuned = report.split("## What was tuned")[1].split("\n## ")[0]
    assert "the peak learning rate and the warm-up share of the run" in tuned
    assert "- geo: 5 runs (5 starting grid, 0 added by the walk's steps, 0 confirmation); rates warm-up 30%: 2e-3, " \
           "4e-3, 8e-3" in tuned


def test_a_journal_without_roles_is_not_counted_as_zero_runs_of_each_role():
    """Journals of an earlier hf-geonorm record no role: the report says so rather than "0 starting grid"."""
    runs = [hand("geo", lr, 0, 4.5 - lr) for lr in (2e-3, 4e-3, 8e-3)]
    for entry in runs:
        del entry["role"]
    report, _ = report_text_with(runs, {"unigram_validation": 6.25, "unigram_test": 6.31})
    tuned = report.split("## What was tuned")[1].split("\n## ")[0]
    assert "- geo: 3 runs (their roles not recorded: journaled by an earlier hf-geonorm); rates" in tuned
    assert "0 starting grid" not in tuned


def report_text_with(runs: list[dict], reference: dict) -> tuple[str, list[str]]:
    from hf_geonorm.sweep.report import report_text

    return report_text(runs, None, reference)


def test_two_seeds_are_not_counted_in_standard_errors():
    """With two seeds a gap's standard error rests on 1-2 degrees of freedom: the plateau note says so instead of
    "N standard errors", and the margin carries the same words."""
    runs = [hand(style, lr, seed, base + 0.3 * abs(math.log2(lr / 4e-3)) + 0.01 * seed)
            for style, base in (("pre", 4.5), ("geo", 4.2)) for lr in (2e-3, 4e-3, 8e-3) for seed in (0, 1)]
    report = report_text_with(runs, None)[0]
    sure = report.split("## How sure each choice is")[1]
    assert "standard errors" not in sure and "p from a t with 1-2 degrees of freedom" in sure
    [margin] = [line for line in report.splitlines() if "is lowest on test" in line]
    assert "2 seeds on a side: p from a t with 1-2 degrees of freedom" in margin


def test_the_default_sweep_writes_the_unigram_reference_of_its_held_out_text(default_sweep, corpus):  # noqa: F811
    """held_out.json's unigram cross-entropy, computed again here from the cached blocks (add-one smoothed training
    target frequencies), and the report's reference row."""
    import numpy as np

    from hf_geonorm.training.data.prepare import data_request, data_source, training_data
    from hf_geonorm.training.options import TrainOptions

    folder, _ = default_sweep
    record = json.loads((folder / "held_out.json").read_text())
    options = TrainOptions(data=str(corpus), data_cache=str(folder.parent / "cache"), seq_len=32, batch_size=4,
                           vocab_size=300, max_steps=10, eval_every=10, eval_blocks=8)  # fmt: skip
    request = data_request(options)
    data = training_data(data_source(request, lambda _: None), request, lambda _: None)
    train = np.concatenate([np.asarray(view) for view in data.train.views])[:, 1:].reshape(-1)
    counts = np.bincount(train, minlength=len(data.tokenizer)) + 1.0
    for split, blocks in (("validation", data.val), ("test", data.test)):
        targets = np.asarray(blocks.blocks)[:, 1:].reshape(-1)
        assert record[f"unigram_{split}"] == pytest.approx(-np.log(counts / counts.sum())[targets].mean(), rel=1e-9)
    row = f"| {record['unigram_validation']:.4f} | {record['unigram_test']:.4f} | – |"
    assert row in (folder / "sweep.md").read_text()


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["serial", "workers"])
def test_a_finished_sweep_without_its_reference_gets_it_when_run_again(default_sweep, corpus, tmp_path, workers):  # noqa: F811
    """A sweep finished by an earlier hf-geonorm has no held_out.json: the same command run again (by either
    engine) trains nothing, measures the reference (the same record the sweep wrote before its first run) and puts
    its row in the report; once it is there, a run again does not prepare the data."""
    import shutil

    folder, _ = default_sweep
    earlier = tmp_path / "sweep"
    shutil.copytree(folder, earlier, ignore=shutil.ignore_patterns("held_out.json", "runs"))
    command = ["sweep", "--output", str(earlier), "--data", str(corpus), "--data-cache", str(folder.parent / "cache"),
               *TINY, *workers]  # fmt: skip
    patch = pytest.MonkeyPatch()
    patch.setattr(grid_module, "_train", lambda *args, **kwargs: pytest.fail("a finished sweep trained a run"))
    patch.setattr(grid_module, "style_grids", lambda sweep, train, log, header=None: dict(START))
    try:
        again = CliRunner().invoke(cli, command)
        once_more = CliRunner().invoke(cli, command)
    finally:
        patch.undo()
    assert again.exit_code == 0 and once_more.exit_code == 0, again.output + once_more.output
    record = json.loads((folder / "held_out.json").read_text())
    assert json.loads((earlier / "held_out.json").read_text()) == record
    row = f"| {record['unigram_validation']:.4f} | {record['unigram_test']:.4f} | – |"
    assert row in (earlier / "sweep.md").read_text()
    assert "preparing the data" in again.output and "preparing the data" not in once_more.output
    # on data that is no longer the journal's, the report is written as before, without the row, and says why
    changed = tmp_path / "changed"
    shutil.copytree(folder, changed, ignore=shutil.ignore_patterns("held_out.json", "runs"))
    other = tmp_path / "text.txt"
    other.write_text(corpus.read_text() + "x = 1\n")
    patch.setattr(grid_module, "_train", lambda *args, **kwargs: pytest.fail("a finished sweep trained a run"))
    patch.setattr(grid_module, "style_grids", lambda sweep, train, log, header=None: dict(START))
    try:
        elsewhere = CliRunner().invoke(cli, ["sweep", "--output", str(changed), "--data", str(other), "--data-cache",
                                             str(tmp_path / "cache"), *TINY, *workers])  # fmt: skip
    finally:
        patch.undo()
    assert elsewhere.exit_code == 0, elsewhere.output
    assert "warning: the report goes without its unigram reference row" in elsewhere.output
    assert not (changed / "held_out.json").exists() and "| unigram:" not in (changed / "sweep.md").read_text()
