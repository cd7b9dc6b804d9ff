"""Frame drift: how far participants' latent frames have rotated apart.

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
from pydantic import BaseModel, ConfigDict

from lensemble.config.seeds import torch_generator
from lensemble.errors import ConfigError, GaugeError, ProbeError
from lensemble.gauge.procrustes import as_float64_matrix, polar_factors
from lensemble.model.collapse import effective_dim

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
    "frame_drift",
]

GLOBAL_KEY = "global"
"""Reserved key: the global (server) model's probe embeddings."""

PAIR_SEP = "|"
"""Pair keys are ``f"{a}|{b}"`` with a < b; participant ids may not contain it."""

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


def pair_key(a: str, b: str) -> str:
    """The report key of the pair (a, b): ``"a|b"``, Q mapping a's frame onto b's."""
    return f"{a}{PAIR_SEP}{b}"


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DriftToGlobal(_Report):
    """One participant's frame against the global model's frame (Q maps participant -> global)."""

    residual: float
    """||Q - I||_F."""
    angle_deg: float
    """Geodesic angle sqrt(½ Σ θ_j²), degrees."""
    fit_residual: float
    """||E_c Q - E_global||_F / ||E_global||_F: how much of the difference a rotation explains."""
    reflection: bool
    """det Q = -1."""


class PairSampling(_Report):
    """Which pairs were measured. Above ``max_pairs`` a seeded uniform sample is drawn."""

    max_pairs: int | None
    seed: int
    sampled: bool
    total_pairs: int
    evaluated_pairs: int


class FrameDriftReport(_Report):
    """Output of :func:`frame_drift`. Plain JSON types only; dict keys are sorted.

    Pair dicts are keyed ``"a|b"`` with a < b (sorted ids), Q mapping a's frame onto b's.
    Magnitudes are symmetric in (a, b): Q_ba = Q_abᵀ has the same eigenvalue phases.
    """

    schema_version: int = 1
    round_index: int
    probe_hash: str | None
    participants: list[str]
    num_probe: int
    latent_dim: int
    singular_floor: float
    pairwise_residual: dict[str, float]
    """||Q_ab - I||_F per pair (canonical drift magnitude)."""
    pairwise_angle_deg: dict[str, float]
    """Geodesic angle per pair, degrees."""
    pairwise_fit_residual: dict[str, float]
    """||E_a Q - E_b||_F / ||E_b||_F per pair."""
    reflected_pairs: list[str]
    drift_from_global: dict[str, DriftToGlobal]
    effective_dim: dict[str, float]
    """Participation ratio per key, the global model included."""
    sampling: PairSampling
    mean_pairwise_residual: float | None
    mean_pairwise_angle_deg: float | None
    max_pairwise_angle_deg: float | None
    mean_global_residual: float | None
    mean_global_angle_deg: float | None

    def summary_metrics(self) -> dict[str, float]:
        """Scalars under the stable JSONL keys (DESIGN §8): drift vs global when a global frame
        was given, else the pairwise means."""
        out: dict[str, float] = {}
        angle = self.mean_global_angle_deg if self.drift_from_global else self.mean_pairwise_angle_deg
        resid = self.mean_global_residual if self.drift_from_global else self.mean_pairwise_residual
        if angle is not None:
            out["gauge/drift_angle_deg"] = angle
        if resid is not None:
            out["gauge/procrustes_residual"] = resid
        if self.effective_dim:
            vals = [v for k, v in self.effective_dim.items() if k != GLOBAL_KEY] or list(
                self.effective_dim.values()
            )
            out["gauge/effective_dim"] = math.fsum(vals) / len(vals)
        return out


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _select_pairs(c: int, max_pairs: int | None, seed: int) -> tuple[list[tuple[int, int]], int, bool]:
    all_pairs = [(i, j) for i in range(c) for j in range(i + 1, c)]
    total = len(all_pairs)
    if max_pairs is None or total <= max_pairs:
        return all_pairs, total, False
    # Seeded without the round index: the same pairs are tracked from round to round.
    perm = torch.randperm(total, generator=torch_generator(seed, "frame_drift", "pairs"))
    chosen = sorted(int(i) for i in perm[:max_pairs])
    return [all_pairs[i] for i in chosen], total, True


