"""Latent-geometry metrics: collapse guards on a batch of latents.

Each function takes latents ``z`` of shape (..., d) (leading dims are flattened into n samples),
accumulates in float64 and returns a Python float. Effective dimension is scale-invariant, so it
must be read together with ``latent_std`` / ``latent_rms``, which catch magnitude collapse.
"""

from __future__ import annotations

import torch

from lensemble.errors import EvaluationError

__all__ = ["effective_dim", "latent_std", "latent_rms"]


def _samples(z: torch.Tensor, min_rows: int) -> torch.Tensor:
    if not isinstance(z, torch.Tensor) or z.ndim < 2:
        raise EvaluationError(
            f"latents must be a tensor of shape (..., d), got {getattr(z, 'shape', type(z).__name__)}",
            remediation="Pass encoder outputs shaped (n, d) or (B, T, d).",
        )
    z = z.detach().reshape(-1, z.shape[-1]).to(torch.float64)
    if z.shape[0] < min_rows:
        raise EvaluationError(
            f"need at least {min_rows} latent vectors, got {z.shape[0]}",
            remediation="Evaluate the metric on a larger batch of frames.",
        )
    if not bool(torch.isfinite(z).all()):
        raise EvaluationError("latents contain NaN or Inf", remediation="Check training for divergence.")
    return z


def effective_dim(z: torch.Tensor) -> float:
    """Participation ratio of the covariance spectrum, PR = (Σ λ_i)² / Σ λ_i².

    Args:
        z: (..., d) latents; n = prod(leading dims) >= 2 samples.

    Returns:
        A float in [1, d] (dimensionless): d for an isotropic cloud, 1 for a rank-1 cloud, and
        0.0 by convention when every latent is identical (no variance at all: total collapse).

    For the symmetric covariance C, Σ λ = tr C and Σ λ² = ||C||_F², so no eigendecomposition is
    needed: this is exact and avoids eigen-solver noise on tiny eigenvalues.
    """
    x = _samples(z, 2)
    x = x - x.mean(dim=0, keepdim=True)
    cov = (x.mT @ x) / (x.shape[0] - 1)
    tr = torch.diagonal(cov).sum()
    fro2 = (cov * cov).sum()
    if float(fro2) == 0.0:
        return 0.0
    return float(tr * tr / fro2)


def latent_std(z: torch.Tensor) -> float:
    """Mean over the d dimensions of the per-dimension sample std (correction 1), latent units.

    Args:
        z: (..., d) latents; n >= 2 samples.
    """
    x = _samples(z, 2)
    return float(x.std(dim=0, correction=1).mean())


def latent_rms(z: torch.Tensor) -> float:
    """Root mean square of all entries, sqrt(mean z²), uncentred, in latent units.

    Args:
        z: (..., d) latents; n >= 1.
    """
    x = _samples(z, 1)
    return float(torch.sqrt((x * x).mean()))
