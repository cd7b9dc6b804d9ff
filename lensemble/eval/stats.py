"""Statistics for honest comparisons (DESIGN.md §7, "study discipline").

Everything here works on small arrays of scalars (per-seed or per-episode numbers), never on
tensors, and every random draw comes from a seeded ``numpy.random.Generator`` so an analysis is
reproducible from its inputs and its seed.

What is here, and why these choices:

* **Bootstrap intervals** (:func:`bootstrap_ci`, :func:`paired_difference`). The experimental unit
  is the seed (or the episode), so resampling draws whole units with replacement; several arrays
  passed together are resampled with *one* set of indices, which keeps pairs paired. The default is
  **BCa** (bias-corrected and accelerated): it adjusts the percentile points for median bias and for
  skew (acceleration estimated by the jackknife), which matters for bounded or skewed statistics
  such as success rates near 0 or 1 and ratios. When BCa is undefined (every replicate on one side
  of the estimate, or a constant jackknife) we fall back to the plain percentile interval and say
  so in ``method``. With very few units (say 3–5 seeds) no bootstrap can see the tails it has not
  sampled: intervals are then too narrow, and a verdict should lean to "inconclusive".
* **Rates**: Wilson score interval (good coverage, never leaves [0, 1], sensible at 0/n).
* **Two proportions**: the difference with Newcombe's hybrid score interval (built from the two
  Wilson intervals) and a pooled z-test or Fisher's exact test p-value; for paired outcomes (two
  arms on the same tasks) Newcombe's paired interval, corrected for the arms' correlation, with
  the exact McNemar p-value.
* **Paired tests**: an exact (or Monte-Carlo) sign-flip permutation test of the mean paired
  difference.
* **Multiplicity**: Holm (step-down), returning reject flags and adjusted p-values.
* **Power**: the minimum detectable effect (MDE) for two independent proportions and for a paired
  design over seeds, plus the inverse (units needed for a target effect). Normal approximations,
  meant for planning before a run, never as post-hoc "observed power".
* **Verdicts**: :func:`verdict` turns an estimate, its interval and the registered effect size δ
  into "confirmed", "falsified" or "inconclusive" by a fixed rule (see its docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product
from typing import Callable, Literal, Sequence

import numpy as np
from scipy import optimize, stats

from lensemble.errors import EvaluationError

Direction = Literal["increase", "decrease"]
Alternative = Literal["two-sided", "greater", "less"]

# Above this many pairs the sign-flip test is Monte-Carlo; 2**16 exact flips is still cheap.
_EXACT_PERMUTATION_MAX_N = 16


# --------------------------------------------------------------------------------------------
# Result types


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval ``[low, high]`` at ``level`` (e.g. 0.95)."""

    low: float
    high: float
    level: float
    method: str

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def as_tuple(self) -> tuple[float, float]:
        return (self.low, self.high)


@dataclass(frozen=True)
class PairedDifference:
    """Mean of ``treatment - control`` over paired units, with a bootstrap CI and a p-value.

    ``p_value`` is the two-sided sign-flip permutation p-value of the mean difference;
    ``sd`` is the sample SD (ddof=1) of the per-unit differences (feeds :func:`mde_paired`).
    """

    estimate: float
    ci: Interval
    p_value: float
    sd: float
    n: int


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


@dataclass(frozen=True)
class MultipleTestResult:
    """Reject flags and adjusted p-values, in the order the p-values were given."""

    reject: tuple[bool, ...]
    adjusted: tuple[float, ...]
    alpha: float
    method: str


@dataclass(frozen=True)
class Verdict:
    """Outcome of one registered claim: ``label`` is confirmed / falsified / inconclusive."""

    label: Literal["confirmed", "falsified", "inconclusive"]
    reason: str
    estimate: float
    ci: tuple[float, float]
    delta: float
    direction: Direction


# --------------------------------------------------------------------------------------------
# Input checks (shared with the study's gap recovery, lensemble.study.gap)


def as_rng(seed: int | np.random.Generator) -> np.random.Generator:
    """``seed`` itself when it is a Generator, else a fresh ``default_rng(seed)``."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise EvaluationError(f"seed must be an int or numpy Generator, got {type(seed).__name__}")
    return np.random.default_rng(int(seed))


def check_alpha(alpha: float) -> float:
    """``alpha`` as a float in (0, 1), else EvaluationError."""
    if not (0.0 < float(alpha) < 1.0):
        raise EvaluationError(f"alpha must be in (0, 1), got {alpha}")
    return float(alpha)


def as_1d(x, name: str, *, min_n: int = 1) -> np.ndarray:
    """``x`` as a finite float64 array (n,), one value per unit, n >= ``min_n``."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise EvaluationError(f"{name} must be 1-D (one value per unit), got shape {arr.shape}")
    if arr.size < min_n:
        raise EvaluationError(f"{name} needs at least {min_n} values, got {arr.size}")
    if not np.all(np.isfinite(arr)):
        raise EvaluationError(f"{name} contains non-finite values")
    return arr


