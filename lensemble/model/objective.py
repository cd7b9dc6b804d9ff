"""The JEPA training objective and the SIGReg sketch schedule.

    total = λ_pred · MSE(g(z_{<K-1}, a), sg(z_{1:}))  +  λ_sig · SIGReg_A(all latents of the batch)
            + λ_anc · anchor(model)  +  λ_straight · mean_t (1 − cos(z_{t+1} − z_t, z_{t+2} − z_{t+1}))
            + λ_rollout · MSE(rollout(z_0, a_{0:K-1}), sg(z_{1:}))
            + λ_inverse · MSE(inverse_head(z_t, z_{t+1}), a_t)

The anchor term is pluggable (the gauge package supplies it); the sketch A is passed per call so
the caller decides its schedule: :func:`sketch_for_step` (fresh every step, single-site) or
:func:`sketch_for_round` (one A per federated round shared by every participant,
INV-SKETCH-CONSISTENCY).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lensemble.config.schema import GaugeConfig, ObjectiveConfig
from lensemble.config.seeds import torch_generator
from lensemble.model.pooled import Pooling, pooled_batchnorm, pooled_sigreg
from lensemble.model.sigreg import make_sketch

AnchorFn = Callable[[torch.nn.Module], torch.Tensor]

#: The unweighted terms :meth:`LossTerms.as_floats` can report (besides the total "loss"); the
#: last three only when their weight is on. The trainer logs them as ``loss/<term>``.
LOSS_TERMS = ("pred", "sigreg", "anchor", "straight", "rollout", "inverse")


@dataclass
class LossTerms:
    """Loss terms of one step. ``total`` carries the graph; the others are the *unweighted*
    terms (fp32 scalars; pred/sigreg/anchor are detached). ``latents`` is the detached batch
    of latents (B, K, d) for diagnostics such as effective dimension."""

    total: torch.Tensor
    pred: torch.Tensor
    sigreg: torch.Tensor
    anchor: torch.Tensor
    latents: torch.Tensor | None = None
    straight: torch.Tensor | None = None  # only when λ_straight > 0
    rollout: torch.Tensor | None = None   # only when λ_rollout > 0
    inverse: torch.Tensor | None = None   # only when λ_inverse > 0

    def as_floats(self) -> dict[str, float]:
        """Python floats for logging: {"loss", "pred", "sigreg", "anchor"} (+ "straight", "rollout",
        "inverse" when their terms are on)."""
        out = {"loss": float(self.total.detach())}
        for term in LOSS_TERMS:
            value = getattr(self, term)
            if value is not None:
                out[term] = float(value)
        return out


def temporal_straightening(z: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Mean curvature ``1 − cos(z_{t+1} − z_t, z_{t+2} − z_{t+1})`` of latent trajectories.

    z: (B, K, d) with K >= 3. Returns a scalar in [0, 2]: 0 when every clip moves along a
    straight line at any speed, 2 when every step reverses the previous one. Invariant to any
    rotation (and scaling) of the latent space, so it is blind to the gauge. ``eps`` keeps a
    zero step (a frame that did not move) from dividing by zero; such a pair then counts as
    cosine 0.
    """
    if z.ndim != 3 or z.shape[1] < 3:
        raise ValueError(f"temporal straightening needs latents (B, K >= 3, d), got {tuple(z.shape)}")
    zf = z.float()  # [precision] differences of bf16 latents would lose their low bits
    v = zf[:, 1:] - zf[:, :-1]
    cos = F.cosine_similarity(v[:, 1:], v[:, :-1], dim=-1, eps=eps)
    return (1.0 - cos).mean()


def sketch_for_step(
    root_seed: int, step: int, d: int, num_directions: int, *, site: str | int | None = None
) -> torch.Tensor:
    """Fresh sketch (d, S) for single-site step ``step``: seed derive(root, "sketch", "step", step)
    (plus ``site`` when given, so independent silos draw independent sketches)."""
    labels = ("sketch", "step", step) if site is None else ("sketch", "site", site, "step", step)
    return make_sketch(d, num_directions, torch_generator(root_seed, *labels))


