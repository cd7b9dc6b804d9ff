"""Gap recovery on synthetic per-seed scores with known answers."""

import numpy as np
import pytest
from pydantic import ValidationError

from lensemble.errors import EvaluationError
from lensemble.study.gap import GapRecovery, gap_recovery


def _arms(n=8, seed=0):
    rng = np.random.default_rng(seed)
    local = rng.uniform(0.1, 0.3, n)
    central = local + 0.4 + rng.normal(0, 0.02, n)
    return local, central


def test_fed_halfway_gives_half():
    local, central = _arms()
    fed = (local + central) / 2
    res = gap_recovery(fed, local, central, n_boot=2000, seed=1)
    assert res.defined and res.reason is None
    assert res.rho == pytest.approx(0.5)
    # Every seed sits exactly halfway, so every resample does too.
    assert res.rho_ci == pytest.approx((0.5, 0.5))
    assert res.denominator_ci[0] > 0


def test_fed_equal_to_local_and_to_central():
    local, central = _arms()
    assert gap_recovery(local, local, central, n_boot=500).rho == pytest.approx(0.0)
    assert gap_recovery(central, local, central, n_boot=500).rho == pytest.approx(1.0)


def test_noisy_fed_interval_covers_truth():
    local, central = _arms(n=10, seed=3)
    rng = np.random.default_rng(4)
    fed = local + 0.75 * (central - local) + rng.normal(0, 0.03, 10)
    res = gap_recovery(fed, local, central, n_boot=3000, seed=0)
    assert res.rho_ci[0] < 0.75 < res.rho_ci[1]
    assert res.rho_ci[0] <= res.rho <= res.rho_ci[1]
    assert res.n_seeds == 10 and res.n_indeterminate == 0


def test_no_gap_is_undefined():
    rng = np.random.default_rng(2)
    local = rng.uniform(0.2, 0.4, 8)
    central = local + rng.normal(0, 0.05, 8)  # no systematic gap
    central = central - (central - local).mean()  # make the mean gap exactly 0
    res = gap_recovery(local + 0.1, local, central, n_boot=2000)
    assert not res.defined
    assert res.rho is None and res.rho_ci is None
    assert "contains 0" in res.reason
    assert res.denominator_ci[0] <= 0 <= res.denominator_ci[1]


def test_seeded_and_frozen():
    local, central = _arms()
    fed = local + 0.3 * (central - local) + np.linspace(-0.02, 0.02, 8)
    a = gap_recovery(fed, local, central, n_boot=500, seed=9)
    assert a == gap_recovery(fed, local, central, n_boot=500, seed=9)
    assert isinstance(a, GapRecovery)
    with pytest.raises(ValidationError):
        a.rho = 2.0


def test_bad_inputs():
    with pytest.raises(EvaluationError):
        gap_recovery([0.1, 0.2], [0.1], [0.5, 0.6])
    with pytest.raises(EvaluationError):
        gap_recovery([0.1], [0.0], [0.5])
    with pytest.raises(EvaluationError):
        gap_recovery([0.1, np.nan], [0.0, 0.0], [0.5, 0.5])
