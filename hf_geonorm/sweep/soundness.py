"""What a sweep's report says of how far its choices can be trusted, besides the seed statistics (``evidence``):
what was tuned and on which grid, each arm's runs; a chosen cell next to a cliff (a neighbouring rate of its warm-up
diverged or stayed at the unigram loss: a little more rate and the arm fails); a factor-4 hole in a grid beside a
chosen rate (the best may lie in it); and the arms whose loss is within ``reference.NOT_LEARNING`` of the held-out
text's unigram cross-entropy, which have not yet learned from the context."""

from __future__ import annotations

from typing import Any

from .reference import NOT_LEARNING
from .table import Cell, Chosen, arm_name, mean_spread, rate_text, share_text

HOLE = 4.0  # a gap between neighbouring rates of a grid this wide (or wider) beside a chosen rate is pointed out


def tuned_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The hyperparameters tuned, and each arm's grid: its warm-up shares, its rates, its runs by role."""
    shares = {e.get("warmup_share") for e in runs}
    tuned = "the peak learning rate" + (" and the warm-up share of the run" if shares - {None} else "")
    lines = [f"- tuned for every arm on one rule, chosen on validation: {tuned} (nothing else: the optimizer, its "
             "betas and weight decay, the schedule's shape, the batch and the model are the train options')"]
    arms: dict[str, list[dict[str, Any]]] = {}
    for entry in runs:
        arms.setdefault(arm_name(entry), []).append(entry)
    for arm, own in arms.items():
        roles = {role: sum(e.get("role") == role for e in own) for role in ("grid", "extension", "confirmation")}
        rows = sorted({e.get("warmup_share") for e in own}, key=lambda share: -1.0 if share is None else share)
        grid = "; ".join(
            ("" if share is None else f"warm-up {share_text(share)}: ")
            + ", ".join(rate_text(lr) for lr in sorted({e["lr"] for e in own if e.get("warmup_share") == share}))
            for share in rows
        )
        by_role = (f"{roles['grid']} starting grid, {roles['extension']} added by the walk's steps, "
                   f"{roles['confirmation']} confirmation" if sum(roles.values()) == len(own)
                   else "their roles not recorded: journaled by an earlier hf-geonorm")  # fmt: skip
        lines.append(f"- {arm}: {len(own)} runs ({by_role}); rates {grid}")
    return lines


def failed(cell: Cell, unigram: float | None) -> str | None:
    """How a neighbouring cell failed: every seed diverged, or its loss stayed above the unigram loss less
    ``NOT_LEARNING``; None where it trained."""
    mean, _, n = mean_spread(cell.val)
    if n == 0:
        return "diverged"
    if unigram is not None and mean > unigram - NOT_LEARNING:
        return f"stayed at the unigram loss ({mean:.3f} against {unigram:.3f})"
    return None


def cliff_notes(table: dict[str, dict[float, Cell]], chosen: dict[str, Chosen],
                reference: dict[str, Any] | None) -> dict[str, str]:  # fmt: skip
    """Each chosen row next to a cliff: the neighbouring rate of its warm-up that failed, and how."""
    unigram = None if reference is None else reference.get("unigram_validation")
    notes = {}
    for choice in chosen.values():
        rates = sorted(table[choice.row])
        at = rates.index(choice.lr)
        for neighbour in rates[max(0, at - 1) : at] + rates[at + 1 : at + 2]:
            how = failed(table[choice.row][neighbour], unigram)
            if how is not None:
                notes[choice.row] = f"next to a cliff: {rate_text(neighbour)} at the same warm-up {how}"
    return notes


def hole_notes(table: dict[str, dict[float, Cell]], chosen: dict[str, Chosen]) -> list[str]:
    """A factor of ``HOLE`` or more between a chosen rate and its neighbouring rate of the grid."""
    notes = []
    for choice in chosen.values():
        rates = sorted(table[choice.row])
        at = rates.index(choice.lr)
        for neighbour in rates[max(0, at - 1) : at] + rates[at + 1 : at + 2]:
            factor = max(neighbour, choice.lr) / min(neighbour, choice.lr)
            if factor >= HOLE * (1 - 1e-9):
                notes.append(f"{choice.row}: the chosen rate {rate_text(choice.lr)} and its neighbour "
                             f"{rate_text(neighbour)} are a factor {factor:.3g} apart: the best rate may lie between "
                             "them; give --lrs with rates a factor 2 apart there")  # fmt: skip
    return notes


def not_learning(table: dict[str, dict[float, Cell]], chosen: dict[str, Chosen],
                 reference: dict[str, Any] | None) -> list[str]:  # fmt: skip
    """The chosen rows whose mean test loss is above the unigram cross-entropy of the test blocks less
    ``NOT_LEARNING`` (within it, or worse)."""
    if reference is None or reference.get("unigram_test") is None:
        return []
    unigram = reference["unigram_test"]
    rows = []
    for choice in chosen.values():
        mean, _, n = mean_spread(table[choice.row][choice.lr].test)
        if n and mean > unigram - NOT_LEARNING:
            rows.append(choice.row)
    return rows