def _check_counts(successes: int, n: int) -> tuple[int, int]:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise EvaluationError(f"n must be a positive integer, got {n}")
    if isinstance(successes, bool) or int(successes) != successes or not 0 <= successes <= n:
        raise EvaluationError(f"successes must be an integer in [0, n={n}], got {successes}")
    return int(successes), int(n)


# --------------------------------------------------------------------------------------------
# Bootstrap


def bootstrap_ci(
    data: np.ndarray | Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray] | None = None,
    *,
    n_boot: int = 10_000,
    seed: int | np.random.Generator = 0,
    alpha: float = 0.05,
    method: Literal["bca", "percentile"] = "bca",
) -> tuple[float, Interval]:
    """Point estimate and bootstrap CI of ``statistic`` over units (rows).

    Args:
        data: one 1-D array of length n, or a sequence of 1-D arrays of equal length n that are
            resampled *jointly* (same indices), e.g. per-seed scores of paired arms.
        statistic: a function of the arrays that reduces the **last** axis and broadcasts over
            leading axes, e.g. ``lambda x: x.mean(-1)`` or ``lambda a, b: a.mean(-1) / b.mean(-1)``.
            It is called once on shape (n_boot, n) resamples and once on (n, n-1) jackknife
            samples, which keeps the bootstrap vectorised. Default: the mean of the single array.
        n_boot: bootstrap replicates.
        seed: int seed or a ``numpy.random.Generator``.
        alpha: 1 - confidence level (two-sided).
        method: "bca" (default; falls back to percentile when BCa is undefined) or "percentile".

    Returns:
        ``(estimate, Interval)``.
    """
    alpha = check_alpha(alpha)
    arrays = [data] if isinstance(data, np.ndarray) or np.ndim(data) == 1 else list(data)
    arrays = [as_1d(a, "data", min_n=2) for a in arrays]
    n = arrays[0].size
    if any(a.size != n for a in arrays):
        raise EvaluationError("all arrays passed to bootstrap_ci must have the same length")
    if n_boot < 100:
        raise EvaluationError(f"n_boot must be at least 100, got {n_boot}")
    if statistic is None:
        if len(arrays) != 1:
            raise EvaluationError("pass a statistic when bootstrapping several arrays")

        def statistic(x):
            return x.mean(-1)

    if method not in ("bca", "percentile"):
        raise EvaluationError(f"unknown bootstrap method {method!r} (use 'bca' or 'percentile')")

    estimate = float(statistic(*arrays))
    rng = as_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    reps = np.asarray(statistic(*[a[idx] for a in arrays]), dtype=np.float64)
    if reps.shape != (n_boot,):
        raise EvaluationError("statistic must reduce the last axis to one value per resample")
    if not np.all(np.isfinite(reps)):
        raise EvaluationError("the statistic is non-finite on some bootstrap resamples")

    lo_q, hi_q = alpha / 2, 1 - alpha / 2
    used = "percentile"
    if method == "bca":
        adjusted = _bca_quantiles(arrays, statistic, estimate, reps, alpha)
        if adjusted is not None:
            lo_q, hi_q = adjusted
            used = "bca"
    low, high = np.quantile(reps, [lo_q, hi_q])
    level = 1 - alpha
    return estimate, Interval(float(low), float(high), level, f"bootstrap-{used}")


def _bca_quantiles(arrays, statistic, estimate, reps, alpha) -> tuple[float, float] | None:
    """BCa-adjusted quantile levels, or None when BCa is undefined (then use percentile)."""
    # Bias correction: how far the replicate distribution's median sits from the estimate.
    # Ties count half, which keeps discrete statistics (rates) from getting a spurious bias.
    below = np.mean(reps < estimate) + 0.5 * np.mean(reps == estimate)
    if below <= 0.0 or below >= 1.0:
        return None
    z0 = stats.norm.ppf(below)

    # Acceleration from the jackknife: row i of the (n, n-1) matrix leaves unit i out.
    n = arrays[0].size
    keep = ~np.eye(n, dtype=bool)
    jack = np.asarray(statistic(*[a[None, :].repeat(n, 0)[keep].reshape(n, n - 1) for a in arrays]))
    dev = jack.mean() - jack
    denom = 6.0 * np.sum(dev**2) ** 1.5
    accel = float(np.sum(dev**3) / denom) if denom > 0 else 0.0

    out = []
    for z_a in (stats.norm.ppf(alpha / 2), stats.norm.ppf(1 - alpha / 2)):
        shifted = z0 + z_a
        corr = 1.0 - accel * shifted
        if corr <= 0:
            return None
        out.append(float(stats.norm.cdf(z0 + shifted / corr)))
    return out[0], out[1]


