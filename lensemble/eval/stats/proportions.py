"""Rates and differences of rates.

* **Rates**: Wilson score interval (good coverage, never leaves [0, 1], sensible at 0/n).
* **Two proportions**: the difference with Newcombe's hybrid score interval (built from the two
  Wilson intervals) and a pooled z-test or Fisher's exact test p-value; for paired outcomes (two
  arms on the same tasks) Newcombe's paired interval, corrected for the arms' correlation, with
  the exact McNemar p-value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from lensemble.errors import EvaluationError
from lensemble.eval.stats.core import Alternative, Interval, as_1d, check_alpha

# --------------------------------------------------------------------------------------------
# Rates


@dataclass(frozen=True)
class ProportionComparison:
    """Difference ``p_a - p_b`` of two rates with its CI and a test p-value: independent samples
    (:func:`compare_proportions`) or paired outcomes on the same tasks
    (:func:`compare_paired_proportions`); ``test`` names the test behind ``p_value``."""

    p_a: float
    p_b: float
    difference: float
    ci: Interval
    p_value: float
    test: str


def _check_counts(successes: int, n: int) -> tuple[int, int]:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise EvaluationError(f"n must be a positive integer, got {n}")
    if isinstance(successes, bool) or int(successes) != successes or not 0 <= successes <= n:
        raise EvaluationError(f"successes must be an integer in [0, n={n}], got {successes}")
    return int(successes), int(n)


def wilson_interval(successes: int, n: int, *, alpha: float = 0.05) -> Interval:
    """Wilson score interval for a binomial rate ``successes / n``.

    It inverts the score test, so it stays inside [0, 1] and gives a non-degenerate interval at
    0/n and n/n, where the textbook Wald interval collapses to a point.
    """
    k, n = _check_counts(successes, n)
    alpha = check_alpha(alpha)
    z = stats.norm.ppf(1 - alpha / 2)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Exact endpoints at the boundaries: rounding must not push 0/n above 0 or n/n below 1.
    low = 0.0 if k == 0 else max(0.0, float(centre - half))
    high = 1.0 if k == n else min(1.0, float(centre + half))
    return Interval(low, high, 1 - alpha, "wilson")


def compare_proportions(
    successes_a: int,
    n_a: int,
    successes_b: int,
    n_b: int,
    *,
    alpha: float = 0.05,
    test: Literal["z", "fisher"] = "z",
) -> ProportionComparison:
    """Compare two independent rates (e.g. success of arm A vs arm B on separate episodes).

    The CI of ``p_a - p_b`` is Newcombe's hybrid score interval: it combines the two Wilson
    intervals, so it behaves at 0 % and 100 % where the Wald interval does not. The p-value is
    the two-sided pooled z-test (``test="z"``) or Fisher's exact test (``test="fisher"``; use it
    for small counts).
    """
    ka, na = _check_counts(successes_a, n_a)
    kb, nb = _check_counts(successes_b, n_b)
    pa, pb = ka / na, kb / nb
    wa, wb = wilson_interval(ka, na, alpha=alpha), wilson_interval(kb, nb, alpha=alpha)
    d = pa - pb
    low = d - math.sqrt((pa - wa.low) ** 2 + (wb.high - pb) ** 2)
    high = d + math.sqrt((wa.high - pa) ** 2 + (pb - wb.low) ** 2)
    ci = Interval(max(-1.0, low), min(1.0, high), 1 - alpha, "newcombe-hybrid-score")
    if test == "z":
        pooled = (ka + kb) / (na + nb)
        se = math.sqrt(pooled * (1 - pooled) * (1 / na + 1 / nb))
        # Both arms at 0 % (or both at 100 %): no variation, no evidence of a difference.
        p_value = 1.0 if se == 0 else float(2 * stats.norm.sf(abs(d) / se))
    elif test == "fisher":
        p_value = float(stats.fisher_exact([[ka, na - ka], [kb, nb - kb]]).pvalue)
    else:
        raise EvaluationError(f"unknown test {test!r} (use 'z' or 'fisher')")
    return ProportionComparison(pa, pb, d, ci, p_value, test)


@dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar test on paired binary outcomes (same tasks, two arms).

    ``a_only`` / ``b_only``: tasks only arm A / only arm B solved (the discordant pairs); the
    concordant ones carry no information about the difference. ``p_value``: exact binomial
    test of ``a_only ~ Binomial(a_only + b_only, 1/2)``.
    """

    a_only: int
    b_only: int
    p_value: float
    alternative: str


