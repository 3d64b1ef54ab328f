"""What benchmarks/sweep_study_tables.py states about the study (study.md, study.json): each margin between two arms
as the difference of their mean test losses ± its standard error with Welch's two-sided p, recomputed here from the
committed journals with the formulas written out (tests/support/helpers.py); never a difference in units of a seed
spread, which is not a standard error; and study.md is what the script writes from the journals today."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from support.helpers import mean, welch_written_out

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "benchmarks" / "results" / "sweeps"
STUDY = (SWEEPS / "study.md").read_text(encoding="utf-8")


def journal(phase: str) -> list[dict]:
    return [json.loads(line) for line in (SWEEPS / phase / "runs.jsonl").read_text().splitlines()][1:]


def chosen_rate(runs: list[dict], style: str) -> float:
    """The rate the study reports an arm at: the lowest mean validation loss over the seeds every rate ran."""
    mine = [e for e in runs if e["style"] == style and e["alpha"] is None]
    rates = sorted({e["lr"] for e in mine})
    common = set.intersection(*({e["seed"] for e in mine if e["lr"] == lr} for lr in rates))
    return min(rates, key=lambda lr: (mean([e["val_loss"] for e in mine if e["lr"] == lr and e["seed"] in common]), lr))


def arm_losses(runs: list[dict], style: str, lr: float) -> list[float]:
    return [e["test_loss"] for e in runs if e["style"] == style and e["alpha"] is None and e["lr"] == lr]


def expected_margin(phase: str, style: str = "geo", rates_from: str | None = None) -> str:
    """``style`` against Pre-Norm on ``phase``'s test split, each at its rate (chosen on ``rates_from``'s
    validation), as study.md's two cells: the difference ± its standard error, then Welch's p."""
    runs, chooser = journal(phase), journal(rates_from or phase)
    arm = arm_losses(runs, style, chosen_rate(chooser, style))
    pre = arm_losses(runs, "pre", chosen_rate(chooser, "pre"))
    if len(arm) < 2 or len(pre) < 2:
        return f"{mean(arm) - mean(pre):+.3f} | single seed"
    margin, se, _, p = welch_written_out(arm, pre)
    return f"{margin:+.3f} ± {se:.3f} | {'< 0.001' if p < 0.001 else f'{p:.3f}'}"


def row_of(link: str) -> str:
    [row] = [line for line in STUDY.splitlines() if line.startswith(f"| {link} ")]
    return row


@pytest.mark.parametrize("phase", ["a_gpt2", "a_llama", "b_fortunes", "c_depth"])
def test_each_phase_gives_geonorms_margin_with_its_standard_error_and_welchs_p(phase):
    assert row_of(f"[{phase}]({phase}/sweep.md)").endswith(f" | {expected_margin(phase)} |")


def test_the_held_out_dictionary_is_compared_at_the_rates_chosen_on_prose():
    row = row_of("[b_gcide](b_gcide/sweep.md)")
    assert row.endswith(f" | {expected_margin('b_gcide', rates_from='b_fortunes')} |")


@pytest.mark.parametrize(("steps", "phase"), [(300, "h_styles"), (1200, "f_length_1200"), (2400, "f_length_2400")])
def test_each_length_gives_the_margin_with_its_standard_error_and_welchs_p(steps, phase):
    assert row_of(f"[{steps}]({phase}/sweep.md)").endswith(f" | {expected_margin(phase)} |")


@pytest.mark.parametrize(("shape", "phase"), [("GPT-2 4 x 256", "g_width_256"), ("GPT-2 2 x 128", "g_depth_2")])
def test_a_shape_with_seeds_gets_welchs_p_and_one_without_says_single_seed(shape, phase):
    row = row_of(f"[{shape}]({phase}/sweep.md)")
    assert row.endswith(f" | {expected_margin(phase)} |")
    assert ("single seed" in row) == (phase == "g_depth_2")  # phase g ran depth at seed 0 only


@pytest.mark.parametrize("style", ["post", "sandwich", "deepnorm"])
def test_phase_h_gives_each_style_against_pre_norm_with_its_standard_error(style):
    name = {"post": "Post-Norm", "sandwich": "SandwichNorm", "deepnorm": "DeepNorm"}[style]
    assert row_of(name).endswith(f" | {expected_margin('h_styles', style)} |")


def test_no_margin_is_stated_in_seed_spreads():
    assert "spreads" not in STUDY
    assert "in_spreads" not in (SWEEPS / "study.json").read_text(encoding="utf-8")


def test_phase_h_is_not_called_the_papers_table_and_says_what_held_post_norm_back():
    """Post-Norm and DeepNorm sat at the unigram loss in phase h, and the warm-up was a tenth of the run for every
    style: the section says both, and does not present the phase as every style tuned alike."""
    section = STUDY.split("## The five norm styles")[1].split("\n## ")[0]
    assert "phase h, before the Post-Norm fix" in section and "did not train" in section
    assert "warm-up fixed at a tenth of the run for every style" in section.lower() and "Post-LN" in section
    assert "paper's table" not in STUDY and "tuned alike" not in STUDY


def test_the_phases_split_and_its_leak_are_stated_from_the_measurement():
    leak = json.loads((ROOT / "benchmarks" / "results" / "split_leak.json").read_text())
    [old] = [row for row in leak["rows"] if row["split"].startswith("old")]
    assert f"{old['test']['leak']:.1%} of the test characters" in STUDY
    assert "no token is trained on twice" not in STUDY


def test_study_md_is_what_the_script_writes_from_the_journals(tmp_path, monkeypatch):
    """The committed page is the script's output on the committed journals (so no figure was edited by hand)."""
    for runs in SWEEPS.glob("*/runs.jsonl"):
        (tmp_path / runs.parent.name).mkdir()
        shutil.copy(runs, tmp_path / runs.parent.name / "runs.jsonl")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_study_tables", ROOT / "benchmarks" / "sweep_study_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["sweep_study_tables.py", "--results", str(tmp_path)])
    module.main()
    assert (tmp_path / "study.md").read_text(encoding="utf-8") == STUDY


