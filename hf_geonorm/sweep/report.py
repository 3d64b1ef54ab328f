"""The report of a sweep (``sweep.md``, ``sweep.png``), a function of its journal: what the runs ran (the warm-up and
the evaluation as they recorded them), the loss at every rate per arm with the spread over seeds and how many seeds,
the rate chosen for each arm on validation, and the arms compared at their chosen rates on test; how sure each
comparison is, and whether the runs are early training (``evidence``). An arm is a norm style (with its geo_alpha
when the sweep varies it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .evidence import PLATEAU_TOLERANCE, caveats, early_training, margins_text, plateau_notes, seeds_named
from .reference import NOT_LEARNING, read_held_out
from .soundness import cliff_notes, hole_notes, not_learning, tuned_lines
from .table import (
    Cell,
    arm_name,
    at_edge,
    best_rates,
    cells,
    chosen_cells,
    common_seeds,
    mean_spread,
    rate_text,
    row_name,
    share_text,
    trained,
)

# the table's names the benchmarks and the tests read from here, besides the report's own
__all__ = ["arm_name", "at_edge", "best_rates", "cells", "mean_spread", "rate_text", "report_text", "write_report"]
SPREAD = "sample standard deviation over seeds (n-1)"
PLATEAU = (
    "An arm's plateau: its best rate and every rate whose mean validation loss, on the seeds all its rates ran, is "
    "within one standard error of the difference from the best's (Welch's where both rates ran two or more of those "
    "seeds; else the arm's seed spread, pooled over the rates that ran two or more seeds, x sqrt(1/n + 1/n_best)); "
    f"where no rate ran two seeds, within a stated tolerance of {PLATEAU_TOLERANCE}. The choice among the rates of "
    "a plateau is not resolved by these runs."
)


def _loss_text(values: list[float | None]) -> str:
    mean, spread, n = mean_spread(values)
    if n == 0:
        return "diverged"
    text = f"{mean:.4f}" + ("" if spread is None else f" ± {spread:.4f}")
    lost = len(values) - n
    return text + (f" (n={n})" if n > 1 or lost else "") + (f", {lost} diverged" if lost else "")


def cell_text(cell: Cell, common: set[int]) -> str:
    """A cell of the validation table: the mean over its seeds ± their spread, how many seeds, and where it ran more
    seeds than the arm's other rates, its loss on the seeds they share (what the choice compared)."""
    mean, spread, n = mean_spread(cell.val)
    if n == 0:
        return "diverged"
    text = f"{mean:.4f}" + ("" if spread is None else f" ± {spread:.4f}") + f" ({n} seed{'s' if n > 1 else ''}"
    lost = len(cell.val) - n
    text += f", {lost} diverged" if lost else ""
    if common and set(cell.seeds) - common:
        shared = cell.val_on(common)
        on = "diverged" if None in shared else f"{mean_spread(shared)[0]:.4f}"
        text += f"; {seeds_named(common)}: {on}"
    return text + ")"


def choice_text(table: dict[str, dict[float, Cell]]) -> str:
    """The legend of the bold cells: the rate chosen for each arm, on which seeds' validation, and which cells average
    more seeds than the choice compared (a mean of three seeds beside single-seed cells is not a comparison of
    equals, so the chosen cell is not called the best of them)."""
    commons = {arm: common_seeds(rates) for arm, rates in table.items()}
    named = {arm: seeds_named(common) if common else "all its seeds (no seed ran every rate)"
             for arm, common in commons.items()}  # fmt: skip
    each = "; ".join(f"{arm}: {seeds}" for arm, seeds in named.items())
    on = named[next(iter(named))] if len(set(named.values())) == 1 else f"the seeds every rate of the arm ran ({each})"
    text = f"**bold**: the rate chosen for each arm, the lowest mean validation loss on {on}."
    more = [f"{arm} {rate_text(lr)} ({len(cell.seeds)} seeds)" for arm, rates in table.items()
            for lr, cell in rates.items() if commons[arm] and set(cell.seeds) - commons[arm]]  # fmt: skip
    if more:
        text += (f" Means over more seeds than that: {', '.join(more)} (seeded once chosen: --confirm-seeds), each "
                 f"also giving its loss on the seeds the choice compared; every other cell ran {on} only.")  # fmt: skip
    return text