def paired_table(a, b) -> tuple[int, int, int, int]:
    """The 2x2 table of paired binary outcomes: (both, a_only, b_only, neither) task counts.

    Args:
        a, b: 1-D boolean (or 0/1) arrays of the same length n >= 1; entry i is task i's outcome
            under arm A and under arm B.
    """
    x = as_1d(np.asarray(a, dtype=float), "a")
    y = as_1d(np.asarray(b, dtype=float), "b")
    if x.size != y.size:
        raise EvaluationError(f"paired outcomes differ in length: {x.size} vs {y.size}")
    if not (np.isin(x, (0.0, 1.0)).all() and np.isin(y, (0.0, 1.0)).all()):
        raise EvaluationError("paired outcomes must be binary (0/1 or booleans)")
    xa, ya = x == 1, y == 1
    return int((xa & ya).sum()), int((xa & ~ya).sum()), int((~xa & ya).sum()), int((~xa & ~ya).sum())


def mcnemar_exact(a, b, *, alternative: Alternative = "two-sided") -> McNemarResult:
    """Exact McNemar test that arms A and B succeed equally often on the same tasks.

    Args:
        a, b: 1-D boolean (or 0/1) arrays of the same length: entry i is task i's outcome under
            each arm. ``alternative="greater"`` tests A better than B.

    With no discordant pair there is no evidence either way and the p-value is 1.
    """
    _, a_only, b_only, _ = paired_table(a, b)
    n = a_only + b_only
    p = 1.0 if n == 0 else float(stats.binomtest(a_only, n, 0.5, alternative=alternative).pvalue)
    return McNemarResult(a_only, b_only, p, alternative)


def _paired_phi(both: int, a_only: int, b_only: int, neither: int) -> float:
    """Newcombe's (1998) continuity-corrected phi coefficient of a paired 2x2 table.

    0 when any margin is 0. The cross-product ``both·neither − a_only·b_only`` is shrunk towards
    0 by n/2 when positive (never below 0) and used as is when negative, as in the paper.
    """
    n = both + a_only + b_only + neither
    margins = (both + a_only) * (b_only + neither) * (both + b_only) * (a_only + neither)
    if margins == 0:
        return 0.0
    cross = both * neither - a_only * b_only
    numerator = max(cross - n / 2, 0.0) if cross > 0 else float(cross)
    return numerator / math.sqrt(margins)


def compare_paired_proportions(a, b, *, alpha: float = 0.05) -> ProportionComparison:
    """Compare two success rates measured on the *same* tasks (paired binary outcomes).

    Args:
        a, b: 1-D boolean (or 0/1) arrays of the same length n: entry i is task i's outcome
            under arm A and under arm B (e.g. two models run on one goal-spec hash and eval seed).
        alpha: 1 - confidence level (two-sided).

    Returns:
        :class:`ProportionComparison` of ``p_a - p_b`` with ``ci.method == "newcombe-paired"`` and
        ``test == "mcnemar-exact"``.

    Why paired: outcomes of two models on the same task are usually positively correlated (an
    easy task is easy for both), so the difference varies less than two independent samples
    would; the unpaired :func:`compare_proportions` ignores that and is too wide, while here
    only the correlation the table shows narrows the interval.

    The CI is Newcombe's method 10 (square-and-add of the two Wilson intervals (l1, u1) of
    p_a and (l2, u2) of p_b, corrected for their correlation φ, :func:`_paired_phi`)::

        L = θ − sqrt((p_a − l1)² − 2φ(p_a − l1)(u2 − p_b) + (u2 − p_b)²)
        U = θ + sqrt((u1 − p_a)² − 2φ(u1 − p_a)(p_b − l2) + (p_b − l2)²),   θ = p_a − p_b,

    clipped to [−1, 1]; with φ = 0 it is the unpaired hybrid score interval. The p-value is the
    exact two-sided McNemar test (:func:`mcnemar_exact`).

    Reference: R. G. Newcombe (1998), "Improved confidence intervals for the difference between
    binomial proportions based on paired data", Statistics in Medicine 17:2635-2650.
    """
    alpha = check_alpha(alpha)
    both, a_only, b_only, neither = paired_table(a, b)
    n = both + a_only + b_only + neither
    ka, kb = both + a_only, both + b_only
    pa, pb = ka / n, kb / n
    wa, wb = wilson_interval(ka, n, alpha=alpha), wilson_interval(kb, n, alpha=alpha)
    phi = _paired_phi(both, a_only, b_only, neither)
    d = pa - pb

    def spread(x: float, y: float) -> float:  # |φ| <= 1 keeps the radicand >= (x − y)² >= 0
        return math.sqrt(max(0.0, x * x - 2 * phi * x * y + y * y))

    low = d - spread(pa - wa.low, wb.high - pb)
    high = d + spread(wa.high - pa, pb - wb.low)
    ci = Interval(max(-1.0, low), min(1.0, high), 1 - alpha, "newcombe-paired")
    return ProportionComparison(pa, pb, d, ci, mcnemar_exact(a, b).p_value, "mcnemar-exact")
