"""What `hf-geonorm sweep`'s report (sweep.md) says: the warm-up and the evaluation as the runs used them, which cells
are means of how many seeds, the margin between arms with its standard error and Welch's p, each arm's plateau of
rates, and that a short run is early training. The report is a function of the journal, so most checks write a
journal by hand and compute the expected numbers here, independently of the code; one runs the README's sweep
example as a user copies it."""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

from hf_geonorm.sweep.welch import two_sided_p, welch_test
from hf_geonorm.training.options import TrainOptions

from support.helpers import invoke, mean, p_by_integration, variance, welch_written_out, write_sweep_journal

ROOT = Path(__file__).resolve().parents[2]
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TINY = ["--seq-len", "32", "--batch-size", "4", "--vocab-size", "300", "--max-steps", "3", "--eval-every", "3",
        "--warmup-steps", "0", "--eval-blocks", "8", "--extend", "0"]  # fmt: skip
RATES = (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)


# ---- statistics written out (helpers.py): Welch's t-test, its p by integrating Student's t density ----


@pytest.mark.parametrize(("t", "df"), [(0.3, 1.0), (2.5, 1.0), (1.7, 2.0), (4.2, 2.0), (2.2, 3.37), (6.0, 7.9),
                                       (0.01, 30.5), (12.0, 4.4)])  # fmt: skip
def test_welchs_p_agrees_with_the_t_density_integrated_and_the_closed_forms(t, df):
    assert two_sided_p(t, df) == pytest.approx(p_by_integration(t, df), abs=1e-9)
    assert two_sided_p(-t, df) == pytest.approx(two_sided_p(t, df), abs=1e-15)
    if df == 1.0:  # Cauchy
        assert two_sided_p(t, df) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-12)
    if df == 2.0:
        assert two_sided_p(t, df) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-12)


def test_welchs_test_agrees_with_the_formulas_written_out():
    a, b = [4.62, 4.66, 4.58, 4.70], [4.05, 4.10, 4.01]
    margin, se, df, p = welch_written_out(a, b)
    found = welch_test(a, b)
    assert (found.difference, found.standard_error, found.df) == pytest.approx((margin, se, df), rel=1e-12)
    assert found.p == pytest.approx(p, abs=1e-9)
    assert welch_test([4.0], b) is None  # one seed: no variance, no test


@pytest.mark.parametrize(("a", "b"), [([4.62, 4.66, 4.58, 4.70], [4.05, 4.10, 4.01]),  # far apart: p near 0
                                    ([3.1, 3.3], [3.2, 3.25, 3.18, 3.4, 2.9]),  # overlapping: p near 1
                                    ([1.0, 2.0, 3.0], [1.5, 2.5]), ([10.0, 10.1], [9.0, 12.0])])  # fmt: skip
def test_welchs_test_agrees_with_scipys_ttest_ind_of_unequal_variances(a, b):
    from scipy.stats import ttest_ind

    expected = ttest_ind(a, b, equal_var=False)
    found = welch_test(a, b)
    assert (found.t, found.p) == pytest.approx((expected.statistic, expected.pvalue), rel=1e-9, abs=1e-15)


# ---- a journal written by hand: pre has a plateau, geo a clear best; three seeds at each best ----


def entry(style: str, lr: float, seed: int, val: float, test: float, role: str = "grid") -> dict:
    from hf_geonorm.sweep.grid import Run

    return {"run": Run(style, None, lr, seed).name, "style": style, "alpha": None, "lr": lr, "seed": seed,
            "settings": {"norm_style": style}, "steps": 3, "tokens": 3 * 4 * 32, "val_loss": val, "test_loss": test,
            "train_seconds": 1.0, "role": role, "warmup_steps": 0,
            "evaluated_blocks": {"validation": 8, "test": 8}}  # fmt: skip


PRE_VAL = {1e-3: 4.60, 2e-3: 4.59, 4e-3: 4.57, 8e-3: 4.58, 1.6e-2: 4.90}  # seed 0; best 4e-3
PRE_BEST_MORE = {1: (4.60, 4.66), 2: (4.55, 4.58)}  # seed: (validation, test) at 4e-3
GEO_VAL = {1e-3: 4.60, 2e-3: 4.40, 4e-3: 4.20, 8e-3: 4.00, 1.6e-2: 4.15}  # best 8e-3
GEO_BEST_MORE = {1: (4.02, 4.60), 2: (3.99, 4.49)}
TEST_AT_SEED_0 = {("pre", 4e-3): 4.62, ("geo", 8e-3): 4.52}


