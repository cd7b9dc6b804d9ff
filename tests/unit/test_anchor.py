"""Frame anchor A/B, the conditioned polar backward, landmark selection."""

import math

import pytest
import torch
from torch import nn

from lensemble.errors import ConfigError, DegenerateProcrustes
from lensemble.gauge import FrameAnchor, differentiable_polar, select_landmarks


def _orthogonal(d, seed):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _targets(k, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, d, generator=g, dtype=torch.float64)


def test_k_below_d_is_a_config_error():
    with pytest.raises(ConfigError):
        FrameAnchor(_targets(3, 4), list(range(3)), "A")
    with pytest.raises(ConfigError):
        FrameAnchor(_targets(8, 4), list(range(8)), "C")
    with pytest.raises(ConfigError):
        FrameAnchor(_targets(8, 4), list(range(7)), "A")


def test_rank_deficient_targets_are_rejected():
    t = _targets(10, 4)
    t[:, 0] = 0.0
    with pytest.raises(DegenerateProcrustes):
        FrameAnchor(t, list(range(10)), "B")


def test_variant_a_is_landmark_mse():
    t = _targets(12, 4)
    anchor = FrameAnchor(t, list(range(12)), "A")
    assert float(anchor(t.clone())) == 0.0
    z = t + 0.5
    assert float(anchor(z)) == pytest.approx(0.25 * 4, rel=1e-12)  # (1/k) Σ ||0.5·1||²


def test_variant_b_is_rotation_penalty():
    t = _targets(20, 5, 1)
    anchor = FrameAnchor(t, list(range(20)), "B")
    assert float(anchor(t.clone())) == pytest.approx(0.0, abs=1e-20)
    r = _orthogonal(5, 2)
    z = t @ r.T  # z @ r = t, so Q* = r
    assert float(anchor(z)) == pytest.approx(
        float(((r - torch.eye(5, dtype=torch.float64)) ** 2).sum()), rel=1e-9
    )
    # Content changes that are not rotations are not penalised.
    assert float(anchor(2.0 * t)) == pytest.approx(0.0, abs=1e-20)


def test_polar_backward_matches_finite_differences():
    g = torch.Generator().manual_seed(3)
    m = (
        torch.randn(4, 4, generator=g, dtype=torch.float64) + 3 * torch.eye(4, dtype=torch.float64)
    ).requires_grad_()
    w = torch.randn(4, 4, generator=g, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: (differentiable_polar(x) * w).sum(), (m,), eps=1e-6, atol=1e-7)


def _isotropic_case(k=16, d=4):
    """Targets with tᵀt = k·I and z = t Rᵀ: every singular value of zᵀt is equal (= k)."""
    t = torch.linalg.qr(_targets(k, d, 4))[0] * math.sqrt(k)
    r = torch.linalg.matrix_exp(0.3 * (lambda a: a - a.T)(_targets(d, d, 5)))
    return t, (t @ r.T)


def test_variant_b_gradients_finite_on_repeated_singular_values():
    t, z0 = _isotropic_case()
    anchor = FrameAnchor(t, list(range(t.shape[0])), "B")
    z = z0.clone().requires_grad_()
    loss = anchor(z)
    loss.backward()
    assert torch.isfinite(z.grad).all()
    assert float(z.grad.norm()) > 0
    # (A plain SVD backward has 1/(σ_i² - σ_j²) terms: with torch 2.14 it returns non-finite
    # gradients on this very input.)


def test_variant_b_gradients_finite_on_rank_deficient_input():
    t = _targets(16, 4, 6)
    anchor = FrameAnchor(t, list(range(16)), "B")
    z = (t @ _orthogonal(4, 7)).clone()
    z[:, 1] = 0.0  # collapsed latent dimension
    z.requires_grad_()
    anchor(z).backward()
    assert torch.isfinite(z.grad).all()


def test_variant_b_gradient_descent_unrotates_the_frame():
    t, z0 = _isotropic_case()
    anchor = FrameAnchor(t, list(range(t.shape[0])), "B")
    z = z0.clone().float().requires_grad_()
    opt = torch.optim.SGD([z], lr=0.5)
    first = float(anchor(z).detach())
    for _ in range(30):
        opt.zero_grad()
        loss = anchor(z)
        loss.backward()
        opt.step()
    assert z.dtype == torch.float32 and loss.dtype == torch.float32
    assert float(anchor(z).detach()) < 0.05 * first


def test_select_landmarks_is_deterministic():
    a = select_landmarks(100, 10, seed=1, probe_hash="p")
    assert a.dtype == torch.long and a.tolist() == sorted(set(a.tolist())) and len(a) == 10
    assert torch.equal(a, select_landmarks(100, 10, seed=1, probe_hash="p"))
    assert not torch.equal(a, select_landmarks(100, 10, seed=2, probe_hash="p"))
    assert torch.equal(select_landmarks(5, 5), torch.arange(5))
    with pytest.raises(ConfigError):
        select_landmarks(5, 6)


def test_from_reference_uses_the_frozen_encoder():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    frames = torch.randn(30, 3, 2, 2)
    anchor = FrameAnchor.from_reference(ref, frames, k=8, variant="A", seed=3)
    assert anchor.k == 8 and anchor.d == 4
    with torch.no_grad():
        expected = ref(frames[anchor.landmark_idx])
    torch.testing.assert_close(anchor.targets, expected)
    assert not anchor.targets.requires_grad
    z = ref(frames[anchor.landmark_idx])
    assert float(anchor(z).detach()) == pytest.approx(0.0, abs=1e-12)


def test_from_reference_takes_the_probe_splits_landmarks_and_nothing_else():
    from lensemble.data.probe import split_probe
    from lensemble.errors import ConfigError

    torch.manual_seed(0)
    ref = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    frames = torch.randn(30, 3, 2, 2)
    split = split_probe(30, 8, seed=5, probe_hash="p")
    anchor = FrameAnchor.from_reference(ref, frames, k=8, landmark_idx=torch.from_numpy(split.landmark_idx))
    assert anchor.landmark_idx.tolist() == split.landmark_idx.tolist()
    assert not set(anchor.landmark_idx.tolist()) & set(split.measurement_idx.tolist())  # held out
    with torch.no_grad():
        torch.testing.assert_close(anchor.targets, ref(frames[torch.from_numpy(split.landmark_idx)]))
    with pytest.raises(ConfigError):
        FrameAnchor.from_reference(ref, frames, k=8, landmark_idx=[0, 1, 2])
    with pytest.raises(ConfigError):
        FrameAnchor.from_reference(ref, frames, k=2, landmark_idx=[0, 99])
