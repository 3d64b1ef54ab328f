"""The report of a sweep (``sweep.md``, ``sweep.png``), from its journal's runs: the loss at every rate per arm
with the spread over seeds, each arm's best rate chosen on validation, and the arms compared at their own best
rates on test. An arm is a norm style (with its geo_alpha when the sweep varies it)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPREAD = "sample standard deviation over seeds (n-1)"


def rate_text(lr: float) -> str:
    """A learning rate as people write it, one digit before the point (4e-3, 1.6e-2; 16e-3 is written 1.6e-2),
    with the fewest digits that read back as exactly this rate: two rates never share a text (1.0000001e-3 is not
    1e-3), so run names built from it cannot collide."""
    for digits in range(17):
        mantissa, exponent = f"{lr:.{digits}e}".split("e")
        if float(f"{mantissa}e{exponent}") == lr:
            break
    return f"{mantissa}e{int(exponent)}"


def alpha_text(alpha: float) -> str:
    """A geo_alpha as people write it (0.5, 1), with the fewest digits that read back as exactly this value."""
    for digits in range(1, 18):
        text = f"{alpha:.{digits}g}"
        if float(text) == alpha:
            return text
    return repr(alpha)


def run_name(style: str, alpha: float | None, lr: float, seed: int) -> str:
    """A run's folder name under ``runs/``, one per cell of the grid: ``geo-alpha0.5-lr8e-3-seed0``."""
    alpha_part = "" if alpha is None else f"-alpha{alpha_text(alpha)}"
    return f"{style}{alpha_part}-lr{rate_text(lr)}-seed{seed}"


@dataclass
class Cell:
    """The runs of one arm at one rate."""

    val: list[float | None]  # one per seed; None: diverged
    test: list[float | None]
    seeds: list[int]


def arm_name(entry: dict[str, Any]) -> str:
    return entry["style"] + ("" if entry["alpha"] is None else f" alpha {alpha_text(entry['alpha'])}")


def cells(runs: list[dict[str, Any]]) -> dict[str, dict[float, Cell]]:
    """The runs grouped by arm, then by rate (rates in increasing order), in the order arms first appear."""
    table: dict[str, dict[float, Cell]] = {}
    for entry in runs:
        cell = table.setdefault(arm_name(entry), {}).setdefault(entry["lr"], Cell([], [], []))
        cell.val.append(entry["val_loss"])
        cell.test.append(entry["test_loss"])
        cell.seeds.append(entry["seed"])
    return {arm: dict(sorted(rates.items())) for arm, rates in table.items()}


