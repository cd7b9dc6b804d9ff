"""Power of the registered test: the noncentral-t formula, and the success simulation's model."""

import math

import numpy as np
import pytest

from lensemble.study import power


def test_t_power_is_the_noncentral_t_and_mde_inverts_it():
    # Known answer: at n = 6, σ = 20, α = 0.0125, an effect of 34.1° is detected with 80 % power.
    assert power.t_power(0.0, 20.0, 6, 0.05) == pytest.approx(0.05, abs=1e-9)
    mde = power.t_mde(20.0, 6, 0.0125, 0.8)
    assert mde == pytest.approx(34.1, abs=0.1)
    assert power.t_power(mde, 20.0, 6, 0.0125) == pytest.approx(0.8, abs=1e-6)
    rng = np.random.default_rng(0)
    sim = power.t_reject(rng.normal(mde, 20.0, size=(20000, 6)), 0.0125).mean()
    assert sim == pytest.approx(0.8, abs=0.015)


def test_success_model_gives_the_planned_correlation_and_spread():
    rng = np.random.default_rng(1)
    r = power.latent_correlation(0.25, 0.56)
    z = rng.standard_normal((200000, 2))
    z[:, 1] = r * z[:, 0] + math.sqrt(1 - r * r) * z[:, 1]
    q = np.quantile(z[:, 0], 0.25)
    a, b = z[:, 0] < q, z[:, 1] < q
    assert np.corrcoef(a, b)[0, 1] == pytest.approx(0.56, abs=0.01)
    ep = power.simulate_success(rng, 4000, 6, 20, baseline=0.25, effect=0.1, sd_train=0.05, episode_correlation=0.56)
    d = ep.mean(-1)
    assert d.mean() == pytest.approx(0.1, abs=0.005)
    assert d.std() == pytest.approx(power.success_sd(0.25, 20, 0.05, 0.56), rel=0.08)


def test_simulated_power_has_the_right_ends():
    kw = dict(n_seeds=6, n_episodes=20, baseline=0.25, sd_train=0.05, episode_correlation=0.0, reps=3000)
    assert power.simulated_success_power(0.0, alpha=0.05, **kw) == pytest.approx(0.05, abs=0.015)
    assert power.simulated_success_power(0.45, alpha=0.0125, **kw) > 0.99
    mde = power.simulated_success_mde(alpha=0.0125, power=0.8, **kw)
    assert 0.1 < mde < 0.45
    assert power.simulated_success_power(mde, alpha=0.0125, **kw) >= 0.8
