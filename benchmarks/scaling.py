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
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus_data  # noqa: E402
import reports  # noqa: E402
import run_loop  # noqa: E402
import studies  # noqa: E402

ALPHAS = (0.125, 0.25, 0.5, 1.0, 2.0)
# Every GeoNorm setting spelled out: a run's identity must not depend on the library's defaults of the day.
FIXED = {"geo_max_angle": math.pi / 4, "geo_learnable_step": False, "geo_radius": "embedding", "geo_bridge": 1.0}
PRE = {"norm_style": "pre", "geo_alpha": 0.25, "geo_decay": "harmonic", **FIXED}
CHOICE_CORPORA = ("stdlib", "prose")
HELDOUT_CORPUS = "dict"
PHASES = ("budget", "depth", "final", "width")  # in the order they run
CHOICE_AXES = ("budget", "depth")  # the cells the rule is chosen on; width is a check run after the choice


def geo(alpha: float, decay: str = "harmonic") -> dict[str, Any]:
    return {"norm_style": "geo", "geo_alpha": alpha, "geo_decay": decay, **FIXED}


def alpha_label(alpha: float, decay: str = "harmonic") -> str:
    return f"geo {decay} alpha {alpha:g}"


@dataclass(frozen=True)
class Cell:
    """One point of the grid: depth, width and training steps (16 x 128 tokens a step)."""

    axis: str
    layers: int
    width: int
    steps: int

    @property
    def name(self) -> str:
        return f"L{self.layers} W{self.width} S{self.steps}"


def grid(smoke: bool) -> dict[str, list[Cell]]:
    """The cells of each axis, in the order they run (the middle point is run once, on the budget axis)."""
    if smoke:
        layers, width, budgets, depths, widths = 2, 16, (4, 8), (3,), (32,)
    else:
        layers, width, budgets, depths, widths = 12, 64, (64, 512, 192), (4, 32), (128, 256)
    middle = budgets[-1]
    return {
        "budget": [Cell("budget", layers, width, s) for s in budgets],
        "depth": [Cell("depth", d, width, middle) for d in depths],
        "width": [Cell("width", layers, w, middle) for w in widths],
    }


def lr_for(width: int) -> float:
    return 2e-3 * math.sqrt(128 / width)


