"""Secure aggregation, framework-free: the bounds, the participant's pre-mask check, the sum check.

With ``federation.secure_aggregation`` each participant's released pseudo-gradient Δ_c (after
alignment, clipping and DP noise, in that order: :mod:`lensemble.federation.release`) is masked
with Flower's SecAgg+ (:mod:`lensemble.federation.flower.secagg` drives it); the coordinator
only ever holds the unmasked sum S = Σ_c Δ_c over the C participants whose masked vectors
arrived. This module holds what does not depend on Flower:

- :class:`SecAggSettings`: the quantisation SecAgg+ applies and the error it adds. Every
  coordinate is clipped to [-c, c] (``secagg_clip_range``; a participant refuses rather than let
  Flower clip silently), mapped to [0, 2^b] (``secagg_bits``) and stochastically rounded, so each
  participant's coordinate is off by less than one quantum q = 2c/2^b; the sum by < C·q, the
  mean by < q. Sums live modulo 2^32 (Flower's mask modulus), hence C·2^b < 2^32.
- :func:`check_before_masking` (participant side): finite, the global's size, |Δ_i| <= c and
  ‖Δ‖₂ <= B (``secagg_max_norm``, default c·√n). Once masked, nobody can check an update.
- :func:`check_secure_sum` (coordinator side): the sum is finite, has n coordinates, and stays
  within C times the per-update bounds (plus the quantisation slack); otherwise the round fails
  closed (:class:`~lensemble.errors.SecureSumRejected`). A failed unmask yields coordinates
  spread over the whole modulus (up to 256·c at b = 24), which this catches.
- :func:`mean_from_sum`: Δ̄ = S / C for the Nesterov outer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from lensemble.config.schema import FederationConfig
from lensemble.errors import RoundError, SecureSumRejected
from lensemble.federation.checks import MOD_BITS
from lensemble.federation.pseudograd import Layout, StateDict, unflatten


@dataclass(frozen=True)
class SecAggSettings:
    """The SecAgg+ quantisation and threshold of a run (see the module docstring)."""

    clip_range: float  # c: coordinates must lie in [-c, c]
    bits: int  # b: [-c, c] maps to 2^b levels
    threshold: int  # t: shares needed to reconstruct a participant's secrets
    max_norm: float | None = None  # B: L2 bound per released Δ; None -> c·√n

    @classmethod
    def from_config(cls, federation: FederationConfig) -> SecAggSettings:
        return cls(clip_range=float(federation.secagg_clip_range), bits=int(federation.secagg_bits),
                   threshold=int(federation.secagg_threshold),
                   max_norm=None if federation.secagg_max_norm is None else float(federation.secagg_max_norm))

    @property
    def levels(self) -> int:
        """Flower's ``quantization_range``: 2^b."""
        return 1 << self.bits

    @property
    def modulus(self) -> int:
        """Flower's ``modulus_range``: 2^32."""
        return 1 << MOD_BITS

    @property
    def quantum(self) -> float:
        """q = 2c/2^b: one quantisation step, the bound on one participant's coordinate error."""
        return 2.0 * self.clip_range / self.levels

    def norm_bound(self, numel: int) -> float:
        """B: the L2 bound on one released Δ of ``numel`` coordinates."""
        return self.max_norm if self.max_norm is not None else self.clip_range * math.sqrt(numel)

    def sum_error_bound(self, participants: int) -> float:
        """L∞ bound on |S_secure - S_plain| per coordinate: C·q (stochastic rounding, one step each)."""
        return participants * self.quantum

    def mean_error_bound(self) -> float:
        """L∞ bound on |Δ̄_secure - Δ̄_plain| per coordinate: q (independent of C)."""
        return self.quantum

    def max_participants(self) -> int:
        """The most participants whose quantised sum fits below the modulus: C·2^b < 2^32."""
        return (self.modulus - 1) // self.levels


def outer_error_bound(mean_error: float, rounds: int, *, lr: float, momentum: float, nesterov: bool) -> float:
    """L∞ bound on the parameter difference after ``rounds`` outer steps whose mean Δ̄ differ by at
    most ``mean_error`` per coordinate each round, everything else equal.

    Velocity error after round r: e_v(r) = Σ_{k<r} μ^k·ε. Step error: η·(ε + μ·e_v(r)) with
    Nesterov, η·e_v(r) without; summed over the rounds. One outer step (rounds=1, Nesterov):
    η·(1+μ)·ε. This assumes the same Δ_c in both runs: in a whole run round r+1's Δ depends on
    round r's global, so the end-to-end difference adds the training's sensitivity on top.
    """
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    total, e_v = 0.0, 0.0
    for _ in range(rounds):
        e_v = momentum * e_v + mean_error
        total += lr * (mean_error + momentum * e_v) if nesterov else lr * e_v
    return total


