"""The pooled objective under federation: the summary exchange at the start of each round.

With ``objective.sigreg_scope=pooled`` or ``objective.bn_scope=pooled`` a round has two to four
asks (the passes of :data:`PHASES`, then the train ask):

0. **moments** (round config ``phase=moments``; only when SIGReg *and* BatchNorm are pooled):
   every participant replies with the BatchNorm input moments of its ``objective.summary_clips``
   clips under the round's global model (3H floats). The coordinator pools them like summaries;
   their mean goes down with the summary ask. Why a pass of its own: the ECF a participant
   subtracts as its own summary must be that of latents normalised as its live batch will be at
   its first inner step, i.e. with the round's *pooled* moments, which exist only once every
   participant's moments are in. Encoding it under the global's running statistics instead (the
   eval-mode shortcut this replaced) left a mismatch: on a committed warm start the pooled SIGReg
   each silo descended at inner step 0 was 22.9 where the consistent value is 14.3 (issue 43).
1. **summary** (round config ``phase=summary``): every participant encodes the same clips with
   the round's global model (under the pooled moments of step 0, when there is one) and replies
   with its :class:`~lensemble.model.pooled.SiloSummary` (ECF means on the round's shared sketch,
   BatchNorm input moments) as a flat fp32 payload, nothing else (no probe embeddings). It keeps
   its own summary on its disk for step 2. The coordinator validates the replies like updates
   (shape, finiteness, round), requires the quorum and averages them: the pooled summary.
1b. **moment gradients** (``phase=moment-gradients``; BatchNorm pooled and
   ``objective.bn_cross_gradient``): under the pooled summary each participant sends the gradient
   of its first inner step's loss with respect to the pooled BatchNorm moments, through its own
   outputs (2H floats: :func:`~lensemble.training.pooling.moment_gradients`); the train ask carries
   their mean and each participant adds the others' part to the gradient of its moments at every
   inner step. This is the part of SyncBatchNorm's backward a summary of latents cannot carry:
   without it the mean update misses how a silo's frames move the *other* silos' outputs through
   the pooled moments, which on a test-size model was 3.4 times the data-parallel step's norm
   (tests/unit/test_pooled_exact.py).
2. **train**: the extras carry the pooled mean (``pooled.*`` arrays) and the contributing
   partition ids (``pooled.members``); each participant rebuilds the others' part (C·mean − own,
   :func:`~lensemble.model.pooled.others_pooling`) and trains its H inner steps on its live batch
   pooled with it (fixed). So summaries are as stale as H inner steps, never older than the round.

Cost per participant and round: S·(2K + 1) + 3H floats up (17,920 at S = 512, K = 17, plus
1,536 for a 512-wide BatchNorm: ~78 KB), the pooled mean down, and one forward pass over the
summary clips. The global model goes down once: in the summary ask; each participant keeps it
and the train ask names it by its digest instead (:mod:`lensemble.federation.global_cache`).
``fed/summary_bytes`` counts the summary ask both ways.
What a summary reveals, and why privacy refuses it: docs/federation.md, "The pooled objective".

Under ``federation.secure_aggregation`` the summary ask runs Flower's SecAgg+ stages like the train
ask, so the coordinator learns only the sum of the summaries (:func:`close_secure_summaries`).
Every coordinate must then lie in the SecAgg+ range [-c, c] (``federation.secagg_clip_range``):
a summary travels divided field by field by public divisors (:func:`secure_summary_divisors`: c
for the squared BatchNorm input means, 1 for everything else), and a participant whose scaled
summary still has a coordinate outside [-c, c] refuses the round naming the field
(:func:`secure_summary_payload`) rather than let Flower clip it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from lensemble.config.schema import LensembleConfig
from lensemble.config.seeds import torch_generator
from lensemble.errors import RoundError, SecureSumRejected
from lensemble.federation.codec import encode_delta
from lensemble.federation.messages import Reply
from lensemble.federation.pseudograd import Layout, unflatten
from lensemble.federation.secure_agg import SecAggSettings, SecureSum, check_secure_sum
from lensemble.federation.summary_checks import check_summary, screen_summaries
from lensemble.federation.validation import (
    Update,
    check_contributors,
    refuse_individual,
    require_quorum,
    validate_updates,
)
from lensemble.model.objective import BatchStatistics
from lensemble.model.pooled import (
    GRADIENT_FIELDS,
    MOMENT_FIELDS,
    SiloSummary,
    others_pooling,
    pooled_moments,
    raw_gradients,
)
from lensemble.training.pooling import (
    moment_gradients,
    needs_gradient_pass,
    needs_moments_first,
    participant_statistics,
    pools_anything,
    pools_batchnorm,
    pools_sigreg,
    summarise,
)

SUMMARY_PHASE = "summary"
MOMENTS_PHASE = "moments"
GRADIENT_PHASE = "moment-gradients"
PHASES = (MOMENTS_PHASE, SUMMARY_PHASE, GRADIENT_PHASE)  # in the order a round runs them
PREFIX = "pooled."
MEMBERS = PREFIX + "members"
GRADIENT_MEMBERS = PREFIX + "bngrad-members"  # who sent moment gradients (may differ from MEMBERS)


def is_summary_round(round_config: dict) -> bool:
    """Whether this ask is one of the pooled objective's summary passes (moments, summary, moment
    gradients) rather than the train ask."""
    return round_config.get("phase") in PHASES


def summary_phase(round_config: dict) -> str:
    """The pass a summary ask asks for: one of :data:`PHASES`."""
    phase = round_config.get("phase")
    if phase not in PHASES:
        raise ValueError(f"round config phase {phase!r} is not a summary pass")
    return phase


def members_key(phase: str) -> str:
    """The extras key naming a pass's contributors."""
    return GRADIENT_MEMBERS if phase == GRADIENT_PHASE else MEMBERS


