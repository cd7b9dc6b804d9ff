"""Summaries for the pooled objective, and the per-silo central control that measures it.

:func:`summarise` is what a party contributes to the pooled statistics of a round: its ECF
summary on the round's sketch and its BatchNorm input moments, taken with the round's model on
``objective.summary_clips`` clips of its own data. A participant runs it once per round with the
global model (:mod:`lensemble.federation.participant`); the central control below runs it for each
silo every ``federation.inner_steps`` steps, so the same staleness can be measured without any
averaging.

The per-silo central control (``train.silo_batches`` / ``train.silo_statistics``): centralized
training whose every batch is B/C clips from each silo, with BatchNorm and/or SIGReg computed per
silo share as each participant computes them under federation. Centrally, per-silo statistics
alone took planning on the room split from 41/50 to 22/50 (issue 31); with
``objective.sigreg_scope`` / ``bn_scope`` = pooled each share is pooled with the other shares'
summaries — the remedy, measured without the federation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lensemble.config.schema import LensembleConfig
from lensemble.config.seeds import torch_generator
from lensemble.data.clips import Clips, ClipSampler
from lensemble.model.objective import PLAIN, BatchStatistics, JEPAObjective
from lensemble.model.pooled import (
    MomentGradient,
    Moments,
    Pooling,
    SiloSummary,
    ecf_summary,
    fixed_batchnorm,
    others_pooling,
    pooled_moments,
    raw_gradients,
    recording_moments,
    standardised_gradients,
    sum_summaries,
)

#: Clips encoded per forward while summarising: one default training batch (64 clips x 4 frames),
#: so a batch-statistics forward (bn_scope=batch) sees a training batch's worth of frames.
SUMMARY_CHUNK = 64


def pools_sigreg(cfg: LensembleConfig) -> bool:
    return cfg.objective.sigreg_scope == "pooled"


def pools_batchnorm(cfg: LensembleConfig) -> bool:
    return cfg.objective.bn_scope == "pooled" and cfg.model.projector_norm == "batchnorm"


def pools_anything(cfg: LensembleConfig) -> bool:
    """Whether this config's parties exchange summaries for pooled statistics."""
    return pools_sigreg(cfg) or pools_batchnorm(cfg)


def pools_across_shares(cfg: LensembleConfig) -> bool:
    """Whether centralized training pools per-silo shares with the other shares' summaries (the
    per-silo control with the remedy), refreshed every ``federation.inner_steps`` steps."""
    return cfg.train.silo_batches and cfg.train.silo_statistics != "none" and pools_anything(cfg)


def freeze_batchnorm(cfg: LensembleConfig) -> bool:
    """FixBN: BatchNorm normalises training batches with the running statistics (eval mode)."""
    return cfg.objective.bn_scope == "frozen" or cfg.model.encoder_frozen


def needs_moments_first(cfg: LensembleConfig) -> bool:
    """Whether a round's summaries take two passes: BatchNorm input moments first, then the ECF
    encoded under the pooled moments (SIGReg and BatchNorm both pooled). The ECF a party
    subtracts as its own must be that of latents normalised as its live batch will be, with the
    round's *pooled* moments, which exist only once every party's moments are in."""
    return pools_sigreg(cfg) and pools_batchnorm(cfg)


@torch.no_grad()
def batchnorm_moments(model, obs: torch.Tensor) -> list[Moments]:
    """Per BatchNorm layer, the input moments of every frame of clips ``obs`` (n, K, 3, H, W) uint8
    under the model's weights (the projector's BatchNorm is the encoder's only one, so its input
    does not depend on how it normalises). Encoded in chunks of :data:`SUMMARY_CHUNK` clips and
    combined exactly (law of total variance); nothing of the model changes."""
    enc = model.encoder
    was_training = enc.training
    enc.eval()
    try:
        with recording_moments(enc) as records:
            for i in range(0, obs.shape[0], SUMMARY_CHUNK):
                enc.encode_frames(obs[i:i + SUMMARY_CHUNK])
    finally:
        enc.train(was_training)
    return _frames_moments(records, obs.shape[0])


