"""The benchmark scripts: each one's imports resolve (none reads a helper that is gone), and none trains a model
by a loop of its own, so that the evidence is about the code users run (``run_training``, ``run_sweep``);
benchmarks/data_pipeline.py runs end to end at 1 MB (with --runslow)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))
# times single training steps of its own (forward, backward, AdamW) for speed; trains no model to a result
STEP_TIMERS = {"overhead"}
OWN_TRAINING = (".backward(", "optimizer.step(", "clip_grad_norm_(")
NEEDS_TRITON = {"kernel_resources"}  # compiles the kernels through Triton's compiler (Linux wheels only)


def load(script: Path, monkeypatch) -> object:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their neighbours by name
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_every_benchmark_script_imports(script, monkeypatch):
    if script.stem in NEEDS_TRITON:
        pytest.importorskip("triton.backends.nvidia", reason="needs triton and its NVIDIA backend (pip install triton)")
    load(script, monkeypatch)


def test_no_benchmark_trains_through_a_loop_of_its_own():
    assert {path.stem for path in SCRIPTS} >= STEP_TIMERS
    found = [f"{path.name}: {marker}" for path in SCRIPTS if path.stem not in STEP_TIMERS
             for marker in OWN_TRAINING if marker in path.read_text(encoding="utf-8")]  # fmt: skip
    assert not found, "train through hf_geonorm.training (run_training, run_sweep) instead:\n" + "\n".join(found)


@pytest.mark.slow  # four child processes and two tokenizers trained: about 30 s of CPU, 4% of the default suite's
@pytest.mark.parametrize("shape", ["file", "folder"])
def test_data_pipeline_marks_every_target_and_resumes_from_its_journal(shape, tmp_path, monkeypatch):
    """benchmarks/data_pipeline.py at 1 MB, each corpus shape: every measurement, every target in the table; the
    tokens it reports are the tokenizer's count of the documented documents; a second run measures nothing again."""
    from tokenizers import Tokenizer

    from support.helpers import reference_documents

    bench = load(BENCHMARKS / "data_pipeline.py", monkeypatch)
    args = ["--sizes", "1", "--shapes", shape, "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    bench.main(args)
    payload = json.loads((tmp_path / "out" / "data_pipeline.json").read_text())
    table = (tmp_path / "out" / "data_pipeline.md").read_text()
    runs = payload["measurements"]
    assert sorted(runs) == sorted(f"{shape}-1-{job}" for job in bench.JOBS)
    assert len(payload["targets"]) == 5 and all(f"| {t['target']} | {t['corpus']} |" in table
                                                for t in payload["targets"])  # fmt: skip
    for target in payload["targets"]:
        if target["target"].startswith("2 processes"):
            assert target["met"] is None  # not a target below 100 MB
    if shape == "file":
        tokenizer = Tokenizer.from_file(str(tmp_path / "work" / "tokenizer.json"))
        docs = reference_documents((tmp_path / "work" / "file-1MB.txt").read_text(encoding="utf-8"))
        counted = sum(len(tokenizer.encode(doc, add_special_tokens=False).ids) + 1 for doc in docs)
        assert runs["file-1-given-1"]["tokens"] == runs["file-1-given-2"]["tokens"] == counted

    def measured_again(*args, **kwargs):
        raise AssertionError("a journaled measurement ran again")

    monkeypatch.setattr(bench, "measure", measured_again)
    bench.main(args)
    assert json.loads((tmp_path / "out" / "data_pipeline.json").read_text())["measurements"] == runs


def test_rate_rule_recovers_a_known_rule_and_borrows_what_the_cells_cannot_fix(monkeypatch):
    """benchmarks/rate_rule.py on cells drawn from rules written out here (phase g's layout): GPT-2's exponents are
    recovered, LLaMA (one depth) borrows GPT-2's depth exponent, a style seen at one shape borrows Pre-Norm's, and
    every cell left out is predicted exactly."""
    bench = load(BENCHMARKS / "rate_rule.py", monkeypatch)
    truth = {("gpt2", "pre"): (0.5, -1.0, -0.5), ("gpt2", "geo"): (0.2, -0.5, 0.25),
             ("llama", "pre"): (0.1, -0.75, -0.5)}  # fmt: skip
    cells = []
    for phase, (arch, layers, width) in bench.SHAPES.items():
        for (rule_arch, style), (c, a, b) in truth.items():
            if rule_arch == arch:
                cells.append({"phase": phase, "arch": arch, "style": style, "layers": layers, "width": width,
                              "lr": c * width**a * layers**b})  # fmt: skip
    cells.append({"phase": "h_styles", "arch": "gpt2", "style": "post", "layers": 4, "width": 128, "lr": 1e-3})
    record = bench.report(cells, [])
    for (arch, style), (c, a, b) in truth.items():
        rule = record["rules"][arch][style]
        assert rule["c"] == pytest.approx(c, rel=1e-6) and rule["a"] == pytest.approx(a, abs=1e-6)
        assert rule["b"] == pytest.approx(b if arch == "gpt2" else -0.5, abs=1e-6)  # LLaMA: GPT-2 pre's b
    assert record["rules"]["llama"]["pre"]["borrowed"] == ["b"]
    post = record["rules"]["gpt2"]["post"]
    assert (post["a"], post["b"], post["borrowed"]) == (pytest.approx(-1.0), pytest.approx(-0.5), ["a", "b"])
    assert post["c"] * 128**-1.0 * 4**-0.5 == pytest.approx(1e-3)
    loo = [row for row in record["leave_one_out"] if row["style"] != "post"]
    assert loo and all(row["ratio"] == pytest.approx(1.0, rel=1e-6) for row in loo)
    assert record["gpt3_125m"]["pre_rule"] == pytest.approx(0.5 * 768**-1.0 * 12**-0.5)


def test_rate_rule_says_how_many_cells_each_rule_fits_and_which_fit_by_construction(monkeypatch):
    """A rule over cells that all measured one rate (a constant), or over one cell, fits them and "predicts" each left
    out by construction: the page says so rather than count them as predictions, and for a rule whose cells vary it
    counts the cells within 10% of the rule, fit with them and fit without each (least squares written out here)."""
    bench = load(BENCHMARKS / "rate_rule.py", monkeypatch)
    llama = {64: 8e-3, 128: 2e-3, 256: 2e-3}  # varies, and the one-width-exponent rule misses it
    cells = [{"phase": phase, "arch": arch, "style": style, "layers": layers, "width": width,
              "lr": (2e-3 if style == "pre" else 1.024 / width) if arch == "gpt2" else llama[width]}
             for phase, (arch, layers, width) in bench.SHAPES.items() for style in ("pre", "geo")
             if arch == "gpt2" or style == "pre"]  # fmt: skip
    cells.append({"phase": "h_styles", "arch": "gpt2", "style": "post", "layers": 4, "width": 128, "lr": 2.5e-4})
    page = bench.page(bench.report(cells, []))
    accounts = {line.split(":")[0]: line for line in page.splitlines() if line.startswith("- ")}
    assert "a constant" in accounts["- gpt2 pre"] and "by construction" in accounts["- gpt2 pre"]
    assert "5 cells" in accounts["- gpt2 pre"]
    assert "one cell" in accounts["- gpt2 post"] and "by construction" in accounts["- gpt2 post"]
    assert "by construction" not in accounts["- gpt2 geo"] and "5 of 5 within 10%" in accounts["- gpt2 geo"]

    def line_fit(widths: list[int]) -> tuple[float, float]:  # log lr = log c + a log width (depth borrowed: 0)
        x, y = np.log(widths), np.log([llama[w] for w in widths])
        a = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
        return math.exp(y.mean() - a * x.mean()), a

    def near(width: int, rule: tuple[float, float]) -> bool:
        return 1 / 1.1 <= rule[0] * width ** rule[1] / llama[width] <= 1.1

    inside = sum(near(w, line_fit(list(llama))) for w in llama)
    left_out = sum(near(w, line_fit([o for o in llama if o != w])) for w in llama)
    assert f"{inside} of 3 within 10% of the rule fit over them" in accounts["- llama pre"]
    assert f"{left_out} of 3 within 10% when left out of the fit" in accounts["- llama pre"]
    assert "exactly" not in page


def copy_journal(phase: str, target: Path, keep=lambda entry: True) -> None:
    """The committed journal of ``phase`` written to ``target``/runs.jsonl: its header and the runs ``keep`` keeps."""
    header, *lines = (BENCHMARKS / "results" / "sweeps" / phase / "runs.jsonl").read_text(encoding="utf-8").splitlines()
    target.mkdir(parents=True)
    kept = [header] + [line for line in lines if keep(json.loads(line))]
    (target / "runs.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")


def test_rate_rule_leaves_out_a_best_at_the_grid_edge_and_refuses_a_phase_at_another_warm_up(tmp_path, monkeypatch):
    """Phase i's GPT-2 journal with Pre-Norm's rates above its best (the lowest seed-0 validation loss, found here)
    taken away: Pre-Norm's best is then the grid's highest rate, left out as at an edge, while the other styles stay
    cells; the 30% warm-up's journal under the 10% one's name is refused, naming its warm-up."""
    bench = load(BENCHMARKS / "rate_rule.py", monkeypatch)
    runs = [json.loads(line) for line in (BENCHMARKS / "results" / "sweeps" / "i_gpt2_w10" / "runs.jsonl")
            .read_text(encoding="utf-8").splitlines()[1:]]  # fmt: skip
    pre = [r for r in runs if (r["style"], r["seed"], r["alpha"]) == ("pre", 0, None)]
    best = min(pre, key=lambda r: (math.inf if r["val_loss"] is None else r["val_loss"], r["lr"]))["lr"]
    assert best < max(r["lr"] for r in pre)
    copy_journal("i_gpt2_w10", tmp_path / "cut" / "i_gpt2_w10", lambda r: r["style"] != "pre" or r["lr"] <= best)
    cells, edges = bench.measured_cells(tmp_path / "cut")
    assert [(c["style"], c["lr"]) for c in edges] == [("pre", best)]
    assert {c["style"] for c in cells} == {r["style"] for r in runs} - {"pre"}
    assert all(c["warmup_share"] == 0.1 for c in cells)
    copy_journal("i_gpt2_w30", tmp_path / "other" / "i_gpt2_w10")
    with pytest.raises(SystemExit, match=r"i_gpt2_w10/runs.jsonl: a warm-up of 90 of 300 steps, not train's default"):
        bench.measured_cells(tmp_path / "other")


def test_paper_table_chooses_on_seed_0_validation_over_rates_and_warm_up_shares(monkeypatch):
    """Phase i's table: the chosen cell is the lowest seed-0 validation loss over every share and rate, its edges are
    named, and the test loss is over the seeds at that cell only; the margin against Pre-Norm and its standard
    error are the two-sample formulas written out here."""
    table = load(BENCHMARKS / "paper_table.py", monkeypatch)

    def run(style, lr, seed, val, test):
        return {"style": style, "lr": lr, "seed": seed, "val_loss": val, "test_loss": test}

    runs = {
        0.1: [run("post", 1e-3, 0, 5.0, 5.1), run("post", 2e-3, 0, 4.8, 4.9), run("post", 4e-3, 0, 4.9, 4.7),
              run("pre", 1e-3, 0, 4.7, 4.6), run("pre", 2e-3, 0, 4.6, 4.5), run("pre", 4e-3, 0, 4.65, 4.4),
              run("pre", 2e-3, 1, 4.62, 4.55), run("pre", 2e-3, 2, 4.61, 4.47)],
        0.3: [run("post", 1e-3, 0, 4.9, 5.0), run("post", 2e-3, 0, 4.75, 4.95), run("post", 4e-3, 0, 4.7, 4.9),
              run("post", 4e-3, 1, 4.72, 4.85), run("post", 4e-3, 2, 4.71, 4.8)],
    }
    post, pre = table.style_row(runs, "post"), table.style_row(runs, "pre")
    assert (post["share"], post["lr"]) == (0.3, 4e-3) and post["edges"] == ["highest rate", "highest warm-up"]
    assert post["test"] == [4.9, 4.85, 4.8] and post["test_mean"] == pytest.approx(4.85)
    assert (pre["share"], pre["lr"], pre["edges"]) == (0.1, 2e-3, [])
    assert pre["test"] == [4.5, 4.55, 4.47]
    monkeypatch.setattr(table, "shape_runs", lambda results, arch: runs)
    rows = table.shape_table(Path("unused"), "gpt2")["styles"]
    a, b = [4.9, 4.85, 4.8], [4.5, 4.55, 4.47]
    var = lambda xs: sum((x - sum(xs) / 3) ** 2 for x in xs) / 2  # noqa: E731
    assert rows["post"]["minus_pre"] == pytest.approx(sum(a) / 3 - sum(b) / 3)
    assert rows["post"]["welch"]["standard_error"] == pytest.approx(((var(a) + var(b)) / 3) ** 0.5)


def test_paper_table_sets_geonorm_against_each_style_and_shows_the_default_warm_up_alone(monkeypatch):
    """GeoNorm's margin over each style is its mean minus theirs with the two-sample standard error written out
    here; the default-share table chooses at a tenth of the run alone, on seed 0's validation."""
    table = load(BENCHMARKS / "paper_table.py", monkeypatch)

    def run(style, lr, seed, val, test):
        return {"style": style, "lr": lr, "seed": seed, "val_loss": val, "test_loss": test}

    geo, pre = [4.1, 4.2, 4.15], [4.4, 4.35, 4.5]
    runs = {
        0.1: [run("geo", 8e-3, 0, 4.5, 4.45), run("geo", 4e-3, 0, 4.6, 4.3), run("pre", 2e-3, 0, 5.0, 4.9),
              run("pre", 4e-3, 0, 5.1, 4.8)],
        0.5: [run("geo", 8e-3, s, 4.3, t) for s, t in enumerate(geo)]
        + [run("pre", 8e-3, s, 4.4, t) for s, t in enumerate(pre)],
    }
    monkeypatch.setattr(table, "shape_runs", lambda results, arch: runs)
    result = table.shape_table(Path("unused"), "gpt2")
    var = lambda xs: sum((x - sum(xs) / 3) ** 2 for x in xs) / 2  # noqa: E731
    assert result["styles"]["pre"]["geo_minus"] == pytest.approx(sum(geo) / 3 - sum(pre) / 3)
    assert result["styles"]["pre"]["geo_welch"]["standard_error"] == pytest.approx(((var(geo) + var(pre)) / 3) ** 0.5)
    assert "geo_minus" not in result["styles"]["geo"]
    assert result["default_share"] == {"geo": {"lr": 8e-3, "val": 4.5, "test": 4.45},
                                       "pre": {"lr": 2e-3, "val": 5.0, "test": 4.9}}  # fmt: skip


def test_paper_table_shows_the_first_ladder_the_unshown_runs_and_the_margins_over_seeds_that_trained(monkeypatch):
    """GPT-2's first table chooses over the shares up to the old ladder's top only; seeded runs away from a chosen
    cell are listed; a style with a seed at the unigram loss is also compared over its other seeds; the share of the
    default-warm-up lead that the tuning removes is 1 - tuned / told. Expected values are written out here."""
    table = load(BENCHMARKS / "paper_table.py", monkeypatch)

    def run(style, lr, seed, val, test):
        return {"style": style, "lr": lr, "seed": seed, "val_loss": val, "test_loss": test}

    geo, pre_half, pre_late, post = [4.1, 4.2, 4.15], [4.5, 4.4, 4.45], [4.3, 4.25, 4.35], [4.3, 6.25, 4.32]
    runs = {
        0.1: [run("geo", 8e-3, 0, 4.6, 4.4), run("pre", 2e-3, 0, 5.0, 4.9), run("post", 5e-4, 0, 5.5, 5.4)],
        0.5: [run("geo", 8e-3, s, 4.3, t) for s, t in enumerate(geo)]
        + [run("pre", 4e-3, s, 4.6, t) for s, t in enumerate(pre_half)] + [run("post", 2e-3, 0, 4.9, 4.8)],
        0.7: [run("pre", 8e-3, s, 4.5, t) for s, t in enumerate(pre_late)]
        + [run("post", 4e-3, s, 4.4, t) for s, t in enumerate(post)],
    }
    monkeypatch.setattr(table, "shape_runs", lambda results, arch: runs)
    full = table.shape_table(Path("unused"), "gpt2")
    first = full["first_table"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    var = lambda xs: sum((x - mean(xs)) ** 2 for x in xs) / (len(xs) - 1)  # noqa: E731
    assert first["top_share"] == 0.5 and (first["styles"]["pre"]["share"], first["styles"]["pre"]["lr"]) == (0.5, 4e-3)
    assert first["styles"]["pre"]["geo_minus"] == pytest.approx(mean(geo) - mean(pre_half))
    assert full["styles"]["pre"]["geo_minus"] == pytest.approx(mean(geo) - mean(pre_late))
    assert [(r["style"], r["share"], r["seed"]) for r in full["unshown"]] == [("pre", 0.5, 1), ("pre", 0.5, 2)]
    assert first["unshown"] == []
    trained = table.trained_seed_margins(full, unigram=6.3)
    assert set(trained) == {"post"} and trained["post"]["test"] == [4.3, 4.32]
    assert trained["post"]["geo_minus"] == pytest.approx(mean(geo) - 4.31)
    assert trained["post"]["geo_welch"]["standard_error"] == pytest.approx((var(geo) / 3 + var([4.3, 4.32]) / 2) ** 0.5)
    lead = table.warmup_share_of_lead(full, trained)
    told, tuned = 4.9 - 4.4, mean(pre_late) - mean(geo)
    assert lead["pre"]["told"] == pytest.approx(told) and lead["pre"]["removed"] == pytest.approx(1 - tuned / told)
    assert lead["pre"]["overstatement"] == pytest.approx(told / tuned)
    assert lead["post"]["removed_trained"] == pytest.approx(1 - (4.31 - mean(geo)) / (5.4 - 4.4))
    assert lead["geo"]["gain_seed0"] == pytest.approx(4.4 - 4.1)
    assert "told" not in lead["geo"]


def test_paper_table_md_is_what_the_script_writes_from_the_committed_journals(monkeypatch):
    """The committed page is the script's output from the journals (its unigram reference as the script recorded
    it): no figure of it was typed by hand."""
    table = load(BENCHMARKS / "paper_table.py", monkeypatch)
    sweeps = BENCHMARKS / "results" / "sweeps"
    reference = json.loads((sweeps / "paper_table.json").read_text(encoding="utf-8"))["reference"]
    corpus = json.loads(table.STUDY_FILES.read_text(encoding="utf-8"))
    written = table.page(table.all_tables(sweeps, reference["unigram_cross_entropy"]), reference, corpus)
    assert (sweeps / "paper_table.md").read_text(encoding="utf-8") == written