def summary_template(cfg: LensembleConfig, phase: str = SUMMARY_PHASE) -> dict[str, torch.Tensor]:
    """Zero tensors shaped like one participant's summary under ``cfg`` in pass ``phase`` (names
    of :meth:`SiloSummary.to_arrays`, sorted): the layout replies are validated against. The
    moments pass carries the BatchNorm fields only."""
    s, k, h = cfg.objective.sigreg_directions, cfg.objective.sigreg_knots, cfg.model.projector_hidden
    if phase == GRADIENT_PHASE:  # ∂L/∂(pooled μ, σ²) of the one BatchNorm layer
        return {f"bngrad.0.{f}": torch.zeros(h) for f in GRADIENT_FIELDS}
    out: dict[str, torch.Tensor] = {}
    if pools_sigreg(cfg) and phase == SUMMARY_PHASE:
        out |= {"ecf.cos": torch.zeros(s, k), "ecf.sin": torch.zeros(s, k), "ecf.mean": torch.zeros(s)}
    if pools_batchnorm(cfg):  # the encoder's one BatchNorm layer, in the projector
        out |= {f"bn.0.{f}": torch.zeros(h) for f in MOMENT_FIELDS}
    return dict(sorted(out.items()))


def summary_numel(cfg: LensembleConfig, phase: str = SUMMARY_PHASE) -> int:
    """Coordinates of one participant's flat summary in pass ``phase`` (what SecAgg+ masks)."""
    return int(sum(v.numel() for v in summary_template(cfg, phase).values()))


# -- secure aggregation of the summaries

#: What each field's coordinate is, for the refusal's message.
_FIELD_WORDS = {"ecf.cos": "a mean of cos(t·p)", "ecf.sin": "a mean of sin(t·p)",
                "ecf.mean": "the latents' mean projection on a sketch direction",
                "mean": "a BatchNorm input feature's mean", "var": "a BatchNorm input feature's variance",
                "meansq": "a BatchNorm input feature's squared mean",
                "bngrad.0.mean": "a loss gradient with respect to a pooled BatchNorm mean",
                "bngrad.0.var": "a loss gradient with respect to a pooled BatchNorm variance"}


def secure_settings(cfg: LensembleConfig) -> SecAggSettings:
    """The SecAgg+ settings a summary is masked and checked with: the run's, without the L2 bound
    ``federation.secagg_max_norm`` (a bound on pseudo-gradients; a summary's is c·√n)."""
    return dataclasses.replace(SecAggSettings.from_config(cfg.federation), max_norm=None)


