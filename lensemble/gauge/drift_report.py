"""Frame-drift reports: :class:`FrameDriftReport` (the output of
:func:`lensemble.gauge.drift.frame_drift`), its pair keys, and its assembly from the measured pairs.

Each pair is read through the two drift magnitudes of its rotation Q (||Q - I||_F and the geodesic
angle, :mod:`lensemble.gauge.magnitudes`) and through the variance-weighted misalignment defined
below.

Variance-weighted misalignment (beside the two magnitudes, which weight all d directions alike, so
noise in weak directions can dominate them). For source X and target Y (same probe frames):

* ``relative_residual_before`` = ||X - Y||_F / ||Y||_F: the disagreement with no alignment (what
  naive averaging of the two frames sees); ``fit_residual`` = ||X Q* - Y||_F / ||Y||_F after the
  best rotation; ``rotation_share`` = 1 - after² / before², the share of the squared disagreement a
  rotation explains (what align-then-average recovers). Each weights a direction by its energy.
* ``subspace_angle_deg``: the geodesic angle of Q* *within* the principal subspace S of Y holding
  ``variance`` (95 %) of its (uncentred, as the gauge is linear) energy: with V_r a basis of S, the
  orthogonal polar factor of V_rᵀ Q* V_r. ``subspace_tilt_deg``: how far Q* turns S out of itself,
  the Grassmann distance sqrt(Σ φ_i²) from the principal angles φ_i between S and S Q*
  (cos φ_i = the singular values of V_rᵀ Q* V_r); ``subspace_rank`` = dim S.
  Two frames identical in their strong directions and random in the weak ones read ~0 on all of
  these while ||Q* - I||_F and the angle are large (tests/unit/test_drift.py).

Pairs ``a|b`` map a onto b, so these use b as the target (b's norm, b's principal subspace); the
two magnitudes above are symmetric in a and b, these are not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from pydantic import BaseModel, ConfigDict

from lensemble.model.collapse import effective_dim

__all__ = [
    "GLOBAL_KEY",
    "PAIR_SEP",
    "pair_key",
    "DriftToGlobal",
    "Misalignment",
    "PairSampling",
    "FrameDriftReport",
    "assemble_report",
]

GLOBAL_KEY = "global"
"""Reserved key: the global (server) model's probe embeddings."""

PAIR_SEP = "|"
"""Pair keys are ``f"{a}|{b}"`` with a < b; participant ids may not contain it."""


def pair_key(a: str, b: str) -> str:
    """The report key of the pair (a, b): ``"a|b"``, Q mapping a's frame onto b's."""
    return f"{a}{PAIR_SEP}{b}"


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DriftToGlobal(_Report):
    """One participant's frame against the global model's frame (Q maps participant -> global)."""

    residual: float | None
    """||Q - I||_F; None when the rotation is not identifiable (``degenerate="mask"``)."""
    angle_deg: float | None
    """Geodesic angle sqrt(½ Σ θ_j²), degrees; None as ``residual``."""
    fit_residual: float
    """||E_c Q - E_global||_F / ||E_global||_F: how much of the difference a rotation explains."""
    reflection: bool
    """det Q = -1."""
    # Variance-weighted misalignment (module docstring); None in reports written before them.
    relative_residual_before: float | None = None
    """||E_c - E_global||_F / ||E_global||_F: the disagreement before any alignment."""
    rotation_share: float | None = None
    """1 - fit_residual² / relative_residual_before²: the share a rotation explains."""
    subspace_angle_deg: float | None = None
    """Geodesic angle of Q within the global frame's 95 %-energy principal subspace, degrees."""
    subspace_tilt_deg: float | None = None
    """Grassmann distance between that subspace and its image under Q, degrees."""
    subspace_rank: int | None = None
    """Dimension of that subspace."""