def _frames_moments(records: list[list[Moments]], n: int) -> list[Moments]:
    """Per layer, the moments of all frames of ``n`` clips from those of their chunks of
    :data:`SUMMARY_CHUNK` clips (frame-weighted: the last chunk may be smaller; law of total variance)."""
    sizes = torch.tensor([min(SUMMARY_CHUNK, n - i) for i in range(0, n, SUMMARY_CHUNK)], dtype=torch.float32)
    w = sizes / sizes.sum()
    out = []
    for rec in records:
        mean = sum(wi * m.mean for wi, m in zip(w, rec, strict=True))
        var = sum(wi * (m.var + (m.mean - mean).square()) for wi, m in zip(w, rec, strict=True))
        out.append(Moments(mean, var, mean.square()))
    return out


@torch.no_grad()
def summarise(model, obs: torch.Tensor, sketch: torch.Tensor, cfg: LensembleConfig, *,
              pooled: Sequence[Moments] | None = None, ecf: bool = True) -> SiloSummary:
    """One party's :class:`~lensemble.model.pooled.SiloSummary` of clips ``obs`` (n, K, 3, H, W) uint8.

    BatchNorm input moments (``bn_scope=pooled``) are those of every frame
    (:func:`batchnorm_moments`). The latents behind the ECF summary (``sigreg_scope=pooled``, and
    ``ecf``) are normalised exactly as the party's live batch is at its first inner step:

    - ``bn_scope=pooled``: with the round's pooled moments, from ``pooled`` (the parties' *mean*
      BatchNorm summary of the round's first pass, :func:`~lensemble.model.pooled.pooled_moments`);
      required, since encoding under the running statistics instead (the eval-mode shortcut this
      replaced) made the pooled SIGReg a party descends 22.9 where the consistent one is 14.3 on a
      committed warm start (issue 43);
    - ``bn_scope=batch``: in train-mode chunks of :data:`SUMMARY_CHUNK` clips (their own moments,
      as a training batch of that size is);
    - frozen BatchNorm or none: in eval mode.

    Running statistics are left untouched. ``ecf=False`` takes the moments only (the first pass).
    """
    enc = model.encoder
    want_ecf, want_bn = ecf and pools_sigreg(cfg), pools_batchnorm(cfg)
    if not want_ecf:
        return SiloSummary(None, batchnorm_moments(model, obs) if want_bn else None)
    layers = enc.batchnorm_layers()
    fixed = None
    if want_bn:
        if pooled is None:
            raise ValueError("with SIGReg and BatchNorm pooled the ECF summary is encoded under the round's pooled "
                             "BatchNorm moments: take the moments first (summarise(..., ecf=False)) and pass "
                             "their pooled mean as pooled=")
        fixed = pooled_moments(pooled)
    saved = {k: v.clone() for k, v in enc.state_dict().items() if "running_" in k or "num_batches" in k}
    was_training = enc.training
    enc.train(cfg.objective.bn_scope == "batch" and bool(layers) and fixed is None)
    try:
        # the BatchNorm input does not depend on the normalisation: its moments come with this pass
        with fixed_batchnorm(enc, fixed), recording_moments(enc) as records:
            z = torch.cat([enc.encode_frames(obs[i:i + SUMMARY_CHUNK]) for i in range(0, obs.shape[0], SUMMARY_CHUNK)])
    finally:
        enc.load_state_dict(saved, strict=False)
        enc.train(was_training)
    summary_ecf = ecf_summary(z, sketch, knots=cfg.objective.sigreg_knots, t_max=cfg.objective.sigreg_t_max)
    return SiloSummary(summary_ecf, _frames_moments(records, obs.shape[0]) if want_bn else None)  # no_grad


def needs_gradient_pass(cfg: LensembleConfig) -> bool:
    """Whether a round's summaries end with the moment-gradient pass (BatchNorm pooled, with
    ``objective.bn_cross_gradient``): each party's ∂L/∂(pooled μ, σ²), which the others add."""
    return pools_batchnorm(cfg) and cfg.objective.bn_cross_gradient


