"""The learning rate `train` gives a model trained from scratch, checked against what it rests on, read here on its
own: every measured cell's best rate (the lowest seed-0 validation loss in the study's journals), GPT-3's published
rates (Brown et al. 2020, table 2.1, written out below) by non-embedding parameter count beyond the cells, and
GeoNorm's measured ratio to Pre-Norm at the largest cell; and the log line that says which of them applies."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hf_geonorm.training import rate_rule
from hf_geonorm.training.options import TrainOptions
from hf_geonorm.training.presets import PRESETS
from hf_geonorm.training.run.model import planned_config, with_learning_rate
from hf_geonorm.training.sweep import grid as sweep_module
from hf_geonorm.training.sweep.options import SweepOptions

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "benchmarks" / "results" / "sweeps"
# GPT-3's models: (layers, width, peak learning rate), Brown et al. 2020, table 2.1
GPT3 = {"125m": (12, 768, 6.0e-4), "350m": (24, 1024, 3.0e-4), "760m": (24, 1536, 2.5e-4), "1.3b": (24, 2048, 2.0e-4),
        "2.7b": (32, 2560, 1.6e-4), "6.7b": (32, 4096, 1.2e-4), "13b": (40, 5140, 1.0e-4),
        "175b": (96, 12288, 0.6e-4)}  # fmt: skip
SWEEP_FIRST = "run `hf-geonorm sweep` first"


def two_figures(value: float) -> float:
    return float(f"{value:.2g}")


def journal_cells() -> dict[tuple[str, str, int, int], tuple[float, str]]:
    """(arch, style, width, depth) -> (best rate, phase) of every study-corpus 300-step journal at the library's
    settings, read from the journals directly: seed 0's lowest validation loss (diverged: infinite), a best at an
    edge of its grid left out (the best may lie beyond it)."""
    found = {}
    for journal in sorted(SWEEPS.glob("*/runs.jsonl")):
        header, *runs = (json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines())
        options = header["train_options"]
        if Path(str(options["data"])).name != "study" or options["max_steps"] != 300 or options["settings"]:
            continue
        sizes = PRESETS[options["preset"]] if isinstance(options["preset"], str) else options["preset"]
        runs = [r for r in runs if r["seed"] == 0 and r["alpha"] is None]
        for style in {r["style"] for r in runs}:
            own = [r for r in runs if r["style"] == style]
            best = min(own, key=lambda r: (math.inf if r["val_loss"] is None else r["val_loss"], r["lr"]))["lr"]
            if len(own) > 1 and best in (min(r["lr"] for r in own), max(r["lr"] for r in own)):
                continue
            shape = (options["arch"], style, sizes["hidden_size"], sizes["num_hidden_layers"])
            found[shape] = (best, journal.parent.name)
    return found


class Config:
    """What ``with_learning_rate`` reads of a GeoNorm config."""

    def __init__(self, arch: str, style: str, width: int, depth: int) -> None:
        self.model_type, self.norm_style = f"geonorm_{arch}", style
        self.hidden_size, self.num_hidden_layers = width, depth


def default_line(arch: str, style: str, width: int, depth: int) -> tuple[float, str]:
    """The rate train picks for a model of this shape, and the line it logs about it."""
    options, lines = with_learning_rate(TrainOptions(), Config(arch, style, width, depth))
    return options.lr, lines[0]


def published(layers: int, width: int) -> float:
    """GPT-3's rate at ``layers`` x ``width``, log-log between its models by non-embedding parameters
    (12 x layers x width^2), at 125M or more."""
    points = sorted((12 * d * w**2, lr) for d, w, lr in GPT3.values())
    size = 12 * layers * width**2
    (low, low_lr), (high, high_lr) = next((a, b) for a, b in zip(points, points[1:], strict=False) if size <= b[0])
    return math.exp(math.log(low_lr) + (math.log(size) - math.log(low)) / (math.log(high) - math.log(low))
                    * (math.log(high_lr) - math.log(low_lr)))  # fmt: skip


def largest_cell(arch: str) -> tuple[int, int, float, float]:
    """The largest shape (by layers x width^2) the journals measured both Pre-Norm and GeoNorm at for ``arch``:
    its width, depth and the two best rates."""
    cells = journal_cells()
    shapes = [(w, d) for (a, s, w, d) in cells if a == arch and s == "pre" and (a, "geo", w, d) in cells]
    width, depth = max(shapes, key=lambda shape: shape[1] * shape[0] ** 2)
    return width, depth, cells[(arch, "pre", width, depth)][0], cells[(arch, "geo", width, depth)][0]


def test_every_measured_cell_is_the_default_at_its_own_shape():
    """Each best rate the study measured, read from its journal here, is what train gives that shape, and the log
    says it is a measured cell (LLaMA Pre-Norm's c / width rule missed two of its three by 2-4x)."""
    cells = journal_cells()
    assert {arch for arch, *_ in cells} == {"gpt2", "llama"} and len(cells) >= 16
    for (arch, style, width, depth), (best, phase) in cells.items():
        lr, line = default_line(arch, style, width, depth)
        assert lr == best, (arch, style, width, depth, lr, best)
        assert "measured cell" in line and phase in line and SWEEP_FIRST not in line, line


def test_train_preset_125m_gets_gpt3s_rate_and_says_it_is_the_published_recipe():
    """`train --preset 125m` (GPT-2, Pre-Norm): the config train would build, and the rate and line it would log,
    within 1.5x of the 6e-4 GPT-3 trained that shape at; no cell measured a model that size, so the line says to
    sweep first."""
    options = TrainOptions(arch="gpt2", preset="125m", settings={"norm_style": "pre"})
    config = planned_config(options)
    assert (config.hidden_size, config.num_hidden_layers) == (768, 12)
    chosen, lines = with_learning_rate(options, config)
    assert 6e-4 / 1.5 <= chosen.lr <= 6e-4 * 1.5
    assert lines[0].startswith(f"learning rate {chosen.lr:g}, the default for training from scratch")
    assert "published recipe" in lines[0] and "GPT-3" in lines[0] and SWEEP_FIRST in lines[0], lines[0]
    assert (chosen.weight_decay, chosen.warmup_steps) == (0.1, 30)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("preset", ["125m", "350m", "760m", "1.3b"])
def test_beyond_the_cells_pre_norm_is_gpt3s_rate_and_geonorm_the_measured_ratio_times_it(arch, preset):
    """The presets are GPT-3's shapes: Pre-Norm gets GPT-3's rate; GeoNorm that rate times GeoNorm's best over
    Pre-Norm's at the largest cell measured for the architecture (read from the journals), stated as an
    extrapolation; Post-Norm, measured at no such shape, falls back to Pre-Norm's."""
    layers, width, gpt3 = GPT3[preset]
    assert (PRESETS[preset]["num_hidden_layers"], PRESETS[preset]["hidden_size"]) == (layers, width)
    lr, line = default_line(arch, "pre", width, layers)
    assert lr == gpt3 and "published recipe" in line and SWEEP_FIRST in line, line
    *_, pre, geo = largest_cell(arch)
    lr, line = default_line(arch, "geo", width, layers)
    assert lr == two_figures(geo / pre * gpt3) and "extrapolation" in line and SWEEP_FIRST in line, line
    lr, line = default_line(arch, "post", width, layers)
    assert lr == gpt3 and "fallback (unmeasured)" in line and SWEEP_FIRST in line, line


def test_the_published_recipe_is_interpolated_by_size_and_anchored_at_the_largest_cell():
    """Between GPT-3's models the rate is interpolated log-log by non-embedding parameters; between the largest
    measured cell and GPT-3's smallest model, log-log from the cell's measured rate; no larger than that cell but
    outside the measured widths and depths, the cell's rate; past GPT-3's largest, GPT-3 175B's."""
    assert default_line("gpt2", "pre", 896, 16)[0] == two_figures(published(16, 896))
    width, depth, pre, _ = largest_cell("gpt2")
    cell, gpt3 = (depth * width**2, pre), (12 * 768**2, 6e-4)
    size = 4 * 512**2  # 4 x 512: above the cell, below GPT-3 125M
    expected = math.exp(math.log(cell[1]) + (math.log(size) - math.log(cell[0])) / (math.log(gpt3[0]) - math.log(
        cell[0])) * (math.log(gpt3[1]) - math.log(cell[1])))  # fmt: skip
    lr, line = default_line("gpt2", "pre", 512, 4)
    assert lr == two_figures(expected) and "published recipe" in line, line
    assert 6e-4 < lr < pre
    small_and_deep = (64, 16)  # fewer parameters than the largest cell, deeper than any cell
    assert small_and_deep[1] * small_and_deep[0] ** 2 < depth * width**2
    assert default_line("gpt2", "pre", *small_and_deep)[0] == pre
    assert default_line("gpt2", "pre", 16384, 128)[0] == GPT3["175b"][2]


def test_inside_the_measured_shapes_the_fitted_rule_holds():
    """A shape between the cells (not one of them) gets the fitted rule c * width^a * depth^b, read from the rule's
    file and written out here."""
    table = json.loads(rate_rule.RATE_RULE.read_text(encoding="utf-8"))
    for arch, style, width, depth in (("gpt2", "pre", 96, 4), ("gpt2", "geo", 192, 6), ("llama", "geo", 96, 4)):
        rule = table["rules"][arch][style]
        lr, line = default_line(arch, style, width, depth)
        assert lr == two_figures(rule["c"] * width ** rule["a"] * depth ** rule["b"])
        assert "rule within the fitted range" in line and SWEEP_FIRST not in line, line


@pytest.mark.parametrize("style", ["post", "sandwich", "deepnorm"])
def test_styles_measured_at_one_shape_use_it_there_and_fall_back_to_pre_norm_elsewhere(style):
    """Phase h measured Post-, Sandwich- and DeepNorm at GPT-2 4 x 128 only: that cell's rate there; anywhere else
    (another width, LLaMA) Pre-Norm's default at that shape, and the line says the style is unmeasured."""
    best, _ = journal_cells()[("gpt2", style, 128, 4)]
    assert default_line("gpt2", style, 128, 4)[0] == best
    for arch, width, depth in (("gpt2", 64, 4), ("llama", 128, 4), ("gpt2", 768, 12)):
        lr, line = default_line(arch, style, width, depth)
        assert lr == default_line(arch, "pre", width, depth)[0]
        assert "fallback (unmeasured)" in line and SWEEP_FIRST in line, line


def test_a_measured_cell_is_added_by_the_rules_data_alone(tmp_path, monkeypatch):
    """A cell added to rate_rule.json (a later study's) is the default at its shape, with no change to the code."""
    table = json.loads(rate_rule.RATE_RULE.read_text(encoding="utf-8"))
    table["cells"].append({"phase": "a_later_study", "arch": "llama", "style": "post", "layers": 4, "width": 128,
                           "lr": 3e-4, "steps": 1200})  # fmt: skip
    edited = tmp_path / "rate_rule.json"
    edited.write_text(json.dumps(table), encoding="utf-8")
    monkeypatch.setattr(rate_rule, "RATE_RULE", edited)
    chosen = rate_rule.pretraining_rate("llama", "post", 128, 4)
    assert (chosen.lr, chosen.source) == (3e-4, "measured cell") and "a_later_study" in chosen.why
    assert rate_rule.pretraining_rate("llama", "post", 256, 4).source == "fallback (unmeasured)"


def test_the_sweeps_grid_spans_eight_times_either_side_of_a_rate_no_cell_measured():
    """At 125M (GPT-3's rate, and GeoNorm's extrapolated from it) the default grid reaches 1/8 and 8 times the
    centre; at a measured shape it stays a quarter to four times."""
    logged: list[str] = []
    wide = sweep_module.style_grids(SweepOptions(styles=("pre", "geo")), TrainOptions(preset="125m"), logged.append)
    for style, rates in wide.items():
        centre = default_line("gpt2", style, 768, 12)[0]
        assert min(rates) <= centre / 8 and max(rates) >= centre * 8 and centre in rates, (style, rates)
        assert all(later / earlier == pytest.approx(2) for earlier, later in zip(rates, rates[1:], strict=False))
    assert any("published recipe" in line for line in logged) and any("extrapolation" in line for line in logged)
    narrow = sweep_module.style_grids(SweepOptions(styles=("pre",)), TrainOptions(), lambda _: None)
    centre = default_line("gpt2", "pre", 128, 4)[0]
    assert narrow["pre"] == (centre / 4, centre / 2, centre, centre * 2, centre * 4)


def test_the_default_rates_table_is_the_scripts_and_sets_gpt3_beside_each_preset(tmp_path, monkeypatch):
    """benchmarks/results/default_rates.json is what benchmarks/default_rates.py writes today; it holds every
    preset x style x family with a source, and GPT-3's rate (written out above) beside each of GPT-3's shapes."""
    import importlib.util
    import sys

    from hf_geonorm.modeling.settings import NORM_STYLES

    script = ROOT / "benchmarks" / "default_rates.py"
    spec = importlib.util.spec_from_file_location("bench_default_rates", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(sys, "argv", [str(script), "--output", str(tmp_path)])
    bench.main()
    written = json.loads((tmp_path / "default_rates.json").read_text(encoding="utf-8"))
    committed = ROOT / "benchmarks" / "results" / "default_rates.json"
    assert json.loads(committed.read_text(encoding="utf-8")) == written
    assert (tmp_path / "default_rates.md").read_text() == committed.with_suffix(".md").read_text()
    rows = {(r["preset"], r["arch"], r["style"]): r for r in written["rates"]}
    assert set(rows) == {(p, a, s) for p in PRESETS for a in ("gpt2", "llama") for s in NORM_STYLES}
    for (preset, _, style), row in rows.items():
        assert row["source"] in rate_rule.UNMEASURED + ("measured cell", "rule within the fitted range")
        if preset in GPT3:
            assert row["gpt3"]["lr"] == GPT3[preset][2]
            assert style != "pre" or row["lr"] == GPT3[preset][2]
        else:
            assert row["gpt3"] is None


def test_the_default_rates_page_says_where_the_measured_ratio_ends_and_where_the_fitted_rules_cross():
    """GeoNorm's best rate was 2-8 times Pre-Norm's only at the cells (widths 64-256, 300 steps); GPT-2's fitted
    rules, taken beyond those widths, put GeoNorm's rate at Pre-Norm's at some width and below it after: the page
    names that width (found here by evaluating the two rules, bisecting in log width) and what train does there."""
    table = json.loads(rate_rule.RATE_RULE.read_text(encoding="utf-8"))
    pre, geo = table["rules"]["gpt2"]["pre"], table["rules"]["gpt2"]["geo"]

    def geo_over_pre(width: float) -> float:
        return (geo["c"] * width ** geo["a"] * 4 ** geo["b"]) / (pre["c"] * width ** pre["a"] * 4 ** pre["b"])

    low, high = 256.0, 65536.0
    assert geo_over_pre(low) > 1 > geo_over_pre(high)
    for _ in range(200):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if geo_over_pre(middle) > 1 else (low, middle)
    page = (ROOT / "benchmarks" / "results" / "default_rates.md").read_text(encoding="utf-8")
    widths = sorted({c["width"] for c in table["cells"] if c["arch"] == "gpt2"})
    [line] = [line for line in page.splitlines() if line.startswith("- gpt2")]
    assert f"meets Pre-Norm's at width {round(low)}" in line and "below it beyond" in line
    assert f"widths {widths[0]}-{widths[-1]}" in line
    if low < GPT3["125m"][1]:  # every preset above tiny is wider: its extrapolated rate contradicts the rules
        assert "gpt2's fitted rules, taken that far, would put GeoNorm's rate below Pre-Norm's" in page
