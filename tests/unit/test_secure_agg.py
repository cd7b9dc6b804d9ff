"""Secure aggregation without Flower: settings, bounds, the participant's and the coordinator's checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lensemble.config import load_config
from lensemble.errors import ConfigError, RoundError, SecureSumRejected
from lensemble.federation.checks import check_federation_config
from lensemble.federation.outer import OuterOptimizer
from lensemble.federation.pseudograd import Layout
from lensemble.federation.secure_agg import (
    SecAggSettings,
    check_before_masking,
    check_secure_sum,
    mean_from_sum,
    outer_error_bound,
)

S = SecAggSettings(clip_range=1.0, bits=16, threshold=2)


def test_defaults_leave_the_dump_and_every_hash_unchanged():
    plain = load_config(["experiment=micro"])
    assert not {"secure_aggregation", "secagg_bits"} & set(plain.model_dump()["federation"])
    explicit = load_config(["experiment=micro", "federation.secure_aggregation=false",
                            "federation.secagg_clip_range=8", "federation.secagg_bits=24"])
    assert explicit.config_hash() == plain.config_hash()
    secure = load_config(["experiment=micro", "federation.secure_aggregation=true"])
    assert secure.config_hash() != plain.config_hash()
    assert secure.model_dump()["federation"]["secure_aggregation"] is True


@pytest.mark.parametrize("overrides, field", [
    (["data.num_silos=1", "federation.min_participants=1"], "num_silos"),
    (["federation.secagg_threshold=3"], "secagg_threshold"),
    (["data.num_silos=5", "federation.secagg_bits=30"], "modulus"),
    (["privacy=dp", "federation.secagg_clip_range=4"], "secagg_clip_range"),
])
def test_configs_secure_aggregation_cannot_run_are_refused(overrides, field):
    cfg = load_config(["experiment=micro", "federation.secure_aggregation=true", *overrides])
    with pytest.raises(ConfigError) as err:
        check_federation_config(cfg)
    assert field in str(err.value)
    # the same settings without secure aggregation are fine
    check_federation_config(load_config(["experiment=micro", *overrides]))


def test_the_default_range_holds_a_default_dp_update():
    check_federation_config(load_config(["experiment=micro", "privacy=dp", "federation.secure_aggregation=true"]))


def test_quantum_and_bounds():
    s = SecAggSettings(clip_range=8.0, bits=24, threshold=2)
    assert s.quantum == pytest.approx(16 / 2**24)
    assert s.sum_error_bound(3) == pytest.approx(3 * s.quantum)
    assert s.mean_error_bound() == s.quantum
    assert s.max_participants() == 255  # 255 * 2^24 < 2^32 <= 256 * 2^24
    assert s.norm_bound(100) == pytest.approx(80.0)
    assert SecAggSettings(8.0, 24, 2, max_norm=3.0).norm_bound(100) == 3.0


def test_outer_error_bound_is_reached_by_a_worst_case_perturbation():
    """Every round's mean off by +ε in every coordinate: the parameters end exactly the bound apart."""
    eps, rounds = 1e-4, 4
    start = {"w": torch.zeros(5, dtype=torch.float64)}
    a = OuterOptimizer(start, lr=0.7, momentum=0.9, nesterov=True)
    b = OuterOptimizer(start, lr=0.7, momentum=0.9, nesterov=True)
    rng = np.random.default_rng(0)
    for _ in range(rounds):
        g = torch.from_numpy(rng.normal(size=5))
        a.commit({"w": g}, expected=a.preview({"w": g}))
        b.commit({"w": g + eps}, expected=b.preview({"w": g + eps}))
    gap = float((a.params["w"] - b.params["w"]).abs().max())
    bound = outer_error_bound(eps, rounds, lr=0.7, momentum=0.9, nesterov=True)
    assert gap == pytest.approx(bound, rel=1e-9)
    assert outer_error_bound(eps, 1, lr=0.7, momentum=0.9, nesterov=True) == pytest.approx(0.7 * 1.9 * eps)


def test_participant_refuses_updates_it_cannot_mask_faithfully():
    ok = np.full(10, 0.5, dtype=np.float32)
    assert check_before_masking(ok, 10, S)["fed/secagg_update_max_abs"] == pytest.approx(0.5)
    bad = {
        "not finite": np.array([np.nan] + [0.0] * 9, dtype=np.float32),
        "10 coordinates": np.zeros(9, dtype=np.float32),
        r"outside the SecAgg\+ range": np.array([1.5] + [0.0] * 9, dtype=np.float32),
    }
    for why, flat in bad.items():
        with pytest.raises(RoundError, match=why):
            check_before_masking(flat, 10, S)
    with pytest.raises(RoundError, match="norm"):
        check_before_masking(ok, 10, SecAggSettings(1.0, 16, 2, max_norm=1.0))  # ‖ok‖ = 1.58


def test_coordinator_accepts_a_genuine_sum_and_rejects_a_broken_one():
    rng = np.random.default_rng(1)
    n, c = 50, 3
    updates = rng.uniform(-1, 1, size=(c, n))
    total = updates.sum(axis=0)
    out = check_secure_sum(total, c, n, S)
    assert out["fed/secagg_sum_norm"] == pytest.approx(np.linalg.norm(total))
    # a failed unmask leaves values spread over the whole modulus: far outside C·(c + q)
    garbage = rng.uniform(-c, 2**32 / 2**16 * 2 - c, size=n)
    cases = {"not finite": np.where(np.arange(n) == 0, np.inf, total), "coordinates": total[:-1],
             r"C·\(c \+ q\)": garbage, "reveal": total}
    for why, value in cases.items():
        with pytest.raises(SecureSumRejected, match=why):
            check_secure_sum(value, 1 if why == "reveal" else c, n, S)
    with pytest.raises(SecureSumRejected, match="norm"):
        check_secure_sum(total, c, n, SecAggSettings(1.0, 16, 2, max_norm=0.5))


def test_mean_from_sum_divides_by_the_contributors():
    layout = Layout.of({"a": torch.zeros(2), "b": torch.zeros(1, 2)})
    mean = mean_from_sum(np.array([3.0, 6.0, 9.0, 0.0]), 3, layout)
    assert mean["a"].tolist() == [1.0, 2.0] and mean["b"].tolist() == [[3.0, 0.0]]
    assert mean["a"].dtype == torch.float32