#: The public divisor of standardised moment gradients under SecAgg+ (a power of two: dividing is
#: exact): with c = 8 they may reach 512 in magnitude; q·64 ≈ 6e-5 at b = 24 bounds their pooled mean.
GRADIENT_DIVISOR = 64.0


def secure_summary_divisors(cfg: LensembleConfig, phase: str = SUMMARY_PHASE) -> dict[str, float]:
    """Public divisors, per summary field, that a summary travels under SecAgg+ with.

    ``bn.<i>.meansq`` is divided by c (``federation.secagg_clip_range``), so it fits [-c, c]
    exactly when the mean does (mean² / c <= c iff |mean| <= c); every other field by 1 (ECF cos
    and sin lie in [-1, 1], and c >= 1 is required: :func:`~lensemble.federation.checks.check_federation_config`; projection means, BatchNorm input means and
    variances must lie in [-c, c] as they are). Moment gradients (``bngrad.*``, standardised: sums
    of the outputs' gradients) are divided by :data:`GRADIENT_DIVISOR`. The coordinator multiplies the mean
    back, so a field's pooled-mean error bound is its divisor times q = 2c/2^b.
    """
    c = float(cfg.federation.secagg_clip_range)
    return {k: (c if k.endswith(".meansq") else GRADIENT_DIVISOR if k.startswith("bngrad.") else 1.0)
            for k in summary_template(cfg, phase)}


def _field_words(key: str) -> str:
    return _FIELD_WORDS.get(key, _FIELD_WORDS.get(key.rsplit(".", 1)[-1], key))


def secure_summary_payload(arrays: dict[str, np.ndarray], cfg: LensembleConfig,
                           phase: str = SUMMARY_PHASE) -> dict[str, np.ndarray]:
    """A participant's summary as it enters SecAgg+: divided by :func:`secure_summary_divisors`,
    flat fp32 in sorted-name order.

    Raises RoundError (the participant sends nothing) when the summary does not have the
    template's fields and shapes, is not finite, or has a scaled coordinate outside the SecAgg+
    range [-c, c]: Flower would clip it silently and the pooled mean would be wrong by more than
    the stated bound. The message names the field and the range.
    """
    template, divisors = summary_template(cfg, phase), secure_summary_divisors(cfg, phase)
    c = float(cfg.federation.secagg_clip_range)
    if sorted(arrays) != sorted(template):
        raise RoundError(f"summary has fields {sorted(arrays)}, the run's summaries have {sorted(template)}")
    scaled: dict[str, torch.Tensor] = {}
    for key in sorted(template):
        a = np.asarray(arrays[key])
        if tuple(a.shape) != tuple(template[key].shape):
            raise RoundError(f"summary field {key} has shape {tuple(a.shape)}, expected {tuple(template[key].shape)}")
        if not bool(np.isfinite(a).all()):
            raise RoundError(f"summary field {key} is not finite; refusing to mask it",
                             remediation="local training diverged: lower the inner learning rate")
        x = a.astype(np.float64) / divisors[key]
        peak = float(np.max(np.abs(x))) if x.size else 0.0
        if peak > c:
            over = f"{key}/{divisors[key]:g}" if divisors[key] != 1.0 else key
            raise RoundError(
                f"summary field {over} ({_field_words(key)}{' over c' if divisors[key] != 1.0 else ''}) reaches "
                f"{peak:.4g}, outside the SecAgg+ coordinate range [-{c:g}, {c:g}] "
                "(federation.secagg_clip_range); refusing to send a clipped summary",
                remediation="raise federation.secagg_clip_range (the error bound q = 2c/2^b grows with it; "
                            "federation.secagg_bits buys it back)")
        scaled[key] = torch.from_numpy(x.astype(np.float32))
    return encode_delta(scaled)