def test_each_finished_phases_report_is_what_the_sweeps_report_writer_writes_from_its_journal():
    """A sweep.md written by an earlier hf-geonorm said what that version said (a margin against the larger seed
    spread, "the arm's best rate" in bold beside single-seed cells); benchmarks/sweep_reports.py writes every finished
    phase's report again from its journal, and this checks that none is stale."""
    from hf_geonorm.sweep.grid import read_journal
    from hf_geonorm.sweep.reference import read_held_out
    from hf_geonorm.sweep.report import report_text

    spec = importlib.util.spec_from_file_location("bench_sweep_reports", ROOT / "benchmarks" / "sweep_reports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    stale = []
    for phase in module.FINISHED:
        header, runs = read_journal(SWEEPS / phase / "runs.jsonl")
        written = report_text(runs, header, read_held_out(SWEEPS / phase, header))[0]
        if written != (SWEEPS / phase / "sweep.md").read_text(encoding="utf-8"):
            stale.append(phase)
    assert not stale, f"run `python benchmarks/sweep_reports.py` to write these again: {stale}"
    running = ("i_", "j_")  # phases i and j: their own sweeps write their reports as they run, until finished
    phases = {p.parent.name for p in SWEEPS.glob("*/runs.jsonl")
              if not p.parent.name.startswith(running) or p.parent.name in module.FINISHED}  # fmt: skip
    assert phases == set(module.FINISHED)


# ---- what the README and docs/training.md quote of the study ----

# the pages as read, their line breaks as spaces (a figure may be wrapped)
README = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
TRAINING = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
RESULT_PAGES = [*(ROOT / "benchmarks" / "results").glob("*.md"), *SWEEPS.glob("*.md")]


@pytest.mark.parametrize("text", [README, TRAINING], ids=["README", "training.md"])
def test_every_margin_the_readme_and_training_docs_quote_is_in_a_results_page(text):
    """Each "X ± Y" figure of the README and docs/training.md stands in a page a script wrote from the results."""
    pages = " ".join(" ".join(page.read_text(encoding="utf-8").split()) for page in RESULT_PAGES)
    quoted = set(re.findall(r"\d+\.\d+ ± \d+\.\d+", text))
    assert quoted and not [figure for figure in sorted(quoted) if figure not in pages]


def phase_i_cell(arch: str, style: str, top_share: float = 1.0) -> list[float]:
    """The test losses at ``style``'s phase-i cell: the lowest seed-0 validation loss over every warm-up share up to
    ``top_share`` and rate, read from the journals here."""
    runs = [(int(folder.name.rsplit("_w", 1)[1]) / 100, run) for folder in sorted(SWEEPS.glob(f"i_{arch}_w*"))
            for run in journal(folder.name)]  # fmt: skip
    own = [(share, r) for share, r in runs if r["style"] == style and share <= top_share and r["val_loss"] is not None]
    share, best = min(((s, r) for s, r in own if r["seed"] == 0), key=lambda item: item[1]["val_loss"])
    return [r["test_loss"] for s, r in own if (s, r["lr"]) == (share, best["lr"])]


def quoted(margin: float, se: float) -> str:
    return f"{'−' if margin < 0 else ''}{abs(margin):.3f} ± {se:.3f}"


@pytest.mark.parametrize("style", ["pre", "post", "deepnorm", "sandwich"])
def test_the_readme_and_docs_give_gpt2s_first_table_before_the_ladder_was_raised(style):
    """GeoNorm against each style over the warm-up shares up to 50% (the ladder before it was raised), Welch
    written out on the journals' test losses: the README and docs/training.md quote it."""
    margin, se, _, _ = welch_written_out(phase_i_cell("gpt2", "geo", 0.5), phase_i_cell("gpt2", style, 0.5))
    assert quoted(margin, se) in README and quoted(margin, se) in TRAINING, quoted(margin, se)


@pytest.mark.parametrize("style", ["deepnorm", "post"])
def test_llamas_margins_over_the_seeds_that_trained_are_quoted(style):
    """On LLaMA, GeoNorm against DeepNorm and Post-Norm over their seeds below the unigram reference (minus 0.1),
    Welch written out: the README and docs/training.md quote both, with p."""
    unigram = json.loads((SWEEPS / "paper_table.json").read_text())["reference"]["unigram_cross_entropy"]
    trained = [t for t in phase_i_cell("llama", style) if t <= unigram - 0.1]
    assert len(trained) == 2
    margin, se, _, p = welch_written_out(phase_i_cell("llama", "geo"), trained)
    for text in (README, TRAINING):
        stated = re.search(re.escape(quoted(margin, se)) + r" \(p = (\d\.\d+)", text)
        assert stated is not None, quoted(margin, se)
        decimals = len(stated.group(1).split(".")[1])
        assert abs(float(stated.group(1)) - p) <= 0.5 * 10**-decimals, (stated.group(0), p)


def phase_j_cell(folder: str, style: str) -> list[float]:
    """The test losses at ``style``'s chosen cell in a phase-j sweep: the lowest seed-0 validation loss over every
    warm-up share and rate of its one journal (none while the style has not run)."""
    own = [r for r in journal(folder) if r["style"] == style and r["val_loss"] is not None]
    if not own:  # a sweep still running that has not reached the style
        return []
    best = min((r for r in own if r["seed"] == 0), key=lambda r: r["val_loss"])
    return [r["test_loss"] for r in own if (r["warmup_share"], r["lr"]) == (best["warmup_share"], best["lr"])]


@pytest.mark.parametrize("style", ["pre", "deepnorm"])
def test_one_sweep_command_reproduces_phase_is_gpt2_margins_within_their_standard_errors(style):
    """j_gpt2_300 is `hf-geonorm sweep`'s default protocol run once (pre, geo, deepnorm); phase i was a driver over
    one folder per warm-up share. GeoNorm's margin over each style agrees within the two standard errors combined,
    each arm confirmed on three seeds, and docs/training.md quotes the reproduction's margin."""
    reproduced = welch_written_out(phase_j_cell("j_gpt2_300", "geo"), phase_j_cell("j_gpt2_300", style))
    original = welch_written_out(phase_i_cell("gpt2", "geo"), phase_i_cell("gpt2", style))
    assert len(phase_j_cell("j_gpt2_300", "geo")) == len(phase_j_cell("j_gpt2_300", style)) == 3
    assert abs(reproduced[0] - original[0]) <= (reproduced[1] ** 2 + original[1] ** 2) ** 0.5
    assert quoted(reproduced[0], reproduced[1]) in TRAINING, quoted(reproduced[0], reproduced[1])


def test_the_length_table_gives_each_confirmed_margin_from_the_journals():
    """length.md (benchmarks/length_table.py): GeoNorm against Pre-Norm and DeepNorm at each shape and length whose
    arms ran three seeds at their chosen cells, Welch written out on the journals here; none for a folder running."""
    text = (SWEEPS / "length.md").read_text(encoding="utf-8")
    rows = text.split("## GeoNorm's margins")[1].splitlines()
    sources = {("GPT-2 4 x 128", 300): lambda s: phase_j_cell("j_gpt2_300", s),
               ("LLaMA 4 x 128", 300): lambda s: phase_i_cell("llama", s)}  # fmt: skip
    for shape, arch in (("GPT-2 4 x 128", "gpt2"), ("LLaMA 4 x 128", "llama")):
        for steps in (1200, 2400):
            if (SWEEPS / f"j_{arch}_{steps}" / "runs.jsonl").is_file() and journal(f"j_{arch}_{steps}"):  # begun
                sources[shape, steps] = lambda s, folder=f"j_{arch}_{steps}": phase_j_cell(folder, s)
    for (shape, steps), losses in sources.items():
        [row] = [line for line in rows if line.startswith(f"| {shape} | {steps} |")]
        geo_minus_pre, geo_minus_deepnorm = row.split(" | ")[2:4]
        for column, style in ((geo_minus_pre, "pre"), (geo_minus_deepnorm, "deepnorm")):
            geo, other = losses("geo"), losses(style)
            if len(geo) < 3 or len(other) < 3:
                assert column == "–", (shape, steps, style)
                continue
            difference, se, _, _ = welch_written_out(geo, other)
            assert column.startswith(f"{difference:+.3f} ± {se:.3f} (p "), (shape, steps, style, column)