def hand_options(folder: Path) -> TrainOptions:
    """The options of every hand-written journal here, with its data in ``folder``."""
    return TrainOptions(data=str(folder / "text.txt"), seq_len=32, batch_size=4, vocab_size=300, max_steps=3,
                        eval_every=3, warmup_steps=0, eval_blocks=8)  # fmt: skip


def hand_journal(output: Path) -> list[dict]:
    runs = []
    for style, losses, best, more in (("pre", PRE_VAL, 4e-3, PRE_BEST_MORE), ("geo", GEO_VAL, 8e-3, GEO_BEST_MORE)):
        runs += [entry(style, lr, 0, val, TEST_AT_SEED_0.get((style, lr), val + 0.05)) for lr, val in losses.items()]
        runs += [entry(style, best, seed, val, test, "confirmation") for seed, (val, test) in more.items()]
    options = hand_options(output.parent)
    (output.parent / "text.txt").write_text((STDLIB / "textwrap.py").read_text())
    write_sweep_journal(output / "runs.jsonl", options, runs)
    return runs


@pytest.fixture
def hand_report(tmp_path) -> str:
    """sweep.md of the hand-written journal, written by `hf-geonorm sweep` over it (every run done: none trains)."""
    output = tmp_path / "sweep"
    hand_journal(output)
    result = invoke("sweep", "--output", output, "--data", tmp_path / "text.txt", "--styles", "pre,geo", "--lrs",
                    ",".join(map(str, RATES)), "--seeds", "0", "--confirm-seeds", "1,2", *TINY)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "all 14 runs of the sweep are in" in result.output
    return (output / "sweep.md").read_text()


def section(report: str, title: str) -> str:
    return report.split(f"## {title}")[1].split("\n## ")[0]


def test_the_margin_between_arms_is_given_with_its_standard_error_and_welchs_p(hand_report):
    pre = [TEST_AT_SEED_0[("pre", 4e-3)]] + [test for _, test in PRE_BEST_MORE.values()]
    geo = [TEST_AT_SEED_0[("geo", 8e-3)]] + [test for _, test in GEO_BEST_MORE.values()]
    margin, se, df, p = welch_written_out(pre, geo)
    assert p > 0.001  # printed to three places
    [line] = [line for line in hand_report.splitlines() if "lowest on test" in line]
    assert line.startswith("geo is lowest on test") and "pre" in line
    assert f"{margin:.4f} ± {se:.4f}" in line and f"p = {p:.3f}" in line and "Welch" in line
    assert f"{df:.1f}" in line


def test_a_plateau_names_every_rate_within_a_standard_error_of_the_best(hand_report):
    """pre: 1e-3, 2e-3 and 8e-3 are within one standard error of the best (4e-3) on seed 0, 1.6e-2 is not; the
    standard error of a difference of two single-seed losses is the seed spread x sqrt(2), the spread measured at
    the best rate's three seeds. geo: its best alone."""
    spread = math.sqrt(variance([PRE_VAL[4e-3]] + [val for val, _ in PRE_BEST_MORE.values()]))
    se = spread * math.sqrt(2)
    within = [lr for lr, val in PRE_VAL.items() if val - PRE_VAL[4e-3] <= se]
    assert within == [1e-3, 2e-3, 4e-3, 8e-3]  # the journal is what this test means it to be
    sure = section(hand_report, "How sure each choice is")
    [pre] = [line for line in sure.splitlines() if line.startswith("- pre,")]
    assert "plateau" in pre and "1e-3, 2e-3, 4e-3 and 8e-3" in pre and f"{se:.4f}" in pre
    assert "1.6e-2" in pre  # the nearest rate outside it, and how far
    geo_spread = math.sqrt(variance([GEO_VAL[8e-3]] + [val for val, _ in GEO_BEST_MORE.values()]))
    [geo] = [line for line in sure.splitlines() if line.startswith("- geo,")]
    assert "no plateau" in geo and "1.6e-2" in geo
    gap = GEO_VAL[1.6e-2] - GEO_VAL[8e-3]
    assert f"{gap:.4f} ± {geo_spread * math.sqrt(2):.4f}" in geo
    assert "beyond the seed spread" not in hand_report


