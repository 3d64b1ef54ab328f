"""Welch's t-test: whether two arms' (or two rates') mean losses over seeds differ by more than their seed spreads
explain, without assuming the two spreads are equal. Student's t distribution is scipy's (the train extra's)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class WelchTest:
    """mean(a) - mean(b), its standard error (sqrt(var_a / n_a + var_b / n_b)), Welch's t, the Welch-Satterthwaite
    degrees of freedom and the two-sided p-value."""

    difference: float
    standard_error: float
    t: float
    df: float
    p: float


def welch_test(a: list[float], b: list[float]) -> WelchTest | None:
    """Welch's t-test of mean(a) against mean(b); None where either side has fewer than two values or neither
    spreads at all (no variance to test against)."""
    if len(a) < 2 or len(b) < 2:
        return None
    share_a, share_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    error = math.sqrt(share_a + share_b)
    if error == 0:
        return None
    difference = statistics.fmean(a) - statistics.fmean(b)
    df = (share_a + share_b) ** 2 / (share_a**2 / (len(a) - 1) + share_b**2 / (len(b) - 1))
    t = difference / error
    return WelchTest(difference, error, t, df, two_sided_p(t, df))


def two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` (any positive real) degrees of freedom: twice its lower tail at
    -|t| (scipy's ``stdtr``, exact far into the tail where 1 - cdf would round to 0)."""
    from scipy.special import stdtr  # imported here: hf_geonorm.inspection reads this module in the core install

    return float(2 * stdtr(df, -abs(t)))
