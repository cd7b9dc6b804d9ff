"""ClipSampler: shapes, dtypes, action concatenation against a hand-built episode, determinism."""

import numpy as np
import pytest
import torch

from lensemble.data import ClipSampler
from lensemble.errors import ConfigError


def _episode(t=12, a=2, offset=0):
    # Frame t has every pixel = offset + t; state t = (offset + t, -(offset + t));
    # action t = (1000 + 10*t, 1000 + 10*t + 1) + offset: each entry identifies its step and dim.
    frame_ids = (offset + np.arange(t + 1, dtype=np.uint8))[:, None, None, None]
    obs = np.broadcast_to(frame_ids, (t + 1, 4, 4, 3)).copy()
    steps = offset + np.arange(t, dtype=np.float32)
    actions = np.stack([1000 + 10 * steps + d for d in range(a)], axis=1).astype(np.float32)
    state = np.stack([offset + np.arange(t + 1), -(offset + np.arange(t + 1))], axis=1).astype(np.float32)
    return {"obs": obs, "actions": actions, "state": state}


def test_shapes_and_dtypes():
    s = ClipSampler([_episode(), _episode(offset=100)], clip_len=3, action_block=2)
    c = s.sample(5, torch.Generator().manual_seed(0))
    assert c.obs.shape == (5, 3, 3, 4, 4) and c.obs.dtype == torch.uint8
    assert c.actions.shape == (5, 2, 4) and c.actions.dtype == torch.float32
    assert c.state.shape == (5, 3, 2) and c.state.dtype == torch.float32
    assert len(s) == 2 * (12 + 1 - 2 * 2)


def test_action_concatenation_matches_hand_computation():
    k, b = 3, 2
    s = ClipSampler([_episode(offset=0), _episode(offset=100)], clip_len=k, action_block=b)
    c = s.clips_at(torch.arange(len(s)))
    for i in range(len(s)):
        t0 = int(c.state[i, 0, 0])  # state encodes the absolute (offset + t) frame index
        for j in range(k):
            assert int(c.obs[i, j, 0, 0, 0]) == t0 + j * b
            assert float(c.state[i, j, 0]) == t0 + j * b
        for j in range(k - 1):
            expected = []
            for step in range(t0 + j * b, t0 + (j + 1) * b):
                expected += [1000 + 10 * step, 1000 + 10 * step + 1]
            assert c.actions[i, j].tolist() == expected
    # no clip crosses an episode boundary: all frames of a clip share the episode offset
    assert torch.all((c.state[:, 0, 0] >= 100) == (c.state[:, -1, 0] >= 100))


def test_batches_of_episodes_and_determinism():
    e1, e2 = _episode(), _episode(offset=50)
    batch = {k: np.stack([e1[k], e2[k]]) for k in e1}
    s = ClipSampler([batch], clip_len=4, action_block=3)
    a = s.sample(16, torch.Generator().manual_seed(7))
    b = s.sample(16, torch.Generator().manual_seed(7))
    assert torch.equal(a.obs, b.obs) and torch.equal(a.actions, b.actions)


def test_too_long_clips_raise():
    with pytest.raises(ConfigError, match="clip spans"):
        ClipSampler([_episode(t=5)], clip_len=4, action_block=2)
