"""PushT's true simulator for the oracle: a restored shadow space reproduces the env's trajectory."""

import math

import numpy as np
import pytest
import torch

from lensemble.envs.adapter import make_env
from lensemble.envs.factors import PUSHT
from lensemble.eval import pusht_sim
from lensemble.eval.pusht_sim import ANGLE_SCALE_PX, PushTDynamics, pusht_embedding


@pytest.fixture
def env():
    with make_env(PUSHT, 64) as e:
        e.reset(3)
        yield e


def _pushes(env, rng, n):
    """Actions that drive the agent at the block (so the rollout has contacts), with noise."""
    u = env.unwrapped
    out = []
    for _ in range(n):
        d = (np.array(u.block.position) - np.array(u.agent.position)) / 100 + rng.normal(0, 0.3, 2)
        out.append(np.clip(d, -1, 1).astype(np.float32))
    return out


def test_a_restored_shadow_reproduces_the_env_through_contacts(env):
    """To 1e-6 px (measured: 0 to 6e-14; the contact solver's warm-start cache is the shadow's own)
    against a 20 px success tolerance. Plain-float arithmetic in the controller, instead of the
    env's float32 promotion, misses by ~1e-6 px per step and then diverges under contact."""
    rng = np.random.default_rng(0)
    dyn = PushTDynamics.from_envs([env])
    contacts, checked = 0, 0
    for _ in range(12):
        acts = _pushes(env, rng, 5)  # one latent step of 5 env steps
        start = env.state().copy()
        sim = dyn.take(torch.tensor([0]))
        z0 = pusht_embedding(start)[None]
        pred = sim.rollout(z0, torch.from_numpy(np.concatenate(acts))[None, None], 5)
        for a in acts:
            env.step(a)
            contacts += env.unwrapped.n_contact_points
        true = env.unwrapped._get_obs()  # float64: the exact state, not the adapter's float32 copy
        assert torch.allclose(pred[0, 0], pusht_embedding(true), rtol=0, atol=1e-4), (pred, true)
        # the shadow's full float64 state, not just its float32 embedding
        shadow = dyn.pools[dyn.episodes[0].key][0]
        assert np.abs(np.array(pusht_sim._state(*pusht_sim._bodies(shadow))) - true).max() <= 1e-6
        checked += 1
    assert contacts > 0 and checked == 12  # the agent did push the block


def test_space_copy_alone_moves_the_block_which_is_why_bodies_are_restored(env):
    """pymunk 7.3 unpickles the angle after the position: the T block's origin (off its centre of
    gravity) jumps. The shadow is therefore re-posed from the live bodies before every rollout."""
    u = env.unwrapped
    copy = pusht_sim._shadow_space(u.space)
    _, block = pusht_sim._bodies(copy)
    for _ in range(5):
        copy.step(u.dt)
        u.space.step(u.dt)
    assert np.linalg.norm(np.array(block.position) - np.array(u.block.position)) > 1.0


def test_episodes_with_one_geometry_share_a_pool_and_rows_match_their_own_env():
    """Two episodes in one call: each row rolls out from its own env's state (checked against
    that env), and the two share one pool of shadows because their shapes are the same."""
    rng = np.random.default_rng(2)
    with make_env(PUSHT, 64) as a, make_env(PUSHT, 64) as b:
        a.reset(4)
        b.reset(5)
        dyn = PushTDynamics.from_envs([a, b])
        assert dyn.episodes[0].key == dyn.episodes[1].key
        acts = torch.from_numpy(rng.uniform(-1, 1, (4, 1, 10)).astype(np.float32))  # rows: a, a, b, b
        sim = dyn.take(torch.tensor([0, 1])).repeat(2)
        z0 = torch.stack([pusht_embedding(e.unwrapped._get_obs()) for e in (a, a, b, b)])
        out = sim.rollout(z0, acts, 5)
        assert len(dyn.pools) == 1 and len(next(iter(dyn.pools.values()))) == 2
        for row, env in ((1, a), (2, b)):
            for act in acts[row, 0].reshape(5, 2).numpy():
                env.step(act)
            assert torch.allclose(out[row, 0], pusht_embedding(env.unwrapped._get_obs()), rtol=0, atol=1e-4)


