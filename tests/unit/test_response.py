"""Known-answer tests of κ, the cross-silo response of one round (lensemble/training/response.py)."""

from __future__ import annotations

import math

import torch
from tiny_model import frames, tiny_cfg

from lensemble.config.schema import LensembleConfig, ObjectiveConfig, TrainConfig
from lensemble.data.clips import Clips
from lensemble.model.sigreg import make_sketch
from lensemble.model.world_model import build_world_model
from lensemble.training.response import cross_response

B, K = 6, 3


class _Fixed:
    """A sampler that always returns the same clips (whatever the generator)."""

    def __init__(self, clips: Clips):
        self.clips = clips

    def sample(self, n: int, generator: torch.Generator) -> Clips:
        idx = torch.randint(0, self.clips.obs.shape[0], (n,), generator=generator)
        return Clips(obs=self.clips.obs[idx], actions=self.clips.actions[idx], state=self.clips.state[idx])


def _clips(seed: int) -> Clips:
    g = torch.Generator().manual_seed(seed + 100)
    return Clips(obs=frames(B * K, seed=seed).reshape(B, K, 3, 16, 16), actions=torch.randn(B, K - 1, 4, generator=g),
                 state=torch.zeros(B, K, 1))


def _cfg():
    return LensembleConfig(model=tiny_cfg(projector_norm="batchnorm"), train=TrainConfig(batch_size=B, warmup_steps=0),
                           objective=ObjectiveConfig(sigreg_directions=16, sigreg_scope="pooled", bn_scope="pooled"))


def test_silos_with_the_same_clips_respond_fully_kappa_one():
    # every silo summarises the same clips: whatever a silo's update does to its own ECF it does to
    # the others', so κ = 1 exactly and the predicted overshoot is C
    cfg = _cfg()
    model = build_world_model(cfg.model, init_seed=0)
    same = _clips(0)
    sketch = make_sketch(16, 16, torch.Generator().manual_seed(1))
    rep = cross_response(cfg, model, [same, same, same], [_Fixed(_clips(1)), _Fixed(_clips(2)), _Fixed(_clips(3))],
                         sketch, inner_steps=3)
    off = [rep.kappa[i][k] for i in range(3) for k in range(3) if i != k]
    assert all(abs(x - 1.0) < 1e-5 for x in off), off
    assert abs(rep.overshoot - 3.0) < 1e-4
    assert all(math.isnan(rep.kappa[i][i]) for i in range(3))


def test_different_silos_respond_partly_and_the_model_is_left_alone():
    cfg = _cfg()
    model = build_world_model(cfg.model, init_seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sketch = make_sketch(16, 16, torch.Generator().manual_seed(1))
    clips = [_clips(0), _clips(5)]
    rep = cross_response(cfg, model, clips, [_Fixed(c) for c in clips], sketch, inner_steps=3)
    assert all(math.isfinite(rep.kappa[i][k]) for i, k in ((0, 1), (1, 0)))
    assert abs(rep.kappa_mean - 1.0) > 1e-3  # other frames: not the full response
    assert rep.sigreg_start > 0 and len(rep.expected) == 2 and rep.averaged > 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