def moment_gradients(model, clips: Clips, sketch: torch.Tensor, cfg: LensembleConfig, pooling: Pooling,
                     pooled: Sequence[Moments]) -> list[MomentGradient]:
    """One party's :class:`~lensemble.model.pooled.MomentGradient` per BatchNorm layer: the gradient of
    the loss it descends at its first inner step with respect to the round's pooled moments, through
    its own outputs only (the moments held fixed as leaves), on its summary clips; standardised as
    it travels (:func:`~lensemble.model.pooled.standardised_gradients`).

    ``pooling``: the others' part of the round (ECF summed over the others, C) as the party's inner
    steps use it; ``pooled``: the parties' mean BatchNorm summary. The loss is the objective of
    the party's inner steps (prediction, SIGReg with the participant's factor C, the planning
    terms) without the anchor, whose probe frames are not normalised with the pooled moments. Its
    SIGReg part grows with the number of latents, so it is scaled from the summary's clips to a
    training batch's (``train.batch_size``); every other term is a mean.
    """
    enc = model.encoder
    leaves = [(m.detach().clone().requires_grad_(True), v.detach().clone().requires_grad_(True))
              for m, v in pooled_moments(pooled)]
    n = clips.obs.shape[0]
    weight = float(pooling.parties) if pooling.ecf is not None else 1.0
    stats = BatchStatistics(pooling=(Pooling(parties=pooling.parties, ecf=pooling.ecf),),
                            sigreg_weight=weight * cfg.train.batch_size / n)
    was_training = model.training
    model.train()
    try:
        with torch.enable_grad(), fixed_batchnorm(enc, leaves):
            terms = JEPAObjective(cfg.objective)(model, clips.obs, clips.actions, sketch, stats)
            flat = [x for mv in leaves for x in mv]
            grads = torch.autograd.grad(terms.total, flat, allow_unused=True)
    finally:
        model.train(was_training)
    grads = [torch.zeros_like(x) if g is None else g.detach() for x, g in zip(flat, grads, strict=True)]
    raw = [MomentGradient(grads[2 * i], grads[2 * i + 1]) for i in range(len(leaves))]
    return standardised_gradients(raw, pooled_moments(pooled))


def silo_summaries(model, clips: Sequence[torch.Tensor], sketch: torch.Tensor, cfg: LensembleConfig) -> list[SiloSummary]:
    """Every party's summary when one process holds all their clips (the per-silo central control,
    tests): both passes of a round, with the parties' moments pooled at equal weights as the
    coordinator pools them."""
    pooled = None
    if needs_moments_first(cfg):
        first = [SiloSummary(None, batchnorm_moments(model, obs)) for obs in clips]
        pooled = sum_summaries(first).scaled(1.0 / len(first)).bn
    return [summarise(model, obs, sketch, cfg, pooled=pooled) for obs in clips]


def participant_statistics(pooling: Pooling) -> BatchStatistics:
    """How a participant's inner steps compute their batch statistics: its live batch pooled with
    the others' part, and the factor C on SIGReg when the ECF is pooled (the coordinator averages
    the C updates; with it their mean gradient is the union batch's, as the twin descends it)."""
    return BatchStatistics(pooling=(pooling,), sigreg_weight=float(pooling.parties) if pooling.ecf is not None else 1.0)


def silo_poolings(model, clips: Sequence[Clips], sketch: torch.Tensor, cfg: LensembleConfig) -> list[Pooling]:
    """Every party's :class:`~lensemble.model.pooled.Pooling` for a round when one process holds all
    their summary clips: every pass a federated round runs (moments, summary, moment gradients),
    pooled at equal weights as the coordinator pools them. The known-answer tests compare it with
    the union batch (tests/unit/test_pooled_exact.py)."""
    own = silo_summaries(model, [c.obs for c in clips], sketch, cfg)
    c = len(own)
    mean = sum_summaries(own).scaled(1.0 / c)
    poolings = [others_pooling(mean, o, c) for o in own]
    if needs_gradient_pass(cfg):
        grads = [moment_gradients(model, x, sketch, cfg, p, mean.bn) for x, p in zip(clips, poolings, strict=True)]
        own = [SiloSummary(o.ecf, o.bn, g) for o, g in zip(own, grads, strict=True)]
        mean = sum_summaries(own).scaled(1.0 / c)
        poolings = [others_pooling(mean, o, c) for o in own]
        for p in poolings:
            p.bn_grad = raw_gradients(p.bn_grad, pooled_moments(mean.bn))
    return poolings