def spec_for(args: argparse.Namespace, cell: Cell, arch: str, corpus: str, label: str, settings: dict[str, Any],
             seed: int = 0) -> run_loop.RunSpec:  # fmt: skip
    steps = args.steps or cell.steps
    overrides = dict(
        label=f"{cell.name} | {label}", arch=arch, corpus=corpus, settings=settings, seed=seed,
        layers=cell.layers, width=cell.width, steps=steps, lr=args.lr or lr_for(cell.width),
        warmup=max(1 if args.smoke else 10, steps // 10), eval_every=max(1, steps // 8),
    )  # fmt: skip
    return studies.base_spec(args, **overrides)


def variant(result: dict[str, Any]) -> str:
    return result["spec"]["label"].split(" | ", 1)[1]


def cell_name(result: dict[str, Any]) -> str:
    return result["spec"]["label"].split(" | ", 1)[0]


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


def best_alpha(runs: list[dict[str, Any]]) -> float:
    """The harmonic alpha with the lowest final validation loss among ``runs`` (one cell, shape and corpus)."""
    harmonic = {r["spec"]["settings"]["geo_alpha"]: r["final_val_loss"] for r in runs
                if r["spec"]["settings"]["norm_style"] == "geo" and r["spec"]["settings"]["geo_decay"] == "harmonic"
                and math.isfinite(r["final_val_loss"])}  # fmt: skip
    return min(harmonic, key=harmonic.get) if harmonic else 1.0


# ---- the decision ----


def cell_tables(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """Final validation loss of every variant, by (cell, arch, corpus): the grid's runs (seed 0, choice
    corpora)."""
    tables: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in results:
        if r["spec"]["seed"] == 0 and r["spec"]["corpus"] != HELDOUT_CORPUS:
            tables.setdefault((cell_name(r), r["spec"]["arch"], r["spec"]["corpus"]), {})[variant(r)] = r[
                "final_val_loss"
            ]
    return tables


def choice_tables(tables: dict[tuple[str, str, str], dict[str, float]], smoke: bool) -> dict:
    """The tables of the cells the rule is chosen on (the budget and depth axes)."""
    names = {c.name for axis in CHOICE_AXES for c in grid(smoke)[axis]}
    return {key: table for key, table in tables.items() if key[0] in names}


def complete(table: dict[str, float]) -> bool:
    return "pre" in table and all(alpha_label(a) in table for a in ALPHAS)


def regrets(tables: dict[tuple[str, str, str], dict[str, float]]) -> dict[float, list[float]]:
    """Per alpha, its loss minus the best harmonic alpha's in each complete cell: what a user pays for a
    fixed alpha instead of the best one of the cell."""
    out: dict[float, list[float]] = {a: [] for a in ALPHAS}
    for table in tables.values():
        if not complete(table):
            continue
        best = min(table[alpha_label(a)] for a in ALPHAS)
        for a in ALPHAS:
            value = table[alpha_label(a)]
            out[a].append(value - best if math.isfinite(value) else math.inf)
    return out


def chosen_rule(tables: dict[tuple[str, str, str], dict[str, float]]) -> tuple[float, str]:
    """The single alpha (harmonic decay) with the lowest mean regret over every complete grid cell of the
    choice corpora; harmonic unless constant decay at the cell's best alpha beats harmonic there in most
    cells."""
    mean_regret = {a: statistics.fmean(v) for a, v in regrets(tables).items() if v}
    if not mean_regret:
        return 1.0, "harmonic"
    alpha = min(mean_regret, key=mean_regret.get)
    constant_wins = total = 0
    for table in tables.values():
        if not complete(table):
            continue
        best = min(ALPHAS, key=lambda a: table[alpha_label(a)])
        constant = table.get(alpha_label(best, "constant"))
        if constant is not None:
            total += 1
            constant_wins += constant < table[alpha_label(best)]
    return alpha, "constant" if total and constant_wins > total / 2 else "harmonic"


# ---- writing ----


def write(study: Study, pending: list[str], chosen: tuple[float, str] | None) -> dict[str, Any]:
    args = study.args
    name = studies.stem("scaling", args)
    results = list(study.results.values())
    env = reports.environment()
    wall = time.perf_counter() - study.start
    tables = cell_tables(results)
    cells = {c.name: c for axis in grid(args.smoke).values() for c in axis}
    lines = [
        "# Scaling: the best geo_alpha by token budget, depth and width",
        "",
        f"Written by `benchmarks/{Path(__file__).name}` ({env['date']}; this invocation {wall / 60:.1f} min wall on "
        f"{env['cpu_count']} shared CPU cores; runs finished earlier are taken from `{study.journal.name}`). "
        f"Shapes: {', '.join(study.archs)}. Tokens per step: {args.batch} x {args.seq_len}. Learning rate fixed per "
        "width: lr = 2e-3 sqrt(128 / width); warm-up over the first tenth of the steps, cosine decay to a tenth; "
        f"AdamW (0.9, 0.95), clip 1.0, 4 heads, BPE vocabulary {args.vocab} per corpus, dropout off, one seed. "
        "Every GeoNorm run: max angle pi/4, embedding radius, fixed step; 'constant' is constant decay at the "
        "cell's best harmonic alpha. Choice corpora: " + ", ".join(args.choice_corpora) + f"; held out: "
        f"{args.heldout} (final comparison only).",
        "",
    ]
    if pending:
        lines += ["**Still to run** (the study is resumable; rerun the same command): " + ", ".join(pending) + ".", ""]
    for axis, axis_cells in grid(args.smoke).items():
        lines += [f"## {axis} axis", "", "| cell | tokens | shape | corpus | pre | "
                  + " | ".join(f"a={a:g}" for a in ALPHAS) + " | constant @best | best alpha | best geo - pre |",
                  "|---|---|---|---|---|" + "---|" * len(ALPHAS) + "---|---|---|"]  # fmt: skip
        middle = grid(args.smoke)["budget"][-1]
        for cell in [*axis_cells, middle] if axis != "budget" else axis_cells:
            for (cname, arch, corpus), table in sorted(tables.items()):
                if cname != cell.name:
                    continue
                lines.append(row(cell, arch, corpus, table, args))
        lines.append("")
    lines += decision_lines(choice_tables(tables, args.smoke), chosen)
    lines += chosen_lines(tables, chosen, args)
    lines += final_lines(results, args, study.final_arm, study.final_cell())
    lines += [f"![best alpha by axis]({name}.png)", ""]
    payload = reports.write_results(args, name, lines, env, wall, pending=pending, chosen=chosen,
                                   cells={k: {"layers": c.layers, "width": c.width, "steps": c.steps}
                                          for k, c in cells.items()},
                                   runs=results)  # fmt: skip
    plot(args.out / f"{name}.png", tables, cells, args)
    return payload


def row(cell: Cell, arch: str, corpus: str, table: dict[str, float], args: argparse.Namespace) -> str:
    tokens = cell.steps * args.batch * args.seq_len
    losses = {a: table.get(alpha_label(a), math.nan) for a in ALPHAS}
    finite = {a: v for a, v in losses.items() if math.isfinite(v)}
    best = min(finite, key=finite.get) if finite else None
    constant = next((v for k, v in table.items() if k.startswith("geo constant")), math.nan)
    pre = table.get("pre", math.nan)
    margin = (min(finite[best], constant if math.isfinite(constant) else math.inf) - pre) if best else math.nan
    cells = " | ".join(("**" + reports.fmt(v) + "**") if a == best else reports.fmt(v) for a, v in losses.items())
    return (f"| {cell.name} | {tokens / 1e6:.2f}M | {arch} | {corpus} | {reports.fmt(pre)} | {cells} | "
            f"{reports.fmt(constant)} | {best if best is not None else '-'} | {margin:+.3f} |")  # fmt: skip


def decision_lines(tables: dict, chosen: tuple[float, str] | None) -> list[str]:
    reg = regrets(tables)
    n = len(next(iter(reg.values()), []))
    lines = [
        "## The rule",
        "",
        f"Mean regret of each fixed alpha (harmonic decay) over the {n} complete cells of the budget and depth axes "
        "(shape x corpus x cell; regret = its validation loss minus the best harmonic alpha's in that cell; the "
        "width axis is left out: it checks the choice):",
        "",
        "| alpha | mean regret | worst regret | cells where it is best |",
        "|---|---|---|---|",
    ]
    for a, values in reg.items():
        if values:
            wins = sum(1 for t in tables.values() if complete(t)
                       and min(ALPHAS, key=lambda b, t=t: t[alpha_label(b)]) == a)  # fmt: skip
            lines.append(f"| {a:g} | {statistics.fmean(values):.3f} | {max(values):.3f} | {wins} |")
    if chosen is not None:
        lines += [
            "",
            f"Rule: the alpha with the lowest mean regret over every complete cell, with harmonic decay unless "
            f"constant decay at a cell's best alpha beats harmonic in most cells: **alpha {chosen[0]:g}, "
            f"{chosen[1]} decay**.",
        ]
    return lines + [""]


def chosen_lines(tables: dict, chosen: tuple[float, str] | None, args: argparse.Namespace) -> list[str]:
    """The chosen setting against Pre-Norm and against the cell's best alpha in every complete cell (one seed):
    where it wins and where it loses; the width axis is marked as a check."""
    if chosen is None:
        return []
    arm = alpha_label(*chosen)
    widths = {c.name for c in grid(args.smoke)["width"]}
    lines = [f"## {arm} in every cell (one seed)", "",
             "| cell | tokens | shape | corpus | pre | chosen | chosen - pre | regret | |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    cells = {c.name: c for axis in grid(args.smoke).values() for c in axis}

    def order(item: tuple) -> tuple:
        cell = cells[item[0][0]]
        return cell.steps, cell.layers, cell.width, item[0][1:]

    for (cname, arch, corpus), table in sorted(tables.items(), key=order):
        if not complete(table) or arm not in table:
            continue
        best = min(table[alpha_label(a)] for a in ALPHAS)
        tokens = cells[cname].steps * args.batch * args.seq_len
        lines.append(f"| {cname} | {tokens / 1e6:.2f}M | {arch} | {corpus} | {reports.fmt(table['pre'])} | "
                     f"{reports.fmt(table[arm])} | {table[arm] - table['pre']:+.3f} | {table[arm] - best:.3f} | "
                     f"{'check (width)' if cname in widths else ''} |")  # fmt: skip
    return lines + [""]


def final_lines(results: list[dict[str, Any]], args: argparse.Namespace, arm: str | None, cell: Cell) -> list[str]:
    if arm is None:
        return []
    lines = [f"## Final comparison: {arm} against Pre-Norm ({cell.name}, {args.seeds} seeds)", "",
             "| corpus | shape | pre mean +- std | chosen mean +- std | chosen - pre | margin (2 SE) | verdict |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for corpus in [*args.choice_corpora, args.heldout]:
        for arch in args.archs.split(","):
            arms = {label: [r for r in results if r["spec"]["label"] == f"{cell.name} | {label}"
                            and r["spec"]["arch"] == arch and r["spec"]["corpus"] == corpus]
                    for label in ("pre", arm)}  # fmt: skip
            if not all(arms.values()):
                continue
            p, g = reports.summary(arms["pre"]), reports.summary(arms[arm])
            margin = 2 * math.sqrt((p["std"] ** 2 + g["std"] ** 2) / max(1, min(p["n"], g["n"])))
            diff = g["mean"] - p["mean"]
            verdict = "GeoNorm better" if diff < -margin else ("Pre-Norm better" if diff > margin else "within noise")
            tag = " (held out)" if corpus == args.heldout else ""
            lines.append(f"| {corpus}{tag} | {arch} | {reports.fmt(p['mean'])} +- {reports.fmt(p['std'])} | "
                         f"{reports.fmt(g['mean'])} +- {reports.fmt(g['std'])} | {diff:+.3f} | {margin:.3f} | "
                         f"{verdict} |")  # fmt: skip
    return lines + [""]


def plot(path: Path, tables: dict, cells: dict[str, Cell], args: argparse.Namespace) -> None:
    """Best alpha (top) and best GeoNorm minus Pre-Norm (bottom) against tokens, depth and width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_spec = [("budget", "tokens (M)", lambda c: c.steps * args.batch * args.seq_len / 1e6),
                 ("depth", "layers", lambda c: c.layers), ("width", "width", lambda c: c.width)]  # fmt: skip
    middle = grid(args.smoke)["budget"][-1]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5), squeeze=False)
    for col, (axis, xlabel, x_of) in enumerate(axes_spec):
        members = {c.name for c in grid(args.smoke)[axis]} | {middle.name}
        series: dict[str, list[tuple[float, float, float]]] = {}
        for (cname, arch, corpus), table in tables.items():
            if cname in members and complete(table):
                best = min(ALPHAS, key=lambda a, t=table: t[alpha_label(a)])
                margin = table[alpha_label(best)] - table["pre"]
                series.setdefault(f"{arch} / {corpus}", []).append((x_of(cells[cname]), best, margin))
        for label, points in sorted(series.items()):
            points.sort()
            xs = [p[0] for p in points]
            axes[0][col].plot(xs, [p[1] for p in points], "o-", label=label)
            axes[1][col].plot(xs, [p[2] for p in points], "o-", label=label)
        for row_index, ylabel in enumerate(["best alpha (harmonic)", "best GeoNorm - Pre-Norm (val loss)"]):
            ax = axes[row_index][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if row_index == 0:
                ax.set_yscale("log", base=2)
                ax.set_title(f"{axis} axis", fontsize=10)
            else:
                ax.axhline(0.0, color="black", linewidth=0.8)
            if series:
                ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
