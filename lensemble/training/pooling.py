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
from lensemble.model.objective import PLAIN, BatchStatistics
from lensemble.model.pooled import (
    Moments,
    SiloSummary,
    ecf_summary,
    others_pooling,
    recording_moments,
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


@torch.no_grad()
def summarise(model, obs: torch.Tensor, sketch: torch.Tensor, cfg: LensembleConfig) -> SiloSummary:
    """One party's :class:`~lensemble.model.pooled.SiloSummary` of clips ``obs`` (n, K, 3, H, W) uint8.

    BatchNorm input moments are those of every frame (the projector's BatchNorm is the encoder's
    only one, so its input does not depend on how it normalises). The latents behind the ECF
    summary are encoded as the party's own training batches would be: in train-mode chunks of
    :data:`SUMMARY_CHUNK` clips (their own moments) under ``bn_scope=batch``, with the running
    statistics otherwise (the pooled moments of the round are not known yet when summaries are
    taken: an approximation, the same for every party). Running statistics are left untouched.
    """
    enc = model.encoder
    want_ecf, want_bn = pools_sigreg(cfg), pools_batchnorm(cfg)
    layers = enc.batchnorm_layers()
    saved = {k: v.clone() for k, v in enc.state_dict().items() if "running_" in k or "num_batches" in k}
    was_training = enc.training
    batch_mode = cfg.objective.bn_scope == "batch" and bool(layers)
    enc.train(batch_mode)
    try:
        with recording_moments(enc) as records:
            z = torch.cat([enc.encode_frames(obs[i:i + SUMMARY_CHUNK]) for i in range(0, obs.shape[0], SUMMARY_CHUNK)])
    finally:
        enc.load_state_dict(saved, strict=False)
        enc.train(was_training)
    ecf = ecf_summary(z, sketch, knots=cfg.objective.sigreg_knots, t_max=cfg.objective.sigreg_t_max) if want_ecf else None
    bn = None
    if want_bn:
        # frame-weighted mean over the chunks' records (chunks may differ in size)
        sizes = torch.tensor([min(SUMMARY_CHUNK, obs.shape[0] - i) for i in range(0, obs.shape[0], SUMMARY_CHUNK)],
                             dtype=torch.float32)
        w = sizes / sizes.sum()
        # the frames' moments from the chunks' (law of total variance across chunks)
        bn = []
        for rec in records:
            mean = sum(wi * m.mean for wi, m in zip(w, rec, strict=True))
            var = sum(wi * (m.var + (m.mean - mean).square()) for wi, m in zip(w, rec, strict=True))
            bn.append(Moments(mean, var, mean.square()))
    return SiloSummary(ecf, bn)  # no_grad: nothing to detach


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
            own = [summarise(model, s.sample(cfg.objective.summary_clips, gen).obs, sketch, cfg) for s in sampler.samplers]
            mean = sum_summaries(own).scaled(1.0 / len(own))
            cache["pooling"] = tuple(others_pooling(mean, o, len(own)) for o in own)
            cache["at"] = refresh
        return BatchStatistics(shares, bn_per, sig_per, cache["pooling"])

    return stats


__all__ = ["SUMMARY_CHUNK", "ShareSampler", "central_statistics", "freeze_batchnorm", "pools_across_shares", "pools_anything",
           "pools_batchnorm", "pools_sigreg", "summarise"]
