"""Paired tests of the mean paired difference over units (seeds).

* **Paired tests**: an exact (or Monte-Carlo) sign-flip permutation test of the mean paired
  difference (:func:`paired_permutation_pvalue`).
* The study's registered test: Student t on per-unit differences (:func:`paired_t_test`), with a
  confirming and a falsifying p-value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

import numpy as np
from scipy import stats

from lensemble.errors import EvaluationError
from lensemble.eval.stats.core import Alternative, Direction, Interval, as_1d, as_rng

# Above this many pairs the sign-flip test is Monte-Carlo; 2**16 exact flips is still cheap.
_EXACT_PERMUTATION_MAX_N = 16


# --------------------------------------------------------------------------------------------
# Paired tests


def paired_permutation_pvalue(
    differences,
    *,
    alternative: Alternative = "two-sided",
    n_perm: int = 20_000,
    seed: int | np.random.Generator = 0,
) -> float:
    """Sign-flip permutation p-value for "the mean paired difference is zero".

    Under the null each unit's difference is symmetric about 0, so flipping its sign is as likely
    as not. Exact over all 2**n flips for n <= 16; otherwise Monte-Carlo with ``n_perm`` flips,
    using (hits + 1) / (n_perm + 1) so the p-value is never 0.
    """
    d = as_1d(differences, "differences", min_n=1)
    if alternative not in ("two-sided", "greater", "less"):
        raise EvaluationError(f"unknown alternative {alternative!r}")
    n = d.size
    observed = d.mean()
    if n <= _EXACT_PERMUTATION_MAX_N:
        signs = np.array(list(product((1.0, -1.0), repeat=n)))
    else:
        rng = as_rng(seed)
        signs = rng.choice(np.array([1.0, -1.0]), size=(n_perm, n))
    null = (signs * d).mean(-1)
    # A relative tolerance so that float noise in the flipped means never flips a tie.
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if alternative == "two-sided":
        hits = np.sum(np.abs(null) >= abs(observed) - tol)
    elif alternative == "greater":
        hits = np.sum(null >= observed - tol)
    else:
        hits = np.sum(null <= observed + tol)
    if n <= _EXACT_PERMUTATION_MAX_N:
        return float(hits / signs.shape[0])
    return float((hits + 1) / (n_perm + 1))


# --------------------------------------------------------------------------------------------
# The registered paired test: Student t on per-unit (per-seed) differences


@dataclass(frozen=True)
class PairedTTest:
    """One-sample t on per-unit paired differences (treatment − control), in the registered
    ``direction``. ``p_confirm`` tests H0: effect ≤ 0 (one-sided; two-sided when registered so);
    ``p_falsify`` tests H0: effect ≥ δ, the registered effect, so a small p means "the effect is
    smaller than δ" with error control (rejected at the same level, adjusted the same way).
    ``ci`` is the two-sided ``level`` t interval of the mean difference."""

    estimate: float
    se: float
    df: int
    n: int
    sd: float
    p_confirm: float
    p_falsify: float
    ci: Interval
    direction: Direction
    delta: float


def paired_t_test(
    differences,
    *,
    delta: float,
    direction: Direction = "increase",
    two_sided: bool = False,
    level: float = 0.95,
) -> PairedTTest:
    """The study's registered test of one comparison (docs/study.md, "The analysis").

    Args:
        differences: per-unit paired differences treatment − control (n >= 2), e.g. one per seed
            (for success: the mean over the seed's paired episodes).
        delta: the registered effect size (> 0; its sign is ``direction``).
        direction: "increase" (treatment − control >= δ claimed) or "decrease" (<= −δ).
        two_sided: confirm with a two-sided p (2 × the one-sided one, capped at 1).
        level: level of the reported two-sided interval.

    With zero spread (every unit's difference equal) the t statistic is ±inf: p is then 0 when
    the common difference lies strictly on the tested side, 1 otherwise.
    """
    d = as_1d(differences, "differences", min_n=2)
    if direction not in ("increase", "decrease"):
        raise EvaluationError(f"direction must be 'increase' or 'decrease', got {direction!r}")
    if not (math.isfinite(delta) and delta > 0):
        raise EvaluationError(f"delta must be a positive finite effect size, got {delta}")
    n = d.size
    est = float(d.mean())
    sd = float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    df = n - 1
    s = 1.0 if direction == "increase" else -1.0
    e = s * est  # the effect in the hypothesised direction

    def upper_tail(x: float) -> float:  # P(T >= x / se) under the null at 0
        if se == 0.0:
            return 0.0 if x > 0 else 1.0
        return float(stats.t.sf(x / se, df))

    p_conf = upper_tail(e)
    if two_sided:
        p_conf = min(1.0, 2.0 * min(p_conf, upper_tail(-e)))
    p_fals = upper_tail(delta - e)  # small when e is well below δ
    q = float(stats.t.ppf(0.5 + level / 2, df))
    ci = Interval(est - q * se, est + q * se, level, "student-t")
    return PairedTTest(est, se, df, n, sd, p_conf, p_fals, ci, direction, float(delta))
