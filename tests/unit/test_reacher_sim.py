"""Reacher's true dynamics for the oracle (lensemble/eval/reacher_sim.py) against the env itself."""

import numpy as np
import pytest
import torch

from lensemble.envs import make_env
from lensemble.eval.reacher_sim import ReacherDynamics, reacher_embedding

REACHER = "swm/ReacherDMControl-v0"


@pytest.fixture(scope="module")
def envs():
    es = [make_env(REACHER, img_size=16) for _ in range(2)]
    yield es
    for e in es:
        e.close()


def test_rollout_reproduces_the_env_step_by_step(envs):
    rng = np.random.default_rng(0)
    block, h = 5, 4
    for seed, e in enumerate(envs):
        e.reset(seed + 10, {"agent.arm_density": [1364]} if seed else None)  # a changed model too
    dyn = ReacherDynamics.from_envs(envs).repeat(3)
    actions = torch.from_numpy(rng.uniform(-1, 1, (6, h, block * 2)).astype(np.float32))
    z0 = reacher_embedding(np.stack([e.state() for e in envs])).repeat_interleave(3, dim=0)
    pred = dyn.rollout(z0, actions, block)
    assert pred.shape == (6, h, 3)
    for row in (0, 4):  # episode 0's first sample, episode 1's second
        e = envs[row // 3]
        start = e.state()
        truth = []
        for k in range(h):
            for j in range(block):
                e.env.step(actions[row, k, 2 * j: 2 * j + 2].numpy())
            truth.append(reacher_embedding(e.state()))
        e.set_state(start)
        np.testing.assert_allclose(pred[row].numpy(), torch.stack(truth).numpy(), atol=1e-5)


def test_embedding_wraps_the_shoulder_only():
    a = reacher_embedding(np.array([np.pi - 0.01, 0.5]))
    b = reacher_embedding(np.array([-np.pi + 0.01, 0.5]))
    assert torch.abs(a - b).sum() < 0.03  # 0.02 rad apart across ±π
    c = reacher_embedding(np.array([0.0, 0.5 + 2 * np.pi]))
    assert torch.abs(c - reacher_embedding(np.array([0.0, 0.5]))).sum() > 6  # the wrist has stops


def test_a_stale_start_is_refused(envs):
    envs[0].reset(1)
    dyn = ReacherDynamics.from_envs(envs[:1])
    with pytest.raises(ValueError, match="snapshot"):
        dyn.rollout(torch.zeros(1, 3), torch.zeros(1, 2, 10), 5)
