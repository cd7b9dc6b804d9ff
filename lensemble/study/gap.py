"""Gap recovery ρ = (S_fed − S_local) / (S_central − S_local) with a paired bootstrap over seeds.

ρ is the fraction of the centralized-minus-local gap that federation recovers (DESIGN.md §7):
0 means federation is no better than training alone, 1 means it matches pooling all data.

Three choices, and why:

* **Ratio of means, not mean of ratios.** The point estimate divides the mean numerator by the
  mean denominator over seeds. Per-seed ratios explode whenever one seed's gap is near zero.
* **Seeds are the unit and stay paired.** Seed i of all three arms shares its warm start, data
  split and evaluation episodes, so a bootstrap replicate draws seed indices once and uses them for
  all three arrays; the numerator and denominator replicates are therefore correlated, as they are
  in the data.
* **Undefined, not huge.** When the denominator's interval contains zero the study cannot tell
  whether there is a gap to recover, and any ratio would be noise; we then return ``defined=False``
  with a reason and no ρ. The ρ interval is a percentile interval: BCa's jackknife on a ratio with
  a handful of seeds can itself divide by ~0, and a percentile interval of order statistics stays
  well-behaved even when a few replicate denominators do.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

from lensemble.errors import EvaluationError
from lensemble.eval.stats import as_1d, as_rng, check_alpha


class GapRecovery(BaseModel):
    """Result of :func:`gap_recovery`. Scores are in the units of S (e.g. success rate in [0, 1]).

    ``rho``/``rho_ci`` are None exactly when ``defined`` is False, and ``reason`` then says why.
    ``n_indeterminate`` counts bootstrap replicates whose numerator and denominator were both 0
    (0/0, left out of the ρ interval); replicates with a zero denominator and non-zero numerator
    count as ±inf and stay in.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    defined: bool
    reason: str | None
    rho: float | None
    rho_ci: tuple[float, float] | None
    numerator: float
    numerator_ci: tuple[float, float]
    denominator: float
    denominator_ci: tuple[float, float]
    n_seeds: int
    n_boot: int
    alpha: float
    seed: int
    n_indeterminate: int = 0
    method: str = "paired-seed bootstrap, percentile"