def paired_difference(
    treatment,
    control,
    *,
    n_boot: int = 10_000,
    seed: int | np.random.Generator = 0,
    alpha: float = 0.05,
    method: Literal["bca", "percentile"] = "bca",
) -> PairedDifference:
    """Mean paired difference ``treatment - control`` over units (seeds), with a bootstrap CI.

    Args:
        treatment, control: 1-D arrays of length n (n >= 2); entry i of both comes from the same
            unit (same seed / same episode), which is what makes the comparison paired.

    The CI resamples whole pairs (the per-unit differences); the p-value is the two-sided
    sign-flip permutation test (:func:`paired_permutation_pvalue`).
    """
    t = as_1d(treatment, "treatment", min_n=2)
    c = as_1d(control, "control", min_n=2)
    if t.size != c.size:
        raise EvaluationError(f"paired arrays differ in length: {t.size} vs {c.size}")
    diff = t - c
    rng = as_rng(seed)
    est, ci = bootstrap_ci(diff, n_boot=n_boot, seed=rng, alpha=alpha, method=method)
    p = paired_permutation_pvalue(diff, seed=rng)
    return PairedDifference(est, ci, p, float(diff.std(ddof=1)), int(diff.size))


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


# --------------------------------------------------------------------------------------------
# Episode-level tools (per-seed lists of paired episode differences)


def _episode_arrays(per_seed) -> list[np.ndarray]:
    arrays = [as_1d(a, "episode differences", min_n=1) for a in per_seed]
    if len(arrays) < 2:
        raise EvaluationError(f"need at least 2 seeds, got {len(arrays)}")
    return arrays


def hierarchical_bootstrap(
    per_seed,
    *,
    n_boot: int = 10_000,
    seed: int | np.random.Generator = 0,
    alpha: float = 0.05,
) -> tuple[float, Interval, float]:
    """Two-stage bootstrap of the mean paired difference: seeds with replacement, then the
    paired episodes of each drawn seed with replacement (the pairing kept: an episode's two
    outcomes move together).

    Args:
        per_seed: one 1-D array per seed of paired episode differences (treatment − control).

    Returns:
        (estimate = mean over seeds of the per-seed mean, percentile Interval, bootstrap SE).

    Its variance counts the within-seed spread twice (once in the seed means, once in the
    resampled episodes), so it is conservative when episode noise dominates and, at a handful
    of seeds, too narrow when the seed-to-seed (treatment × seed) spread dominates
    (benchmarks/study_stats_simulation.py): the study reports it beside the registered t test.
    """
    alpha = check_alpha(alpha)
    arrays = _episode_arrays(per_seed)
    if n_boot < 100:
        raise EvaluationError(f"n_boot must be at least 100, got {n_boot}")
    rng = as_rng(seed)
    means = np.array([a.mean() for a in arrays])
    est = float(means.mean())
    n = len(arrays)
    picks = rng.integers(0, n, size=(n_boot, n))
    # Every seed's episode resample for every (replicate, slot); slot j of replicate b uses the
    # resample of the seed drawn there.
    stacked = np.stack([a[rng.integers(0, a.size, size=(n_boot, n, a.size))].mean(-1) for a in arrays])
    reps = stacked[picks, np.arange(n_boot)[:, None], np.arange(n)[None, :]].mean(-1)
    low, high = np.quantile(reps, [alpha / 2, 1 - alpha / 2])
    return est, Interval(float(low), float(high), 1 - alpha, "hierarchical-bootstrap-percentile"), float(reps.std(ddof=1))


