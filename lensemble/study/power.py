"""Power and minimum detectable effects of the study's *registered* test, before any run.

The registered test (docs/study.md, "The analysis") is a one-sided paired t test on per-seed
differences; a success difference is the mean over the seed's paired episodes. Power comes from
that test itself, not from a normal approximation of another one:

* for a metric whose per-seed difference is modelled as normal (drift, effective dimension), the
  t test's power is exact: P(T' > t_{1-α, n-1}) with T' noncentral t, ncp = δ √n / σ
  (:func:`t_power`, :func:`t_mde`);
* for success, no formula fits (binary episodes, seeds, a treatment × seed spread), so the test is
  simulated (:func:`simulate_success`, :func:`simulated_success_power`) under the registry's
  planning model: per seed a true difference δ + u_s with u_s ~ N(0, 2·σ_train²); per episode the
  two arms' outcomes are Bernoulli around the baseline rate, coupled by a Gaussian copula so that
  their correlation is ``episode_correlation`` (the same episode is easy or hard for both arms).

Every simulation is seeded; ``benchmarks/study_stats_simulation.py`` runs the long versions
(interval coverage, test level, falsification level, power) and prints them.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

from lensemble.errors import EvaluationError


def t_power(delta: float, sd: float, n: int, alpha: float) -> float:
    """Power of the one-sided one-sample t test at level ``alpha`` for a true mean ``delta`` of
    normal per-unit differences with SD ``sd`` over ``n`` units (exact, noncentral t)."""
    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if delta > 0 else 0.0
    crit = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(crit, n - 1, delta * math.sqrt(n) / sd))


def t_mde(sd: float, n: int, alpha: float, power: float) -> float | None:
    """The smallest mean difference that :func:`t_power` detects with ``power``."""
    if n < 2:
        return None
    if sd <= 0:
        return 0.0
    hi = sd
    while t_power(hi, sd, n, alpha) < power:
        hi *= 2
        if hi > 1e6 * sd:
            return None
    return float(optimize.brentq(lambda x: t_power(x, sd, n, alpha) - power, 0.0, hi, xtol=1e-9 * sd))


@lru_cache(maxsize=64)
def latent_correlation(p: float, phi: float) -> float:
    """The Gaussian-copula correlation r that gives two Bernoulli(p) outcomes the correlation
    ``phi`` (phi coefficient)."""
    if phi <= 0:
        return 0.0
    z = stats.norm.ppf(p)

    def gap(r: float) -> float:
        p11 = stats.multivariate_normal(mean=[0, 0], cov=[[1, r], [r, 1]]).cdf([z, z])
        return (p11 - p * p) / (p * (1 - p)) - phi

    if gap(0.999) < 0:
        return 0.999
    return float(optimize.brentq(gap, 0.0, 0.999, xtol=1e-6))


def simulate_success(rng: np.random.Generator, reps: int, n_seeds: int, n_episodes: int, *, baseline: float,
                     effect: float, sd_train: float, episode_correlation: float) -> np.ndarray:
    """Per-episode paired differences (reps, n_seeds, n_episodes) in {-1, 0, 1}: treatment − control.

    Seed s of replicate r has the true difference ``effect + u`` with u ~ N(0, 2·sd_train²) (the
    arms' seed effects that pairing does not cancel), centred on ``baseline``; episodes couple the
    two arms' outcomes with correlation ``episode_correlation``."""
    tau = math.sqrt(2.0) * sd_train
    u = rng.normal(0.0, tau, size=(reps, n_seeds)) if tau > 0 else np.zeros((reps, n_seeds))
    diff = effect + u
    p_t = np.clip(baseline + diff / 2, 0.005, 0.995)
    p_c = np.clip(baseline - diff / 2, 0.005, 0.995)
    r = latent_correlation(float(baseline), float(episode_correlation))
    z = rng.standard_normal(size=(reps, n_seeds, n_episodes, 2))
    z_c = r * z[..., 0] + math.sqrt(1 - r * r) * z[..., 1]
    t = z[..., 0] < stats.norm.ppf(p_t)[..., None]
    c = z_c < stats.norm.ppf(p_c)[..., None]
    return t.astype(np.float64) - c.astype(np.float64)


def simulate_success_replicated(rng: np.random.Generator, reps: int, n_seeds: int, n_episodes: int, *,
                                baseline: float, effect: float, sd_train: float, sd_replicate: float,
                                replicates: int, episode_correlation: float) -> np.ndarray:
    """Per-seed paired success differences (reps, n_seeds) with ``replicates`` training replicates
    of each arm per seed: treatment − control of the replicate means.

    Seed s has the true difference ``effect + u``, u ~ N(0, 2·sd_train²) (the seed means' spread);
    each replicate of each arm adds its own w ~ N(0, sd_replicate²) to its arm's rate (the training
    run's spread within a seed). Every replicate of both arms plays the seed's same ``n_episodes``
    tasks: any two runs' outcomes on one task are coupled by one Gaussian copula with the
    correlation ``episode_correlation`` (the same task is easy or hard for every run)."""
    tau = math.sqrt(2.0) * sd_train
    u = rng.normal(0.0, tau, size=(reps, n_seeds, 1, 1)) if tau > 0 else np.zeros((reps, n_seeds, 1, 1))
    w = (rng.normal(0.0, sd_replicate, size=(reps, n_seeds, 2, replicates)) if sd_replicate > 0
         else np.zeros((reps, n_seeds, 2, replicates)))
    sign = np.array([0.5, -0.5])[None, None, :, None]                    # treatment, control
    p = np.clip(baseline + sign * (effect + u) + w, 0.005, 0.995)        # (reps, seeds, arm, replicate)
    r = latent_correlation(float(baseline), float(episode_correlation))
    task = rng.standard_normal(size=(reps, n_seeds, 1, 1, n_episodes))
    own = rng.standard_normal(size=(reps, n_seeds, 2, replicates, n_episodes))
    z = math.sqrt(r) * task + math.sqrt(1 - r) * own
    y = (z < stats.norm.ppf(p)[..., None]).astype(np.float64).mean(-1)   # each run's success rate
    rate = y.mean(-1)                                                    # replicate means (reps, seeds, arm)
    return rate[..., 0] - rate[..., 1]


def t_reject(per_seed: np.ndarray, alpha: float) -> np.ndarray:
    """Vectorised registered test: one-sided t of (reps, n) per-seed differences at ``alpha``."""
    n = per_seed.shape[-1]
    mean = per_seed.mean(-1)
    sd = per_seed.std(-1, ddof=1)
    crit = stats.t.ppf(1 - alpha, n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(sd > 0, mean / (sd / math.sqrt(n)), np.where(mean > 0, np.inf, -np.inf))
    return t > crit


@lru_cache(maxsize=512)
def simulated_success_power(delta: float, *, n_seeds: int, n_episodes: int, baseline: float, sd_train: float,
                            episode_correlation: float, alpha: float, reps: int = 4000, seed: int = 0,
                            replicates: int = 1, sd_replicate: float | None = None) -> float:
    """Power of the registered t test for a true success difference ``delta`` (simulation).

    With ``replicates`` > 1 or a ``sd_replicate`` (the measured between-replicate spread), each
    seed's difference is that of its replicate means (:func:`simulate_success_replicated`);
    otherwise the one-run model of before (:func:`simulate_success`), number for number."""
    if n_seeds < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    if replicates == 1 and sd_replicate is None:
        d = simulate_success(rng, reps, n_seeds, n_episodes, baseline=baseline, effect=delta, sd_train=sd_train,
                             episode_correlation=episode_correlation).mean(-1)
    else:
        d = simulate_success_replicated(rng, reps, n_seeds, n_episodes, baseline=baseline, effect=delta,
                                        sd_train=sd_train, sd_replicate=float(sd_replicate or 0.0),
                                        replicates=int(replicates), episode_correlation=episode_correlation)
    return float(t_reject(d, alpha).mean())


def simulated_success_mde(*, n_seeds: int, n_episodes: int, baseline: float, sd_train: float,
                          episode_correlation: float, alpha: float, power: float, reps: int = 4000,
                          seed: int = 0, replicates: int = 1, sd_replicate: float | None = None) -> float | None:
    """The smallest success difference the registered test detects with ``power`` (bisection over
    the simulated power, common random numbers); None when even 1 − baseline is not enough."""
    if n_seeds < 2:
        return None
    kw = dict(n_seeds=n_seeds, n_episodes=n_episodes, baseline=baseline, sd_train=sd_train,
              episode_correlation=episode_correlation, alpha=alpha, reps=reps, seed=seed)
    if replicates != 1 or sd_replicate is not None:  # (kept out of kw otherwise: the cache keys of before)
        kw.update(replicates=int(replicates), sd_replicate=sd_replicate)
    hi = min(2 * (1 - baseline), 2 * baseline)
    if simulated_success_power(hi, **kw) < power:
        return None
    lo = 0.0
    for _ in range(14):
        mid = (lo + hi) / 2
        if simulated_success_power(mid, **kw) >= power:
            hi = mid
        else:
            lo = mid
    return float(hi)


def success_sd(baseline: float, n_episodes: int, sd_train: float, episode_correlation: float, *,
               replicates: int = 1, sd_replicate: float | None = None) -> float:
    """SD of one seed's paired success difference under the planning model (normal approx.):
    sqrt(2·p0(1 − p0)(1 − ρ)/(E·R) + 2·σ_train² + 2·σ_rep²/R) with R replicates per arm playing the
    same E tasks (R = 1, no σ_rep: sqrt(2·p0(1 − p0)(1 − ρ)/E + 2·σ_train²))."""
    if n_episodes < 1:
        raise EvaluationError("n_episodes must be >= 1")
    if replicates < 1:
        raise EvaluationError(f"replicates must be >= 1, got {replicates}")
    rep = 0.0 if sd_replicate is None else 2 * sd_replicate**2 / replicates
    return math.sqrt(2 * baseline * (1 - baseline) * (1 - episode_correlation) / (n_episodes * replicates)
                     + 2 * sd_train**2 + rep)


def seed_spread(rates, within_var) -> dict:
    """Seed spread of one arm's success from a pilot: ``rates`` (k,) per seed, ``within_var`` (k,)
    each rate's binomial variance over its tasks. ``sd_raw`` is the SD of the rates (holds the task
    noise too: conservative), ``sd_moments`` the same with the binomial part removed (method of
    moments; can be 0 with few seeds), ``sd_raw_upper80`` the raw SD's 80 % chi-square upper end
    (k − 1 degrees of freedom): the spread to size a study for when k is small."""
    rates = np.asarray(rates, float)
    k = len(rates)
    if k < 2:
        nan = float("nan")
        return {"rates": [round(float(r), 4) for r in rates], "sd_raw": nan, "sd_moments": nan, "sd_raw_upper80": nan}
    var = float(np.var(rates, ddof=1))
    return {"rates": [round(float(r), 4) for r in rates], "sd_raw": math.sqrt(var),
            "sd_moments": math.sqrt(max(0.0, var - float(np.mean(within_var)))),
            "sd_raw_upper80": math.sqrt(var * (k - 1) / stats.chi2.ppf(0.2, k - 1))}


def replicate_spread(rates_by_seed, within_var_by_seed) -> dict:
    """Between-replicate spread of one arm's success within a seed, from runs with replicates:
    ``rates_by_seed`` a list (one per seed) of its replicates' success rates, ``within_var_by_seed``
    the same shape, each rate's binomial variance over its tasks. Seeds with one replicate are
    skipped. ``sd_raw`` pools the within-seed variance of the rates (k_s − 1 degrees of freedom each;
    it holds the task noise too: conservative), ``sd_moments`` removes the mean binomial part
    (method of moments, never below 0), ``sd_raw_upper80`` is the pooled SD's 80 % chi-square
    upper end: the spread to plan with (``registry.planning.sd_replicate_success``)."""
    ss, df, within, n = 0.0, 0, [], 0
    for rates, var in zip(rates_by_seed, within_var_by_seed, strict=True):
        x = np.asarray(rates, float)
        if x.size < 2:
            continue
        ss += float(((x - x.mean()) ** 2).sum())
        df += x.size - 1
        within.extend(float(v) for v in var)
        n += 1
    if df == 0:
        nan = float("nan")
        return {"seeds": 0, "df": 0, "sd_raw": nan, "sd_moments": nan, "sd_raw_upper80": nan}
    var = ss / df
    return {"seeds": n, "df": df, "sd_raw": math.sqrt(var),
            "sd_moments": math.sqrt(max(0.0, var - float(np.mean(within)))),
            "sd_raw_upper80": math.sqrt(var * df / stats.chi2.ppf(0.2, df))}


def episode_phi(a, b) -> float:
    """Correlation (phi) of two arms' 0/1 outcomes on the same tasks; nan when one is constant."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


__all__ = ["episode_phi", "seed_spread", "latent_correlation", "replicate_spread", "simulate_success",
           "simulate_success_replicated", "simulated_success_mde", "simulated_success_power", "success_sd", "t_mde",
           "t_power", "t_reject"]