def sketch_for_round(root_seed: int, round_idx: int, d: int, num_directions: int) -> torch.Tensor:
    """The sketch (d, S) every participant uses in round ``round_idx``:
    seed derive(root_seed, "sketch", round_idx), as DESIGN.md §3 specifies."""
    return make_sketch(d, num_directions, torch_generator(root_seed, "sketch", round_idx))


@dataclass(frozen=True)
class BatchStatistics:
    """How the objective computes its batch statistics (SIGReg, train-mode BatchNorm).

    The default (one share, nothing pooled) is the plain objective: one encoder pass over the
    batch, SIGReg of all its latents. Otherwise the batch is ``shares`` consecutive slices of
    clips (one per silo; sizes sum to B):

    - ``batchnorm_per_share``: each share is encoded in its own train-mode forward, so BatchNorm
      normalises it by its own moments, as a participant's batch is under federation;
    - ``sigreg_per_share``: SIGReg is each share's statistic at its own N, summed over shares (so
      each latent's gradient has the size it has in the pooled statistic);
    - ``pooling``: per share, the other shares' (silos') summaries it is pooled with
      (:class:`~lensemble.model.pooled.Pooling`, or None): SIGReg of that share is then the pooled
      statistic and, when the pooling carries BatchNorm moments, the share is normalised with
      pooled moments. A participant under federation is one share with the others' pooling.
    - ``sigreg_weight``: the factor on the SIGReg term of the total (the reported ``sigreg`` is
      the statistic itself). A participant pooled with C − 1 others sets C: each live latent's
      gradient of the pooled statistic is the union batch's (:func:`pooled_sigreg`), but the
      coordinator *averages* the C updates, so without the factor the federation would descend
      λ_sig·SIGReg / C against the data-parallel twin's λ_sig·SIGReg of the union batch
      (tests/unit/test_pooled_exact.py: the averaged gradient is the union batch's).
    """

    shares: tuple[int, ...] | None = None
    batchnorm_per_share: bool = False
    sigreg_per_share: bool = False
    pooling: tuple[Pooling | None, ...] | None = None
    sigreg_weight: float = 1.0

    def share_slices(self, b: int) -> list[slice]:
        sizes = self.shares or (b,)
        if sum(sizes) != b:
            raise ValueError(f"shares {sizes} do not add up to the batch's {b} clips")
        if self.pooling is not None and len(self.pooling) != len(sizes):
            raise ValueError(f"{len(self.pooling)} poolings for {len(sizes)} shares")
        bounds = [0]
        for n in sizes:
            bounds.append(bounds[-1] + n)
        return [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]

    def pooling_of(self, i: int) -> Pooling | None:
        return self.pooling[i] if self.pooling is not None else None


PLAIN = BatchStatistics()


