"""Episode-level tools: per-seed lists of paired episode differences (two levels, seeds and the
episodes within each seed): the two-stage :func:`hierarchical_bootstrap` and the seed-stratified
sign-flip test :func:`stratified_permutation_pvalue`."""

from __future__ import annotations

import numpy as np

from lensemble.errors import EvaluationError
from lensemble.eval.stats.core import Alternative, Interval, as_1d, as_rng, check_alpha

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
