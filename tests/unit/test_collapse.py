"""Collapse guards: participation ratio, latent std and RMS."""

import pytest
import torch

from lensemble.errors import EvaluationError
from lensemble.model.collapse import effective_dim, latent_rms, latent_std


def _exact_spectrum(n, lam, seed=0):
    """n samples whose sample covariance is exactly diag(lam)."""
    d = len(lam)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    x = x - x.mean(0)
    q, _ = torch.linalg.qr(x)  # orthonormal, zero-mean columns
    return q * torch.sqrt(torch.tensor(lam, dtype=torch.float64) * (n - 1))


def test_participation_ratio_of_known_spectrum():
    lam = [4.0, 2.0, 1.0, 0.5, 0.25]
    expected = sum(lam) ** 2 / sum(v * v for v in lam)
    z = _exact_spectrum(200, lam)
    assert effective_dim(z) == pytest.approx(expected, rel=1e-10)
    # Rotating the cloud does not change the spectrum.
    q, _ = torch.linalg.qr(torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    assert effective_dim(z @ q) == pytest.approx(expected, rel=1e-10)


def test_gaussian_sample_with_known_covariance():
    lam = torch.tensor([3.0, 1.0, 1.0, 0.5, 0.1, 0.1])
    g = torch.Generator().manual_seed(2)
    z = torch.randn(20000, 6, generator=g) * lam.sqrt()
    expected = float(lam.sum() ** 2 / (lam**2).sum())
    assert effective_dim(z) == pytest.approx(expected, rel=0.03)


def test_rank_one_isotropic_and_collapsed():
    g = torch.Generator().manual_seed(3)
    u = torch.randn(300, 1, generator=g)
    direction = torch.randn(1, 16, generator=g)
    assert effective_dim(u @ direction + 0.5) == pytest.approx(1.0, abs=1e-6)
    assert effective_dim(_exact_spectrum(100, [1.0] * 16)) == pytest.approx(16.0, rel=1e-10)
    assert effective_dim(torch.ones(10, 4)) == 0.0
    # Scale-invariant, which is why std / RMS are reported next to it.
    z = torch.randn(100, 8, generator=g)
    assert effective_dim(1e-3 * z) == pytest.approx(effective_dim(z), rel=1e-6)


def test_std_and_rms():
    z = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    # per-dim sample std: |1-3|/sqrt(2), |2-6|/sqrt(2)
    assert latent_std(z) == pytest.approx((2.0 + 4.0) / 2 / 2**0.5, rel=1e-12)
    assert latent_rms(z) == pytest.approx(((1 + 4 + 9 + 36) / 4) ** 0.5, rel=1e-12)
    # Leading dims are flattened: (B, T, d) works.
    assert latent_rms(z.reshape(1, 2, 2)) == latent_rms(z)
    assert latent_std(torch.full((5, 3), 7.0)) == 0.0


def test_metric_errors():
    with pytest.raises(EvaluationError):
        effective_dim(torch.ones(1, 4))
    with pytest.raises(EvaluationError):
        latent_std(torch.ones(4))
    with pytest.raises(EvaluationError):
        latent_rms(torch.tensor([[float("nan"), 1.0]]))
