"""How much a sweep's report can say: each arm's plateau of rates (which rates its choice does not separate), the
margin between arms with its standard error and Welch's p, and whether the runs are short enough that the project's
length study says to read them as early training."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from .table import Cell, choice_loss, common_seeds, mean_spread, rate_text, trained
from .welch import welch_test

# where no rate ran two seeds: rates within this validation loss of the best are a plateau; about the seed spread of
# the project's study at train's default model (docs/training.md: runs comparable to about 0.02)
PLATEAU_TOLERANCE = 0.02
# the project's length study (benchmarks/results/sweeps h_styles, f_length_1200, f_length_2400: GPT-2 4 x 128, each
# arm re-tuned at each length): tokens per run, GeoNorm's lead over Pre-Norm on test, Pre-Norm's best rate there
LENGTH_STUDY = ((614_400, 0.569, "2e-3"), (2_457_600, 0.155, "8e-3"), (4_915_200, 0.119, "4e-3"))
STUDY_LONGEST_TOKENS = LENGTH_STUDY[-1][0]
STUDY_SECTION = (
    'docs/training.md of the hf-geonorm repository, section "The default learning rate" (the "Length" point of what '
    'the study corpus says; its table: benchmarks/results/sweeps/study.md, "Length")'
)


# the project's phase i (benchmarks/results/sweeps/i_*: GPT-2 and LLaMA 4 x 128, 300 steps, every style tuned on
# rate and warm-up, three seeds at the chosen cell), as tests/sweep/test_sweep_protocol.py recomputes it from the
# journals: GeoNorm's lead over Pre-Norm on test at a warm-up fixed at a tenth (rate tuned, seed 0) over the lead with
# the warm-up tuned too (three seeds), per shape; and DeepNorm on GPT-2, a tie told as a lead
WARMUP_OVERSTATEMENT = {"gpt2": 3.55, "llama": 3.17}
DEEPNORM_AT_A_TENTH, DEEPNORM_TUNED = 0.839, -0.007
# its cells run on three seeds: how many, how many had a seed fail to train (more than FAILED_SEED above its cell's
# median on test), and the widest spread (max - min) of the others' test losses
FAILED_SEED = 1.0
SEEDED_CELLS, FAILED_CELLS, SEEDED_SPREAD = 14, 3, 0.20
FEW_DEGREES = 3  # below this many degrees of freedom a gap is not counted in standard errors
TWO_SEEDS = "2 seeds on a side: p from a t with 1-2 degrees of freedom"


def caveats(runs: list[dict[str, Any]], shares: dict[str, float | None], seeds: dict[str, int],
            plan: dict[str, Any] | None = None) -> list[str]:  # fmt: skip
    """The report's first lines where the sweep tuned less than its default: the warm-up not tuned, fewer than
    three seeds at a chosen cell; each with what that did in the project's study. ``shares`` and ``seeds``: each
    chosen row's warm-up share and seed count; ``plan``, the sweep options the journal began with: what the sweep
    will tune (a sweep in progress has not stepped its warm-up nor confirmed its seeds yet), else what the runs
    show (a warm-up not tuned: an arm's chosen cell has no share, or its arm ran one)."""
    lines = []
    if plan is not None:
        ladder = plan.get("warmup_shares") or []
        fixed = len(ladder) < 2
        planned = len(set(plan.get("seeds") or []) | set(plan.get("confirm_seeds") or []))
        seeds = {row: max(count, planned) for row, count in seeds.items()}
    else:
        ran: dict[str, set] = {}
        for entry in runs:
            ran.setdefault(entry["style"], set()).add(entry.get("warmup_share"))
        fixed = any(share is None for share in shares.values()) or any(len(found) < 2 for found in ran.values())
    if fixed:
        low, high = min(WARMUP_OVERSTATEMENT.values()), max(WARMUP_OVERSTATEMENT.values())
        lines.append(
            "**Not tuned: the warm-up.** Every arm ran one warm-up, so each arm's rate was tuned at a warm-up that "
            "may suit one style more than another. In the project's study (GPT-2 and LLaMA 4 x 128, 300 steps), a "
            f"warm-up fixed at a tenth of the run overstated GeoNorm's lead over Pre-Norm {low:.1f}-{high:.1f}x "
            f"against each style's rate and warm-up tuned together, and told a tie with DeepNorm "
            f"({DEEPNORM_TUNED:+.3f}) as a lead of {DEEPNORM_AT_A_TENTH:.3f}. Read these margins as upper bounds; "
            "the default (--warmup-shares, without --warmup-steps) tunes the warm-up with the rate."
        )
    few = sorted(row for row, count in seeds.items() if count < 2)
    if few:
        lines.append(
            f"**One seed** at the chosen cell of {names_text(few)}: no standard error and no p. In the project's "
            f"study, {FAILED_CELLS} of {SEEDED_CELLS} cells run on three seeds had one seed fail to train (more than "
            f"{FAILED_SEED} above the others on test), and the others' seeds spread up to {SEEDED_SPREAD:.2f}: one "
            "seed can rank arms wrongly; the default confirms three seeds (--confirm-seeds)."
        )
    two = sorted(row for row, count in seeds.items() if count == 2)
    if two:
        lines.append(f"**2 seeds** at the chosen cell of {names_text(two)}: each p below is from a t with 1-2 degrees "
                     "of freedom, and a standard error from two seeds is itself uncertain; the default confirms three "
                     "seeds.")  # fmt: skip
    return lines


def seeds_named(seeds: set[int] | list[int]) -> str:
    ordered = sorted(seeds)
    return ("seed " if len(ordered) == 1 else "seeds ") + ", ".join(map(str, ordered))


def names_text(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def p_text(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def pooled_spread(rates: dict[float, Cell]) -> tuple[float, int] | None:
    """The arm's seed spread: the sample standard deviation pooled over the rates that ran two or more seeds (each
    rate's own mean taken out), and its degrees of freedom; None where no rate ran two seeds."""
    squares, df = 0.0, 0
    for cell in rates.values():
        finite = [v for v in cell.val if v is not None]
        if len(finite) > 1:
            squares += statistics.variance(finite) * (len(finite) - 1)
            df += len(finite) - 1
    return (math.sqrt(squares / df), df) if df else None


@dataclass(frozen=True)
class Gap:
    """How much worse a rate is than the arm's best on the seeds they are compared on, and how sure that is."""

    lr: float
    gap: float
    error: float | None  # the standard error of the gap; None: no seed spread measured
    p: float | None  # Welch's, where both rates ran two or more of those seeds
    df: float | None = None  # the degrees of freedom behind the standard error

    def text(self) -> str:
        if self.error is None:
            return f"{rate_text(self.lr)}, is {self.gap:.4f} worse"
        if self.df is not None and self.df < FEW_DEGREES:  # a count of standard errors on 1-2 degrees says little
            sure = f"a standard error from {self.df:.3g} degree(s) of freedom: p from a t with 1-2 degrees of freedom"
        else:
            sure = f"{self.gap / self.error:.1f} standard errors" if self.error > 0 else "no spread"
        welch = "" if self.p is None else f", Welch's {p_text(self.p)}"
        return f"{rate_text(self.lr)}, is {self.gap:.4f} ± {self.error:.4f} worse ({sure}{welch})"


def gaps(rates: dict[float, Cell], best: float) -> list[Gap]:
    """Every other rate that trained against the best, on the seeds all the arm's rates ran: the standard error of
    the difference is Welch's where both ran two or more of them, else the arm's pooled seed spread x
    sqrt(1/n_rate + 1/n_best)."""
    common, spread = common_seeds(rates), pooled_spread(rates)
    best_values = [v for v in rates[best].val_on(common) if v is not None]
    found = []
    for lr, cell in rates.items():
        if lr == best or not math.isfinite(choice_loss(cell, common)):
            continue
        values = [v for v in cell.val_on(common) if v is not None]
        gap = choice_loss(cell, common) - choice_loss(rates[best], common)
        test = welch_test(values, best_values)
        if test is not None:
            found.append(Gap(lr, gap, test.standard_error, test.p, test.df))
        elif spread is not None:
            found.append(Gap(lr, gap, spread[0] * math.sqrt(1 / len(values) + 1 / len(best_values)), None,
                             spread[1]))  # fmt: skip
        else:
            found.append(Gap(lr, gap, None, None))
    return found


def plateau_text(arm: str, rates: dict[float, Cell], best: float) -> str | None:
    """The arm's plateau: the best rate and every rate whose validation loss is within one standard error of the
    difference from the best's (within ``PLATEAU_TOLERANCE`` where no seed spread was measured), all named; and the
    nearest rate outside it."""
    found = gaps(rates, best)
    if not found:
        return None
    common, spread = common_seeds(rates), pooled_spread(rates)
    on = f"on validation, {seeds_named(common)} (which every rate ran)" if common else "on validation"
    inside = [g for g in found if g.gap <= (PLATEAU_TOLERANCE if g.error is None else g.error)]
    outside = sorted((g for g in found if g not in inside), key=lambda g: g.gap)
    if spread is None:
        value, why = f"{PLATEAU_TOLERANCE}", ("a stated tolerance: no rate ran two seeds to measure the seed spread; "
                                              "--confirm-seeds 1,2 measures it")  # fmt: skip
    elif all(g.p is None for g in found) and len({round(g.error or 0, 12) for g in found}) == 1:
        value = f"{found[0].error or 0:.4f}"
        why = (f"one standard error of the difference between two rates, from the seed spread {spread[0]:.4f} with "
               f"{spread[1]} degree(s) of freedom")  # fmt: skip
    else:
        value = "one standard error"
        why = (f"of each rate's difference from the best: Welch's where both rates ran two or more seeds, else from "
               f"the seed spread {spread[0]:.4f}")  # fmt: skip
    if not inside:
        return (f"{arm}, {on}: no plateau: {rate_text(best)} alone is best, every other rate more than {value} "
                f"worse ({why}); the next best rate, {outside[0].text()}")  # fmt: skip
    names = names_text([rate_text(lr) for lr in sorted([best, *(g.lr for g in inside)])])
    nearest = f"; the nearest rate outside it, {outside[0].text()}" if outside else ""
    return (f"{arm}, {on}: a plateau of {len(inside) + 1} rates, {names}, each within {value} of the best ({why}): "
            f"any of them is as good on this evidence, and the choice of {rate_text(best)} among them is not "
            f"resolved{nearest}")  # fmt: skip


def plateau_notes(table: dict[str, dict[float, Cell]], best: dict[str, float]) -> list[str]:
    return [text for arm, rates in table.items() if trained(rates) and len(rates) > 1
            if (text := plateau_text(arm, rates, best[arm])) is not None]  # fmt: skip


def margins_text(table: dict[str, dict[float, Cell]], best: dict[str, float], ranked: list[str]) -> str:
    """The lowest arm on test against each other: the difference of the mean test losses at their best rates ± its
    standard error, Welch's t, degrees of freedom and p, where both ran two or more seeds."""
    lowest = [v for v in table[ranked[0]][best[ranked[0]]].test if v is not None]
    parts = []
    for arm in ranked[1:]:
        other = [v for v in table[arm][best[arm]].test if v is not None]
        margin = mean_spread(other)[0] - mean_spread(lowest)[0]
        test = welch_test(other, lowest)
        if test is not None:
            few = "" if min(len(lowest), len(other)) >= 3 else f"; {TWO_SEEDS}"
            parts.append(f"{margin:.4f} ± {test.standard_error:.4f} below {arm} (the difference of the means over "
                         f"{len(lowest)} and {len(other)} seeds ± its standard error; Welch's t = {test.t:.2f}, "
                         f"{test.df:.1f} degrees of freedom, {p_text(test.p)}{few})")  # fmt: skip
        else:
            few = "one seed each" if len(lowest) < 2 and len(other) < 2 else "one seed on one side"
            parts.append(f"{margin:.4f} below {arm} ({few}: no standard error and no p; --confirm-seeds 1,2 "
                         "measures them)")  # fmt: skip
    return f"{ranked[0]} is lowest on test: " + "; ".join(parts) + "."


def early_training(runs: list[dict[str, Any]]) -> list[str]:
    """A section saying that runs shorter than the length study's longest are early training, where the study saw
    GeoNorm's lead shrink with length and Pre-Norm's best rate move; none for longer runs."""
    finished = [e for e in runs if e.get("val_loss") is not None and isinstance(e.get("tokens"), int)]
    if not finished:
        return []
    tokens, steps = max(e["tokens"] for e in finished), max(e["steps"] for e in finished)
    if tokens >= STUDY_LONGEST_TOKENS:
        return []
    points = ", ".join(f"{margin} at {size / 1e6:.1f}M tokens" for size, margin, _ in LENGTH_STUDY)
    growth = LENGTH_STUDY[-1][0] // LENGTH_STUDY[0][0]
    return [
        "## Early training",
        "",
        f"Each run trained {tokens:,} tokens ({steps} steps), fewer than the {STUDY_LONGEST_TOKENS:,} of the longest "
        "runs of the project's length study, so read this report's losses, margins and best rates as early-training "
        "figures. In that study (GPT-2, 4 layers of width 128, on 32M tokens of torch and transformers source, each "
        "arm's peak rate re-tuned at each length, the warm-up a tenth of each run) GeoNorm's lead over Pre-Norm on "
        f"test fell as the runs grew {growth} times longer: {points}; and Pre-Norm's best rate moved "
        f"({', '.join(rate for *_, rate in LENGTH_STUDY)}): a margin measured this early may shrink, and a best rate "
        "move, with longer training. Part of that fall is the warm-up, not the length: a tenth of a short run is few "
        "steps, and in the study's phase i (300 steps) tuning each style's warm-up with its rate cut GeoNorm's lead "
        f"over Pre-Norm {min(WARMUP_OVERSTATEMENT.values()):.1f}-{max(WARMUP_OVERSTATEMENT.values()):.1f}x; a report "
        "whose warm-up was not tuned says so first. The study: "
        f"{STUDY_SECTION}.",
        "",
    ]