Misalignment = DriftToGlobal
"""One source frame against one target frame: the fields of :class:`DriftToGlobal`."""


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

    schema_version: int = 3
    round_index: int
    probe_hash: str | None
    participants: list[str]
    num_probe: int
    latent_dim: int
    singular_floor: float
    pairwise_residual: dict[str, float | None]
    """||Q_ab - I||_F per pair (canonical drift magnitude); None for a degenerate pair."""
    pairwise_angle_deg: dict[str, float | None]
    """Geodesic angle per pair, degrees; None for a degenerate pair."""
    pairwise_fit_residual: dict[str, float]
    """||E_a Q - E_b||_F / ||E_b||_F per pair."""
    reflected_pairs: list[str]
    degenerate_pairs: list[str] = []
    """Pairs (``"a|b"``, ``"c|global"``) whose full rotation was not identifiable (version >= 3,
    ``degenerate="mask"``): their full magnitudes, and every mean over them, are None."""
    drift_from_global: dict[str, DriftToGlobal]
    effective_dim: dict[str, float]
    """Participation ratio per key, the global model included."""
    sampling: PairSampling
    mean_pairwise_residual: float | None
    mean_pairwise_angle_deg: float | None
    max_pairwise_angle_deg: float | None
    mean_global_residual: float | None
    mean_global_angle_deg: float | None
    # Variance-weighted misalignment per pair (module docstring); empty in version-1 reports.
    pairwise_relative_residual_before: dict[str, float] = {}
    """||E_a - E_b||_F / ||E_b||_F per pair (before alignment)."""
    pairwise_rotation_share: dict[str, float] = {}
    pairwise_subspace_angle_deg: dict[str, float | None] = {}
    pairwise_subspace_tilt_deg: dict[str, float | None] = {}
    pairwise_subspace_rank: dict[str, int] = {}
    subspace_variance: float = 0.95
    """Energy share that defines the principal subspace of the target frame."""
    probe_subset: dict | None = None
    """Which probe frames were measured (e.g. the measurement part of the probe split, with its
    index-set hash); None: the embeddings as given."""
    mean_pairwise_relative_residual_before: float | None = None
    mean_pairwise_fit_residual: float | None = None
    mean_pairwise_rotation_share: float | None = None
    mean_pairwise_subspace_angle_deg: float | None = None
    mean_global_relative_residual_before: float | None = None
    mean_global_fit_residual: float | None = None
    mean_global_rotation_share: float | None = None
    mean_global_subspace_angle_deg: float | None = None

    def summary_metrics(self) -> dict[str, float]:
        """Scalars under the stable JSONL keys (DESIGN §8): drift vs global when a global frame
        was given, else the pairwise means.

        ``gauge/drift_angle_deg`` / ``gauge/procrustes_residual``: the geodesic angle / ||Q − I||_F
        of each participant's (unaligned) frame against the global one, averaged over participants;
        ``gauge/drift_rel_residual_before`` / ``_after``: ||E − G||/||G|| without / with the best
        rotation; ``gauge/drift_rotation_share``: the share of that disagreement a rotation
        explains; ``gauge/drift_subspace_angle_deg``: the angle within the global frame's principal
        subspace (docs/gauge.md §3)."""
        out: dict[str, float] = {}
        g = bool(self.drift_from_global)
        pick = {
            "gauge/drift_angle_deg": self.mean_global_angle_deg if g else self.mean_pairwise_angle_deg,
            "gauge/procrustes_residual": self.mean_global_residual if g else self.mean_pairwise_residual,
            "gauge/drift_rel_residual_before": (self.mean_global_relative_residual_before if g
                                                else self.mean_pairwise_relative_residual_before),
            "gauge/drift_rel_residual_after": self.mean_global_fit_residual if g else self.mean_pairwise_fit_residual,
            "gauge/drift_rotation_share": self.mean_global_rotation_share if g else self.mean_pairwise_rotation_share,
            "gauge/drift_subspace_angle_deg": (self.mean_global_subspace_angle_deg if g
                                               else self.mean_pairwise_subspace_angle_deg),
        }
        out.update({k: v for k, v in pick.items() if v is not None})
        if self.effective_dim:
            vals = [v for k, v in self.effective_dim.items() if k != GLOBAL_KEY] or list(
                self.effective_dim.values()
            )
            out["gauge/effective_dim"] = math.fsum(vals) / len(vals)
        return out

    def pairwise_metrics(self) -> dict[str, float]:
        """Between-participant drift (no global frame involved), averaged over the measured pairs:
        ``gauge/pairwise_angle_deg``, ``gauge/pairwise_residual`` (||Q − I||_F),
        ``gauge/pairwise_rel_residual_before`` / ``_after``, ``gauge/pairwise_rotation_share``,
        ``gauge/pairwise_subspace_angle_deg``."""
        pick = {
            "gauge/pairwise_angle_deg": self.mean_pairwise_angle_deg,
            "gauge/pairwise_residual": self.mean_pairwise_residual,
            "gauge/pairwise_rel_residual_before": self.mean_pairwise_relative_residual_before,
            "gauge/pairwise_rel_residual_after": self.mean_pairwise_fit_residual,
            "gauge/pairwise_rotation_share": self.mean_pairwise_rotation_share,
            "gauge/pairwise_subspace_angle_deg": self.mean_pairwise_subspace_angle_deg,
        }
        return {k: v for k, v in pick.items() if v is not None}


def _mean(values: list[float | None]) -> float | None:
    """Mean, or None when empty or when any value is unmeasured (a partial mean would describe
    another set of participants)."""
    if not values or any(v is None for v in values):
        return None
    return math.fsum(values) / len(values)