def stratified_permutation_pvalue(
    per_seed,
    *,
    alternative: Alternative = "greater",
    n_perm: int = 20_000,
    seed: int | np.random.Generator = 0,
) -> float:
    """Episode-level sign-flip test stratified by seed: each paired episode's difference flips
    sign independently (the two arms' outcomes of one episode are exchangeable), the statistic is
    the mean over seeds of the per-seed mean.

    Exact for the *fixed models* null ("these two trained models do equally well on these
    episodes"). It is not a test of the training procedures: with a treatment × seed spread it
    rejects far too often (benchmarks/study_stats_simulation.py), so it never decides a claim.
    Monte-Carlo, (hits + 1) / (n_perm + 1).
    """
    arrays = _episode_arrays(per_seed)
    if alternative not in ("two-sided", "greater", "less"):
        raise EvaluationError(f"unknown alternative {alternative!r}")
    rng = as_rng(seed)
    observed = float(np.mean([a.mean() for a in arrays]))
    null = np.zeros(n_perm)
    for a in arrays:
        flips = rng.choice(np.array([1.0, -1.0]), size=(n_perm, a.size))
        null += (flips * a).mean(-1)
    null /= len(arrays)
    tol = 1e-12 * max(1.0, max(float(np.abs(a).max()) for a in arrays))
    if alternative == "greater":
        hits = np.sum(null >= observed - tol)
    elif alternative == "less":
        hits = np.sum(null <= observed + tol)
    else:
        hits = np.sum(np.abs(null) >= abs(observed) - tol)
    return float((hits + 1) / (n_perm + 1))


# --------------------------------------------------------------------------------------------
# Rates


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


# --------------------------------------------------------------------------------------------
# Multiplicity


def _check_pvalues(p_values) -> np.ndarray:
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise EvaluationError("p_values must be a non-empty 1-D sequence")
    if not np.all((p >= 0) & (p <= 1)):
        raise EvaluationError("p-values must lie in [0, 1]")
    return p


def holm(p_values, *, alpha: float = 0.05) -> MultipleTestResult:
    """Holm's step-down procedure (controls the familywise error rate, uniformly beats Bonferroni).

    Sort p ascending; the i-th smallest (1-based) is compared with alpha / (m - i + 1) and the
    procedure stops at the first non-rejection. Adjusted p-values are the running maximum of
    (m - i + 1)·p_(i), capped at 1, so ``reject == adjusted <= alpha``.
    """
    alpha = check_alpha(alpha)
    p = _check_pvalues(p_values)
    m = p.size
    order = np.argsort(p, kind="stable")
    scaled = p[order] * (m - np.arange(m))
    # The running max enforces the step-down stop: once one hypothesis survives, later ones do too.
    adj_sorted = np.minimum(1.0, np.maximum.accumulate(scaled))
    adj = np.empty(m)
    adj[order] = adj_sorted
    return MultipleTestResult(
        tuple(bool(x) for x in adj <= alpha), tuple(float(x) for x in adj), alpha, "holm"
    )


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


# --------------------------------------------------------------------------------------------
# Verdicts


def verdict(
    estimate: float,
    ci: Interval | tuple[float, float],
    *,
    delta: float,
    direction: Direction = "increase",
    p_value: float | None = None,
    alpha: float = 0.05,
) -> Verdict:
    """Decide a registered claim "the effect is at least ``delta`` in ``direction``".

    Work in the hypothesised direction: for "decrease" every number is negated first, so the
    claim always reads "effect >= δ > 0". With interval [L, U] and point estimate e:

    1. **falsified** if U < δ: the interval excludes every effect as large as the registered one
       (this includes a significant effect in the wrong direction, and a real but too-small one).
    2. **confirmed** if L > 0 *and* e >= δ (*and*, when ``p_value`` is given, e.g. a
       Holm-adjusted one, ``p_value <= alpha``): the effect is distinguishable from zero in the
       hypothesised direction and its best estimate reaches the registered size. Since e <= U,
       a confirmed claim is never also falsified.
    3. **inconclusive** otherwise: the interval still contains 0, or it excludes 0 but the
       estimate falls short of δ while δ remains compatible with the data.

    The interval should be at the level the study registered (and match any multiplicity
    correction). No verdict is ever read off a point estimate alone.
    """
    if direction not in ("increase", "decrease"):
        raise EvaluationError(f"direction must be 'increase' or 'decrease', got {direction!r}")
    if not (math.isfinite(delta) and delta > 0):
        raise EvaluationError(
            f"delta must be a positive finite effect size (its sign is given by direction), got {delta}"
        )
    low, high = ci.as_tuple() if isinstance(ci, Interval) else (float(ci[0]), float(ci[1]))
    values = (estimate, low, high)
    if not all(math.isfinite(v) for v in values):
        raise EvaluationError(f"estimate and interval must be finite, got {values}")
    if low > high:
        raise EvaluationError(f"interval is inverted: [{low}, {high}]")
    if p_value is not None and not 0.0 <= p_value <= 1.0:
        raise EvaluationError(f"p_value must be in [0, 1], got {p_value}")

    s = 1.0 if direction == "increase" else -1.0
    e, lo, hi = s * estimate, min(s * low, s * high), max(s * low, s * high)
    word = "above" if direction == "increase" else "below"
    span = f"[{low:.4g}, {high:.4g}]"
    if hi < delta:
        label = "falsified"
        reason = f"the interval {span} excludes every {direction} of {delta:.4g} or more (registered)"
    elif lo > 0 and e >= delta and (p_value is None or p_value <= alpha):
        label = "confirmed"
        reason = f"the interval {span} excludes 0 and the estimate {estimate:.4g} reaches {delta:.4g}"
    elif lo > 0 and e >= delta:
        label = "inconclusive"
        reason = f"the interval {span} excludes 0 but the p-value {p_value:.4g} exceeds {alpha:.4g}"
    elif lo > 0:
        label = "inconclusive"
        reason = (
            f"the effect is {word} 0 but the estimate {estimate:.4g} falls short of the registered "
            f"{delta:.4g}, which the interval {span} still allows"
        )
    else:
        label = "inconclusive"
        reason = f"the interval {span} contains 0 and still allows the registered effect {delta:.4g}"
    return Verdict(label, reason, float(estimate), (float(low), float(high)), float(delta), direction)