def data_facts(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The data facts the runs recorded (the first run's that has them; the journal checks that they agree)."""
    return next((entry["data"] for entry in runs if isinstance(entry.get("data"), dict)), None)


def swept_text(runs: list[dict[str, Any]], header: dict[str, Any]) -> list[str]:
    """What was swept: the data and its fingerprints, the model, the steps and tokens, the evaluation, the rates
    (as the report and the run names write them) and the seeds."""
    options, facts = header["train_options"], data_facts(runs) or {}
    marks = header.get("fingerprints")  # format 2; a format-1 header's data_key, else the runs' facts
    key = ({"fingerprint": marks["data"], "tokenizer": marks["tokenizer"]} if isinstance(marks, dict)
           else header.get("data_key") or {n: facts.get(n) for n in ("fingerprint", "tokenizer")})  # fmt: skip
    data = options.get("data") or "the Python standard library's source"
    fingerprints = ", ".join(f"{n} {key[n][:16]}" for n in ("fingerprint", "tokenizer") if key.get(n)) or (
        "not recorded (a journal of an earlier hf-geonorm)")  # fmt: skip
    available = "" if facts.get("train_tokens") is None else f"; {facts['train_tokens']:,} training tokens"
    model = options.get("model") or f"{options.get('arch')} at --preset {options.get('preset')}"
    per_step = options["batch_size"] * options.get("gradient_accumulation_steps", 1) * options["seq_len"]
    steps = options["max_steps"]
    held = "" if facts.get("val_documents") is None else (
        f"; validation holds {facts['val_documents']:,} documents ({facts['val_tokens']:,} tokens), test "
        f"{facts['test_documents']:,} ({facts['test_tokens']:,} tokens)")  # fmt: skip
    rates = sorted({entry["lr"] for entry in runs})
    return [
        "## What was swept",
        "",
        f"- data: {data} (data fingerprint and tokenizer hash: {fingerprints}){available}",
        f"- model: {model}, settings {options.get('settings') or 'the library defaults'} (each arm sets its style)",
        f"- each run: {steps} steps x {per_step:,} tokens = {steps * per_step:,} tokens, warm-up "
        f"{warmup_text(runs, options)}, precision {options.get('precision', 'fp32')}",
        f"- evaluation: {evaluation_text(runs, options, facts)}{held}",
        "- rates, as this report and the run folders write them (one digit before the point: 16e-3 is 1.6e-2): "
        + ", ".join(f"{rate_text(lr)} ({lr!r})" for lr in rates),
        f"- {seeds_text(runs)}",
        "",
    ]


def seeds_text(runs: list[dict[str, Any]]) -> str:
    """Which seeds ran where: those of every rate, the others at the rates that ran them (the confirmation runs at
    each arm's best), and the rates ``--extend`` added."""
    table = cells(runs)
    common = set.intersection(*(set(cell.seeds) for rates in table.values() for cell in rates.values()))
    extra = [f"{arm} {rate_text(lr)}: {', '.join(map(str, sorted(set(cell.seeds) - common)))}"
             for arm, rates in table.items() for lr, cell in rates.items() if set(cell.seeds) - common]  # fmt: skip
    text = f"seeds: {', '.join(map(str, sorted(common))) or 'none'} at every rate"
    if extra:
        text += f"; more seeds at {'; '.join(extra)}"
    extended = sorted({(row_name(e), e["lr"]) for e in runs if e.get("role") == "extension"})
    if extended:
        text += ("; cells added by the walk's steps (a rate beyond an edge, a share beyond the shares run): "
                 f"{', '.join(f'{a} {rate_text(lr)}' for a, lr in extended)}")  # fmt: skip
    return text


def recorded(runs: list[dict[str, Any]], name: str) -> list[Any]:
    """The distinct values the runs that trained recorded under ``name`` (a journal of an earlier hf-geonorm has
    none), in the order they first appear."""
    values = [e[name] for e in runs if e.get("val_loss") is not None and e.get(name) is not None]
    return [v for i, v in enumerate(values) if v not in values[:i]]


def warmup_text(runs: list[dict[str, Any]], options: dict[str, Any]) -> str:
    """The warm-up the runs used (recorded by each run: ``--warmup-steps``, or its default, a tenth of the steps)."""
    shares = sorted({e["warmup_share"] for e in runs if e.get("warmup_share") is not None})
    used = recorded(runs, "warmup_steps")
    if shares:
        steps = ", ".join(str(round(share * options["max_steps"])) for share in shares)
        return f"tuned: {', '.join(map(share_text, shares))} of the run ({steps} steps)"
    if used:
        return " or ".join(map(str, used)) + " steps"
    if options.get("warmup_steps") is not None:
        return f"{options['warmup_steps']} steps"
    return "not recorded (runs of an earlier hf-geonorm; --warmup-steps was not given: a tenth of the steps)"


def evaluation_text(runs: list[dict[str, Any]], options: dict[str, Any], facts: dict[str, Any]) -> str:
    """The blocks each evaluation read (recorded by each run: ``--eval-blocks``, or the default for the run's
    length), and of how many held out where that is more."""
    length = options["seq_len"]
    used = recorded(runs, "evaluated_blocks")
    if not used:
        if options.get("eval_blocks") is None:
            return f"blocks of {length} tokens, how many not recorded (runs of an earlier hf-geonorm)"
        return f"{options['eval_blocks']} blocks of {length} tokens for validation and as many for test"
    text = " or ".join(f"{blocks['validation']} blocks of {length} tokens for validation and {blocks['test']} for "
                       "test" for blocks in used)  # fmt: skip
    held = (facts.get("val_blocks"), facts.get("test_blocks"))
    if None not in held and any(held[0] > b["validation"] or held[1] > b["test"] for b in used):
        text += f" (the first of the {held[0]} and {held[1]} blocks held out)"
    return text


MIN_VAL_DOCUMENTS = 100
MIN_VAL_TOKENS = 65_536


def validation_warning(runs: list[dict[str, Any]]) -> list[str]:
    """A warning when validation holds too few documents or tokens to separate arms a few hundredths apart."""
    facts = data_facts(runs)
    if not facts or facts.get("val_documents") is None:
        return []
    documents, tokens = facts["val_documents"], facts["val_tokens"]
    if documents >= MIN_VAL_DOCUMENTS and tokens >= MIN_VAL_TOKENS:
        return []
    return [
        f"validation holds {documents:,} documents ({tokens:,} tokens), fewer than {MIN_VAL_DOCUMENTS} documents or "
        f"{MIN_VAL_TOKENS:,} tokens: another sample of held-out documents could reorder rates and arms a few "
        "hundredths apart; raise --eval-blocks (held-out documents are taken until they fill that many blocks) and "
        "give more documents (at most one in twenty is held out for each split)"
    ]


def report_text(runs: list[dict[str, Any]], header: dict[str, Any] | None = None,
                reference: dict[str, Any] | None = None) -> tuple[str, list[str]]:  # fmt: skip
    """The markdown report and its warnings (best rates at the edge of the grid, arms where no rate trained, a
    chosen cell next to a cliff, a hole in a grid beside a chosen rate, arms not yet learning from the context, a
    small validation sample); ``header``, the journal's, says what was swept; ``reference``, the held-out text's
    unigram cross-entropy (``reference.read_held_out``)."""
    table, rows_best, edges = cells(runs), best_rates(runs), at_edge(runs)
    chosen = chosen_cells(runs)
    best = {choice.row: choice.lr for choice in chosen.values()}  # each arm's chosen row and its rate
    rates = sorted({lr for arm in table.values() for lr in arm})
    lines = ["# Sweep", ""]
    seeds = {choice.row: len(table[choice.row][choice.lr].seeds) for choice in chosen.values()}
    plan = header.get("sweep_options") if header else None
    first = caveats(runs, {choice.row: choice.share for choice in chosen.values()}, seeds, plan)
    lines += [*[f"{line}\n" for line in first]] if first else []
    if header is not None:
        lines += swept_text(runs, header)
    lines += ["## What was tuned", "", *tuned_lines(runs), ""]
    lines += early_training(runs)
    lines += [
        f"{len(runs)} runs. Validation loss at each peak learning rate: the mean over the seeds a cell ran ± their "
        f"{SPREAD}, and how many seeds. {choice_text(table)}",
        "",
        "| arm | " + " | ".join(rate_text(lr) for lr in rates) + " |",
        "|---|" + "---|" * len(rates),
    ]
    for arm, arm_rates in table.items():
        row = []
        for lr in rates:
            text = cell_text(arm_rates[lr], common_seeds(arm_rates)) if lr in arm_rates else "–"
            row.append(f"**{text}**" if lr == best.get(arm) and trained(arm_rates) else text)
        lines.append(f"| {arm} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## The arms at their chosen rates, on test",
        "",
        f"Test loss: documents held out apart from validation's, never used for the choice. Mean ± {SPREAD}.",
        "",
        "| arm | warm-up | rate chosen | seeds | validation loss | test loss | test loss of each seed |",
        "|---|---|---|---|---|---|---|",
    ]
    shares = {choice.row: choice.share for choice in chosen.values()}
    ranked = sorted((arm for arm in best if trained(table[arm])),
                    key=lambda arm: mean_spread(table[arm][best[arm]].test)[0])  # fmt: skip
    cliffs, idle = cliff_notes(table, chosen, reference), not_learning(table, chosen, reference)
    for arm in ranked:
        cell = table[arm][best[arm]]
        share = warmup_text(runs, header["train_options"] if header else {}) if shares[arm] is None else (
            share_text(shares[arm]))  # fmt: skip
        each = ", ".join(f"{seed}: {'diverged' if loss is None else f'{loss:.4f}'}"
                         for seed, loss in sorted(zip(cell.seeds, cell.test, strict=True)))  # fmt: skip
        flags = [text for text in (cliffs.get(arm), "not yet learning from context" if arm in idle else None) if text]
        name = arm + (f" ({'; '.join(flags)})" if flags else "")
        lines.append(f"| {name} | {share} | {rate_text(best[arm])} | {len(cell.seeds)} | {_loss_text(cell.val)} | "
                     f"{_loss_text(cell.test)} | {each} |")  # fmt: skip
    if reference is not None:
        lines.append(f"| unigram: the held-out text's tokens at their training frequencies, no context | – | – | – | "
                     f"{reference['unigram_validation']:.4f} | {reference['unigram_test']:.4f} | – |")  # fmt: skip
    failed = [arm for arm in best if not trained(table[arm])]
    for arm in failed:
        lines.append(f"| {arm} | none: no rate trained | {len({s for c in table[arm].values() for s in c.seeds})} | "
                     "every run diverged | – |")  # fmt: skip
    if len(ranked) > 1:
        lines += ["", margins_text(table, best, ranked)]
    elif not ranked:
        lines += ["", "No rate trained: every run of every arm diverged, so nothing was chosen or compared."]
    notes = plateau_notes(table, rows_best)
    if notes:
        lines += ["", "## How sure each choice is", "", PLATEAU, "", *[f"- {note}" for note in notes]]
    warnings = [f"every run of {arm} diverged: no rate trained; try lower rates" for arm in failed]
    warnings += [
        f"the best rate of {arm} ({rate_text(best[arm])}) is the {where} rate of its grid: the best may lie "
        "beyond it; extend the grid (--extend, or --lrs) and run the sweep again" if where != "only" else
        f"{arm} has one rate only: nothing was chosen"
        for arm, where in edges.items() if arm in best and arm not in failed
    ]  # fmt: skip
    warnings += [f"{arm}: its test loss is within {NOT_LEARNING} of the unigram loss "
                 f"({reference['unigram_test']:.3f}): not yet learning from context; its margins say little (longer "
                 "runs, another rate)" for arm in idle if reference is not None]  # fmt: skip
    warnings += [f"{arm}: {note}: a little more rate and this arm fails; read its margin with that"
                 for arm, note in cliffs.items()]  # fmt: skip
    warnings += hole_notes(table, chosen)
    warnings += validation_warning(runs)
    if warnings:
        lines += ["", "## Warnings", "", *[f"- {warning}" for warning in warnings]]
    lines += ["", "![loss against learning rate](sweep.png)", ""]
    return "\n".join(lines), warnings


def plot(runs: list[dict[str, Any]], path: Path, header: dict[str, Any] | None = None) -> None:
    """Validation loss against learning rate (log scale, ticks at the rates as the report writes them) per row (an
    arm at one warm-up), the seed spread as error bars, each row's best marked; the title says the run length and
    the warm-up."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    from ..training.run.outputs import replace_file

    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.subplots()
    best = best_rates(runs)
    for arm, rates in cells(runs).items():
        points = [(lr, *mean_spread(cell.val)[:2]) for lr, cell in rates.items() if mean_spread(cell.val)[2]]
        if not points:
            continue
        xs, ys, spreads = zip(*points, strict=True)
        line = ax.errorbar(xs, ys, yerr=[s or 0.0 for s in spreads], marker="o", capsize=3, label=arm)
        if best[arm] in xs:
            index = xs.index(best[arm])
            ax.plot([xs[index]], [ys[index]], marker="*", markersize=14, color=line[0].get_color())
    ax.set_xscale("log", base=2)
    rates = sorted({entry["lr"] for entry in runs})
    ax.set_xticks(rates, [rate_text(lr) for lr in rates])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("validation loss (mean over seeds)")
    options = header["train_options"] if header else {}
    steps = options.get("max_steps") or max((e["steps"] for e in runs if e.get("steps")), default="?")
    ax.set_title(f"sweep: validation loss against peak rate, {steps} steps a run, warm-up "
                 f"{warmup_text(runs, options)} (star: each row's best)", fontsize=8, wrap=True)  # fmt: skip
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    replace_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def write_report(folder: Path, runs: list[dict[str, Any]], log: Any = print,
                 header: dict[str, Any] | None = None) -> None:  # fmt: skip
    """``sweep.md`` and ``sweep.png`` in ``folder``; ``log`` gets the warnings and where the report is."""
    from ..training.run.outputs import replace_file

    if not runs:
        return
    text, warnings = report_text(runs, header, read_held_out(folder, header))
    replace_file(folder / "sweep.md", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    plot(runs, folder / "sweep.png", header)
    for warning in warnings:
        log(f"warning: {warning}")
    log(f"report in {folder / 'sweep.md'} and {folder / 'sweep.png'}")
