"""Aligned consensus and function-space distillation."""

import pytest
import torch
from torch import nn

from lensemble.errors import ConfigError, GaugeError
from lensemble.gauge import aligned_consensus, distill_encoder


def _orthogonal(d, seed):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def test_consensus_undoes_each_participants_rotation():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(40, 5, generator=g)
    parts = {
        f"s{i}": (
            ref.double() @ _orthogonal(5, i).T + 0.01 * torch.randn(40, 5, generator=g, dtype=torch.float64)
        ).float()
        for i in range(3)
    }
    consensus, fit = aligned_consensus(parts, ref)
    assert consensus.dtype == torch.float32 and consensus.shape == ref.shape
    torch.testing.assert_close(consensus, ref, atol=0.02, rtol=0)
    assert set(fit) == {"s0", "s1", "s2"} and all(v < 0.02 for v in fit.values())
    # The naive (unaligned) mean is far from the reference.
    naive = torch.stack(list(parts.values())).mean(0)
    assert float((naive - ref).abs().max()) > 0.2
    with pytest.raises(GaugeError):
        aligned_consensus({}, ref)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 4))


def test_distillation_reduces_the_loss_and_leaves_the_input_alone():
    student = _mlp()
    before = {k: v.clone() for k, v in student.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    frames = torch.randn(64, 3, 2, 2, generator=g)
    teacher = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    with torch.no_grad():
        target = teacher(frames)
    res = distill_encoder(student, frames, target, steps=150, lr=1e-2, seed=0)
    assert res.steps == 150 and len(res.losses) == 150
    assert res.loss_after < 0.1 * res.loss_before
    for k, v in student.state_dict().items():
        assert torch.equal(v, before[k])  # the caller's module is untouched
    trained = _mlp()
    trained.load_state_dict(res.state_dict)
    with torch.no_grad():
        err_after = float(((trained(frames) - target) ** 2).sum(-1).mean())
    assert err_after == pytest.approx(res.loss_after, rel=1e-4)


def test_minibatch_distillation_is_deterministic():
    frames = torch.randn(40, 12, generator=torch.Generator().manual_seed(2))
    target = torch.randn(40, 4, generator=torch.Generator().manual_seed(3))
    student = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))
    a = distill_encoder(student, frames, target, steps=12, lr=1e-2, batch_size=16, seed=7)
    b = distill_encoder(student, frames, target, steps=12, lr=1e-2, batch_size=16, seed=7)
    assert a.losses == b.losses
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)
    assert a.loss_after < a.loss_before
    with pytest.raises(ConfigError):
        distill_encoder(student, frames, target, steps=0)
    with pytest.raises(ConfigError):
        distill_encoder(student, frames, target, batch_size=41)
    with pytest.raises(GaugeError):
        distill_encoder(student, frames, target[:10])