def test_verdict(
    estimate: float,
    ci: Interval | tuple[float, float],
    *,
    delta: float,
    direction: Direction,
    p_confirm: float,
    p_falsify: float,
    alpha: float = 0.05,
) -> Verdict:
    """The registered verdict from two error-controlled tests (both p-values already adjusted for
    multiplicity, the same way):

    1. **confirmed** if ``p_confirm`` (H0: no effect in the registered direction) is at most α and
       the estimate reaches δ;
    2. **falsified** if ``p_falsify`` (H0: the effect is at least δ) is at most α: the data rule out
       an effect as large as registered, with the error rate of a test;
    3. **inconclusive** otherwise.

    The two cannot both hold (a falsifying test needs the estimate below δ). The interval is
    reported, and must agree: a confirmation whose interval does not exclude 0 on the registered
    side is refused as an internal error by the caller's guard.
    """
    if direction not in ("increase", "decrease"):
        raise EvaluationError(f"direction must be 'increase' or 'decrease', got {direction!r}")
    if not (math.isfinite(delta) and delta > 0):
        raise EvaluationError(f"delta must be a positive finite effect size, got {delta}")
    for name, p in (("p_confirm", p_confirm), ("p_falsify", p_falsify)):
        if not 0.0 <= p <= 1.0:
            raise EvaluationError(f"{name} must be in [0, 1], got {p}")
    low, high = ci.as_tuple() if isinstance(ci, Interval) else (float(ci[0]), float(ci[1]))
    e = estimate if direction == "increase" else -estimate
    span = f"[{low:.4g}, {high:.4g}]"
    if p_confirm <= alpha and e >= delta:
        label, reason = "confirmed", (f"H0 'no {direction}' rejected (adjusted p {p_confirm:.3g} <= {alpha:g}) and the "
                                      f"estimate {estimate:.4g} reaches {delta:.4g}; 95% interval {span}")
    elif p_falsify <= alpha:
        label, reason = "falsified", (f"H0 'a {direction} of {delta:.4g} or more' rejected (adjusted p "
                                      f"{p_falsify:.3g} <= {alpha:g}); estimate {estimate:.4g}, 95% interval {span}")
    elif p_confirm <= alpha:
        label, reason = "inconclusive", (f"an effect in the registered direction (adjusted p {p_confirm:.3g}) but the "
                                         f"estimate {estimate:.4g} falls short of {delta:.4g}, which is not ruled out "
                                         f"(adjusted p {p_falsify:.3g})")
    else:
        label, reason = "inconclusive", (f"neither 'no effect' (adjusted p {p_confirm:.3g}) nor 'an effect of "
                                         f"{delta:.4g} or more' (adjusted p {p_falsify:.3g}) is rejected at {alpha:g}; "
                                         f"95% interval {span}")
    return Verdict(label, reason, float(estimate), (float(low), float(high)), float(delta), direction)


__all__ = [
    "PairedTTest",
    "bootstrap_ci",
    "compare_paired_proportions",
    "compare_proportions",
    "hierarchical_bootstrap",
    "holm",
    "McNemarResult",
    "mcnemar_exact",
    "mde_paired",
    "mde_two_proportions",
    "paired_table",
    "paired_difference",
    "paired_permutation_pvalue",
    "paired_t_test",
    "stratified_permutation_pvalue",
    "test_verdict",
    "units_for_paired",
    "verdict",
    "wilson_interval",
]