def close_secure_summaries(cfg: LensembleConfig, t: int, replies: dict[str, Reply], failures: dict[str, str],
                           secure_sum: SecureSum | None, phase: str = SUMMARY_PHASE) -> tuple[dict[str, np.ndarray], dict]:
    """Coordinator side of a secure summary ask: (extras for the train ask, metrics) from the
    SecAgg+ sum S of the contributors' scaled summaries; no individual summary is ever held.

    Refuses (ResidencyViolation) a reply that carries a summary, or a round without a sum;
    requires the quorum and the SecAgg+ threshold (FaultToleranceExceeded); checks S like an
    update sum (:func:`~lensemble.federation.secure_agg.check_secure_sum`: finite, n coordinates,
    within C x the per-summary bounds) and the pooled ECF means within [-1 - q, 1 + q]
    (SecureSumRejected otherwise, nothing is pooled). The mean is S / C times the divisors;
    ``pooled.members`` are the contributors.
    """
    refuse_individual(t, replies, secure_sum, "summary", "summaries")
    settings = secure_settings(cfg)
    template, divisors = summary_template(cfg, phase), secure_summary_divisors(cfg, phase)
    contributors = sorted(secure_sum.contributors)
    require_quorum(len(contributors), max(cfg.federation.min_participants, settings.threshold), round_index=t,
                   failures=dict(failures))
    layout = Layout.of(template)
    checked = check_secure_sum(secure_sum.total, len(contributors), layout.numel, settings, round_index=t)
    check_contributors(t, contributors, replies, (0, cfg.model.latent_dim), "summary sum")
    mean64 = np.asarray(secure_sum.total, dtype=np.float64) / float(len(contributors))
    scaled = unflatten(torch.from_numpy(mean64), layout)
    q = settings.quantum
    mean: dict[str, np.ndarray] = {}
    for key in template:
        value = scaled[key].double() * divisors[key]
        if key in ("ecf.cos", "ecf.sin") and float(value.abs().max()) > 1.0 + q:
            raise SecureSumRejected(f"round {t}: the pooled {key} reaches {float(value.abs().max()):.4g}, "
                                    f"beyond 1 + q = {1.0 + q:.4g}: the unmasked summary sum is broken")
        mean[key] = value.to(torch.float32).numpy()
    # [robust] the mean of the sum holds every range an honest summary holds (variances >= 0, means
    # bounded, ...) within its quantisation error: no single summary is seen, so none is named (issue 47)
    why = check_summary(mean, cfg, pooled_slack=max(divisors.values()) * q)
    if why is not None:
        raise SecureSumRejected(f"round {t}: the pooled summary is out of range ({why}): some participant's "
                                "summary was not one an honest participant computes, and the sum does not say whose")
    extras = {PREFIX + k: v for k, v in mean.items()}
    extras[members_key(phase)] = np.asarray([int(p.rsplit("-", 1)[1]) for p in contributors], dtype=np.int64)
    metrics = {"fed/summary_participants": len(contributors), "fed/summary_floats": layout.numel,
               "fed/summary_secagg_sum_max_abs": checked["fed/secagg_sum_max_abs"],
               "fed/summary_secagg_sum_norm": checked["fed/secagg_sum_norm"],
               "fed/summary_secagg_mean_error_bound": max(divisors.values()) * settings.mean_error_bound()}
    return extras, metrics


def _own_path(state_dir: Path, t: int) -> Path:
    return state_dir / f"summary-{t:05d}.npz"


def _summary_payload(arrays: dict[str, np.ndarray], cfg: LensembleConfig, phase: str) -> dict[str, np.ndarray]:
    """A pass's reply payload: scaled and range-checked for SecAgg+ (the Flower app masks it) under
    secure aggregation, the plain flat fp32 arrays otherwise."""
    if cfg.federation.secure_aggregation:
        return secure_summary_payload(arrays, cfg, phase)
    return encode_delta({k: torch.from_numpy(arrays[k]) for k in sorted(arrays)})


def pooled_mean_of(extras: dict[str, np.ndarray] | None) -> SiloSummary | None:
    """The pooled mean summary an ask's extras carry (``pooled.*``), or None when they carry none."""
    arrays = {k[len(PREFIX):]: v for k, v in (extras or {}).items()
              if k.startswith(PREFIX) and k not in (MEMBERS, GRADIENT_MEMBERS)}
    return SiloSummary.from_arrays(arrays) if arrays else None


