"""**Power**: the minimum detectable effect (MDE) for two independent proportions and for a paired
design over seeds, plus the inverse (units needed for a target effect). Normal approximations,
meant for planning before a run, never as post-hoc "observed power".
"""

from __future__ import annotations

import math
from typing import Literal

from scipy import optimize, stats

from lensemble.errors import EvaluationError
from lensemble.eval.stats.core import Direction, check_alpha

# --------------------------------------------------------------------------------------------
# Power / minimum detectable effect


def _z_sum(alpha: float, power: float, alternative: Literal["two-sided", "one-sided"]) -> tuple:
    alpha = check_alpha(alpha)
    if not 0.0 < power < 1.0:
        raise EvaluationError(f"power must be in (0, 1), got {power}")
    if alternative not in ("two-sided", "one-sided"):
        raise EvaluationError(f"alternative must be 'two-sided' or 'one-sided', got {alternative}")
    z_a = stats.norm.ppf(1 - alpha / 2) if alternative == "two-sided" else stats.norm.ppf(1 - alpha)
    return float(z_a), float(stats.norm.ppf(power))


def mde_two_proportions(
    baseline: float,
    n_per_arm: int,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    alternative: Literal["two-sided", "one-sided"] = "two-sided",
    direction: Direction = "increase",
) -> float:
    """Smallest change of a success rate from ``baseline`` detectable with n episodes per arm.

    Normal approximation for two independent arms: the test statistic uses the pooled variance
    under the null, the power term the unpooled variance under the alternative, i.e. δ solves

        δ = z_α·sqrt(2·p̄(1-p̄)/n) + z_β·sqrt((p0(1-p0) + p1(1-p1))/n),  p1 = p0 ± δ, p̄ = (p0+p1)/2.

    Returns δ as a positive rate difference (0.24 = 24 points), or ``inf`` when no rate inside
    [0, 1] is detectable. At p0 = 0.25 and n = 50 the per-arm standard error is about 0.061
    (the "±6 points" of the design note) and δ is about 0.24.
    """
    if not 0.0 < baseline < 1.0:
        raise EvaluationError(f"baseline must be in (0, 1), got {baseline}")
    if n_per_arm < 1:
        raise EvaluationError(f"n_per_arm must be >= 1, got {n_per_arm}")
    if direction not in ("increase", "decrease"):
        raise EvaluationError(f"direction must be 'increase' or 'decrease', got {direction}")
    z_a, z_b = _z_sum(alpha, power, alternative)
    sign = 1.0 if direction == "increase" else -1.0
    room = (1.0 - baseline) if direction == "increase" else baseline

    def gap(delta: float) -> float:
        p1 = baseline + sign * delta
        pbar = (baseline + p1) / 2
        need = z_a * math.sqrt(2 * pbar * (1 - pbar) / n_per_arm) + z_b * math.sqrt(
            (baseline * (1 - baseline) + p1 * (1 - p1)) / n_per_arm
        )
        return delta - need

    if gap(room) < 0:
        return math.inf
    return float(optimize.brentq(gap, 1e-12, room, xtol=1e-10))


def mde_paired(
    sd_diff: float,
    n_units: int,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    alternative: Literal["two-sided", "one-sided"] = "two-sided",
    distribution: Literal["normal", "t"] = "normal",
) -> float:
    """Minimum detectable mean paired difference over ``n_units`` seeds.

    ``δ = (z_α + z_β)·σ_D/√n`` with σ_D the between-seed SD of the paired differences (the
    normal planning formula). ``distribution="t"`` swaps in Student-t quantiles with n-1 degrees
    of freedom, a more conservative approximation for the handful of seeds a study can afford.
    """
    if not sd_diff >= 0 or not math.isfinite(sd_diff):
        raise EvaluationError(f"sd_diff must be a finite non-negative number, got {sd_diff}")
    if n_units < 2:
        raise EvaluationError(f"n_units must be >= 2, got {n_units}")
    z_a, z_b = _z_sum(alpha, power, alternative)
    if distribution == "t":
        df = n_units - 1
        one_sided_alpha = alpha / 2 if alternative == "two-sided" else alpha
        z_a, z_b = float(stats.t.ppf(1 - one_sided_alpha, df)), float(stats.t.ppf(power, df))
    elif distribution != "normal":
        raise EvaluationError(f"distribution must be 'normal' or 't', got {distribution}")
    return (z_a + z_b) * sd_diff / math.sqrt(n_units)


def units_for_paired(
    delta: float,
    sd_diff: float,
    *,
    alpha: float = 0.05,
    power: float = 0.8,
    alternative: Literal["two-sided", "one-sided"] = "two-sided",
    distribution: Literal["normal", "t"] = "normal",
) -> int:
    """Smallest number of paired units (seeds) whose :func:`mde_paired` is at most ``delta``."""
    if not delta > 0:
        raise EvaluationError(f"delta must be positive, got {delta}")
    n = 2
    while (
        mde_paired(sd_diff, n, alpha=alpha, power=power, alternative=alternative, distribution=distribution)
        > delta
    ):
        n += 1
        if n > 10**6:
            raise EvaluationError("delta is too small to detect with any practical number of seeds")
    return n