def _none_if_nan(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else x


def assemble_report(
    pair_tasks: Sequence[tuple],
    global_tasks: Sequence[tuple],
    measured: Sequence[dict[str, list]],
    *,
    round_index: int,
    probe_hash: str | None,
    ids: list[str],
    keys: list[str],
    mats: Mapping[str, torch.Tensor],
    n: int,
    d: int,
    singular_floor: float,
    max_pairs: int | None,
    seed: int,
    sampled: bool,
    total: int,
    pairs: list[tuple[int, int]],
    variance: float,
    probe_subset: dict | None,
) -> FrameDriftReport:
    """The report of :func:`lensemble.gauge.drift.frame_drift` from its measured chunks.

    ``measured`` holds one result per task (``pair_tasks`` then ``global_tasks``, in that order),
    each task carrying its pair labels at index 5; the keyword arguments are frame_drift's
    values of the same names. Unmeasured numbers (NaN) become None, tables are sorted by pair key.
    """
    fields = ("frob", "angle", "fit", "before", "share", "sub_angle", "sub_tilt", "sub_rank")
    pair_vals: dict[str, dict[str, float | None]] = {f: {} for f in fields}
    reflected: list[str] = []
    degenerate_pairs: list[str] = []
    for task, res in zip(pair_tasks, measured[: len(pair_tasks)], strict=True):
        for b, label in enumerate(task[5]):
            for f in fields:
                pair_vals[f][label] = _none_if_nan(res[f][b])
            if res["refl"][b]:
                reflected.append(label)
            if res["degenerate"][b]:
                degenerate_pairs.append(label)

    from_global: dict[str, DriftToGlobal] = {}
    for task, res in zip(global_tasks, measured[len(pair_tasks) :], strict=True):
        for b, label in enumerate(task[5]):
            from_global[label.split(PAIR_SEP)[0]] = DriftToGlobal(
                residual=_none_if_nan(res["frob"][b]), angle_deg=_none_if_nan(res["angle"][b]),
                fit_residual=res["fit"][b], reflection=bool(res["refl"][b]),
                relative_residual_before=res["before"][b], rotation_share=res["share"][b],
                subspace_angle_deg=_none_if_nan(res["sub_angle"][b]),
                subspace_tilt_deg=_none_if_nan(res["sub_tilt"][b]), subspace_rank=int(res["sub_rank"][b]),
            )
            if res["degenerate"][b]:
                degenerate_pairs.append(label)

    pair_labels = sorted(pair_vals["frob"])

    def table(f: str, cast=float) -> dict:
        return {k: (None if pair_vals[f][k] is None else cast(pair_vals[f][k])) for k in pair_labels}

    def mean_of(f: str) -> float | None:
        return _mean([pair_vals[f][k] for k in pair_labels])

    def global_mean(attr: str) -> float | None:
        return _mean([getattr(v, attr) for v in from_global.values()])

    return FrameDriftReport(
        round_index=int(round_index),
        probe_hash=probe_hash,
        participants=ids,
        num_probe=n,
        latent_dim=d,
        singular_floor=float(singular_floor),
        pairwise_residual=table("frob"),
        pairwise_angle_deg=table("angle"),
        pairwise_fit_residual=table("fit"),
        reflected_pairs=sorted(reflected),
        degenerate_pairs=sorted(degenerate_pairs),
        drift_from_global=from_global,
        effective_dim={k: effective_dim(mats[k]) for k in keys},
        sampling=PairSampling(
            max_pairs=max_pairs,
            seed=int(seed),
            sampled=sampled,
            total_pairs=total,
            evaluated_pairs=len(pairs),
        ),
        mean_pairwise_residual=mean_of("frob"),
        mean_pairwise_angle_deg=mean_of("angle"),
        max_pairwise_angle_deg=(None if any(pair_vals["angle"][k] is None for k in pair_labels)
                                else max((pair_vals["angle"][k] for k in pair_labels), default=None)),
        mean_global_residual=global_mean("residual"),
        mean_global_angle_deg=global_mean("angle_deg"),
        pairwise_relative_residual_before=table("before"),
        pairwise_rotation_share=table("share"),
        pairwise_subspace_angle_deg=table("sub_angle"),
        pairwise_subspace_tilt_deg=table("sub_tilt"),
        pairwise_subspace_rank=table("sub_rank", int),
        subspace_variance=float(variance),
        probe_subset=probe_subset,
        mean_pairwise_relative_residual_before=mean_of("before"),
        mean_pairwise_fit_residual=mean_of("fit"),
        mean_pairwise_rotation_share=mean_of("share"),
        mean_pairwise_subspace_angle_deg=mean_of("sub_angle"),
        mean_global_relative_residual_before=global_mean("relative_residual_before"),
        mean_global_fit_residual=global_mean("fit_residual"),
        mean_global_rotation_share=global_mean("rotation_share"),
        mean_global_subspace_angle_deg=global_mean("subspace_angle_deg"),
    )