def gap_recovery(
    s_fed,
    s_local,
    s_central,
    *,
    n_boot: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
) -> GapRecovery:
    """Fraction of the centralized−local gap recovered by federation, with paired bootstrap CIs.

    Args:
        s_fed, s_local, s_central: 1-D arrays of length n >= 2; entry i of each is the score of
            that arm trained and evaluated with seed i (success rate, or any higher-is-better score).
        n_boot: bootstrap replicates (resamples of seeds, shared by all three arms).
        seed: seed of the numpy Generator that draws the resamples.
        alpha: 1 − confidence level of all intervals (two-sided).

    Returns:
        :class:`GapRecovery`. The denominator interval is always reported; ρ and its interval only
        when that interval excludes zero.
    """
    alpha = check_alpha(alpha)
    fed = as_1d(s_fed, "s_fed", min_n=2)
    local = as_1d(s_local, "s_local", min_n=2)
    central = as_1d(s_central, "s_central", min_n=2)
    if not fed.size == local.size == central.size:
        raise EvaluationError(
            f"gap_recovery needs one score per seed for every arm; got lengths "
            f"{fed.size}, {local.size}, {central.size}",
            remediation="Evaluate every arm on the same seeds and pass them in the same order.",
        )
    if n_boot < 100:
        raise EvaluationError(f"n_boot must be at least 100, got {n_boot}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise EvaluationError(f"seed must be an int (it is recorded in the result), got {seed!r}")

    num_units = fed - local
    den_units = central - local
    num, den = float(num_units.mean()), float(den_units.mean())

    rng = as_rng(seed)
    n = fed.size
    idx = rng.integers(0, n, size=(n_boot, n))
    num_reps = num_units[idx].mean(-1)
    den_reps = den_units[idx].mean(-1)
    q = [alpha / 2, 1 - alpha / 2]
    num_ci = tuple(float(x) for x in np.quantile(num_reps, q))
    den_ci = tuple(float(x) for x in np.quantile(den_reps, q))

    common = dict(
        numerator=num,
        numerator_ci=num_ci,
        denominator=den,
        denominator_ci=den_ci,
        n_seeds=n,
        n_boot=n_boot,
        alpha=alpha,
        seed=int(seed),
    )
    if den_ci[0] <= 0.0 <= den_ci[1]:
        return GapRecovery(
            defined=False,
            reason=(
                f"the {100 * (1 - alpha):.0f}% interval of S_central - S_local "
                f"[{den_ci[0]:.4g}, {den_ci[1]:.4g}] contains 0: no measurable gap to recover"
            ),
            rho=None,
            rho_ci=None,
            **common,
        )

    with np.errstate(divide="ignore", invalid="ignore"):
        rho_reps = num_reps / den_reps
    indeterminate = np.isnan(rho_reps)  # 0/0 only; x/0 with x != 0 is ±inf and sorts to an end
    kept = rho_reps[~indeterminate]
    # Order statistics (no interpolation) so an infinite replicate never turns a bound into nan.
    rho_ci = tuple(float(x) for x in np.quantile(kept, q, method="inverted_cdf"))
    return GapRecovery(
        defined=True,
        reason=None,
        rho=num / den,
        rho_ci=rho_ci,
        n_indeterminate=int(indeterminate.sum()),
        **common,
    )


def gap_recovery_replicated(units, *, n_boot: int = 10_000, seed: int = 0, alpha: float = 0.05,
                            levels: str = "seeds, replicates, paired episodes") -> GapRecovery:
    """:func:`gap_recovery` for a study with training replicates: ρ of the replicate-mean success
    rates (the ratio of means over seeds, as without replicates), its intervals from the
    three-level bootstrap :func:`lensemble.study.replicates.nested_bootstrap` (seeds, then each
    arm's replicates, then the seed's tasks).

    Args:
        units: per seed, ``[fed, local, central]`` arrays (replicates, tasks) of outcomes
            (:func:`lensemble.study.replicates.seed_units`).
        levels: what was resampled (recorded in ``method``).
    """
    from lensemble.study.replicates import nested_bootstrap, point_estimate

    alpha = check_alpha(alpha)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise EvaluationError(f"seed must be an int (it is recorded in the result), got {seed!r}")
    if any(len(arms) != 3 for arms in units):
        raise EvaluationError("gap_recovery_replicated needs [fed, local, central] per seed",
                              remediation="pass lensemble.study.replicates.seed_units([fed, local, central], seeds)")
    boot = nested_bootstrap(units, n_boot=n_boot, seed=seed)
    fed, local, central = point_estimate(units)
    num, den = float(fed - local), float(central - local)
    num_reps, den_reps = boot[:, 0] - boot[:, 1], boot[:, 2] - boot[:, 1]
    q = [alpha / 2, 1 - alpha / 2]
    num_ci = tuple(float(x) for x in np.quantile(num_reps, q))
    den_ci = tuple(float(x) for x in np.quantile(den_reps, q))
    common = dict(numerator=num, numerator_ci=num_ci, denominator=den, denominator_ci=den_ci, n_seeds=len(units),
                  n_boot=n_boot, alpha=alpha, seed=int(seed), method=f"hierarchical bootstrap ({levels}), percentile")
    if den_ci[0] <= 0.0 <= den_ci[1]:
        return GapRecovery(defined=False, rho=None, rho_ci=None, reason=(
            f"the {100 * (1 - alpha):.0f}% interval of S_central - S_local [{den_ci[0]:.4g}, {den_ci[1]:.4g}] "
            "contains 0: no measurable gap to recover"), **common)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho_reps = num_reps / den_reps
    indeterminate = np.isnan(rho_reps)
    rho_ci = tuple(float(x) for x in np.quantile(rho_reps[~indeterminate], q, method="inverted_cdf"))
    return GapRecovery(defined=True, reason=None, rho=num / den, rho_ci=rho_ci,
                       n_indeterminate=int(indeterminate.sum()), **common)


__all__ = ["GapRecovery", "gap_recovery", "gap_recovery_replicated"]
