"""Drift magnitudes of an orthogonal matrix: ||Q - I||_F and the geodesic rotation angle.

Two magnitudes of an orthogonal Q (d, d), both reported:

* ``frobenius``: ||Q - I||_F (canonical; dimensionless, in [0, 2 sqrt(d)]).
* ``geodesic angle`` in degrees, from the eigenvalue phases of Q. Q is orthogonal, so its
  eigenvalues are e^{±i θ_j} with principal angles θ_j in [0, π] (one per eigenvalue: a rotation
  plane contributes its angle twice, a fixed axis 0, a reflected axis π once). We report

      angle = sqrt( ½ Σ_{j=1..d} θ_j² )            (radians, then converted to degrees).

  For Q in SO(d) this is the geodesic distance from I to Q on the rotation group (||log Q||_F/√2):
  a rotation by θ in one plane reads θ exactly, a rotation by θ₁ and θ₂ in two orthogonal planes
  reads sqrt(θ₁² + θ₂²). It never saturates: it keeps growing with the number of rotated planes
  (up to 180°·sqrt(d/2)), whereas the trace formula acos((tr Q - (d-2))/2) is exact for one plane
  only and pins every generic high-d rotation at 180°. We prefer the geodesic norm over the max
  principal angle (which also saturates near 180° in high d) and over the RMS angle (which would
  dilute a one-plane rotation by sqrt(d/2)). For small rotations angle ≈ ||Q - I||_F / √2 (rad).

Reflections (det Q = -1) have no rotation path from I; the formula then counts the reflected axis
as π/√2 (half a plane turned by π). Such pairs are listed in ``reflected_pairs`` so that nobody
mistakes them for a large smooth drift.

Numerics: Q - I and Q + I are normal matrices, so their singular values are exactly
|λ_j - 1| = 2 sin(θ_j/2) and |λ_j + 1| = 2 cos(θ_j/2). Both lists are monotone in θ (one
decreasing, one increasing), so the k-th largest of the first and the k-th smallest of the second
belong to the same angle, and θ = 2 atan2(sin(θ/2), cos(θ/2)) is accurate to ~1e-15 rad over the
whole range [0, π]. When every θ_j <= 90° (small drift), 2 asin(σ(Q - I)/2) is already that
accurate and the second decomposition is skipped. This avoids a general (complex) eigen-solver, which is several times slower,
and avoids acos / asin of a single list, which lose half their digits near 0 or near π.

The batched fast route of :func:`lensemble.gauge.drift.frame_drift` to the same numbers is in
:mod:`lensemble.gauge.drift`; this module is the exact reference it falls back on.
"""

from __future__ import annotations

import math

import torch

__all__ = ["principal_angles", "geodesic_angle_deg", "frobenius_drift", "drift_magnitudes"]


def principal_angles(q: torch.Tensor) -> torch.Tensor:
    """Principal angles θ_j of orthogonal matrices, in radians.

    Args:
        q: (..., d, d) orthogonal matrices (any float dtype; computed in float64).

    Returns:
        (..., d) float64 angles in [0, π], ascending; one per eigenvalue λ_j = e^{±iθ_j}.
    """
    q = q.to(torch.float64)
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    chord_minus = torch.linalg.svdvals(q - eye).flip(-1)  # 2 sin(θ/2), ascending = θ ascending
    if chord_minus.numel() == 0 or float(chord_minus.max()) <= math.sqrt(2.0):
        # Every θ <= 90°: asin is well conditioned there (slope <= √2), so the second
        # decomposition is not needed. This is the common case of small federated drift.
        return 2.0 * torch.asin((chord_minus / 2.0).clamp(0.0, 1.0))
    chord_plus = torch.linalg.svdvals(q + eye)  # 2 cos(θ/2), descending = θ ascending
    return 2.0 * torch.atan2(chord_minus, chord_plus)


def geodesic_angle_deg(q: torch.Tensor) -> torch.Tensor:
    """Geodesic rotation angle sqrt(½ Σ θ_j²) of orthogonal matrices, in degrees.

    Args:
        q: (..., d, d). Returns (...) float64 degrees (see the module docstring).
    """
    theta = principal_angles(q)
    return torch.rad2deg(torch.sqrt(0.5 * (theta * theta).sum(dim=-1)))


def frobenius_drift(q: torch.Tensor) -> torch.Tensor:
    """||Q - I||_F for (..., d, d) matrices; returns (...) float64 (dimensionless)."""
    q = q.to(torch.float64)
    eye = torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)
    return torch.linalg.matrix_norm(q - eye)


def _reflection_flags(q: torch.Tensor) -> torch.Tensor:
    # slogdet's sign; torch.linalg.det on batched fp64 input returned garbage under MKL with 2
    # threads in this environment, while slogdet's LU path is correct.
    return torch.linalg.slogdet(q.to(torch.float64)).sign < 0


def drift_magnitudes(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both drift magnitudes of (..., d, d) orthogonal matrices.

    Returns:
        (frobenius (...) float64, angle_deg (...) float64, reflection (...) bool).
    """
    return frobenius_drift(q), geodesic_angle_deg(q), _reflection_flags(q)
