"""Silo partitioner: determinism, disjoint at severity 1, full overlap at 0, roles respected."""

import pytest

from lensemble.data import partition_silos
from lensemble.envs import factor_spec
from lensemble.errors import ConfigError

ENV, FACTOR = "swm/TwoRoom-v1", "agent.color"


def _plan(severity, seed=0, silos=3, episodes=20, heldout=4):
    return partition_silos(ENV, FACTOR, silos, episodes, severity, seed, heldout)


def test_deterministic_from_seed():
    assert _plan(0.5) == _plan(0.5)
    assert _plan(0.5, seed=1) != _plan(0.5, seed=0)


def test_severity_one_gives_disjoint_silos():
    plan = _plan(1.0)
    seen = [plan.seen_by(c) for c in range(plan.num_silos)]
    for i in range(len(seen)):
        assert seen[i] <= set(plan.home[i])
        for j in range(i + 1, len(seen)):
            assert not seen[i] & seen[j]


def test_severity_zero_every_silo_sees_every_value():
    spec = factor_spec(ENV, FACTOR)
    plan = _plan(0.0, episodes=len(spec.silo))
    for c in range(plan.num_silos):
        assert set(plan.train[c]) == set(spec.silo)


def test_intermediate_severity_mixes():
    plan = _plan(0.5, episodes=40)
    for c in range(plan.num_silos):
        home = sum(v in plan.home[c] for v in plan.train[c])
        assert home >= 20  # at least the home quota (shared draws can also land at home)
        assert set(plan.train[c]) - set(plan.home[c])  # but not only home values


def test_transfer_and_public_values_never_reach_silos():
    for s in (0.0, 0.5, 1.0):
        plan = _plan(s)
        reserved = set(plan.transfer) | set(plan.public)
        for c in range(plan.num_silos):
            assert not plan.seen_by(c) & reserved
    assert 0 <= plan.held_out_silo < plan.num_silos


def test_episode_counts_and_errors():
    plan = _plan(1.0, episodes=7, heldout=3)
    assert all(len(t) == 7 for t in plan.train) and all(len(h) == 3 for h in plan.heldout)
    with pytest.raises(ConfigError):
        _plan(1.5)
    with pytest.raises(ConfigError, match="cannot each own"):
        _plan(1.0, silos=len(factor_spec(ENV, FACTOR).silo) + 1)
    with pytest.raises(ConfigError):
        partition_silos(ENV, "agent.mood", 2, 4, 1.0, 0)


def test_shared_homes_give_more_silos_than_values_one_value_each():
    # agent.region has two silo values (the rooms): four silos are two per room, each silo's
    # episodes all in its room at severity 1, and the two silos of a room are distinct draws.
    n_values = len(factor_spec(ENV, "agent.region").silo)
    assert n_values == 2
    with pytest.raises(ConfigError, match="shared_homes"):
        partition_silos(ENV, "agent.region", 4, 8, 1.0, 0)
    plan = partition_silos(ENV, "agent.region", 4, 8, 1.0, 0, shared_homes=True)
    assert [len(h) for h in plan.home] == [1, 1, 1, 1]
    assert plan.home[0] == plan.home[2] and plan.home[1] == plan.home[3] and plan.home[0] != plan.home[1]
    for c in range(4):
        assert set(plan.train[c]) == set(plan.home[c])
    # sharing changes nothing when every silo can own a value of its own
    assert partition_silos(ENV, "agent.region", 2, 8, 1.0, 0, shared_homes=True) == \
        partition_silos(ENV, "agent.region", 2, 8, 1.0, 0)