def test_rollout_rows_are_independent_and_leave_the_env_untouched(env):
    rng = np.random.default_rng(1)
    before = env.unwrapped._get_obs().copy()
    dyn = PushTDynamics.from_envs([env])
    acts = torch.from_numpy(rng.uniform(-1, 1, (3, 2, 10)).astype(np.float32))  # 3 samples, H = 2, block 5
    sim = dyn.take(torch.tensor([0])).repeat(3)
    z0 = pusht_embedding(before).repeat(3, 1)
    out = sim.rollout(z0, acts, 5)
    assert out.shape == (3, 2, 6)
    assert np.array_equal(env.unwrapped._get_obs(), before)   # only the shadow moved
    alone = dyn.take(torch.tensor([0])).rollout(z0[:1], acts[1:2], 5)
    assert torch.equal(alone[0], out[1])                        # a row does not depend on its neighbours
    assert not torch.equal(out[0], out[2])


def test_a_start_that_is_not_the_snapshot_is_refused(env):
    dyn = PushTDynamics.from_envs([env])
    sim = dyn.take(torch.tensor([0]))
    wrong = pusht_embedding(env.state())[None] + 50.0
    with pytest.raises(ValueError, match="snapshot"):
        sim.rollout(wrong, torch.zeros(1, 1, 10), 5)


def test_embedding_costs_one_threshold_of_angle_like_one_of_position_and_wraps():
    base = np.array([100.0, 100.0, 200.0, 200.0, 0.0, 0.0, 0.0])
    moved = base.copy()
    moved[2] += 20.0                                   # the position tolerance
    turned = base.copy()
    turned[4] = math.pi / 9                            # the angle tolerance
    d_pos = torch.linalg.norm(pusht_embedding(moved) - pusht_embedding(base))
    d_ang = torch.linalg.norm(pusht_embedding(turned) - pusht_embedding(base))
    assert d_pos == pytest.approx(20.0, rel=1e-6)
    assert d_ang == pytest.approx(2 * ANGLE_SCALE_PX * math.sin(math.pi / 18), rel=1e-6)
    assert d_ang == pytest.approx(20.0, rel=0.01)      # the chord is within 1 % of r·Δθ here
    a, b = base.copy(), base.copy()
    a[4], b[4] = 0.01, 2 * math.pi - 0.01              # 0.02 rad apart across the wrap
    assert torch.linalg.norm(pusht_embedding(a) - pusht_embedding(b)) == pytest.approx(0.02 * ANGLE_SCALE_PX, rel=1e-3)


def test_whole_horizon_rollouts_stay_within_a_tenth_of_the_tolerance(env):
    """The planner's use: 25 env steps from a shadow that last rolled out something else. The
    warm-start cache of the contact solver is the one thing not restored; under sustained random
    pushing its 1e-14 px effect grows (measured ≤ 0.4 px here), still far inside the 20 px
    success tolerance."""
    rng = np.random.default_rng(5)
    dyn = PushTDynamics.from_envs([env])
    snapshot = dyn.take(torch.tensor([0])).starts[0]
    acts = rng.uniform(-1, 1, (8, 5, 10)).astype(np.float32)
    z0 = pusht_embedding(env.unwrapped._get_obs()).repeat(8, 1)
    pred = dyn.take(torch.tensor([0])).repeat(8).rollout(z0, torch.from_numpy(acts), 5)
    agent, block = pusht_sim._bodies(env.unwrapped.space)
    worst = 0.0
    for i in range(8):
        pusht_sim._write(agent, snapshot[0])
        pusht_sim._write(block, snapshot[1])
        for a in acts[i].reshape(25, 2):
            env.unwrapped.step(a)
        worst = max(worst, float((pusht_embedding(env.unwrapped._get_obs()) - pred[i, -1]).abs().max()))
    assert worst < 2.0, worst
