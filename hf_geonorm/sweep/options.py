"""What ``hf-geonorm sweep`` takes beside the ``TrainOptions`` of its runs: ``SweepOptions``, a plain dataclass as
``TrainOptions`` is, so that the command line generates its options from here."""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .._plumbing.declarations import OptionError, check_limits
from ..modeling.settings import NORM_STYLES
from ..training.options import MAX_SEED

MAX_RATES = 64  # rates in a sweep's grid (--lr-range 1e-300 1e300 would be 1,994)
EXTEND_DEFAULT = 2  # rate steps beyond an edge per arm, unless --extend says
DEFAULT_GRID_STEPS = 1  # sweep's starting rates: factors of 2 either side of the default rate (rate/2 to rate x 2)
UNMEASURED_GRID_STEPS = 2  # ... around a rate no cell measured (GPT-3's, or extrapolated): rate/4 to rate x 4
# the warm-up shares of the run the walk may take (phase i's ladder), and the two every arm starts from
WARMUP_LADDER = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
WARMUP_START = (0.1, 0.3)
CONFIRMED_SEEDS = 3  # seeds at each arm's chosen cell by default: --seeds, then the next seeds up to three
STARTING_RATES = "starting_rates"  # a plan's each style's starting rates, as the sweep began (not an option)
RATES = ("lrs", "lr_range")  # one choice: given either, the sweep takes neither from its header
# what a plan recorded before an option existed ran: no warm-up walk (the journal's --warmup-steps); a plan's null
# --confirm-seeds is none (a plan of today records the seeds its default resolved to)
LEGACY_PLAN = {"warmup_shares": None, "warmup_start": None, "extend": 0}


def _grid_text() -> str:
    """The factors of sweep's default grid around each style's rate: ``/4, /2, x1, x2, x4``."""
    steps = range(-DEFAULT_GRID_STEPS, DEFAULT_GRID_STEPS + 1)
    return ", ".join(f"/{2**-step}" if step < 0 else f"x{2**step}" for step in steps)


# The train options the runs of one sweep may differ in (left out of its journal's key): the rate and seed the grid
# sets, where a run writes and what it keeps, and what does not change what a run computes.
OUTSIDE_SWEEP_KEY = ("data_workers", "data_cache", "lr", "lr_source", "logging_steps", "report_to", "output",
                     "keep_checkpoints", "resume", "force", "seed")  # fmt: skip
# The train options that ``sweep`` does not take: what the grid sets, and what each run's folder or the sweep decides.
# The sweep also sets each run's norm style (``--styles``).
NOT_SWEPT = ("lr", "fsdp", "report_to", "output", "keep_checkpoints", "resume", "force", "seed")


