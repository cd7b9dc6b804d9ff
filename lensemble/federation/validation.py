"""Checks on what crosses the silo boundary, in both directions.

Server side: :func:`validate_updates` drops replies that must not enter the average (non-finite,
wrong shape, wrong round, oversize, undecodable) and says why; :func:`require_quorum` and
:func:`retry_or_raise` decide what happens when too few survive.

Participant side: :func:`check_egress` is the allow-list for a reply. Only the pseudo-gradient
payload, embeddings of the public probe and scalar metrics may leave; anything else raises
:class:`ResidencyViolation`, which is fail-closed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from lensemble.errors import (
    DiskFull,
    FaultToleranceExceeded,
    ReadOnlyFolder,
    ResidencyViolation,
    RoundError,
    SecureSumRejected,
    StorageError,
)
from lensemble.federation.codec import FP32_KEYS, INT8_KEYS, decode_delta, payload_nbytes
from lensemble.federation.outer import ParticipantId
from lensemble.federation.pseudograd import Layout, StateDict

log = logging.getLogger(__name__)

BYTES_PER_MB = 1024 * 1024  # max_update_mb is read as MiB

EGRESS_KEYS = frozenset({"delta", "probe_embeddings", "metrics"})


@dataclass(frozen=True)
class Update:
    """One participant's reply as the server sees it.

    ``payload``: the codec form of Δ (:mod:`lensemble.federation.codec`).
    ``round_index``: the round the participant says it trained for.
    ``probe_embeddings``: its (P, d) embeddings of the public probe, checked when
    :func:`validate_updates` is given an ``embedding_shape``.
    """

    participant_id: ParticipantId
    round_index: int
    payload: Mapping[str, np.ndarray]
    probe_embeddings: np.ndarray | None = None


@dataclass
class ValidationResult:
    """``accepted``: participant id → decoded fp32 Δ; ``rejected``: (participant id, reason)."""

    accepted: dict[ParticipantId, StateDict] = field(default_factory=dict)
    rejected: list[tuple[ParticipantId, str]] = field(default_factory=list)


def validate_delta(delta: Mapping[str, torch.Tensor], template: Mapping[str, torch.Tensor]) -> str | None:
    """Why a decoded Δ is unusable against the global ``template``, or ``None`` if it is fine.

    Checks keys (the template's floating entries), per-key shape and finiteness.
    """
    layout = Layout.of(template)
    if set(delta) != set(layout.names):
        return f"wrong keys: {len(set(layout.names) - set(delta))} missing, {len(set(delta) - set(layout.names))} extra"
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        if tuple(delta[name].shape) != shape:
            return f"wrong shape for {name}: {tuple(delta[name].shape)} vs {shape}"
        if not bool(torch.isfinite(delta[name]).all()):
            return f"non-finite values in {name}"
    return None


def validate_embeddings(embeddings, shape: tuple[int, int]) -> str | None:
    """Why a reply's probe embeddings are unusable, or ``None``: must be a finite float array of
    exactly ``shape`` (|P|, d) — (0, d) when privacy withholds them."""
    if not isinstance(embeddings, np.ndarray):
        return f"probe embeddings are a {type(embeddings).__name__}, not an array"
    if tuple(embeddings.shape) != tuple(shape):
        return f"probe embeddings have shape {tuple(embeddings.shape)}, expected {tuple(shape)}"
    if embeddings.dtype.kind != "f":
        return f"probe embeddings have dtype {embeddings.dtype}, expected a float type"
    if not bool(np.isfinite(embeddings).all()):
        return "probe embeddings hold non-finite values"
    return None


def validate_updates(
    updates: Iterable[Update],
    *,
    template: Mapping[str, torch.Tensor],
    round_index: int,
    max_update_mb: float,
    embedding_shape: tuple[int, int] | None = None,
) -> ValidationResult:
    """Decode and screen this round's updates against the global ``template``.

    Checks, cheapest first: duplicate participant, round index, payload keys, wire size
    (> ``max_update_mb`` MiB), dtype and element count, finiteness, then (with
    ``embedding_shape``) the probe embeddings' shape and finiteness. Each rejection is
    logged at WARNING with its reason and returned; accepted Δ are keyed by participant id.
    A participant that replies twice keeps its first verdict; the second reply is dropped.
    """
    layout = Layout.of(template)
    limit = max_update_mb * BYTES_PER_MB
    result = ValidationResult()

    def reject(pid: ParticipantId, reason: str) -> None:
        log.warning("round %d: dropping update from %r: %s", round_index, pid, reason)
        result.rejected.append((pid, reason))

    for upd in updates:
        pid = upd.participant_id
        if pid in result.accepted or any(pid == p for p, _ in result.rejected):
            reject(pid, "duplicate reply")
            continue
        if upd.round_index != round_index:
            reject(pid, f"wrong round: {upd.round_index} (expected {round_index})")
            continue
        if not isinstance(upd.payload, Mapping) or frozenset(upd.payload) not in (FP32_KEYS, INT8_KEYS):
            what = (
                sorted(map(str, upd.payload))
                if isinstance(upd.payload, Mapping)
                else type(upd.payload).__name__
            )
            reject(pid, f"malformed payload: {what}")
            continue
        nbytes = payload_nbytes(upd.payload)
        if nbytes > limit:
            reject(pid, f"oversize: {nbytes} bytes > {max_update_mb} MiB")
            continue
        try:
            delta = decode_delta(upd.payload, layout)
        except RoundError as exc:
            reject(pid, f"wrong shape: {exc.message}")
            continue
        except Exception as exc:  # a malformed payload is the sender's fault; never crash the round
            reject(pid, f"malformed payload: {exc}")
            continue
        reason = validate_delta(delta, template)
        if reason is None and embedding_shape is not None:
            reason = validate_embeddings(upd.probe_embeddings, embedding_shape)
        if reason is not None:
            reject(pid, reason)
            continue
        result.accepted[pid] = delta
    return result


def refuse_individual(round_index: int, replies: Mapping[str, object], secure_sum, what: str, plural: str) -> None:
    """Under secure aggregation: ResidencyViolation when the ask came without a SecAgg+ sum or a
    reply carries an individual ``what`` ("update", "summary"; ``plural`` its plural) in the clear."""
    if secure_sum is None:
        raise ResidencyViolation(f"round {round_index}: federation.secure_aggregation is on but the round came "
                                 f"with individual {plural}, not a SecAgg+ sum",
                                 remediation="secure aggregation runs on the Flower engines "
                                             "(--engine ray or flower-inprocess)")
    holding = sorted(pid for pid, r in replies.items() if r.payload)
    if holding:
        raise ResidencyViolation(f"round {round_index}: replies of {holding} carry an individual {what} under "
                                 "secure aggregation")


def check_contributors(round_index: int, contributors: Iterable[str], replies: Mapping[str, object],
                       embedding_shape: tuple[int, int], what: str) -> list[str]:
    """The sorted contributors of a secure sum, each with a usable reply record (this round, probe
    embeddings of ``embedding_shape``); SecureSumRejected naming the first that has none: its
    contribution is in the ``what`` sum whatever its side data, so the round cannot be used."""
    accepted = []
    for pid in sorted(contributors):
        r = replies.get(pid)
        why = ("sent no reply record" if r is None else
               f"wrong round {r.round_index}" if r.round_index != round_index else
               validate_embeddings(r.probe_embeddings, embedding_shape))
        if why:
            raise SecureSumRejected(f"round {round_index}: {pid} is in the {what} but its reply is unusable ({why})")
        accepted.append(pid)
    return accepted


def describe_failures(failures: Mapping[str, str]) -> str:
    """``"silo-1 did not reply within 5 s; silo-2 failed: RoundError [round_failed]"``."""
    return "; ".join(f"{who} {why}" for who, why in sorted(failures.items()))


def require_quorum(n_accepted: int, min_participants: int, *, round_index: int | None = None,
                   failures: Mapping[str, str] | None = None) -> None:
    """Raise :class:`FaultToleranceExceeded` when fewer than ``min_participants`` updates survived.

    ``failures`` (participant id -> what happened, a phrase such as "did not reply within 5 s")
    goes into the message, so it says what happened rather than only blaming the quorum.
    """
    if n_accepted < min_participants:
        where = f"round {round_index}: " if round_index is not None else ""
        what = f" ({describe_failures(failures)})" if failures else ""
        raise FaultToleranceExceeded(
            f"{where}{n_accepted} valid update(s), quorum is {min_participants}{what}",
            remediation=_storage_remedy(failures) or _screen_remedy(failures),
            accepted=n_accepted,
            min_participants=min_participants,
        )


def _screen_remedy(failures: Mapping[str, str] | None) -> str | None:
    """The remedy when the coordinator itself refused replies that arrived (the norm bound, the
    direction screen, the summary range checks of issue 47): bringing nodes back or waiting longer
    would not help. None keeps the default remedy."""
    from lensemble.federation.robust import DIRECTION_REASON, NORM_REASON
    from lensemble.federation.summary_checks import SUMMARY_REASON

    sites = sorted(who for who, why in (failures or {}).items()
                   if any(mark in why for mark in (NORM_REASON, DIRECTION_REASON, SUMMARY_REASON)))
    if not sites:
        return None
    return (f"the coordinator refused what {', '.join(sites)} sent (the reason is beside each): a broken or hostile "
            "participant; check that site (its data, its code, its inner learning rate) or leave it out of the run. "
            "If it is honest, loosen the screen that refused it (federation.update_norm_factor / update_norm_floor "
            "/ update_max_norm for the norm bound, federation.update_max_cancel for the direction screen; "
            "docs/federation.md, 'Threat model'); lowering federation.min_participants only lets the others' "
            "rounds commit without it")


def _storage_remedy(failures: Mapping[str, str] | None) -> str | None:
    """The remedy when a participant failed on its disk (a StorageError's label): fix the disk
    first; waiting longer (round_timeout_s) would not help. None keeps the default remedy."""
    sites = sorted(who for who, why in (failures or {}).items()
                   if any(f"[{cls.code}]" in why for cls in (DiskFull, ReadOnlyFolder, StorageError)))
    if not sites:
        return None
    return (f"{', '.join(sites)} failed writing at its site (see the cause above): free space there or make its "
            "state folder writable, then run the same command again to resume; otherwise lower "
            "federation.min_participants")


def retry_or_raise(error: FaultToleranceExceeded, attempt: int, round_retries: int) -> bool:
    """Decide what to do after a failed attempt at a round.

    ``attempt`` counts attempts at this round from 1. The round may be tried ``1 + round_retries``
    times in all (``federation.round_retries``); while attempts remain this returns ``True``
    (retry the same round: the global and its hash are unchanged), after that it re-raises
    ``error`` so the run stops.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if attempt <= round_retries:
        log.warning(
            "%s; retrying the round (attempt %d of %d)", error.message, attempt + 1, round_retries + 1
        )
        return True
    raise error


def check_egress(reply: Mapping[str, object]) -> None:
    """Allow-list for what a participant sends back; raises :class:`ResidencyViolation` otherwise.

    Allowed top-level keys: ``delta`` (a codec payload: exactly ``{fp32}`` or ``{q, scale}``),
    ``probe_embeddings`` (one array of public-probe embeddings, (P, d)), ``metrics`` (a mapping
    from str to int, float, str or bool). Any other key, extra arrays hidden in the payload, or a
    tensor or array among the metrics, is refused: the only way data leaves a silo is the way
    the design names.
    """
    if not isinstance(reply, Mapping):
        raise ResidencyViolation(f"reply must be a mapping, got {type(reply).__name__}")
    extra = sorted(str(k) for k in reply if k not in EGRESS_KEYS)
    if extra:
        raise ResidencyViolation(f"reply carries keys outside the egress allow-list: {extra}")

    if "delta" in reply:
        payload = reply["delta"]
        if not isinstance(payload, Mapping) or frozenset(payload) not in (FP32_KEYS, INT8_KEYS):
            keys = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
            raise ResidencyViolation(f"delta must be a codec payload ({{fp32}} or {{q, scale}}), got {keys}")
        for key, arr in payload.items():
            if not isinstance(arr, (np.ndarray, torch.Tensor)) or arr.ndim != 1:
                raise ResidencyViolation(f"delta[{key!r}] must be a flat array")

    if "probe_embeddings" in reply:
        emb = reply["probe_embeddings"]
        if not isinstance(emb, (np.ndarray, torch.Tensor)) or emb.ndim != 2:
            raise ResidencyViolation("probe_embeddings must be one (P, d) array")

    if "metrics" in reply:
        metrics = reply["metrics"]
        if not isinstance(metrics, Mapping):
            raise ResidencyViolation(f"metrics must be a mapping, got {type(metrics).__name__}")
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise ResidencyViolation(f"metric names must be str, got {type(key).__name__}")
            # np.float64 subclasses float and passes; tensors, arrays and containers do not
            if isinstance(value, (np.ndarray, torch.Tensor)) or not isinstance(
                value, (int, float, str, bool)
            ):
                raise ResidencyViolation(
                    f"metric {key!r} is a {type(value).__name__}; only int, float, str and bool may leave"
                )


# What a reply may carry when privacy is on: scalars that depend only on the config and on how
# often this silo has released (never on its data). Everything else is withheld (docs: Privacy).
DP_RELEASED_METRICS = frozenset({"dp/epsilon", "dp/releases", "fed/update_bytes", "fed/inner_steps",
                                 "fed/examples"})


def check_private_egress(reply: Mapping[str, object]) -> None:
    """The egress rule under DP: only the clipped, noised delta is data-dependent.

    Raises :class:`ResidencyViolation` (fail-closed) when a reply built with privacy on carries
    probe embeddings (any row) or a metric outside :data:`DP_RELEASED_METRICS`.
    """
    emb = reply.get("probe_embeddings")
    if emb is not None and (not hasattr(emb, "shape") or len(emb.shape) != 2 or emb.shape[0] != 0):
        raise ResidencyViolation("with privacy on, probe embeddings must be withheld (a (0, d) array)")
    extra = sorted(str(k) for k in dict(reply.get("metrics") or {}) if k not in DP_RELEASED_METRICS)
    if extra:
        raise ResidencyViolation(f"with privacy on, metrics {extra} would leave un-noised")


__all__ = [
    "BYTES_PER_MB",
    "DP_RELEASED_METRICS",
    "check_private_egress",
    "describe_failures",
    "validate_embeddings",
    "EGRESS_KEYS",
    "Update",
    "ValidationResult",
    "validate_delta",
    "validate_updates",
    "require_quorum",
    "retry_or_raise",
    "check_egress",
]
