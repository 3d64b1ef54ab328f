"""Scaling: where GeoNorm's best ``geo_alpha`` lies as the token budget, the depth and the width change.

A grid that moves one axis at a time around a middle point (12 layers, width 64, 192 steps x 16 x 128 tokens =
0.39M tokens), on the GPT-2 and the LLaMA shape:

    budget  64 / 192 / 512 steps (0.13M / 0.39M / 1.05M tokens) at 12 layers, width 64
    depth   4 / 12 / 32 layers at width 64, 0.39M tokens
    width   64 / 128 / 256 at 12 layers, 0.39M tokens

The learning rate is fixed per width as a user would fix it, ``lr = 2e-3 sqrt(128 / width)`` (64: 2.8e-3,
128: 2e-3, 256: 1.4e-3), with warm-up over the first tenth of the steps and cosine decay to a tenth; 4 heads.
Each cell runs Pre-Norm and GeoNorm with harmonic decay at alpha 0.125 / 0.25 / 0.5 / 1 / 2 (every other
setting as the library's defaults stood when the study began: max angle pi/4, embedding radius, fixed step,
written out so that a later change of a default does not change the runs), then constant decay at the cell's
best alpha. One seed per grid run.

The grid runs on two corpora, the Python standard library's source (``stdlib``) and Debian's ``fortunes``
(``prose``). The defaults are chosen on the budget and depth axes of those two corpora only. Two checks the
choice never saw follow: the third corpus, the GNU dictionary GCIDE (``dict``), held out for the final
comparison (the chosen setting against Pre-Norm at the middle size and the largest budget, 3 seeds, every
corpus, both shapes), and the width axis, run after the choice.

The work is ordered so that a cut-short session still answers the question: the budget axis first (the one a
default chosen at one budget failed on), then depth, then the final comparison, then width. Every finished run
is appended to ``scaling_runs.jsonl`` at once and reused by the next invocation with the same specification,
and the tables, JSON and figure are rewritten after every cell, marking the cells still to run
(``--report`` rewrites them from the journal without running anything).

    python benchmarks/scaling.py                          # the CPU study (many hours on 2 cores; resumable)
    python benchmarks/scaling.py --phases budget          # only the budget axis
    python benchmarks/scaling.py --scale 125m --steps 20000 --seq-len 1024 --batch 32 --vocab 50304 \\
        --max-chars 0 --workers 1 --threads 8             # on a GPU: Pre-Norm vs the defaults at the paper's 125M
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus_data  # noqa: E402
import reports  # noqa: E402
import run_loop  # noqa: E402
import studies  # noqa: E402
from scaling_grid import (  # noqa: E402
    ALPHAS,
    CHOICE_CORPORA,
    HELDOUT_CORPUS,
    PHASES,
    PRE,
    Cell,
    alpha_label,
    best_alpha,
    cell_name,
    cell_tables,
    choice_tables,
    chosen_rule,
    complete,
    geo,
    grid,
    lr_for,
    variant,
)
from scaling_tables import write  # noqa: E402


def spec_for(args: argparse.Namespace, cell: Cell, arch: str, corpus: str, label: str, settings: dict[str, Any],
             seed: int = 0) -> run_loop.RunSpec:  # fmt: skip
    steps = args.steps or cell.steps
    overrides = dict(
        label=f"{cell.name} | {label}", arch=arch, corpus=corpus, settings=settings, seed=seed,
        layers=cell.layers, width=cell.width, steps=steps, lr=args.lr or lr_for(cell.width),
        warmup=max(1 if args.smoke else 10, steps // 10), eval_every=max(1, steps // 8),
    )  # fmt: skip
    return studies.base_spec(args, **overrides)


class Study:
    """Runs cells in order, keeps every finished run and rewrites the results after each cell."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.archs = args.archs.split(",")
        self.journal = args.out / f"{studies.stem('scaling', args)}_runs.jsonl"
        self.results: dict[str, dict[str, Any]] = {}  # by label/arch/corpus/seed
        self.start = time.perf_counter()
        self.corpora: dict[str, corpus_data.Corpus] = {}
        self.final_arm: str | None = None

    def corpus(self, name: str) -> corpus_data.Corpus:
        if name not in self.corpora:
            self.corpora[name] = corpus_data.load_corpus(name, self.args.vocab, self.args.seq_len,
                                                    studies.max_chars(self.args), self.args.prose)  # fmt: skip
        return self.corpora[name]

    def load_journal(self) -> None:
        """Every run finished so far (``--report``: rewrite the results without running anything)."""
        if self.journal.exists():
            for line in self.journal.read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    s = r["spec"]
                    self.results[f"{s['label']}|{s['arch']}|{s['corpus']}|{s['seed']}"] = r

    def rule(self) -> tuple[float, str]:
        """The rule's setting over the choice cells among the runs known so far."""
        return chosen_rule(choice_tables(cell_tables(list(self.results.values())), self.args.smoke))

    def run(self, specs: list[run_loop.RunSpec]) -> list[dict[str, Any]]:
        corpora = {s.corpus: self.corpus(s.corpus) for s in specs}
        runs = run_loop.run_all(specs, corpora, self.args.workers, self.args.threads, reuse=self.journal,
                              journal=self.journal)  # fmt: skip
        for r in runs:
            s = r["spec"]
            self.results[f"{s['label']}|{s['arch']}|{s['corpus']}|{s['seed']}"] = r
        return runs

    def run_cell(self, cell: Cell) -> None:
        """Pre-Norm and the harmonic alphas on every shape and choice corpus, then constant decay at each
        (shape, corpus)'s best alpha."""
        first = [
            spec_for(self.args, cell, arch, corpus, label, settings)
            for arch in self.archs
            for corpus in self.args.choice_corpora
            for label, settings in [("pre", PRE)] + [(alpha_label(a), geo(a)) for a in ALPHAS]
        ]
        runs = self.run(first)
        second = []
        for arch in self.archs:
            for corpus in self.args.choice_corpora:
                mine = [r for r in runs if r["spec"]["arch"] == arch and r["spec"]["corpus"] == corpus]
                best = best_alpha(mine)
                second.append(spec_for(self.args, cell, arch, corpus, alpha_label(best, "constant"),
                                       geo(best, "constant")))  # fmt: skip
        self.run(second)

    def run_final(self, alpha: float, decay: str) -> None:
        """The chosen setting against Pre-Norm, every corpus (the held-out one too), both shapes, ``seeds``
        seeds, at the middle size and the largest budget (seed 0 on the choice corpora is the grid's run)."""
        self.final_arm = alpha_label(alpha, decay)
        cell = self.final_cell()
        specs = [
            spec_for(self.args, cell, arch, corpus, label, settings, seed)
            for corpus in [*self.args.choice_corpora, self.args.heldout]
            for arch in self.archs
            for seed in range(self.args.seeds)
            for label, settings in [("pre", PRE), (self.final_arm, geo(alpha, decay))]
        ]
        self.run(specs)

    def final_cell(self) -> Cell:
        budget = grid(self.args.smoke)["budget"]
        return Cell("final", budget[0].layers, budget[0].width, max(c.steps for c in budget))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    studies.common_arguments(parser, steps=0, layers=12, width=64, seq_len=128)
    parser.set_defaults(lr=0.0, seeds=3)
    parser.add_argument("--archs", default="gpt2,llama")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, in order: {', '.join(PHASES)}")
    parser.add_argument("--final-alpha", type=float, default=None,
                        help="alpha of the final comparison [default: the rule's choice from the grid]")  # fmt: skip
    parser.add_argument("--final-decay", default=None, choices=["harmonic", "constant"])
    parser.add_argument("--report", action="store_true",
                        help="only rewrite the tables, JSON and figure from the runs finished so far")  # fmt: skip
    args = parser.parse_args(argv)
    args.choice_corpora, args.heldout = list(CHOICE_CORPORA), HELDOUT_CORPUS
    if args.smoke:
        studies.apply_smoke(args)
        args.steps, args.seeds, args.archs = 0, 2, "llama"
        args.choice_corpora = ["stdlib"]
    if args.scale:  # on a GPU: Pre-Norm against the given (or current library) defaults at a paper size
        return scale_run(args)
    study = Study(args)
    phases = args.phases.split(",")
    axes = grid(args.smoke)
    if args.report:
        return report(study, phases)
    chosen = None
    for index, phase in enumerate(phases):
        after = phases[index + 1 :]
        later = [c.name for p in after for c in axes.get(p, [])] + (["final"] if "final" in after else [])
        if phase == "final":  # the rule over every choice cell finished so far, this invocation's or earlier
            study.load_journal()
            chosen = study.rule()
            study.run_final(args.final_alpha or chosen[0], args.final_decay or chosen[1])
            write(study, later, chosen)
            continue
        for i, cell in enumerate(axes[phase]):
            study.run_cell(cell)
            chosen = study.rule()
            write(study, [c.name for c in axes[phase][i + 1 :]] + later, chosen)
    payload = write(study, [], chosen)
    print(f"wrote {args.out / studies.stem('scaling', args)}.md/.json/.png")
    return payload