def best_rates(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each arm's best rate: the lowest mean validation loss (the lower rate on a tie) over the seeds that every
    rate of the arm has run, so that a rate run with more seeds (the best, seeded once chosen) is compared on the
    same seeds as the others; over all its seeds where no seed is common. A diverged run counts as infinite loss.
    Test losses play no part in it."""
    best = {}
    for arm, rates in cells(runs).items():
        common = set.intersection(*(set(cell.seeds) for cell in rates.values()))

        def loss(lr: float, rates: dict[float, Cell] = rates, common: set[int] = common) -> tuple[float, float]:
            cell = rates[lr]
            kept = [v for v, seed in zip(cell.val, cell.seeds, strict=True) if not common or seed in common]
            return (math.inf if None in kept else statistics.fmean(kept), lr)

        best[arm] = min(rates, key=loss)
    return best


def at_edge(runs: list[dict[str, Any]]) -> dict[str, str]:
    """The arms whose best rate is the lowest or the highest of their grid: the best may lie beyond it."""
    edges = {}
    for arm, lr in best_rates(runs).items():
        rates = list(cells(runs)[arm])
        if len(rates) > 1 and lr == rates[0]:
            edges[arm] = "lowest"
        elif len(rates) > 1 and lr == rates[-1]:
            edges[arm] = "highest"
        elif len(rates) == 1:
            edges[arm] = "only"
    return edges


def mean_spread(values: list[float | None]) -> tuple[float, float | None, int]:
    """Mean, sample standard deviation (None for one value) and count of the finite values."""
    finite = [v for v in values if v is not None]
    if not finite:
        return math.inf, None, 0
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else None, len(finite)


def _loss_text(values: list[float | None]) -> str:
    mean, spread, n = mean_spread(values)
    if n == 0:
        return "diverged"
    text = f"{mean:.4f}" + ("" if spread is None else f" ± {spread:.4f}")
    lost = len(values) - n
    return text + (f" (n={n})" if n > 1 or lost else "") + (f", {lost} diverged" if lost else "")


def trained(rates: dict[float, Cell]) -> bool:
    """Whether any run of an arm trained to the end (not every one diverged)."""
    return any(v is not None for cell in rates.values() for v in cell.val)


def data_facts(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The data facts the runs recorded (the first run's that has them; the journal checks that they agree)."""
    return next((entry["data"] for entry in runs if isinstance(entry.get("data"), dict)), None)


def swept_text(runs: list[dict[str, Any]], header: dict[str, Any]) -> list[str]:
    """What was swept: the data and its fingerprints, the model, the steps and tokens, the evaluation, the rates
    (as the report and the run names write them) and the seeds."""
    options, facts = header["train_options"], data_facts(runs) or {}
    key = header.get("data_key") or {n: facts.get(n) for n in ("fingerprint", "tokenizer")}
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
        f"{options.get('warmup_steps')} steps, precision {options.get('precision', 'fp32')}",
        f"- evaluation: {options['eval_blocks']} blocks of {options['seq_len']} tokens for validation and as many "
        f"for test{held}",
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
    extended = sorted({(arm_name(e), e["lr"]) for e in runs if e.get("role") == "extension"})
    if extended:
        text += f"; rates added beyond an edge (--extend): {', '.join(f'{a} {rate_text(lr)}' for a, lr in extended)}"
    return text


def sureness_text(table: dict[str, dict[float, Cell]], best: dict[str, float]) -> list[str]:
    """Whether each arm's choice is resolved: its two best rates against the seed spread (a plateau when they are
    within it), or that one seed gives no spread to judge by."""
    notes = []
    for arm, rates in table.items():
        if not trained(rates) or len(rates) < 2:
            continue
        common = set.intersection(*(set(cell.seeds) for cell in rates.values()))

        def mean(lr: float, rates: dict[float, Cell] = rates, common: set[int] = common) -> float:
            cell = rates[lr]
            kept = [v for v, seed in zip(cell.val, cell.seeds, strict=True) if not common or seed in common]
            return math.inf if None in kept else statistics.fmean(kept)

        ranked = sorted(rates, key=lambda lr: (mean(lr), lr))
        first, second = ranked[0], ranked[1]
        gap = mean(second) - mean(first)
        spreads = [s for s in (mean_spread(rates[lr].val)[1] for lr in (first, second)) if s is not None]
        pair = f"{rate_text(first)} and {rate_text(second)}"
        on = f"on validation (seed {', '.join(map(str, sorted(common)))}, which both ran)" if common else (
            "on validation")  # fmt: skip
        if not math.isfinite(gap):
            continue
        if not spreads:
            notes.append(f"{arm}: one seed only, so no seed spread tells whether its two best rates ({pair}, "
                         f"{gap:.4f} apart {on}) differ; --confirm-seeds 1,2 measures it")  # fmt: skip
        elif gap <= max(spreads):
            notes.append(f"{arm}: a plateau: its two best rates ({pair}) are {gap:.4f} apart {on}, within "
                         f"the seed spread {max(spreads):.4f}; either is as good, and the choice between them is not "
                         "resolved")  # fmt: skip
        else:
            notes.append(f"{arm}: its two best rates ({pair}) are {gap:.4f} apart {on}, beyond the seed "
                         f"spread {max(spreads):.4f}")  # fmt: skip
    return notes


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
        "give data of more, shorter documents"
    ]