def summary_round(cfg: LensembleConfig, model, sampler, sketch: torch.Tensor, state_dir: Path,
                  participant_id: str, t: int, phase: str = SUMMARY_PHASE,
                  extras: dict[str, np.ndarray] | None = None) -> Reply:
    """Steps 0 and 1 on one participant: its BatchNorm moments (``phase`` moments) or its summary
    of round t as a Reply (flat fp32 payload, no probe embeddings). Both passes encode the same
    clips (drawn from the same seed label), so the moments of step 1 are those pooled in step 0.
    In step 1 with SIGReg and BatchNorm pooled, ``extras`` must carry step 0's pooled moments;
    its own copy stays in ``state_dir`` for the train ask."""
    started = time.perf_counter()
    gen = torch_generator(cfg.root_seed, "summary", participant_id, t)
    clips = sampler.sample(cfg.objective.summary_clips, gen)
    if phase == GRADIENT_PHASE:
        return _gradient_round(cfg, model, clips, sketch, state_dir, participant_id, t, extras, started)
    obs = clips.obs
    pooled = None
    if phase == SUMMARY_PHASE and needs_moments_first(cfg):
        mean = pooled_mean_of(extras)
        if mean is None or mean.bn is None:
            raise RoundError(f"round {t}: the summary ask carries no pooled BatchNorm moments, and the ECF summary "
                             "must be encoded under them", remediation="the coordinator runs the moments ask first "
                             "(federation/rounds.py); the round is retried")
        pooled = mean.bn
    summary = summarise(model, obs, sketch, cfg, pooled=pooled, ecf=phase == SUMMARY_PHASE)
    arrays = summary.to_arrays()
    payload = _summary_payload(arrays, cfg, phase)
    if phase == SUMMARY_PHASE:
        np.savez(_own_path(state_dir, t), **arrays)
        for old in sorted(state_dir.glob("summary-*.npz"))[:-2]:
            old.unlink()
    metrics = {"fed/summary_clips": cfg.objective.summary_clips, "fed/compute_seconds": time.perf_counter() - started}
    return Reply(t, payload, np.zeros((0, cfg.model.latent_dim), dtype=np.float32), metrics)


def _gradient_round(cfg: LensembleConfig, model, clips, sketch: torch.Tensor, state_dir: Path, participant_id: str,
                    t: int, extras: dict[str, np.ndarray] | None, started: float) -> Reply:
    """Step 2 (the moment-gradient pass) on one participant: ∂L/∂(pooled μ, σ²) of its loss at its
    first inner step on its summary clips, under the pooled summary in ``extras`` (its own summary
    from disk); kept beside its summary for the train ask."""
    mean = pooled_mean_of(extras)
    if mean is None or mean.bn is None or not extras or MEMBERS not in extras:
        raise RoundError(f"round {t}: the moment-gradient ask carries no pooled summary",
                         remediation="the coordinator runs the summary ask first (federation/rounds.py); the round is "
                                     "retried")
    members = [int(m) for m in np.asarray(extras[MEMBERS]).ravel()]
    own = _load_own(state_dir, t) if int(participant_id.rsplit("-", 1)[1]) in members else None
    pooling = others_pooling(SiloSummary(mean.ecf, mean.bn), own and SiloSummary(own.ecf, own.bn), len(members))
    grads = moment_gradients(model, clips, sketch, cfg, pooling, mean.bn)
    arrays = SiloSummary(None, None, grads).to_arrays()
    payload = _summary_payload(arrays, cfg, GRADIENT_PHASE)
    if own is not None:  # its own part, to subtract from the pooled sum in the train ask
        np.savez(_own_path(state_dir, t), **(own.to_arrays() | arrays))
    metrics = {"fed/summary_clips": cfg.objective.summary_clips, "fed/compute_seconds": time.perf_counter() - started}
    return Reply(t, payload, np.zeros((0, cfg.model.latent_dim), dtype=np.float32), metrics)