def report(study: Study, phases: list[str]) -> dict[str, Any]:
    """``--report``: the results of every run in the journal, the final comparison's arm read from its runs."""
    args = study.args
    study.load_journal()
    results = list(study.results.values())
    tables = cell_tables(results)
    final = study.final_cell().name
    chosen = study.rule()
    counts: dict[str, int] = {}
    for r in results:
        extra = r["spec"]["seed"] > 0 or r["spec"]["corpus"] == args.heldout  # not a grid run
        if cell_name(r) == final and variant(r) != "pre" and extra:
            counts[variant(r)] = counts.get(variant(r), 0) + 1
    # the final comparison's arm: the rule's setting, else the arm with the most final runs
    arm = alpha_label(*chosen)
    study.final_arm = arm if arm in counts else max(counts, key=counts.get, default=None)
    pending = [c.name for p in phases for c in grid(args.smoke).get(p, []) if not all(
               complete(tables.get((c.name, a, k), {})) for a in study.archs for k in args.choice_corpora)]  # fmt: skip
    if "final" in phases and study.final_arm is None:
        pending.append("final")
    return write(study, pending, chosen)


def scale_run(args: argparse.Namespace) -> dict[str, Any]:
    """``--scale 125m`` (or 350m ...): Pre-Norm against GeoNorm at ``--final-alpha``/``--final-decay`` (default:
    the library's current defaults) at the paper's size, same data, steps and seeds, written to
    ``scaling_<scale>.md``."""
    from hf_geonorm import GeoNormSettings

    defaults = GeoNormSettings()
    alpha = args.final_alpha if args.final_alpha is not None else defaults.geo_alpha
    decay = args.final_decay or defaults.geo_decay
    args.lr = args.lr or 6e-4
    start = time.perf_counter()
    corpus = args.choice_corpora[0]
    corpora = {corpus: corpus_data.load_corpus(corpus, args.vocab, args.seq_len, studies.max_chars(args), args.prose)}
    arms = [("pre", PRE), (alpha_label(alpha, decay), geo(alpha, decay))]
    specs = [studies.base_spec(args, label=label, arch=arch, corpus=corpus, settings=settings, seed=seed)
             for arch in args.archs.split(",") for seed in range(args.seeds) for label, settings in arms]  # fmt: skip
    results = run_loop.run_all(specs, corpora, args.workers, args.threads, reuse=args.reuse)
    env, wall = reports.environment(), time.perf_counter() - start
    name = studies.stem("scaling", args)
    lines = [f"# Scaling at the paper's {args.scale} size: Pre-Norm against GeoNorm ({alpha_label(alpha, decay)})",
             "", f"Written by `benchmarks/{Path(__file__).name} --scale {args.scale}` ({env['date']}; "
             f"{wall / 60:.1f} min wall). {args.steps} steps x {args.batch} x {args.seq_len} tokens on {corpus}, "
             f"lr {args.lr}.", "", "| shape | arm | val loss mean | std | seeds |",
             "|---|---|---|---|---|"]  # fmt: skip
    for (arch, label), runs in reports.group(results, "arch", "label").items():
        s = reports.summary(runs)
        lines.append(f"| {arch} | {label} | {reports.fmt(s['mean'])} | {reports.fmt(s['std'])} | {s['n']} |")
    payload = reports.write_results(args, name, lines + [""], env, wall, runs=results)
    panels = {arch: {k[0]: v for k, v in reports.group(runs, "label").items()}
              for (arch,), runs in reports.group(results, "arch").items()}  # fmt: skip
    reports.plot_panels(args.out / f"{name}.png", panels, f"{args.scale}: seed-mean validation loss")
    return payload


if __name__ == "__main__":
    main()
