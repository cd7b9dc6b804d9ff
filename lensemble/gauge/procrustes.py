"""Orthogonal Procrustes: the rotation that best maps one latent frame onto another.

The JEPA objective (prediction + isotropic SIGReg) is invariant under z -> z Q for any Q in O(d),
so two participants trained apart can agree on content yet disagree on the basis. Procrustes
recovers that basis change from the two participants' embeddings of the same public probe frames.

Conventions (used everywhere in ``lensemble.gauge``):

* Row convention: embeddings are rows, ``source`` (n, d) is mapped by ``source @ Q``.
* The linear gauge has no translation (the frame layer has no bias), so embeddings are NOT
  centred before alignment.
* All linear algebra runs in float64, whatever the input dtype; ``Q`` is returned in float64.
* Q ranges over the full orthogonal group O(d), reflections included: the objective is invariant
  under reflections too, so forcing det Q = +1 (Kabsch) would report a worse fit than the
  gauge actually allows. Drift magnitudes flag reflections separately (see ``drift.py``).
"""

from __future__ import annotations

import torch

from lensemble.errors import DegenerateProcrustes, GaugeError

__all__ = ["procrustes_align", "polar_factors", "check_singular_floor", "as_float64_matrix"]


def as_float64_matrix(x: torch.Tensor, name: str) -> torch.Tensor:
    """Validate a (n, d) embedding matrix and return it as float64 (same device).

    Raises GaugeError for a wrong rank, an empty matrix or non-finite entries: silently aligning
    NaNs would produce a NaN rotation that poisons every average downstream.
    """
    if not isinstance(x, torch.Tensor):
        raise GaugeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise GaugeError(f"{name} must have shape (n, d) with n, d >= 1, got {tuple(x.shape)}")
    if x.is_complex():
        raise GaugeError(f"{name} must be real, got {x.dtype}")
    x = x.detach().to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise GaugeError(f"{name} contains NaN or Inf entries")
    return x


def check_singular_floor(sigma: torch.Tensor, singular_floor: float, labels: list[str] | None = None) -> None:
    """Raise DegenerateProcrustes if any cross-covariance in the batch is (near) rank-deficient.

    ``sigma`` (B, d) holds singular values sorted in descending order (torch's SVD order). The
    test is RELATIVE: sigma_min / sigma_max < singular_floor. A relative floor makes the decision
    independent of the embeddings' overall scale (latents of a healthy model may have any
    norm), and 1 / floor is exactly the largest condition number we accept. An all-zero matrix
    (sigma_max = 0) is always degenerate.

    The error's ``details`` carry ``sigma_min``, ``sigma_max``, ``condition_number``,
    ``singular_floor`` and ``pair`` (the label of the first offending item, or its index).
    """
    if singular_floor <= 0:
        raise GaugeError(f"singular_floor must be > 0, got {singular_floor}")
    smax = sigma[..., 0]
    smin = sigma[..., -1]
    # sigma_max == 0 is degenerate regardless of the ratio; compare without dividing by zero.
    bad = (smax <= 0) | (smin < singular_floor * smax)
    if bool(bad.any()):
        i = int(torch.nonzero(bad.reshape(-1))[0])
        s_min = float(smin.reshape(-1)[i])
        s_max = float(smax.reshape(-1)[i])
        cond = float("inf") if s_min == 0.0 else s_max / s_min
        label = labels[i] if labels is not None else str(i)
        err = DegenerateProcrustes(
            f"cross-covariance for {label!r} is near rank-deficient: sigma_min/sigma_max = "
            f"{(s_min / s_max) if s_max > 0 else 0.0:.3e} < singular_floor = {singular_floor:.1e} "
            f"(condition number {cond:.3e}); the rotation is not identifiable",
            sigma_min=s_min,
            sigma_max=s_max,
            condition_number=cond,
            singular_floor=singular_floor,
            pair=label,
        )
        # Also expose the numbers as attributes for callers that prefer them.
        err.sigma_min, err.condition_number, err.singular_floor = s_min, cond, singular_floor
        raise err


def polar_factors(
    cross_cov: torch.Tensor, *, singular_floor: float = 1e-6, labels: list[str] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched orthogonal polar factors of cross-covariances, in float64.

    Args:
        cross_cov: (B, d, d) or (d, d), M = sourceᵀ target (any float dtype; computed in float64).
        singular_floor: relative floor, see :func:`check_singular_floor`.
        labels: optional names of the B items, used in the error message.

    Returns:
        (Q, sigma): Q (B, d, d) float64 with Q = U Vᵀ from M = U Σ Vᵀ (the maximiser of
        tr(Qᵀ M) over O(d)); sigma (B, d) float64, descending.
    """
    m = cross_cov.to(torch.float64)
    u, sigma, vh = torch.linalg.svd(m, full_matrices=False)
    check_singular_floor(sigma, singular_floor, labels)
    return u @ vh, sigma


def procrustes_align(
    source: torch.Tensor, target: torch.Tensor, *, singular_floor: float = 1e-6
) -> tuple[torch.Tensor, float]:
    """Orthogonal Procrustes: Q in O(d) minimising ||source @ Q - target||_F.

    Args:
        source: (n, d) embeddings in the frame to be rotated (rows are probe frames).
        target: (n, d) embeddings of the same n probe frames in the reference frame.
        singular_floor: relative floor on the singular values of sourceᵀ target; below it the
            rotation is not identifiable and DegenerateProcrustes is raised.

    Returns:
        Q: (d, d) float64 orthogonal matrix (det may be -1), on the inputs' device.
        residual: float, the RELATIVE fit error ||source @ Q - target||_F / ||target||_F
            (dimensionless; 0 when the two sets differ by exactly an orthogonal map). This
            measures how well a rotation explains the difference, not how large the rotation
            is; for the latter see ``lensemble.gauge.drift.drift_magnitudes``.

    Raises:
        DegenerateProcrustes: sigma_min / sigma_max < singular_floor (details carry sigma_min,
            condition_number and singular_floor). Needs n >= d for a full-rank cross-covariance.
        GaugeError: shapes differ, or the inputs are not finite.
    """
    s = as_float64_matrix(source, "source")
    t = as_float64_matrix(target, "target")
    if s.shape != t.shape:
        raise GaugeError(f"source {tuple(s.shape)} and target {tuple(t.shape)} must have the same shape")
    t = t.to(s.device)
    q, _ = polar_factors((s.mT @ t).unsqueeze(0), singular_floor=singular_floor, labels=["source->target"])
    q = q[0]
    t_norm = torch.linalg.matrix_norm(t)
    # Explicit residual (not the sigma identity) so that a perfect fit reports ~1e-16, not ~1e-8.
    resid = torch.linalg.matrix_norm(s @ q - t)
    residual = float(resid / t_norm) if float(t_norm) > 0 else float(resid)
    return q, residual
