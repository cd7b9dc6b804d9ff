"""How far one silo's round moves the *other* silos' statistics: κ, and the overshoot it predicts.

Under the pooled objective each participant descends the pooled SIGReg with the others' summaries
fixed for its H inner steps. It is 1/C of the pool, so closing a gap in the pooled ECF takes it C
times as far as the gap; if its update moves the other silos' latents just as far (the update is a
change of the shared model, applied to every silo's frames after averaging), the averaged update
closes the gap 1 + κ(C − 1) times over, κ being how much one silo's update moves another's ECF
relative to its own (issue 43's linearised overshoot; a 2-D toy oscillated at C = 4).

:func:`cross_response` measures it on the real model, one round from a global model: every silo
trains its H inner steps as a participant would (the round's pooled statistics from
:func:`~lensemble.training.pooling.silo_poolings`), then every silo's summary clips are encoded under
every silo's update, and

    κ_{c→k} = <Δφ_k(θ_c), Δφ_c(θ_c)> / |Δφ_c(θ_c)|²,

Δφ_j(θ) the change of silo j's ECF summary (cos and sin on the round's sketch, under the pooled
BatchNorm moments of θ) from the round's start. κ = 1: an update moves every silo's latents as it
moves its own (identical silos); κ = 0: only its own. Beside it, the pooled SIGReg at the round's
start, what each silo expected after its own update (the others held fixed, as it trained), and
what the plain average of the updates (η = 1, μ = 0) gives: an average far below the expectation
is the overshoot, in the objective's own units.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from lensemble.config.schema import LensembleConfig
from lensemble.config.seeds import torch_generator
from lensemble.data.clips import Clips
from lensemble.model.pooled import SiloSummary, sigreg_of_summed, sum_summaries
from lensemble.training.loop import InnerLoop
from lensemble.training.pooling import participant_statistics, silo_poolings, silo_summaries


@dataclass
class ResponseReport:
    """One round's cross-silo response. ``kappa[c][k]`` (k ≠ c; NaN on the diagonal), ``kappa_mean``
    over the off-diagonal pairs, ``overshoot`` = 1 + κ̄(C − 1); pooled SIGReg (the union-scale
    statistic on the silos' summary clips) at the start, as silo c expected it after its own
    update (``expected[c]``) and after the plain average of all updates (``averaged``)."""

    parties: int
    inner_steps: int
    kappa: list[list[float]]
    kappa_mean: float
    overshoot: float
    sigreg_start: float
    expected: list[float]
    averaged: float

    def as_dict(self) -> dict:
        return asdict(self)


def _flat(summary: SiloSummary) -> torch.Tensor:
    return torch.cat([summary.ecf.cos.flatten(), summary.ecf.sin.flatten()]).double()


def _pool_value(summaries: Sequence[SiloSummary], frames: int, cfg: LensembleConfig) -> float:
    """The pooled SIGReg of the silos' summaries (equal weights) at ``frames`` latents per silo."""
    o = cfg.objective
    total = sum_summaries(list(summaries)).ecf
    return float(sigreg_of_summed(total, len(summaries), frames, knots=o.sigreg_knots, t_max=o.sigreg_t_max))


def cross_response(cfg: LensembleConfig, model, clips: Sequence[Clips], samplers: Sequence, sketch: torch.Tensor,
                   *, inner_steps: int | None = None, seed_label: str = "response") -> ResponseReport:
    """Measure one round's κ from ``model`` (the round's global; left unchanged): silo c trains
    ``inner_steps`` (default ``federation.inner_steps``) AdamW steps on ``samplers[c]`` with the
    round's pooled statistics of the summary ``clips`` (one :class:`Clips` per silo)."""
    h = int(inner_steps or cfg.federation.inner_steps)
    c = len(clips)
    if c < 2:
        raise ValueError("κ needs at least two silos")
    frames = cfg.train.batch_size * cfg.train.clip_len  # the statistic at a training batch's size, as logged
    start = silo_summaries(model, [x.obs for x in clips], sketch, cfg)
    poolings = silo_poolings(model, clips, sketch, cfg)
    locals_ = []
    for i, (sampler, pooling) in enumerate(zip(samplers, poolings, strict=True)):
        local = copy.deepcopy(model)
        loop = InnerLoop(local, cfg, sampler)
        stats = participant_statistics(pooling)
        loop.run(h, sketch_fn=lambda _i: sketch, generator=torch_generator(cfg.root_seed, seed_label, i),
                 log_every=h, stats_fn=lambda _i, _a, s=stats: s)
        locals_.append(local)
    after = [silo_summaries(m, [x.obs for x in clips], sketch, cfg) for m in locals_]
    kappa = [[float("nan")] * c for _ in range(c)]
    pairs = []
    for i in range(c):
        own = _flat(after[i][i]) - _flat(start[i])
        norm = float(own.square().sum())
        for k in range(c):
            if k == i or norm == 0.0:
                continue
            kappa[i][k] = float((_flat(after[i][k]) - _flat(start[k])) @ own) / norm
            pairs.append(kappa[i][k])
    kappa_mean = float(sum(pairs) / len(pairs)) if pairs else float("nan")
    expected = [_pool_value([after[i][i]] + [start[k] for k in range(c) if k != i], frames, cfg) for i in range(c)]
    averaged_model = copy.deepcopy(model)
    with torch.no_grad():
        states = [m.state_dict() for m in locals_]
        for name, value in averaged_model.state_dict().items():
            if value.dtype.is_floating_point:
                value.copy_(torch.stack([s[name] for s in states]).mean(0))
    averaged = silo_summaries(averaged_model, [x.obs for x in clips], sketch, cfg)
    return ResponseReport(parties=c, inner_steps=h, kappa=kappa, kappa_mean=kappa_mean,
                          overshoot=1.0 + kappa_mean * (c - 1),
                          sigreg_start=_pool_value(start, frames, cfg), expected=expected,
                          averaged=_pool_value(averaged, frames, cfg))


__all__ = ["ResponseReport", "cross_response"]