def test_each_cell_says_how_many_seeds_it_averages(hand_report):
    """The bold best is a three-seed mean beside single-seed cells: each cell says its seeds, and the best also gives
    its loss on the seed the choice compared (seed 0)."""
    [row] = [line for line in hand_report.splitlines() if line.startswith("| pre |") and "1 seed" in line]
    best = [PRE_VAL[4e-3]] + [val for val, _ in PRE_BEST_MORE.values()]
    cell = f"**{mean(best):.4f} ± {math.sqrt(variance(best)):.4f} (3 seeds; seed 0: {PRE_VAL[4e-3]:.4f})**"
    assert cell in row
    assert f"{PRE_VAL[1e-3]:.4f} (1 seed)" in row and row.count("(1 seed)") == 4


def test_the_bold_cell_is_the_rate_chosen_on_seed_0_and_the_means_of_more_seeds_are_named(hand_report):
    """The bold pre cell, a three-seed mean, stood beside single-seed cells under the legend "the arm's best rate",
    as if unequal cells were compared as equals: the legend says the bold rate is the one chosen on seed 0's
    validation (the seed every rate ran) and names the cells that average more seeds than the choice compared."""
    [legend] = [part for part in hand_report.split("\n\n") if part.startswith("14 runs.")]
    assert "best" not in legend
    assert "**bold**: the rate chosen for each arm, the lowest mean validation loss on seed 0" in legend
    assert "Means over more seeds than that: pre 4e-3 (3 seeds), geo 8e-3 (3 seeds)" in legend
    assert "every other cell ran seed 0 only" in legend
    header = "| arm | warm-up | rate chosen | seeds | validation loss | test loss | test loss of each seed |"
    assert header in hand_report
    assert "best rate" not in section(hand_report, "The arms at their chosen rates, on test")


def test_a_short_run_is_said_to_be_early_training(hand_report):
    note = section(hand_report, "Early training")
    assert "384 tokens" in note and "4,915,200" in note and "docs/training.md" in note


def test_the_early_training_note_quotes_the_length_study_as_its_journals_give_it(hand_report):
    """The margins the note quotes, recomputed from the study's committed journals: each arm's best rate on seed 0's
    validation, its test loss averaged over its seeds."""
    sweeps = ROOT / "benchmarks" / "results" / "sweeps"
    note = section(hand_report, "Early training")
    for phase in ("h_styles", "f_length_1200", "f_length_2400"):
        lines = [json.loads(line) for line in (sweeps / phase / "runs.jsonl").read_text().splitlines()]
        options, runs = lines[0]["train_options"], lines[1:]
        tokens = options["max_steps"] * options["batch_size"] * options["seq_len"]
        test = {}
        for style in ("pre", "geo"):
            mine = [e for e in runs if e["style"] == style and e["alpha"] is None]
            seed_0 = {e["lr"]: e["val_loss"] for e in mine if e["seed"] == 0 and e["val_loss"] is not None}
            best = min(seed_0, key=lambda lr: (seed_0[lr], lr))
            test[style] = mean([e["test_loss"] for e in mine if e["lr"] == best])
        assert f"{test['pre'] - test['geo']:.3f}" in note and f"{tokens / 1e6:.1f}M tokens" in note


# ---- the README's sweep example, as a user copies it ----