def report_text(runs: list[dict[str, Any]], header: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """The markdown report and its warnings (best rates at the edge of the grid, arms where no rate trained, a
    small validation sample); ``header``, the journal's, says what was swept."""
    table, best, edges = cells(runs), best_rates(runs), at_edge(runs)
    rates = sorted({lr for arm in table.values() for lr in arm})
    lines = ["# Sweep", ""]
    if header is not None:
        lines += swept_text(runs, header)
    lines += [
        f"{len(runs)} runs. Validation loss (mean ± {SPREAD}; n: seeds) at each peak learning rate; "
        "**bold**: the arm's best rate, chosen on validation (on the seeds all its rates ran).",
        "",
        "| arm | " + " | ".join(rate_text(lr) for lr in rates) + " |",
        "|---|" + "---|" * len(rates),
    ]
    for arm, arm_rates in table.items():
        row = []
        for lr in rates:
            text = _loss_text(arm_rates[lr].val) if lr in arm_rates else "–"
            row.append(f"**{text}**" if lr == best[arm] and trained(arm_rates) else text)
        lines.append(f"| {arm} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## The arms at their own best rates, on test",
        "",
        f"Test loss: documents held out apart from validation's, never used for the choice. Mean ± {SPREAD}.",
        "",
        "| arm | best rate | seeds | validation loss | test loss |",
        "|---|---|---|---|---|",
    ]
    ranked = sorted((arm for arm in best if trained(table[arm])),
                    key=lambda arm: mean_spread(table[arm][best[arm]].test)[0])  # fmt: skip
    for arm in ranked:
        cell = table[arm][best[arm]]
        lines.append(f"| {arm} | {rate_text(best[arm])} | {len(cell.seeds)} | {_loss_text(cell.val)} | "
                     f"{_loss_text(cell.test)} |")  # fmt: skip
    failed = [arm for arm in best if not trained(table[arm])]
    for arm in failed:
        lines.append(f"| {arm} | none: no rate trained | {len({s for c in table[arm].values() for s in c.seeds})} | "
                     "every run diverged | – |")  # fmt: skip
    if len(ranked) > 1:
        first, second = (mean_spread(table[arm][best[arm]].test) for arm in ranked[:2])
        spreads = [s for s in (first[1], second[1]) if s is not None]
        versus = f"; the larger seed spread is {max(spreads):.4f}" if spreads else " (one seed each: no spread)"
        lines += ["", f"{ranked[0]} is lowest on test, by {second[0] - first[0]:.4f} below {ranked[1]}{versus}."]
    elif not ranked:
        lines += ["", "No rate trained: every run of every arm diverged, so nothing was chosen or compared."]
    notes = sureness_text(table, best)
    if notes:
        lines += ["", "## How sure each choice is", "", *[f"- {note}" for note in notes]]
    warnings = [f"every run of {arm} diverged: no rate trained; try lower rates" for arm in failed]
    warnings += [
        f"the best rate of {arm} ({rate_text(best[arm])}) is the {where} rate of its grid: the best may lie "
        "beyond it; extend the grid (--extend, or --lrs) and run the sweep again" if where != "only" else
        f"{arm} has one rate only: nothing was chosen"
        for arm, where in edges.items() if arm not in failed
    ]  # fmt: skip
    warnings += validation_warning(runs)
    if warnings:
        lines += ["", "## Warnings", "", *[f"- {warning}" for warning in warnings]]
    lines += ["", "![loss against learning rate](sweep.png)", ""]
    return "\n".join(lines), warnings


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Validation loss against learning rate (log scale, ticks at the rates as the report writes them) per arm, the
    seed spread as error bars, the best marked."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator

    from ..run.outputs import replace_file

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
    ax.set_title("sweep: loss against learning rate (star: best, chosen on validation)", fontsize=9)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    replace_file(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def write_report(folder: Path, runs: list[dict[str, Any]], log: Any = print,
                 header: dict[str, Any] | None = None) -> None:  # fmt: skip
    """``sweep.md`` and ``sweep.png`` in ``folder``; ``log`` gets the warnings and where the report is."""
    from ..run.outputs import replace_file

    if not runs:
        return
    text, warnings = report_text(runs, header)
    replace_file(folder / "sweep.md", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    plot(runs, folder / "sweep.png")
    for warning in warnings:
        log(f"warning: {warning}")
    log(f"report in {folder / 'sweep.md'} and {folder / 'sweep.png'}")
