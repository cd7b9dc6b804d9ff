"""The pooled objective's batch statistics: SIGReg and BatchNorm across silos, from summaries.

Anything computed over a batch is part of the objective. Computed on one silo's batch it is not
the pooled objective: SIGReg's empirical characteristic function (ECF) is linear in the samples,
so for silos k with weights w_k (Σ w_k = 1) and φ̂_pool = Σ_k w_k φ̂_k,

    Σ_k w_k |φ̂_k(t) − φ(t)|²  =  |φ̂_pool(t) − φ(t)|²  +  Σ_k w_k |φ̂_k(t) − φ̂_pool(t)|²,

i.e. per-silo SIGReg is the pooled SIGReg plus a penalty on every difference between the silos'
latent distributions; BatchNorm normalising each silo's batch by its own moments removes the same
differences at the projector (docs/federation.md, "The pooled objective").

Here each party summarises what the pooled statistics need with sums and means — which secure
aggregation can add — and trains with its own live batch (with gradient) pooled with the others'
summary (fixed):

- :class:`EcfSummary`: per sketch direction s and knot t_k, the mean of cos(t_k p) and sin(t_k p)
  of the *uncentred* projections p = z a_s, and the mean of p. Centring on the pooled mean
  μ = Σ w_k μ_k is exact afterwards: the centred ECF is exp(−i t μ) · Σ_k w_k (C_k + i S_k).
- :class:`Moments`: per BatchNorm layer, the mean, variance and squared mean of its input features.

Weights: every party weighs alike (w_k = 1/C), as the coordinator's unweighted mean of
pseudo-gradients does; so a pooled summary is the mean of the parties' summaries, which is what a
SecAgg+ sum divided by C gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lensemble.model.precision import full_precision
from lensemble.model.sigreg import _knot_weights, sigreg

#: Names under which a summary travels (np arrays; see :meth:`SiloSummary.to_arrays`).
ECF_FIELDS = ("cos", "sin", "mean")
ECF_KEYS = tuple(f"ecf.{f}" for f in ECF_FIELDS)
MOMENT_FIELDS = ("mean", "var", "meansq")
GRADIENT_FIELDS = ("mean", "var")


@dataclass
class EcfSummary:
    """Mean ECF parts of a set of latents on one sketch: cos, sin (S, K) and mean (S,), float32.

    Means, not sums: every entry lies in [−1, 1] except ``mean`` (the projections' mean), so a
    summary fits a SecAgg+ clip range, and a mean over parties is the pooled summary at equal
    weights.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    mean: torch.Tensor


@dataclass
class Moments:
    """One BatchNorm layer's input: per-feature mean, (biased) variance and squared mean (H,), float32.

    Centred moments, not E[x²]: E[x²] − mean² loses every digit of a small variance under a large
    mean in float32. Summed over parties they still pool exactly (:meth:`PoolableBatchNorm1d.forward`).
    """

    mean: torch.Tensor
    var: torch.Tensor
    meansq: torch.Tensor

    @classmethod
    def of(cls, x: torch.Tensor) -> "Moments":
        """The moments of a batch x (N, H) in float32."""
        x = x.to(torch.float32)
        mean = x.mean(dim=0)
        return cls(mean, x.var(dim=0, unbiased=False), mean.square())


@dataclass
class MomentGradient:
    """One BatchNorm layer: the gradient of a party's loss with respect to the pooled moments it
    is normalised with, through that party's own outputs: ∂L_k/∂μ and ∂L_k/∂σ² (H,), float32
    (in a summary that travels: standardised, :func:`standardised_gradients`).

    This is what SyncBatchNorm's backward all-reduces. Under the pooled objective a party's frames
    move the pooled moments and so every *other* party's outputs; no summary of latents carries
    that path, so each party sends this and the others add it (:class:`PoolableBatchNorm1d`).
    """

    mean: torch.Tensor
    var: torch.Tensor


@dataclass
class Pooling:
    """The fixed part of one party's pooled statistics: the *other* parties' summaries, summed
    (``others`` of them), and ``parties`` = C, the number of parties the pooled mean is over.

    The pooled ECF a party trains with is (ECF_live + Σ_others ECF_j) / C; with ``others`` = 0 it
    is the live batch's own (the silo objective). ``bn_grad`` (per BatchNorm layer, Σ over the
    others of their :class:`MomentGradient`) closes the cross-party path through the pooled moments.
    """

    parties: int
    ecf: EcfSummary | None = None          # Σ over the others (cos, sin, mean summed)
    bn: list[Moments] | None = None        # per BatchNorm layer, Σ over the others
    bn_grad: list[MomentGradient] | None = None  # per BatchNorm layer, Σ over the others


#: The variance offset of the moment gradients' standardisation (nn.BatchNorm1d's default eps): both
#: ends use it, so :func:`standardised_gradients` and :func:`raw_gradients` are exact inverses.
GRADIENT_EPS = 1e-5


def standardised_gradients(grads: Sequence[MomentGradient], pooled: Sequence[tuple[torch.Tensor, torch.Tensor]]
                           ) -> list[MomentGradient]:
    """Moment gradients as they travel: ∂L/∂μ·√(σ²+ε) and ∂L/∂σ²·(σ²+ε) at the pooled (μ, σ²) of
    each layer. Raw, they scale as 1/σ and 1/σ³ (∂L/∂σ² reached 1.5e6 on the micro preset, whose
    BatchNorm inputs vary little); standardised they are sums of the outputs' gradients, bounded
    like the loss."""
    return [MomentGradient(g.mean * torch.sqrt(v + GRADIENT_EPS), g.var * (v + GRADIENT_EPS))
            for g, (_, v) in zip(grads, pooled, strict=True)]


def raw_gradients(grads: Sequence[MomentGradient], pooled: Sequence[tuple[torch.Tensor, torch.Tensor]]
                  ) -> list[MomentGradient]:
    """The inverse of :func:`standardised_gradients`: ∂L/∂μ and ∂L/∂σ² at the pooled moments."""
    return [MomentGradient(g.mean / torch.sqrt(v + GRADIENT_EPS), g.var / (v + GRADIENT_EPS))
            for g, (_, v) in zip(grads, pooled, strict=True)]


class _AddGradient(torch.autograd.Function):
    """Identity forward; backward adds the fixed tensor ``g`` to the incoming gradient, so ``x``
    behaves as if the loss held the term <g, x> (whose value is not counted in the loss)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        ctx.g = g.detach()
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad + ctx.g.to(grad), None


def add_gradient(x: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    """``x`` with ``g`` added to its gradient in the backward pass (``x`` itself when g is None)."""
    return x if g is None else _AddGradient.apply(x, g)


def ecf_summary(z: torch.Tensor, sketch: torch.Tensor, *, knots: int = 17, t_max: float = 3.0) -> EcfSummary:
    """The ECF summary of latents z (N, d) (leading dims flattened) on ``sketch`` (d, S)."""
    z = z.reshape(-1, z.shape[-1]).to(torch.float32)
    with full_precision(z):  # [precision] fp32 under bf16 autocast, like sigreg()
        proj = z @ sketch.to(device=z.device, dtype=torch.float32)  # (N, S)
        t, _, _ = _knot_weights(knots, t_max, z.device)
        arg = proj.unsqueeze(-1) * t  # (N, S, K)
        return EcfSummary(torch.cos(arg).mean(dim=0), torch.sin(arg).mean(dim=0), proj.mean(dim=0))


def pooled_sigreg(z: torch.Tensor, sketch: torch.Tensor, pooling: Pooling | None, *, knots: int = 17,
                  t_max: float = 3.0) -> torch.Tensor:
    """SIGReg of the pooled latent distribution, differentiable w.r.t. the live latents z (N, d).

    The pooled ECF is (live + Σ others) / C with the live batch's summary in it; the projections
    are centred on the pooled mean. Scaled by N_eff = N·C (the live batch counts for 1/C of the
    pool), so each live latent's gradient has the size it has in :func:`~lensemble.model.sigreg.sigreg`
    of a pooled batch, and at C = 1 this *is* ``sigreg(z)`` (same value and gradient, float
    rounding aside). When ``others`` equals the summary of a batch z' of the same size, the value
    equals ``sigreg(cat(z, z'))`` (tests/unit/test_pooled_stats.py).
    """
    if pooling is None or pooling.ecf is None:
        return sigreg(z, sketch, knots=knots, t_max=t_max)
    live = ecf_summary(z, sketch, knots=knots, t_max=t_max)
    others = pooling.ecf
    total = EcfSummary(live.cos + others.cos.to(live.cos), live.sin + others.sin.to(live.sin),
                       live.mean + others.mean.to(live.mean))
    return sigreg_of_summed(total, pooling.parties, z.reshape(-1, z.shape[-1]).shape[0], knots=knots, t_max=t_max)


def sigreg_of_summed(total: EcfSummary, parties: int, frames: int, *, knots: int = 17,
                     t_max: float = 3.0) -> torch.Tensor:
    """The pooled SIGReg of C = ``parties`` parties from their *summed* ECF summaries (cos, sin
    (S, K), mean (S,)), each party counting ``frames`` latents: N·C times the Epps–Pulley error of
    the pooled ECF centred on the pooled mean (a rotation of the ECF by exp(−i t μ))."""
    c = float(parties)
    mu = total.mean / c  # (S,)
    re_raw, im_raw = total.cos / c, total.sin / c  # (S, K)
    t, phi, w = _knot_weights(knots, t_max, total.cos.device)
    ang = mu.unsqueeze(-1) * t  # (S, K)
    cos_a, sin_a = torch.cos(ang), torch.sin(ang)
    re = re_raw * cos_a + im_raw * sin_a
    im = im_raw * cos_a - re_raw * sin_a
    err = (re - phi).square() + im.square()
    with full_precision(err):  # [precision] err @ w is a matmul: fp32 under bf16 autocast
        return frames * c * (err @ w).mean()


class PoolableBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d that can normalise a training batch with moments pooled across silos.

    Same parameters and buffers as ``nn.BatchNorm1d`` (checkpoints and hashes do not change).
    While :func:`pooled_batchnorm` has set ``pooled_with`` (the other parties' summed moments and
    the party count C), a train-mode forward normalises with
    mean = (live mean + Σ others) / C and var the pooled variance (law of total variance), the
    gradient flowing through the live batch only, and updates the running statistics with those
    pooled moments (momentum, unbiased over the pool's C·N frames), as ``nn.BatchNorm1d`` updates
    them with a batch's. While :func:`fixed_batchnorm` has set ``fixed`` (a pooled mean and
    variance), every forward normalises with exactly those, in any mode, and leaves the running
    statistics alone: that is how a party encodes its round summary with the moments its live batch
    will be normalised with (:func:`lensemble.training.pooling.summarise`). Otherwise it is exactly
    ``nn.BatchNorm1d``. ``record`` (a list, or None) collects the input moments of each forward, for
    summaries.
    """

    pooled_with: tuple[Moments, int] | None = None
    pooled_grad: MomentGradient | None = None  # Σ over the others of ∂L_k/∂(μ, σ²): added in backward
    fixed: tuple[torch.Tensor, torch.Tensor] | None = None  # (mean, biased var) (H,)
    record: list[Moments] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.record is not None:
            self.record.append(Moments.of(x.detach()))
        if self.fixed is not None:
            mean, var = self.fixed
            return self._normalise(x, mean, var)
        if self.pooled_with is None or not self.training:
            return super().forward(x)
        others, c = self.pooled_with
        xf = x.to(torch.float32)
        live_mean, live_var = xf.mean(dim=0), xf.var(dim=0, unbiased=False)
        mean = (live_mean + others.mean.to(xf)) / c
        # law of total variance over the C parties: mean within-party variance + variance of their means;
        # Σ_others (μ_k − μ)² = Σ μ_k² − 2μ Σ μ_k + (C − 1) μ²
        between = ((live_mean - mean).square() + others.meansq.to(xf) - 2 * mean * others.mean.to(xf)
                   + (c - 1) * mean.square())
        var = ((live_var + others.var.to(xf) + between) / c).clamp_min(0.0)
        if self.track_running_stats and self.running_mean is not None:
            # the running statistics follow the moments the batch was normalised with, as in
            # nn.BatchNorm1d (unbiased over the pool's frames), so eval mode sees the pooled moments
            n = x.shape[0] * c
            with torch.no_grad():
                # momentum None: the cumulative average, as nn.BatchNorm1d keeps it
                m = 1.0 / float(self.num_batches_tracked + 1) if self.momentum is None else self.momentum
                self.running_mean.mul_(1 - m).add_(m * mean.detach())
                self.running_var.mul_(1 - m).add_(m * var.detach() * (n / max(n - 1.0, 1.0)))
                self.num_batches_tracked.add_(1)
        if self.pooled_grad is not None:
            # [pooled] the others' outputs depend on these moments too: their gradient with respect to
            # them (fixed, from the round's start) joins this party's, as SyncBatchNorm's backward sums it
            mean = add_gradient(mean, self.pooled_grad.mean)
            var = add_gradient(var, self.pooled_grad.var)
        return self._normalise(x, mean, var)

    def _normalise(self, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32)
        y = (xf - mean.to(xf)) / torch.sqrt(var.to(xf) + self.eps)
        if self.affine:
            y = y * self.weight + self.bias
        return y.to(x.dtype)


def pooled_moments(mean: Sequence[Moments]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per BatchNorm layer, the (mean, biased variance) of the pooled frames from the parties'
    *mean* summary (each field averaged over the C parties, as the coordinator pools them):
    mean = E_k[μ_k], var = E_k[σ²_k] + E_k[μ_k²] − mean² (law of total variance). These are the
    moments a live batch equal to its party's summary is normalised with under
    ``bn_scope=pooled`` (:class:`PoolableBatchNorm1d`), and the union batch under plain BatchNorm."""
    return [(m.mean, (m.var + m.meansq - m.mean.square()).clamp_min(0.0)) for m in mean]


@contextmanager
def fixed_batchnorm(module: nn.Module, moments: Sequence[tuple[torch.Tensor, torch.Tensor]] | None):
    """Inside the block, ``module``'s poolable BatchNorm layers normalise with the given (mean, var)
    per layer (module order) in any mode; running statistics are left alone. A no-op for None."""
    layers = poolable_layers(module)
    if moments is None:
        yield
        return
    if len(moments) != len(layers):
        raise ValueError(f"{len(moments)} fixed BatchNorm moments for {len(layers)} BatchNorm layers")
    try:
        for layer, mv in zip(layers, moments, strict=True):
            layer.fixed = mv
        yield
    finally:
        for layer in layers:
            layer.fixed = None


def poolable_layers(module: nn.Module) -> list[PoolableBatchNorm1d]:
    """The module's poolable BatchNorm layers, in module order (the order moments travel in)."""
    return [m for m in module.modules() if isinstance(m, PoolableBatchNorm1d)]


@contextmanager
def pooled_batchnorm(module: nn.Module, pooling: Pooling | None):
    """Inside the block, ``module``'s BatchNorm layers normalise train-mode batches with moments
    pooled with ``pooling.bn`` (one :class:`Moments` per layer, in module order). A no-op when
    ``pooling`` has no BatchNorm moments."""
    layers = poolable_layers(module)
    if pooling is None or pooling.bn is None or not layers:
        yield
        return
    if len(pooling.bn) != len(layers):
        raise ValueError(f"{len(pooling.bn)} BatchNorm moment summaries for {len(layers)} BatchNorm layers")
    grads = pooling.bn_grad or [None] * len(layers)
    if len(grads) != len(layers):
        raise ValueError(f"{len(grads)} BatchNorm moment gradients for {len(layers)} BatchNorm layers")
    try:
        for layer, moments, grad in zip(layers, pooling.bn, grads, strict=True):
            layer.pooled_with = (moments, pooling.parties)
            layer.pooled_grad = grad
        yield
    finally:
        for layer in layers:
            layer.pooled_with = None
            layer.pooled_grad = None


@contextmanager
def recording_moments(module: nn.Module):
    """Collects the BatchNorm input moments of every forward inside the block: yields a list that
    receives, per forward, one list of :class:`Moments` per layer (module order)."""
    layers = poolable_layers(module)
    records: list[list[Moments]] = [[] for _ in layers]
    try:
        for layer, rec in zip(layers, records, strict=True):
            layer.record = rec
        yield records
    finally:
        for layer in layers:
            layer.record = None


@dataclass
class SiloSummary:
    """What one party contributes to the pooled statistics of a round: its ECF summary on the
    round's sketch (None unless SIGReg is pooled) and its BatchNorm input moments (None unless
    BatchNorm is pooled), each a mean over ``frames`` latents; and, from the round's third pass,
    its loss's gradient with respect to the pooled moments (:class:`MomentGradient`)."""

    ecf: EcfSummary | None
    bn: list[Moments] | None
    bn_grad: list[MomentGradient] | None = None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat float32 arrays under fixed names: ``ecf.cos`` (S, K), ``ecf.sin``, ``ecf.mean`` (S,),
        ``bn.<i>.mean`` / ``bn.<i>.var`` / ``bn.<i>.meansq`` (H,) per BatchNorm layer i,
        ``bngrad.<i>.mean`` / ``bngrad.<i>.var`` (H,) for its moment gradients."""
        out: dict[str, np.ndarray] = {}
        if self.ecf is not None:
            for f in ECF_FIELDS:
                out[f"ecf.{f}"] = getattr(self.ecf, f).detach().cpu().numpy().astype(np.float32)
        for i, m in enumerate(self.bn or []):
            for f in MOMENT_FIELDS:
                out[f"bn.{i}.{f}"] = getattr(m, f).detach().cpu().numpy().astype(np.float32)
        for i, g in enumerate(self.bn_grad or []):
            for f in GRADIENT_FIELDS:
                out[f"bngrad.{i}.{f}"] = getattr(g, f).detach().cpu().numpy().astype(np.float32)
        return out

    def scaled(self, k: float) -> "SiloSummary":
        """Every entry times ``k`` (a sum over C parties times 1/C is their pooled mean)."""
        return _fieldwise(lambda x: x * k, self)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "SiloSummary":
        def t(key: str) -> torch.Tensor:
            return torch.from_numpy(np.asarray(arrays[key], dtype=np.float32))

        ecf = EcfSummary(*(t(k) for k in ECF_KEYS)) if ECF_KEYS[0] in arrays else None
        n_bn = len({k.split(".")[1] for k in arrays if k.startswith("bn.")})
        bn = [Moments(*(t(f"bn.{i}.{f}") for f in MOMENT_FIELDS)) for i in range(n_bn)] or None
        n_grad = len({k.split(".")[1] for k in arrays if k.startswith("bngrad.")})
        grads = [MomentGradient(*(t(f"bngrad.{i}.{f}") for f in GRADIENT_FIELDS)) for i in range(n_grad)] or None
        return cls(ecf, bn, grads)


def _fieldwise(fn, *summaries: SiloSummary) -> SiloSummary:
    """The summary whose every field is ``fn`` of the same field of ``summaries`` (which share a
    layout: the first one's ECF / BatchNorm parts decide which parts there are)."""
    first = summaries[0]
    ecf = None if first.ecf is None else EcfSummary(
        *(fn(*(getattr(s.ecf, f) for s in summaries)) for f in ECF_FIELDS))
    bn = None if first.bn is None else [
        Moments(*(fn(*(getattr(s.bn[i], f) for s in summaries)) for f in MOMENT_FIELDS)) for i in range(len(first.bn))]
    grads = None if first.bn_grad is None else [
        MomentGradient(*(fn(*(getattr(s.bn_grad[i], f) for s in summaries)) for f in GRADIENT_FIELDS))
        for i in range(len(first.bn_grad))]
    return SiloSummary(ecf, bn, grads)


def sum_summaries(summaries: Sequence[SiloSummary]) -> SiloSummary:
    """The element-wise sum of parties' summaries (what secure aggregation would reveal)."""
    return _fieldwise(lambda *xs: torch.stack(xs).sum(0), *summaries)


def others_pooling(pooled_mean: SiloSummary, own: SiloSummary | None, parties: int) -> Pooling:
    """One party's :class:`Pooling` from the pooled mean over ``parties`` contributors and its
    own contribution (None when it did not contribute: then the pool gains it as one more party).

    Σ_others = C·mean − own (own in the pool) or C·mean (own not in it, C+1 parties then).
    """
    c = float(parties)
    if own is None:
        others = _fieldwise(lambda m: m * c, pooled_mean)
    else:
        others = _fieldwise(lambda m, o: m * c - o, pooled_mean, own)
    return Pooling(parties=int(parties) + (own is None), ecf=others.ecf, bn=others.bn, bn_grad=others.bn_grad)


__all__ = ["ECF_KEYS", "GRADIENT_EPS", "GRADIENT_FIELDS", "raw_gradients", "standardised_gradients", "EcfSummary", "MomentGradient", "Moments", "Pooling", "add_gradient", "PoolableBatchNorm1d", "SiloSummary", "ecf_summary",
           "fixed_batchnorm", "others_pooling", "sigreg_of_summed", "pooled_batchnorm", "pooled_moments", "pooled_sigreg",
           "poolable_layers", "recording_moments", "sum_summaries"]