class JEPAObjective:
    """Callable loss: ``objective(model, obs, actions, sketch) -> LossTerms``.

    Args:
        objective_cfg: λ_pred, λ_sig, SIGReg knots / t_max, stop-gradient flag.
        anchor: optional ``anchor(model) -> scalar tensor`` (gauge anchor term).
        lambda_anc: weight of the anchor term (``cfg.gauge.lambda_anc``). Its default is read from
            the schema (GaugeConfig) so the two cannot disagree. The anchor is not evaluated when
            it is None or lambda_anc == 0; the anchor field is then 0.
    """

    def __init__(
        self, objective_cfg: ObjectiveConfig, *, anchor: AnchorFn | None = None,
        lambda_anc: float = GaugeConfig.model_fields["lambda_anc"].default,
    ):
        if lambda_anc < 0:
            raise ValueError(f"lambda_anc must be >= 0, got {lambda_anc}")
        self.cfg = objective_cfg
        self.anchor = anchor
        self.lambda_anc = float(lambda_anc)

    def __call__(
        self,
        model: torch.nn.Module,
        obs: torch.Tensor,
        actions: torch.Tensor,
        sketch: torch.Tensor,
        stats: BatchStatistics = PLAIN,
    ) -> LossTerms:
        """One clip batch.

        model: a WorldModel (``.encoder.encode_frames``, ``.predictor``).
        obs: uint8 (B, K, 3, H, W) frames at stride ``action_block``; actions: float (B, K-1, A*b);
        sketch: (d, S) unit-norm directions (moved to the latents' device); stats: how batch
        statistics are computed (:class:`BatchStatistics`; the default is the plain objective).
        """
        if obs.ndim != 5:
            raise ValueError(f"obs must be (B, K, 3, H, W), got {tuple(obs.shape)}")
        b, k = obs.shape[:2]
        if k < 2:
            raise ValueError("a clip needs at least 2 frames")
        if actions.shape[:2] != (b, k - 1):
            raise ValueError(f"actions must be (B={b}, K-1={k - 1}, A*b), got {tuple(actions.shape)}")
        cfg = self.cfg
        shares = stats.share_slices(b)
        z = self._encode(model, obs, stats, shares)  # (B, K, d)
        pred = model.predictor(z[:, :-1], actions.to(z.dtype))
        target = z[:, 1:].detach() if cfg.stop_gradient else z[:, 1:]
        pred_loss = F.mse_loss(pred.float(), target.float())
        if len(shares) > 1 and (stats.sigreg_per_share or stats.pooling is not None):
            sig = torch.stack([pooled_sigreg(z[sl], sketch, stats.pooling_of(i), knots=cfg.sigreg_knots,
                                             t_max=cfg.sigreg_t_max) for i, sl in enumerate(shares)]).sum()
        else:  # one share (pooled with the others' summary, if any), or shares that share one SIGReg
            sig = pooled_sigreg(z, sketch, stats.pooling_of(0) if len(shares) == 1 else None,
                                knots=cfg.sigreg_knots, t_max=cfg.sigreg_t_max)
        total = cfg.lambda_pred * pred_loss + cfg.lambda_sig * stats.sigreg_weight * sig
        if self.anchor is not None and self.lambda_anc > 0:
            anc = self.anchor(model).float()
            total = total + self.lambda_anc * anc
        else:
            anc = torch.zeros((), device=z.device)
        straight = None
        if cfg.lambda_straight > 0:
            straight = temporal_straightening(z)
            total = total + cfg.lambda_straight * straight
            straight = straight.detach()
        roll = None
        if cfg.lambda_rollout > 0:
            # Open loop from the first latent alone: the predictor's own predictions are its
            # inputs after step 1, as in planning (errors compound here, not under teacher forcing).
            rolled = model.predictor.rollout(z[:, :1], actions.to(z.dtype))
            roll = F.mse_loss(rolled.float(), target.float())
            total = total + cfg.lambda_rollout * roll
            roll = roll.detach()
        inv = None
        if cfg.lambda_inverse > 0:
            # Not detached: the gradient reaches the encoder, which is the point of the lever
            # (latents must keep what the action changed).
            est = model.predictor.infer_actions(z)
            inv = F.mse_loss(est.float(), actions.float())
            total = total + cfg.lambda_inverse * inv
            inv = inv.detach()
        return LossTerms(
            total=total,
            pred=pred_loss.detach(),
            sigreg=sig.detach(),
            anchor=anc.detach(),
            latents=z.detach(),
            straight=straight,
            rollout=roll,
            inverse=inv,
        )

    @staticmethod
    def _encode(model: torch.nn.Module, obs: torch.Tensor, stats: BatchStatistics, shares: list[slice]) -> torch.Tensor:
        """Latents (B, K, d): one pass over the batch, or one train-mode pass per share when each
        share needs its own BatchNorm statistics (per share, or pooled with its own summary)."""
        separate = stats.batchnorm_per_share or any(
            p is not None and p.bn is not None for p in (stats.pooling or ()))
        if not separate:
            with pooled_batchnorm(model.encoder, stats.pooling_of(0)) if len(shares) == 1 else nullcontext():
                return model.encoder.encode_frames(obs)
        parts = []
        for i, sl in enumerate(shares):
            with pooled_batchnorm(model.encoder, stats.pooling_of(i)):
                parts.append(model.encoder.encode_frames(obs[sl]))
        return torch.cat(parts)


__all__ = ["LOSS_TERMS", "PLAIN", "BatchStatistics", "JEPAObjective", "LossTerms", "sketch_for_round", "sketch_for_step", "temporal_straightening"]