def _measure(
    sources: torch.Tensor,
    targets: torch.Tensor,
    source_sq: torch.Tensor,
    target_sq: torch.Tensor,
    labels: list[str],
    singular_floor: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched Procrustes + drift magnitudes for B (source, target) pairs.

    Args:
        sources, targets: (B, n, d) float64, or broadcastable (1, n, d).
        source_sq, target_sq: their squared Frobenius norms, (B,) or (1,).
    Returns:
        (frobenius, angle_deg, fit_residual, reflection), each (B,).
    """
    m = sources.mT @ targets  # (B, d, d) cross-covariances, one batched GEMM
    q, sigma = _fast_polar_factors(m, singular_floor, labels)
    frob, angle, refl = _fast_drift_magnitudes(q)
    # ||S Q - T||² = ||S||² + ||T||² - 2 tr(Qᵀ M) and tr(Qᵀ M) = Σ σ: no n x d product needed.
    fit2 = (source_sq + target_sq - 2.0 * sigma.sum(dim=-1)).clamp_min(0.0)
    fit = torch.sqrt(fit2) / torch.sqrt(target_sq).clamp_min(torch.finfo(torch.float64).tiny)
    return frob, angle, fit.expand_as(frob), refl


_Chunk = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, "slice | torch.Tensor", list[str]]
"""(sources, target pool, source_sq, target pool's sq norms, selection, labels): one
:func:`_measure` call on ``targets = pool[selection]``. A slice selects a view; an index tensor
(sampled pairs) is gathered only when the chunk runs, so at most ``workers`` copies exist at once."""


def _measure_chunks(
    tasks: list[_Chunk], singular_floor: float, workers: int
) -> list[tuple[list[float], list[float], list[float], list[bool]]]:
    """:func:`_measure` every chunk, ``workers`` chunks at a time; results in task order.

    The decompositions are d x d (d ~ 10^2): too small for LAPACK to use several threads well, so
    the threads go to whole chunks instead, each running with one torch thread. Every chunk
    therefore runs the same single-threaded kernels whatever ``workers`` is, which keeps the
    report bitwise identical across thread counts. An error (e.g. DegenerateProcrustes) surfaces
    from the first failing chunk in task order, as in a serial loop.
    """
    def one(task: _Chunk):
        sources, pool, source_sq, pool_sq, sel, labels = task
        fr, an, ft, rf = _measure(sources, pool[sel], source_sq, pool_sq[sel], labels, singular_floor)
        return fr.tolist(), an.tolist(), ft.tolist(), rf.tolist()

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

    Returns:
        FrameDriftReport. Bitwise identical for identical inputs (ids are sorted, the pair
        sample is seeded, and every reduction runs in a fixed order).

    Raises:
        ProbeError: probe hash mismatch (fail-closed).
        DegenerateProcrustes: a pair's cross-covariance is near rank-deficient (named in the
            error), e.g. collapsed latents or fewer probe frames than latent dimensions.
        GaugeError / ConfigError: malformed embeddings / arguments.

    Cost: one (d x n)(n x d) GEMM, one d x d symmetric eigendecomposition (of MᵀM), one d x d
    symmetric eigenvalue solve (of (Q + Qᵀ)/2), an LU (the reflection sign) and three d x d GEMMs
    per pair, all batched (the only Python loops run over participants and chunks, never over
    pairs); pairs that are ill-conditioned or turned by nearly π in some plane also take the SVD
    path (see the module docstring). Computed on CPU in float64 whatever the input device. Chunks
    of up to 32 pairs run ``workers`` at a time on threads (see :func:`_measure_chunks`).
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

    residual: dict[str, float] = {}
    angle: dict[str, float] = {}
    fit: dict[str, float] = {}
    reflected: list[str] = []

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
            pair_tasks.append((stacked[i].unsqueeze(0), stacked, sq_norms[i : i + 1], sq_norms, sel, labels))

    global_tasks: list[_Chunk] = []
    if GLOBAL_KEY in mats and ids:
        g = mats[GLOBAL_KEY].unsqueeze(0)
        g_sq = (g * g).sum(dim=(-2, -1))
        for start in range(0, len(ids), _CHUNK):
            stop = start + len(ids[start : start + _CHUNK])
            labels = [pair_key(k, GLOBAL_KEY) for k in ids[start:stop]]
            global_tasks.append((stacked[start:stop], g, sq_norms[start:stop], g_sq, slice(None), labels))

    measured = _measure_chunks(pair_tasks + global_tasks, singular_floor, workers)

    residual: dict[str, float] = {}
    angle: dict[str, float] = {}
    fit: dict[str, float] = {}
    reflected: list[str] = []
    for task, (fr, an, ft, rf) in zip(pair_tasks, measured[: len(pair_tasks)], strict=True):
        for b, label in enumerate(task[-1]):
            residual[label], angle[label], fit[label] = fr[b], an[b], ft[b]
            if rf[b]:
                reflected.append(label)

    from_global: dict[str, DriftToGlobal] = {}
    for task, (fr, an, ft, rf) in zip(global_tasks, measured[len(pair_tasks) :], strict=True):
        for b, label in enumerate(task[-1]):
            from_global[label.split(PAIR_SEP)[0]] = DriftToGlobal(
                residual=fr[b], angle_deg=an[b], fit_residual=ft[b], reflection=bool(rf[b])
            )

    pair_labels = sorted(residual)
    return FrameDriftReport(
        round_index=int(round_index),
        probe_hash=probe_hash,
        participants=ids,
        num_probe=n,
        latent_dim=d,
        singular_floor=float(singular_floor),
        pairwise_residual={k: residual[k] for k in pair_labels},
        pairwise_angle_deg={k: angle[k] for k in pair_labels},
        pairwise_fit_residual={k: fit[k] for k in pair_labels},
        reflected_pairs=sorted(reflected),
        drift_from_global=from_global,
        effective_dim={k: effective_dim(mats[k]) for k in keys},
        sampling=PairSampling(
            max_pairs=max_pairs,
            seed=int(seed),
            sampled=sampled,
            total_pairs=total,
            evaluated_pairs=len(pairs),
        ),
        mean_pairwise_residual=_mean([residual[k] for k in pair_labels]),
        mean_pairwise_angle_deg=_mean([angle[k] for k in pair_labels]),
        max_pairwise_angle_deg=max((angle[k] for k in pair_labels), default=None),
        mean_global_residual=_mean([v.residual for v in from_global.values()]),
        mean_global_angle_deg=_mean([v.angle_deg for v in from_global.values()]),
    )