def readme_sweep_example() -> list[str]:
    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("hf-geonorm sweep ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[1:]


@pytest.fixture(scope="module")
def readme_sweep(tmp_path_factory) -> tuple[Path, str]:
    """The README's example on a folder of three standard-library files, with a smaller batch and vocabulary than
    its defaults (cheaper; the warm-up and the evaluation stay the defaults the example leaves them at)."""
    root = tmp_path_factory.mktemp("readme-sweep")
    (root / "corpus").mkdir()
    for name in ("textwrap.py", "shlex.py", "string.py"):
        shutil.copy(STDLIB / name, root / "corpus" / name)
    args = readme_sweep_example()
    assert args[0] == "sweep" and "--warmup-steps" not in args and "--eval-blocks" not in args
    args = [str(root / "sweep") if a == "sweep/" else str(root / "corpus") if a == "corpus/" else a for a in args]
    with pytest.MonkeyPatch.context() as patch:
        (root / "home").mkdir()
        patch.setenv("HOME", str(root / "home"))
        patch.chdir(root)
        torch.set_num_threads(1)
        # the default walk, cut to its starting grid (two rates x two shares) to keep the test short
        result = invoke(*args, "--batch-size", "2", "--vocab-size", "300", "--data-cache", root / "cache", "--extend",
                        "0", "--warmup-shares", "0.1,0.3", "--confirm-seeds", "none")  # fmt: skip
    assert result.exit_code == 0, result.output
    return root / "sweep", result.output


def test_the_readme_sweep_reports_the_warm_up_and_evaluation_its_runs_used(readme_sweep):
    output, _ = readme_sweep
    report = (output / "sweep.md").read_text()
    assert "None" not in report
    steps = int(readme_sweep_example()[readme_sweep_example().index("--max-steps") + 1])
    # the default tunes the warm-up: the shares this test's walk starts from (its step 0 cut) as steps of the run
    assert f"warm-up tuned: 10%, 30% of the run ({steps // 10}, {3 * steps // 10} steps)" in report
    evaluated = set()
    for metrics in output.glob("runs/*/metrics.json"):
        blocks = json.loads(metrics.read_text())["evaluated_blocks"]
        evaluated.add((blocks["validation"], blocks["test"]))
    assert len(evaluated) == 1
    [(validation, test)] = evaluated
    assert validation == 8  # the fewest the default evaluates: 3 evaluations of 40 trained blocks afford 4
    assert f"evaluation: {validation} blocks of 64 tokens for validation and {test} for test" in report


def test_a_runs_log_says_one_number_of_blocks_evaluated(readme_sweep):
    """The data lines said "(64 blocks evaluated)", then "each evaluation reads the first 32 of those blocks"."""
    output, _ = readme_sweep
    for log in output.glob("logs/*.log"):
        text = log.read_text()
        blocks = json.loads((output / "runs" / log.stem / "metrics.json").read_text())["evaluated_blocks"]
        said = [int(n) for n in re.findall(r"(\d+) blocks evaluated", text)]
        said += [int(n) for n in re.findall(r"reads the first (\d+) of those blocks", text)]
        assert said and set(said) <= {blocks["validation"], blocks["test"]}, (said, blocks)


def test_the_readme_sweep_says_its_runs_are_early_training(readme_sweep):
    output, _ = readme_sweep
    note = section((output / "sweep.md").read_text(), "Early training")
    assert "20 steps" in note and "docs/training.md" in note


def test_the_readme_sweep_logs_a_time_estimate_after_each_run_but_the_last(readme_sweep):
    output, log = readme_sweep
    runs = len((output / "runs.jsonl").read_text().splitlines()) - 1
    assert runs == 8 and log.count("time estimate:") == runs - 1 and "for the 1 run(s) left" in log
    assert log.index("data prepared") < log.index("run 1/8")


def test_where_every_rate_ran_seeds_the_plateau_takes_welchs_standard_error_of_each_pair(tmp_path):
    """Three seeds at every rate: a rate is on the plateau when its gap to the best is within Welch's standard error
    of the two rates' means, and the nearest rate outside it gets Welch's p."""
    losses = {1e-3: (4.40, 4.47, 4.36), 2e-3: (4.31, 4.37, 4.28), 4e-3: (4.29, 4.31, 4.33), 8e-3: (4.45, 4.43, 4.47)}
    runs = [entry("pre", lr, seed, val, val) for lr, values in losses.items() for seed, val in enumerate(values)]
    output = tmp_path / "sweep"
    hand_journal(output)
    write_sweep_journal(output / "runs.jsonl", hand_options(tmp_path), runs)
    result = invoke("sweep", "--output", output, "--data", tmp_path / "text.txt", "--styles", "pre", "--lrs",
                    "1e-3,2e-3,4e-3,8e-3", "--seeds", "0,1,2", *TINY)  # fmt: skip
    assert result.exit_code == 0, result.output
    best = min(losses, key=lambda lr: mean(losses[lr]))
    assert best == 4e-3
    tests = {lr: welch_written_out(list(values), list(losses[best])) for lr, values in losses.items() if lr != best}
    inside = sorted([best, *(lr for lr, (gap, se, _, _) in tests.items() if gap <= se)])
    assert inside == [2e-3, 4e-3]  # 1e-3 and 8e-3 lie outside: the journal is what this test means it to be
    nearest = min((lr for lr in tests if lr not in inside), key=lambda lr: tests[lr][0])
    gap, se, _, p = tests[nearest]
    [line] = [line for line in (output / "sweep.md").read_text().splitlines() if line.startswith("- pre,")]
    assert "a plateau of 2 rates, 2e-3 and 4e-3," in line and "Welch's" in line
    assert nearest == 1e-3 and f"the nearest rate outside it, 1e-3, is {gap:.4f} ± {se:.4f} worse" in line
    assert f"Welch's p = {p:.3f}" in line