class ShareSampler:
    """Batches of B/C clips from each of C silos, concatenated in silo order (the first B mod C
    silos take one clip more). ``frames`` is every silo's frames, like a pooled ClipSampler's."""

    def __init__(self, samplers: Sequence[ClipSampler]):
        if len(samplers) < 1:
            raise ValueError("a share sampler needs at least one silo")
        self.samplers = list(samplers)

    @property
    def frames(self) -> torch.Tensor:
        return torch.cat([s.frames for s in self.samplers])

    def share_sizes(self, batch_size: int) -> tuple[int, ...]:
        c = len(self.samplers)
        if batch_size < c:
            raise ValueError(f"a batch of {batch_size} clips cannot hold a share of each of {c} silos")
        return tuple(batch_size // c + (1 if i < batch_size % c else 0) for i in range(c))

    def sample(self, batch_size: int, generator: torch.Generator) -> Clips:
        parts = [s.sample(n, generator) for s, n in zip(self.samplers, self.share_sizes(batch_size), strict=True)]
        return Clips(obs=torch.cat([p.obs for p in parts]), actions=torch.cat([p.actions for p in parts]),
                     state=torch.cat([p.state for p in parts]))


def central_statistics(cfg: LensembleConfig, model, sampler, source: str) -> Callable[[int, torch.Tensor], BatchStatistics]:
    """``stats(step, sketch) -> BatchStatistics`` for centralized training under ``cfg``.

    PLAIN unless ``train.silo_batches``. With pooled scopes, every silo's summary is re-taken with
    the current model every ``federation.inner_steps`` steps (on the sketch of that step, as a
    round's summaries are taken on the round's sketch) and each share is pooled with the others'.
    """
    t = cfg.train
    if not t.silo_batches:
        return lambda step, sketch: PLAIN
    if not isinstance(sampler, ShareSampler):
        raise TypeError("train.silo_batches needs a ShareSampler (training_sampler gives one for source 'pooled')")
    shares = sampler.share_sizes(t.batch_size)
    bn_per = t.silo_statistics in ("batchnorm", "both")
    sig_per = t.silo_statistics in ("sigreg", "both")
    pool = pools_across_shares(cfg)
    every = cfg.federation.inner_steps
    cache: dict[str, object] = {"at": None, "pooling": None}

    def stats(step: int, sketch: torch.Tensor) -> BatchStatistics:
        if not pool:
            return BatchStatistics(shares, bn_per, sig_per, None)
        refresh = step // every
        if cache["at"] != refresh:
            gen = torch_generator(cfg.root_seed, "summary", source, refresh)
            own = silo_summaries(model, [s.sample(cfg.objective.summary_clips, gen).obs for s in sampler.samplers],
                                 sketch, cfg)
            mean = sum_summaries(own).scaled(1.0 / len(own))
            cache["pooling"] = tuple(others_pooling(mean, o, len(own)) for o in own)
            cache["at"] = refresh
        return BatchStatistics(shares, bn_per, sig_per, cache["pooling"])

    return stats


__all__ = ["SUMMARY_CHUNK", "ShareSampler", "batchnorm_moments", "central_statistics", "freeze_batchnorm",
           "moment_gradients", "needs_gradient_pass", "needs_moments_first", "participant_statistics", "silo_poolings", "pools_across_shares", "pools_anything", "pools_batchnorm", "pools_sigreg",
           "silo_summaries", "summarise"]
