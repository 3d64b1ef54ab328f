"""Welch's t-test, written out (the standard library has no Student's t distribution, and hf-geonorm does not depend
on scipy): whether two arms' (or two rates') mean losses over seeds differ by more than their seed spreads explain,
without assuming the two spreads are equal."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONTINUED_FRACTION_TERMS = 300
CONTINUED_FRACTION_TOLERANCE = 1e-15


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
    """P(|T| >= |t|) for Student's t with ``df`` (any positive real) degrees of freedom: the regularized incomplete
    beta function I_x(df/2, 1/2) at x = df / (df + t^2)."""
    return regularized_beta(df / (df + t * t), df / 2, 0.5)


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), by its continued fraction (Numerical Recipes, betai), on the side of x where it converges fast."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _continued_fraction(x, a, b) / a
    return 1 - front * _continued_fraction(1 - x, b, a) / b


def _continued_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by the modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, CONTINUED_FRACTION_TERMS + 1):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= d * c
        if abs(d * c - 1) < CONTINUED_FRACTION_TOLERANCE:
            break
    return value
