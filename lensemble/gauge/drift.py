"""Frame drift: how far participants' latent frames have rotated apart.

The two drift magnitudes of an orthogonal Q (||Q - I||_F and the geodesic angle), their exact
(SVD) numerics and the handling of reflections are in :mod:`lensemble.gauge.magnitudes`; the
report, its pair keys and the variance-weighted misalignment it carries are in
:mod:`lensemble.gauge.drift_report`. Both are re-exported here. This module measures them:
:func:`frame_drift` for many frames at once, :func:`misalignment` for one pair of frames.

``frame_drift`` (thousands of d x d problems) takes a cheaper route to the same numbers, and uses
the path above only where the cheap one would lose accuracy (a per-item rule, see
_fast_polar_factors and _fast_drift_magnitudes): Q from eigh(MᵀM) instead of an SVD, and the
angles from the cosines eig((Q + Qᵀ)/2) as Σ θ_j² = ||Q - I||_F² + Σ_j [acos(c_j)² - 2(1 - c_j)],
one symmetric eigenvalue solve instead of two singular-value solves. Items whose cross-covariance
has sigma_min / sigma_max < 1e-4 (or < 10 x the singular floor), or whose rotation has a plane
within ~1.4e-3 rad of π (beyond a reflection's own -1 eigenvalue), go through the SVD path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from lensemble.config.seeds import torch_generator
from lensemble.errors import ConfigError, DegenerateProcrustes, GaugeError, ProbeError
from lensemble.gauge.drift_report import (
    GLOBAL_KEY,
    PAIR_SEP,
    DriftToGlobal,
    FrameDriftReport,
    Misalignment,
    PairSampling,
    assemble_report,
    pair_key,
)
from lensemble.gauge.magnitudes import (
    _reflection_flags,
    drift_magnitudes,
    frobenius_drift,
    geodesic_angle_deg,
    principal_angles,
)
from lensemble.gauge.procrustes import as_float64_matrix, polar_factors

__all__ = [
    "GLOBAL_KEY",
    "PAIR_SEP",
    "principal_angles",
    "geodesic_angle_deg",
    "frobenius_drift",
    "drift_magnitudes",
    "pair_key",
    "DriftToGlobal",
    "PairSampling",
    "FrameDriftReport",
    "Misalignment",
    "frame_drift",
    "misalignment",
]

# Pairs whose cross-covariances are decomposed in one batched call. Bounds the memory of the
# gathered embeddings (chunk x n x d float64) without giving up batching.
_CHUNK = 32

# Fast path of frame_drift (see _fast_polar_factors / _fast_drift_magnitudes). Items outside it go
# through the reference SVD path; which path an item takes depends on that item's numbers only.
_FAST_MIN_REL_SIGMA = 1e-4
"""Smallest sigma_min / sigma_max handled through eigh(MᵀM). Forming MᵀM squares the condition
number κ: Q's error is ~eps·κ², mostly a loss of orthogonality (measured at d = 192 against the
SVD: 5e-14 at κ = 1e2, 2e-12 at 1e3, 1e-10 at 1e4)."""
_FAST_REFINE_REL_SIGMA = 1e-2
"""Below this sigma_min / sigma_max, one Newton-Schulz step Q <- Q (3I - QᵀQ) / 2 restores
orthogonality (the part of the error the angles are most sensitive to): at κ = 1e4 Q then agrees
with the SVD to 3e-11 and the geodesic angle to 7e-10 degrees, instead of 1e-10 and 7e-8."""
_FAST_PI_MARGIN = 1e-6
"""Smallest 1 + cos θ (outside a reflection's own -1) read from cosines: acos's slope is
1 / sin θ, so θ² keeps about 1e-11 absolute accuracy down to this margin (π - θ >= 1.4e-3)."""


def _fast_polar_factors(
    cross_cov: torch.Tensor, singular_floor: float, labels: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`polar_factors` from the symmetric eigendecomposition, SVD where that is unsafe.

    MᵀM = V Λ Vᵀ (one batched eigh, about half the cost of an SVD with vectors), Σ = Λ^½ and
    Q = (M V Σ⁻¹) Vᵀ = U Vᵀ, the same factor as the SVD's. Forming MᵀM squares the condition
    number, so items with sigma_min / sigma_max (as read from Λ) below _FAST_REFINE_REL_SIGMA get
    one Newton-Schulz step, and items below max(_FAST_MIN_REL_SIGMA, 10 singular_floor) are
    redone with :func:`polar_factors`. The latter include every item the singular floor rejects
    (sigma_min² from Λ is off by at most ~eps·sigma_max², far inside the factor 10), so
    DegenerateProcrustes is raised by the same check, on the same SVD values, for the same first
    pair as before. Each item's path depends on that item's numbers only.

    Args:
        cross_cov: (B, d, d) float64. Returns (Q (B, d, d), sigma (B, d) descending), float64.
    """
    if singular_floor <= 0:  # as check_singular_floor, which the fast items never reach
        raise GaugeError(f"singular_floor must be > 0, got {singular_floor}")
    m = cross_cov
    amax = m.abs().amax(dim=(-2, -1))
    if not bool(torch.isfinite(amax).all()):  # overflowed products: whatever the SVD path does
        return polar_factors(m, singular_floor=singular_floor, labels=labels)
    # Exact power-of-two scaling per item: MᵀM can neither overflow nor underflow, and the
    # scaled arithmetic is bit-for-bit the unscaled one wherever the latter is representable.
    exponent = torch.frexp(amax).exponent.clamp(-1020, 1020)
    inv_scale = torch.ldexp(torch.ones_like(amax), -exponent)
    ms = m * inv_scale[:, None, None]
    lam, v = torch.linalg.eigh(ms.mT @ ms)  # ascending
    sig = lam.clamp_min(0.0).sqrt()
    cutoff = max(_FAST_MIN_REL_SIGMA, 10.0 * singular_floor)
    fast = (sig[:, -1] > 0) & (sig[:, 0] >= cutoff * sig[:, -1])
    safe = torch.where(fast[:, None], sig, torch.ones_like(sig))
    q = ((ms @ v) / safe[:, None, :]) @ v.mT
    refine = fast & (sig[:, 0] < _FAST_REFINE_REL_SIGMA * sig[:, -1])
    if bool(refine.any()):
        mid = torch.nonzero(refine).flatten()
        qm = q[mid]
        q[mid] = 1.5 * qm - 0.5 * (qm @ (qm.mT @ qm))
    sigma = sig.flip(-1) / inv_scale[:, None]
    if not bool(fast.all()):
        slow = torch.nonzero(~fast).flatten()
        q_slow, sigma_slow = polar_factors(
            m[slow], singular_floor=singular_floor, labels=[labels[int(i)] for i in slow]
        )
        q[slow] = q_slow
        sigma[slow] = sigma_slow
    return q, sigma


def _fast_drift_magnitudes(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`drift_magnitudes` of (B, d, d) orthogonal matrices, cosines first.

    The eigenvalues of (Q + Qᵀ)/2 are cos θ_j (one batched eigvalsh of a symmetric matrix, several
    times cheaper than the two singular-value solves of :func:`principal_angles`). The sum is
    split as Σ θ_j² = ||Q - I||_F² + Σ_j g(cos θ_j) with g(c) = acos(c)² - 2(1 - c): the first term
    is read from Q itself (full relative accuracy for small drift, where cosines are flat), and g's
    slope vanishes at c = 1, so an error eps in a cosine costs ~eps·θ²/3 there. Near c = -1 acos
    loses half its digits. A reflection has an eigenvalue exactly -1 of odd multiplicity, so its
    lowest cosine is set to -1; any other cosine within _FAST_PI_MARGIN of -1 (a plane turned by
    nearly π) sends the item to the SVD path of :func:`drift_magnitudes`, as does a reflection
    whose lowest cosine is not near -1 (never seen; a safety net).

    Returns:
        (frobenius (B,), angle_deg (B,), reflection (B,) bool), as :func:`drift_magnitudes`.
    """
    frob = frobenius_drift(q)
    refl = _reflection_flags(q)
    c = torch.linalg.eigvalsh((q + q.mT) * 0.5)  # ascending: θ descending
    near = -1.0 + _FAST_PI_MARGIN
    lowest = c[:, 0]
    second = c[:, 1] if c.shape[-1] > 1 else torch.full_like(lowest, math.inf)
    fast = torch.where(refl, (lowest < near) & (second >= near), lowest >= near)
    c[:, 0] = torch.where(refl, torch.full_like(lowest, -1.0), lowest)
    c = c.clamp(-1.0, 1.0)
    extra = torch.acos(c).square() - 2.0 * (1.0 - c)
    theta_sq = (frob.square() + extra.sum(dim=-1)).clamp_min(0.0)
    angle = torch.rad2deg(torch.sqrt(0.5 * theta_sq))
    if not bool(fast.all()):
        slow = torch.nonzero(~fast).flatten()
        angle[slow] = geodesic_angle_deg(q[slow])
    return frob, angle, refl


def _select_pairs(c: int, max_pairs: int | None, seed: int) -> tuple[list[tuple[int, int]], int, bool]:
    all_pairs = [(i, j) for i in range(c) for j in range(i + 1, c)]
    total = len(all_pairs)
    if max_pairs is None or total <= max_pairs:
        return all_pairs, total, False
    # Seeded without the round index: the same pairs are tracked from round to round.
    perm = torch.randperm(total, generator=torch_generator(seed, "frame_drift", "pairs"))
    chosen = sorted(int(i) for i in perm[:max_pairs])
    return [all_pairs[i] for i in chosen], total, True


_TINY_FLOOR = 1e-300
"""Singular floor of the within-subspace polar factor: only an exactly singular block is refused."""


def principal_basis(x: torch.Tensor, variance: float) -> tuple[torch.Tensor, int]:
    """Eigenvectors of XᵀX (d, d, columns by descending energy) and the smallest r whose leading
    eigenvalues hold ``variance`` of the total (uncentred: the gauge is linear). r = d for X = 0."""
    lam, v = torch.linalg.eigh(x.mT @ x)  # ascending
    lam, v = lam.flip(-1).clamp_min(0.0), v.flip(-1)
    total = float(lam.sum())
    if total <= 0.0:
        return v, int(x.shape[-1])
    share = torch.cumsum(lam, dim=-1) / total
    r = int(torch.searchsorted(share, torch.tensor([variance - 1e-12], dtype=share.dtype)).item()) + 1
    return v, min(r, int(x.shape[-1]))


def _subspace_magnitudes(q: torch.Tensor, basis: torch.Tensor, rank: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(angle within, tilt out of) each target's principal subspace, degrees, for (B, d, d) Q.

    C = Vᵀ Q V in the target's principal basis; its leading r x r block, padded with the identity
    to d x d (which adds only zero angles), gives the within-subspace rotation as its orthogonal
    polar factor and the principal angles between S and S Q as the arccosines of its singular
    values."""
    # Only the leading r_max columns matter (the padding below adds zero angles): on SIGReg
    # latents r ~ 12 of d = 64, so the decompositions are (r_max x r_max), not (d x d).
    d = max(int(rank.max()), 1)
    v = basis[..., :d]
    c = v.mT @ q @ v
    ar = torch.arange(d)
    inside = (ar[None, :, None] < rank[:, None, None]) & (ar[None, None, :] < rank[:, None, None])
    eye = torch.eye(d, dtype=q.dtype).expand_as(c)
    block = torch.where(inside, c, eye)
    try:
        # The cheap polar factor (eigh of BᵀB, SVD only where ill-conditioned): B is a contraction
        # with singular values cos φ_i, so it is ill-conditioned only when S is turned by ~90°.
        polar, sig = _fast_polar_factors(block, _TINY_FLOOR, ["subspace"] * block.shape[0])
    except DegenerateProcrustes:  # a direction of S turned fully out of it: any polar factor will do
        u, sig, vh = torch.linalg.svd(block)
        polar = u @ vh
    _, within, _ = _fast_drift_magnitudes(polar)
    phi = torch.acos(sig.clamp(-1.0, 1.0))
    tilt = torch.rad2deg(torch.sqrt((phi * phi).sum(dim=-1)))
    return within, tilt


_SUBSPACE_AMBIGUITY_TOL = 1e-3
"""Largest bound on the spectral norm of the unidentified part of Vᵀ Q V (the target subspace's
block of Q) at which a degenerate pair's subspace angle and tilt are still reported: the block's
polar factor, hence each of its angles, can then move by at most ~1e-3 rad (0.06°)."""


def _polar_or_any(
    m: torch.Tensor, singular_floor: float, labels: list[str], basis: torch.Tensor, rank: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`_fast_polar_factors` for the identifiable items, *a* polar factor for the others.

    Items that pass the singular floor get exactly the factor :func:`_fast_polar_factors` gives
    them (each item's path depends on its own numbers only, so their bits are those of the raising
    mode). A degenerate item gets U Vᵀ from its SVD: Q is then fixed on the singular directions
    above the floor and arbitrary (any orthogonal pairing) on the directions below it, U₀ (source
    side) and V₀ (target side). Its block C = V_rᵀ Q V_r in the target's principal subspace V_r
    (d, r) is therefore ambiguous by at most ||V_rᵀ U₀||₂ · ||V₀ᵀ V_r||₂, returned per item.

    Args:
        m: (B, d, d) float64 cross-covariances; basis (B, d, d), rank (B,): the targets' subspaces.
    Returns:
        (Q (B, d, d), sigma (B, d) descending, degenerate (B,) bool, ambiguity bound (B,) float64,
        0 for identified items).
    """
    try:
        q, sigma = _fast_polar_factors(m, singular_floor, labels)
        return q, sigma, torch.zeros(m.shape[0], dtype=torch.bool), torch.zeros(m.shape[0], dtype=torch.float64)
    except DegenerateProcrustes:
        pass
    # The same SVD polar_factors' floor check takes (not svdvals, whose driver may differ in the last
    # bits), so an item judged identifiable here passes that check inside _fast_polar_factors too.
    u_all, sv, vh_all = torch.linalg.svd(m)
    degenerate = (sv[:, 0] <= 0) | (sv[:, -1] < singular_floor * sv[:, 0])
    q = torch.empty_like(m)
    sigma = torch.empty_like(sv)
    ambiguity = torch.zeros(m.shape[0], dtype=torch.float64)
    ok = torch.nonzero(~degenerate).flatten()
    if len(ok):
        q[ok], sigma[ok] = _fast_polar_factors(m[ok], singular_floor, [labels[int(i)] for i in ok])
    bad = torch.nonzero(degenerate).flatten()
    u, s, vh = u_all[bad], sv[bad], vh_all[bad]
    q[bad], sigma[bad] = u @ vh, s
    below = ((s <= 0) | (s < singular_floor * s[:, :1]))[:, None, :].to(m.dtype)  # (k, 1, d) null columns
    cols = torch.arange(m.shape[-1])
    v_r = basis[bad] * (cols[None, :] < rank[bad][:, None])[:, None, :].to(m.dtype)  # (k, d, d), r columns kept
    left = torch.linalg.matrix_norm(v_r.mT @ (u * below), ord=2)
    right = torch.linalg.matrix_norm((vh.mT * below).mT @ v_r, ord=2)
    ambiguity[bad] = left * right
    return q, sigma, degenerate, ambiguity


def _measure(
    sources: torch.Tensor,
    targets: torch.Tensor,
    source_sq: torch.Tensor,
    target_sq: torch.Tensor,
    labels: list[str],
    singular_floor: float,
    basis: torch.Tensor,
    rank: torch.Tensor,
    mask: bool = False,
) -> dict[str, torch.Tensor]:
    """Batched Procrustes, drift magnitudes and the weighted misalignment for B pairs.

    Args:
        sources, targets: (B, n, d) float64, or broadcastable (1, n, d).
        source_sq, target_sq: their squared Frobenius norms, (B,) or (1,).
        basis, rank: the targets' principal bases (B or 1, d, d) and subspace ranks (B or 1,).
        mask: a degenerate pair does not raise (see :func:`_polar_or_any`): NaN where unmeasured.
    Returns:
        {"frob", "angle", "fit", "refl", "before", "share", "sub_angle", "sub_tilt", "sub_rank",
        "degenerate", "ambiguity"}, each (B,).
    """
    m = sources.mT @ targets  # (B, d, d) cross-covariances, one batched GEMM
    b = m.shape[0]
    basis = basis.expand(b, -1, -1)
    rank = rank.expand(b)
    if mask:
        q, sigma, degenerate, ambiguity = _polar_or_any(m, singular_floor, labels, basis, rank)
    else:
        q, sigma = _fast_polar_factors(m, singular_floor, labels)
        degenerate = torch.zeros(b, dtype=torch.bool)
        ambiguity = torch.zeros(b, dtype=torch.float64)
    frob, angle, refl = _fast_drift_magnitudes(q)
    tiny = torch.finfo(torch.float64).tiny
    t_norm = torch.sqrt(target_sq).clamp_min(tiny)
    # ||S Q - T||² = ||S||² + ||T||² - 2 tr(Qᵀ M) and tr(Qᵀ M) = Σ σ: no n x d product needed;
    # ||S - T||² the same with tr(M). Both accurate to ~1e-8 relative (cancellation).
    fit2 = (source_sq + target_sq - 2.0 * sigma.sum(dim=-1)).clamp_min(0.0)
    before2 = (source_sq + target_sq - 2.0 * torch.diagonal(m, dim1=-2, dim2=-1).sum(-1)).clamp_min(0.0)
    before2 = torch.maximum(before2, fit2)  # Q = I is a candidate: the fit can never be worse
    fit = (torch.sqrt(fit2) / t_norm).expand_as(frob)
    before = (torch.sqrt(before2) / t_norm).expand_as(frob)
    share = torch.where(before2 > 0, 1.0 - fit2 / before2.clamp_min(tiny), torch.zeros_like(before2)).expand_as(frob)
    sub_angle, sub_tilt = _subspace_magnitudes(q, basis, rank)
    nan = torch.full_like(frob, math.nan)
    # A degenerate item's full rotation is not identified: its magnitudes are unmeasured (NaN ->
    # None in the report). Its subspace ones are kept only where the unidentified part of Q cannot
    # reach the subspace (ambiguity bound below _SUBSPACE_AMBIGUITY_TOL).
    unidentified = ambiguity > _SUBSPACE_AMBIGUITY_TOL
    return {"frob": torch.where(degenerate, nan, frob), "angle": torch.where(degenerate, nan, angle),
            "fit": fit, "refl": refl & ~degenerate, "before": before, "share": share,
            "sub_angle": torch.where(unidentified, nan, sub_angle), "sub_tilt": torch.where(unidentified, nan, sub_tilt),
            "sub_rank": rank, "degenerate": degenerate, "ambiguity": ambiguity}


_Chunk = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "slice | torch.Tensor", list[str],
               torch.Tensor, torch.Tensor]
"""(sources, target pool, source_sq, target pool's sq norms, selection, labels, the pool's principal
bases, their ranks): one :func:`_measure` call on ``targets = pool[selection]``. A slice selects a
view; an index tensor (sampled pairs) is gathered only when the chunk runs, so at most ``workers``
copies exist at once."""


def _measure_chunks(tasks: list[_Chunk], singular_floor: float, workers: int, mask: bool = False) -> list[dict[str, list]]:
    """:func:`_measure` every chunk, ``workers`` chunks at a time; results in task order.

    The decompositions are d x d (d ~ 10^2): too small for LAPACK to use several threads well, so
    the threads go to whole chunks instead, each running with one torch thread. Every chunk
    therefore runs the same single-threaded kernels whatever ``workers`` is, which keeps the
    report bitwise identical across thread counts. An error (e.g. DegenerateProcrustes) surfaces
    from the first failing chunk in task order, as in a serial loop.
    """
    def one(task: _Chunk):
        sources, pool, source_sq, pool_sq, sel, labels, bases, ranks = task
        out = _measure(sources, pool[sel], source_sq, pool_sq[sel], labels, singular_floor, bases[sel], ranks[sel],
                       mask)
        return {k: v.tolist() for k, v in out.items()}

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if workers <= 1 or len(tasks) <= 1:
            return [one(t) for t in tasks]
        from concurrent.futures import ThreadPoolExecutor

        # torch releases the GIL inside its kernels, so plain threads run chunks in parallel.
        with ThreadPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
            return list(pool.map(one, tasks))
    finally:
        torch.set_num_threads(previous)


def frame_drift(
    embeddings: Mapping[str, torch.Tensor],
    *,
    round_index: int = 0,
    probe_hash: str | None = None,
    expected_probe_hash: str | None = None,
    max_pairs: int | None = None,
    seed: int = 0,
    singular_floor: float = 1e-6,
    workers: int | None = None,
    variance: float = 0.95,
    probe_subset: dict | None = None,
    degenerate: str = "raise",
) -> FrameDriftReport:
    """Pairwise frame drift between participants (and against the global model) on a probe.

    Args:
        embeddings: id -> (n, d) embeddings of the SAME n public probe frames, in the same order.
            The reserved id ``"global"`` is the global model; it is compared with every
            participant (``drift_from_global``) and excluded from the pairwise table. Ids may
            not contain ``"|"``.
        round_index: recorded in the report.
        probe_hash: content hash of the probe the embeddings came from (recorded).
        expected_probe_hash: when given, must equal ``probe_hash`` (else ProbeError).
        max_pairs: above this many participant pairs, measure a seeded uniform sample of
            ``max_pairs`` pairs (derived from ``seed``; the same pairs every round).
        seed: root seed for the pair sample.
        singular_floor: relative singular-value floor of every Procrustes problem.
        workers: chunks of pairs measured concurrently, one torch thread each (default: the
            process's torch thread count, ``torch.get_num_threads()``). Does not change the result.
        variance: energy share of the target's principal subspace (``subspace_*`` fields).
        probe_subset: recorded as is: which probe frames the embeddings are (e.g. the
            measurement part of :func:`lensemble.data.probe.split_probe`, with its hash).
        degenerate: ``"raise"``: a pair whose full rotation is not identifiable raises
            DegenerateProcrustes. ``"mask"``: it is listed in ``degenerate_pairs``, its ||Q − I||_F
            and geodesic angle are None (unmeasured, and so is any mean over them), and its
            variance-weighted numbers are still reported: the residuals and rotation share always
            (they need only the singular values), the subspace angle and tilt where the
            unidentified part of Q provably cannot reach the target's principal subspace
            (``_SUBSPACE_AMBIGUITY_TOL``). Identifiable pairs read bit for bit as under "raise".

    Returns:
        FrameDriftReport. Bitwise identical for identical inputs (ids are sorted, the pair
        sample is seeded, and every reduction runs in a fixed order).

    Raises:
        ProbeError: probe hash mismatch (fail-closed).
        DegenerateProcrustes: (``degenerate="raise"``) a pair's cross-covariance is near
            rank-deficient (named in the error), e.g. collapsed latents, latents with dead
            directions, or fewer probe frames than latent dimensions.
        GaugeError / ConfigError: malformed embeddings / arguments.

    Cost: one (d x n)(n x d) GEMM, one d x d symmetric eigendecomposition (of MᵀM), one d x d
    symmetric eigenvalue solve (of (Q + Qᵀ)/2), an LU (the reflection sign), a d x d SVD (the
    principal-subspace polar factor) and five d x d GEMMs per pair, plus one eigh per embedding
    (its principal basis), all batched (the only Python loops run over participants and chunks,
    never over pairs); pairs that are ill-conditioned or turned by nearly π in some plane also
    take the SVD path (see the module docstring). Computed on CPU in float64 whatever the input
    device. Chunks of up to 32 pairs run ``workers`` at a time on threads (see
    :func:`_measure_chunks`).
    """
    if expected_probe_hash is not None and probe_hash != expected_probe_hash:
        raise ProbeError(
            f"probe hash {probe_hash!r} does not match the expected {expected_probe_hash!r}; "
            "drift between frames measured on different probes is meaningless",
            probe_hash=probe_hash,
            expected_probe_hash=expected_probe_hash,
        )
    if max_pairs is not None and (
        isinstance(max_pairs, bool) or not isinstance(max_pairs, int) or max_pairs < 1
    ):
        raise ConfigError(f"max_pairs must be a positive int or None, got {max_pairs!r}")
    if workers is None:
        workers = torch.get_num_threads()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be a positive int or None, got {workers!r}")
    if not 0.0 < float(variance) <= 1.0:
        raise ConfigError(f"variance must be in (0, 1], got {variance!r}")
    if degenerate not in ("raise", "mask"):
        raise ConfigError(f"degenerate must be 'raise' or 'mask', got {degenerate!r}")
    if not isinstance(embeddings, Mapping) or len(embeddings) == 0:
        raise GaugeError("embeddings must be a non-empty mapping id -> (n, d) tensor")
    for key in embeddings:
        if not isinstance(key, str) or not key:
            raise GaugeError(f"embedding ids must be non-empty strings, got {key!r}")
        if PAIR_SEP in key:
            raise GaugeError(f"embedding id {key!r} contains the reserved pair separator {PAIR_SEP!r}")

    keys = sorted(embeddings)
    # Always on CPU: float64 decompositions of many small d x d matrices are latency-bound on a
    # GPU (an H200 was 1.8x slower than one CPU core at d = 192), and computing in one place
    # makes the report's bits independent of where the embeddings were produced.
    mats = {k: as_float64_matrix(embeddings[k], f"embeddings[{k!r}]").cpu() for k in keys}
    shape = mats[keys[0]].shape
    for k in keys:
        if mats[k].shape != shape:
            raise GaugeError(f"embeddings[{k!r}] has shape {tuple(mats[k].shape)}, expected {tuple(shape)}")
    n, d = int(shape[0]), int(shape[1])

    ids = [k for k in keys if k != GLOBAL_KEY]
    stacked = torch.stack([mats[k] for k in ids]) if ids else torch.empty(0, n, d, dtype=torch.float64)
    pairs, total, sampled = _select_pairs(len(ids), max_pairs, seed)
    # Every embedding's principal basis once (the weighted measures use the target's).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # small decompositions: one thread each, as in _measure_chunks
    try:
        bases_ranks = [principal_basis(mats[k], float(variance)) for k in ids]
        g_basis_rank = principal_basis(mats[GLOBAL_KEY], float(variance)) if GLOBAL_KEY in mats else None
    finally:
        torch.set_num_threads(previous)
    bases = torch.stack([b for b, _ in bases_ranks]) if ids else torch.empty(0, d, d, dtype=torch.float64)
    ranks = torch.tensor([r for _, r in bases_ranks], dtype=torch.long)

    # Group pairs by their first member: each group is one (k, d, d) batch whose source is a
    # single un-copied matrix broadcast against its partners (a view when they are consecutive,
    # i.e. always unless pairs are sampled).
    groups: dict[int, list[int]] = {}
    for i, j in pairs:
        groups.setdefault(i, []).append(j)
    # Squared norms once per participant (the fit residual needs them for every pair).
    sq_norms = (stacked * stacked).sum(dim=(-2, -1))
    pair_tasks: list[_Chunk] = []
    for i in sorted(groups):
        partners = groups[i]
        for start in range(0, len(partners), _CHUNK):
            js = partners[start : start + _CHUNK]
            labels = [pair_key(ids[i], ids[j]) for j in js]
            if js[-1] - js[0] == len(js) - 1:  # consecutive partners (no sampling): a view, no copy
                sel: slice | torch.Tensor = slice(js[0], js[-1] + 1)
            else:
                sel = torch.tensor(js, dtype=torch.long, device=stacked.device)
            pair_tasks.append((stacked[i].unsqueeze(0), stacked, sq_norms[i : i + 1], sq_norms, sel, labels,
                               bases, ranks))

    global_tasks: list[_Chunk] = []
    if GLOBAL_KEY in mats and ids:
        g = mats[GLOBAL_KEY].unsqueeze(0)
        g_sq = (g * g).sum(dim=(-2, -1))
        g_basis, g_rank = g_basis_rank
        g_bases, g_ranks = g_basis.unsqueeze(0), torch.tensor([g_rank], dtype=torch.long)
        for start in range(0, len(ids), _CHUNK):
            stop = start + len(ids[start : start + _CHUNK])
            labels = [pair_key(k, GLOBAL_KEY) for k in ids[start:stop]]
            global_tasks.append((stacked[start:stop], g, sq_norms[start:stop], g_sq, slice(None), labels,
                                 g_bases, g_ranks))

    measured = _measure_chunks(pair_tasks + global_tasks, singular_floor, workers, mask=degenerate == "mask")
    return assemble_report(
        pair_tasks, global_tasks, measured, round_index=round_index, probe_hash=probe_hash, ids=ids,
        keys=keys, mats=mats, n=n, d=d, singular_floor=singular_floor, max_pairs=max_pairs, seed=seed,
        sampled=sampled, total=total, pairs=pairs, variance=variance, probe_subset=probe_subset,
    )


def misalignment(
    source: torch.Tensor, target: torch.Tensor, *, singular_floor: float = 1e-6, variance: float = 0.95
) -> Misalignment:
    """Every drift number of one (n, d) source frame against one (n, d) target frame: ||Q − I||_F,
    the geodesic angle and the variance-weighted misalignment (the source is mapped onto the
    target, which sets the norm and the principal subspace). Same code path as :func:`frame_drift`."""
    report = frame_drift({"source": source, GLOBAL_KEY: target}, singular_floor=singular_floor,
                         variance=variance, workers=1)
    return report.drift_from_global["source"]