def _load_own(state_dir: Path, t: int) -> SiloSummary:
    """This participant's own summary of round t (and its moment gradients, once sent) from its disk."""
    with np.load(_own_path(state_dir, t)) as f:
        return SiloSummary.from_arrays({k: f[k] for k in f.files})


def pooled_statistics(cfg: LensembleConfig, extras: dict[str, np.ndarray] | None, state_dir: Path,
                      partition_id: int, t: int) -> BatchStatistics | None:
    """Step 2 on one participant: its :class:`BatchStatistics` for round t's inner steps from the
    pooled mean in ``extras`` and its own summary, or None when nothing is pooled."""
    if not pools_anything(cfg):
        return None
    if not extras or MEMBERS not in extras:
        raise KeyError(f"round {t}: the pooled objective is on but the round carries no pooled summary")
    members = [int(m) for m in np.asarray(extras[MEMBERS]).ravel()]
    mean = pooled_mean_of(extras)
    own = _load_own(state_dir, t) if partition_id in members else None
    pooling = others_pooling(SiloSummary(mean.ecf, mean.bn), own and SiloSummary(own.ecf, own.bn), len(members))
    if mean.bn_grad is not None:
        # the moment gradients' contributors may be fewer than the summaries' (a silo lost between
        # the passes): the others' part of their sum is taken over their own members
        grad_members = [int(m) for m in np.asarray(extras[GRADIENT_MEMBERS]).ravel()]
        own_grad = own.bn_grad if own is not None and partition_id in grad_members else None
        others = others_pooling(SiloSummary(None, None, mean.bn_grad),
                                SiloSummary(None, None, own_grad) if own_grad is not None else None,
                                len(grad_members)).bn_grad
        pooling.bn_grad = raw_gradients(others, pooled_moments(mean.bn))  # they travel standardised
    elif needs_gradient_pass(cfg):
        raise KeyError(f"round {t}: objective.bn_cross_gradient is on but the round carries no pooled moment gradients")
    return participant_statistics(pooling)


def close_summaries(cfg: LensembleConfig, t: int, replies: dict[str, Reply], failures: dict[str, str],
                    phase: str = SUMMARY_PHASE) -> tuple[dict[str, np.ndarray], dict]:
    """Coordinator side of step 1: (extras for the train ask, metrics). Raises
    FaultToleranceExceeded below the quorum (the round is retried like a failed train ask).
    ``phase``: which pass the replies answer (the moments pass carries the BatchNorm fields only)."""
    template = summary_template(cfg, phase)
    result = validate_updates([Update(pid, r.round_index, r.payload, r.probe_embeddings)
                               for pid, r in sorted(replies.items())],
                              template=template, round_index=t, max_update_mb=cfg.federation.max_update_mb,
                              embedding_shape=(0, cfg.model.latent_dim))
    dropped = dict(failures) | {pid: f"sent an unusable summary ({why})" for pid, why in result.rejected}
    accepted, refused = screen_summaries(result.accepted, cfg, round_index=t)
    dropped |= refused
    require_quorum(len(accepted), cfg.federation.min_participants, round_index=t, failures=dropped)
    members = sorted(accepted)
    mean = {k: torch.stack([accepted[p][k].double() for p in members]).mean(0).float() for k in template}
    extras = {PREFIX + k: v.numpy() for k, v in mean.items()}
    extras[members_key(phase)] = np.asarray([int(p.rsplit("-", 1)[1]) for p in members], dtype=np.int64)
    metrics = {"fed/summary_participants": len(members), "fed/summary_dropped": len(refused),
               "fed/summary_floats": int(sum(v.numel() for v in template.values()))}
    return extras, metrics


__all__ = ["GRADIENT_MEMBERS", "GRADIENT_PHASE", "MEMBERS", "MOMENTS_PHASE", "PHASES", "PREFIX", "SUMMARY_PHASE",
           "close_secure_summaries", "members_key", "needs_gradient_pass",
           "close_summaries", "is_summary_round", "needs_moments_first", "pooled_mean_of", "summary_phase", "pooled_statistics", "secure_settings", "secure_summary_divisors",
           "secure_summary_payload", "summary_numel", "summary_round", "summary_template"]