@dataclass
class SweepOptions:
    """The grid of ``hf-geonorm sweep``: every style (and, for geo, every alpha) at every learning rate and seed,
    each run as ``hf-geonorm train`` would run it with the ``TrainOptions`` beside these."""

    output: str = field(default="geonorm-sweep", metadata={"help": (
        "Folder of the sweep: runs.jsonl (one line per finished run), sweep.md, sweep.png and runs/ (each run's "
        "train output)."), "path": "folder"})  # fmt: skip
    styles: tuple[str, ...] = field(default=("pre", "geo"), metadata={"help": (
        f"Norm styles compared, a comma list of {', '.join(NORM_STYLES)}."), "metavar": "LIST"})
    lrs: tuple[float, ...] | None = field(default=None, metadata={"help": (
        "Peak learning rates, a comma list (e.g. 2e-3,4e-3,8e-3)."), "metavar": "LIST", "default_text": (
        f"each style's default rate (train's) {_grid_text()}; /8 to x8 around one no cell measured")})  # fmt: skip
    lr_range: tuple[float, float] | None = field(default=None, metadata={"help": (
        "The rates from LOW to HIGH a factor 2 apart (instead of --lrs)."), "metavar": "LOW HIGH"})
    seeds: tuple[int, ...] = field(default=(0,), metadata={"help": (
        "Seeds of every cell (rate x warm-up), a comma list: each arm's cell is chosen on their mean validation "
        "loss."), "metavar": "LIST"})  # fmt: skip
    warmup_shares: tuple[float, ...] | None = field(default=WARMUP_LADDER, metadata={"help": (
        "The warm-up shares of the run the walk may take, a comma list from 0 to below 1 (none: the warm-up is "
        "not tuned; --warmup-steps fixes it): every arm starts at --warmup-start and takes the next share while its "
        "best cell is at the lowest or highest share it ran, at three rates around that cell's."),
        "metavar": "LIST"})  # fmt: skip
    warmup_start: tuple[float, ...] = field(default=WARMUP_START, metadata={"help": (
        "The warm-up shares every arm starts from, a comma list of --warmup-shares."), "metavar": "LIST"})
    alphas: tuple[float, ...] | None = field(default=None, metadata={"help": (
        "geo_alpha values swept for the geo style, a comma list."), "metavar": "LIST",
        "default_text": "--alpha, else the library's"})  # fmt: skip
    confirm_seeds: tuple[int, ...] | None = field(default=None, metadata={"help": (
        "More seeds, run only at each arm's chosen cell once it is chosen on --seeds (a third of the cost of every "
        "seed at every cell), a comma list; none: no more seeds."), "metavar": "LIST",
        "default_text": f"the seeds after --seeds, {CONFIRMED_SEEDS} seeds at each chosen cell in all"})  # fmt: skip
    extend: int = field(default=EXTEND_DEFAULT, metadata={"help": (
        "While an arm's best cell is at the lowest or highest rate of its warm-up, add the next rate one grid step "
        "beyond it (a factor 2 for --lr-range), N times at most per arm; 0: no rate added."), "ge": 0,
        "le": MAX_RATES, "metavar": "N"})  # fmt: skip

    def __post_init__(self) -> None:
        if self.warmup_shares is not None and not self.warmup_shares:  # --warmup-shares none: not tuned
            self.warmup_shares = None

    def start_shares(self) -> tuple[float | None, ...]:
        """The warm-up shares every arm starts from (None: the train options' warm-up, not tuned)."""
        return tuple(sorted(self.warmup_start)) if self.warmup_shares is not None else (None,)

    def resolved(self) -> SweepOptions:
        """These options with ``--confirm-seeds``'s default made explicit: the seeds after ``--seeds`` up to
        ``CONFIRMED_SEEDS`` at each chosen cell (none where ``--seeds`` has as many)."""
        if self.confirm_seeds is not None:
            return self
        more = max(0, CONFIRMED_SEEDS - len(self.seeds))
        return replace(self, confirm_seeds=tuple(range(max(self.seeds) + 1, max(self.seeds) + 1 + more)))

    def plan(self) -> dict[str, Any]:
        """The options that plan the sweep (all but ``output``), as its journal's header holds them (JSON)."""
        return {name: list(value) if isinstance(value, tuple) else value
                for name, value in asdict(self).items() if name != "output"}  # fmt: skip

    def as_begun(self, begun: dict[str, Any], given: Collection[str]) -> tuple[SweepOptions, list[str]]:
        """These options with each one not ``given`` (on the command line) taken from ``begun``, the plan the sweep
        began with (its header's): a rerun with fewer options finishes the same sweep. Also the options taken (as
        ``--name value``) where they differ from this call's defaults. ``--lrs`` and ``--lr-range`` are one choice;
        ``--alphas`` is not taken for a sweep given ``--styles`` without geo."""
        taken: dict[str, Any] = {}
        begun = {**LEGACY_PLAN, **begun, "confirm_seeds": begun.get("confirm_seeds") or ()}
        for spec in fields(self):
            name = spec.name
            if name not in begun or name in given or (name in RATES and set(RATES) & set(given)):
                continue
            value = begun[name]
            taken[name] = tuple(value) if isinstance(value, list) else value
        if "alphas" in taken and "geo" not in taken.get("styles", self.styles):
            del taken["alphas"]
        resumed = replace(self, **taken)
        shown = [f"--{name.replace('_', '-')} {_option_text(value)}" for name, value in taken.items()
                 if value != getattr(self, name)]  # fmt: skip
        return resumed, shown

    def rates(self, centre: float = 1e-3, steps: int = DEFAULT_GRID_STEPS) -> tuple[float, ...]:
        """The learning rates of the grid: ``lrs``, else ``lr_range`` (LOW, 2 LOW, ... up to HIGH), else ``centre``
        (the style's default rate) times 2^-steps to 2^steps, a factor 2 apart."""
        if self.lrs is not None and self.lr_range is not None:
            raise OptionError("give --lrs or --lr-range, not both")
        if self.lrs is not None:
            return tuple(self.lrs)
        if self.lr_range is None:
            return tuple(centre * 2.0**step for step in range(-steps, steps + 1))
        low, high = self.lr_range
        if not (0 < low <= high and math.isfinite(high)):
            raise OptionError(f"--lr-range LOW HIGH needs finite 0 < LOW <= HIGH; got {low:g} {high:g}")
        count = int(math.floor(math.log2(high) - math.log2(low) + 1e-9)) + 1  # logs apart: 1e300 / 1e-300 overflows
        if count > MAX_RATES:
            raise OptionError(
                f"--lr-range {low:g} {high:g} spans {count} rates a factor 2 apart; a sweep takes at most {MAX_RATES}: "
                "give a narrower range"
            )
        return tuple(low * 2**i for i in range(count))

    def validate(self) -> SweepOptions:
        if not os.fspath(self.output).strip():
            raise OptionError("--output is empty (an unset shell variable?); give the folder of the sweep")
        check_limits(self)
        rates = self.rates()
        if not rates or any(not (rate > 0 and math.isfinite(rate)) for rate in rates):
            raise OptionError(f"--lrs: learning rates must be positive finite numbers; got "
                              f"{', '.join(f'{r:g}' for r in rates)}")  # fmt: skip
        if len(rates) > MAX_RATES:
            raise OptionError(f"--lrs names {len(rates)} rates; a sweep takes at most {MAX_RATES}")
        if not self.styles:
            raise OptionError(f"--styles names at least one of {', '.join(NORM_STYLES)}")
        for style in self.styles:
            if style not in NORM_STYLES:
                raise OptionError(f"--styles: unknown norm style {style!r}; choose from {', '.join(NORM_STYLES)}")
        if not self.seeds:
            raise OptionError("--seeds names at least one seed")
        for name in ("seeds", "confirm_seeds"):
            for seed in getattr(self, name) or ():
                if not 0 <= seed <= MAX_SEED:
                    raise OptionError(f"--{name.replace('_', '-')}: seed {seed} is not a whole number from 0 to "
                                      f"{MAX_SEED}")  # fmt: skip
        if self.confirm_seeds is not None and set(self.confirm_seeds) & set(self.seeds):
            both = sorted(set(self.confirm_seeds) & set(self.seeds))
            raise OptionError(f"--confirm-seeds names {', '.join(map(str, both))}, already in --seeds (every rate "
                              "runs those): give other seeds")  # fmt: skip
        if self.warmup_shares is not None:
            ladder, start = self.warmup_shares, self.warmup_start
            if not ladder or any(not 0 <= share < 1 for share in ladder):
                raise OptionError("--warmup-shares: shares of the run from 0 to below 1 (0.1: a tenth of the steps); "
                                  f"got {', '.join(map(str, ladder)) or 'none'}")  # fmt: skip
            if not start or any(share not in ladder for share in start):
                raise OptionError(f"--warmup-start {', '.join(map(str, start))}: each must be one of --warmup-shares "
                                  f"({', '.join(map(str, ladder))})")  # fmt: skip
            steps = sorted(sorted(ladder).index(share) for share in set(start))
            if steps[-1] - steps[0] != len(steps) - 1:
                raise OptionError(f"--warmup-start {', '.join(map(str, start))}: give neighbours on --warmup-shares "
                                  f"({', '.join(map(str, sorted(ladder)))}), so that the walk steps from them")
        if self.alphas is not None:
            if "geo" not in self.styles:
                raise OptionError("--alphas sweeps geo_alpha of the geo style; add geo to --styles")
            if not self.alphas or any(not (alpha >= 0 and math.isfinite(alpha)) for alpha in self.alphas):
                raise OptionError("--alphas: step sizes must be finite numbers >= 0")
        for name in ("styles", "lrs", "seeds", "alphas", "confirm_seeds", "warmup_shares", "warmup_start"):
            values = getattr(self, name)
            if values is not None and len(set(values)) != len(values):
                raise OptionError(f"--{name.replace('_', '-')} names a value twice: {', '.join(map(str, values))}")
        return self


def _option_text(value: Any) -> str:
    """An option's value as the command line writes it: a comma list (every digit of a rate kept), a number."""
    if value is None:
        return "none"
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