def check_before_masking(flat: np.ndarray, numel: int, settings: SecAggSettings) -> dict[str, float]:
    """The participant's own check of its released Δ (flat, (n,)) before SecAgg+ masks it.

    Raises RoundError (the participant sends nothing) when Δ is not finite, does not have the
    global's ``numel`` coordinates, has a coordinate outside [-c, c] (Flower would clip it
    silently and the sum would be wrong by more than the stated bound) or ‖Δ‖₂ > B. Returns
    ``{"fed/secagg_update_max_abs", "fed/secagg_update_norm"}`` for the site's own log.
    """
    arr = np.asarray(flat)
    if arr.ndim != 1 or arr.size != numel:
        raise RoundError(f"released update has shape {arr.shape}, the global model has {numel} coordinates",
                         remediation="the participant and the coordinator run different model configs")
    if arr.dtype.kind != "f" or not bool(np.isfinite(arr).all()):
        raise RoundError("released update is not finite; refusing to mask it",
                         remediation="Local training diverged: lower the inner learning rate or H.")
    x = arr.astype(np.float64, copy=False)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    norm = float(np.linalg.norm(x))
    if peak > settings.clip_range:
        raise RoundError(f"a coordinate of the released update is {peak:.4g}, outside the SecAgg+ range "
                         f"[-{settings.clip_range:g}, {settings.clip_range:g}]",
                         remediation="raise federation.secagg_clip_range (the error bound grows with it)")
    bound = settings.norm_bound(numel)
    if norm > bound:
        raise RoundError(f"released update has norm {norm:.4g} > federation.secagg_max_norm {bound:.4g}",
                         remediation="raise federation.secagg_max_norm, or clip (privacy.clip_norm)")
    return {"fed/secagg_update_max_abs": peak, "fed/secagg_update_norm": norm}


def check_secure_sum(total: np.ndarray, participants: int, numel: int, settings: SecAggSettings, *,
                     round_index: int | None = None) -> dict[str, float]:
    """The coordinator's check of the unmasked sum S (flat, (n,)) of ``participants`` updates.

    Each update had |Δ_i| <= c and ‖Δ‖₂ <= B before quantisation, which adds < q per coordinate,
    so a genuine sum has |S_i| <= C·(c + q) and ‖S‖₂ <= C·(B + q·√n). Anything else (non-finite,
    wrong size, beyond those bounds) raises :class:`SecureSumRejected` and nothing is committed.
    Returns ``{"fed/secagg_sum_max_abs", "fed/secagg_sum_norm"}``.
    """
    where = f"round {round_index}: " if round_index is not None else ""
    arr = np.asarray(total)
    if participants < 2:
        raise SecureSumRejected(f"{where}a secure sum of {participants} update(s) would reveal an update")
    if arr.ndim != 1 or arr.size != numel:
        raise SecureSumRejected(f"{where}the unmasked sum has shape {arr.shape}, the global has {numel} coordinates")
    if arr.dtype.kind != "f" or not bool(np.isfinite(arr).all()):
        raise SecureSumRejected(f"{where}the unmasked sum is not finite")
    x = arr.astype(np.float64, copy=False)
    q = settings.quantum
    peak, norm = float(np.max(np.abs(x))), float(np.linalg.norm(x))
    peak_bound = participants * (settings.clip_range + q)
    norm_bound = participants * (settings.norm_bound(numel) + q * math.sqrt(numel))
    if peak > peak_bound:
        raise SecureSumRejected(f"{where}a coordinate of the unmasked sum of {participants} updates is "
                                f"{peak:.4g} > C·(c + q) = {peak_bound:.4g}")
    if norm > norm_bound:
        # [robust] honest updates each pass ‖Δ‖ <= B on their own site; a sum beyond C·B holds one that did
        # not (a participant that skipped its check, Flower clipping it to ±c) or a failed unmask
        raise SecureSumRejected(f"{where}the unmasked sum of {participants} updates has norm {norm:.4g} > "
                                f"C·(B + q·√n) = {norm_bound:.4g} (B = {settings.norm_bound(numel):.4g}): "
                                "a participant released an update above the bound its own check enforces, "
                                "or the unmasking failed",
                                remediation="Nothing was committed for this round. Find the site whose update is "
                                            "out of range (its log; a site without the pre-mask check is broken or "
                                            "hostile), exclude it, then resume the run to retry the round.")
    return {"fed/secagg_sum_max_abs": peak, "fed/secagg_sum_norm": norm}


def mean_from_sum(total: np.ndarray, participants: int, layout: Layout) -> StateDict:
    """Δ̄ = S / C in fp64, rounded once to fp32, laid out like the global's federated tensors."""
    mean = torch.from_numpy(np.asarray(total, dtype=np.float64) / float(participants))
    return unflatten(mean.to(torch.float32), layout)


@dataclass(frozen=True)
class SecureSum:
    """What a secure round hands the coordinator instead of individual updates.

    ``total``: S = Σ_c Δ_c, float64 (n,), as SecAgg+ unmasked it; ``contributors``: the
    participant ids whose masked vectors are in it (sorted); ``nodes``: how many nodes completed
    each stage (for the round's log).
    """

    total: np.ndarray
    contributors: tuple[str, ...]
    stages: tuple[tuple[str, int], ...] = ()

    @property
    def participants(self) -> int:
        return len(self.contributors)


__all__ = ["SecAggSettings", "SecureSum", "outer_error_bound", "check_before_masking", "check_secure_sum",
           "mean_from_sum"]
