"""Planning helpers of the pooled-objective study: the pilot's seed spread and task correlation,
and the simulated outcome of claim 3's registered ρ decision."""

import math

import numpy as np
import pytest

from lensemble.study.power import episode_phi, seed_spread
from lensemble.study.rho import simulated_rho_outcomes


def test_seed_spread_removes_the_binomial_part_and_bounds_small_samples():
    s = seed_spread([0.5, 0.6, 0.7], [0.005, 0.005, 0.005])
    assert s["sd_raw"] == pytest.approx(0.1)
    assert s["sd_moments"] == pytest.approx(math.sqrt(0.01 - 0.005))
    assert s["sd_raw_upper80"] > s["sd_raw"]                 # 2 degrees of freedom: the upper end is wider
    assert seed_spread([0.5, 0.5, 0.5], [0.01] * 3)["sd_moments"] == 0.0   # never negative


def test_seed_spread_recovers_a_known_training_spread_and_sees_none_when_there_is_none():
    spread = seed_spread
    rng = np.random.default_rng(0)

    def estimate(sd_train, seeds=20, tasks=100, reps=200):
        got = []
        for _ in range(reps):
            p = np.clip(0.6 + sd_train * rng.standard_normal(seeds), 0, 1)
            y = (rng.random((seeds, tasks)) < p[:, None]).astype(float)
            got.append(spread(y.mean(1), y.var(1, ddof=1) / tasks))
        return (float(np.mean([g["sd_moments"] ** 2 for g in got])), float(np.mean([g["sd_raw"] for g in got])))

    var_moments, _ = estimate(0.10)
    assert abs(var_moments - 0.01) < 0.0015          # the method of moments is unbiased for sd_train²
    var_moments, sd_raw = estimate(0.0)
    # no training spread at all: the moments estimate stays near 0, while the raw SD is the
    # binomial noise sqrt(0.24 / 100) ≈ 0.049 (why it is only an upper estimate)
    assert var_moments < 0.0005 and 0.04 < sd_raw < 0.06


def test_episode_phi_of_identical_opposite_and_constant_outcomes():
    a = np.array([1, 0, 1, 0, 1, 1])
    assert episode_phi(a, a) == pytest.approx(1.0)
    assert episode_phi(a, 1 - a) == pytest.approx(-1.0)
    assert math.isnan(episode_phi(a, np.ones(6)))


@pytest.mark.parametrize("rho,expected", [(0.9, "confirmed"), (0.0, "falsified")])
def test_claim_3_simulation_confirms_a_large_rho_and_falsifies_none(rho, expected):
    out = simulated_rho_outcomes(local=0.4, reference=0.7, fed=0.4 + rho * 0.3, n_seeds=8, n_episodes=50,
                                 sd_seed=0.1, sd_train=0.03, threshold=0.5, reps=40, n_boot=500)
    assert out["true_rho"] == pytest.approx(rho)
    assert out[expected] >= 0.9


def test_claim_3_simulation_is_inconclusive_without_seeds_or_gap():
    # no gap to recover (reference = local): ρ undefined, never confirmed or falsified
    out = simulated_rho_outcomes(local=0.5, reference=0.5 + 1e-9, fed=0.5, n_seeds=4, n_episodes=30, sd_seed=0.05,
                                 sd_train=0.03, threshold=0.5, reps=20, n_boot=300)
    assert out["inconclusive"] >= 0.9
