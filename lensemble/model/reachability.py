"""A learned temporal-reachability cost: how many latent steps separate a latent from a goal.

The L1 energy between a predicted latent and the goal latent is nearly flat for goals across
TwoRoom's wall (docs/model.md, Pilot 2): the straight-line latent distance says nothing about
the door. A reachability head ``r(z, g)`` is regressed on pairs of frames from logged
trajectories, labelled by the time between them (TRM and RC-aux in
shared/notes/planning-levers.md), so it learns distances along the paths the data actually took
— through the door — from images and actions' timing only, with no privileged state.

It is fitted *after* training, on the frozen latents of the checkpoint it serves: it is not part
of the federated state, and because it is fitted in the checkpoint's own latent frame the gauge
does not touch it (a checkpoint re-expressed by the backstop, ``z -> z Q``, simply gets a head
fitted on its rotated latents; :func:`rotate_head_basis_` does the same by reparametrisation).
Where the pairs come from is the evaluator's choice (``eval.reach_source``: the public corpus, so
no silo data is needed, or the pooled silo data a central model trained on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from lensemble.errors import ConfigError


class ReachabilityHead(nn.Module):
    """``r(z, g)``: predicted latent steps from ``z`` to ``g`` (≥ 0).

    Input features are ``[z, g − z]`` (2d), through an MLP of ``depth`` hidden layers of
    ``hidden`` units (GELU), ending in a softplus so the output is a non-negative step count.
    """

    def __init__(self, latent_dim: int, hidden: int = 256, depth: int = 2):
        super().__init__()
        if latent_dim < 1 or hidden < 1 or depth < 1:
            raise ConfigError(f"reachability head needs positive sizes, got d={latent_dim}, hidden={hidden}, "
                              f"depth={depth}")
        self.latent_dim = int(latent_dim)
        layers: list[nn.Module] = []
        width = 2 * self.latent_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.GELU()]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """z (..., d), g broadcastable to z -> (...) predicted latent steps (float32)."""
        z = z.float()
        g = g.float().expand_as(z)
        return nn.functional.softplus(self.net(torch.cat([z, g - z], dim=-1))).squeeze(-1)


@torch.no_grad()
def rotate_head_basis_(head: ReachabilityHead, q: torch.Tensor) -> ReachabilityHead:
    """In place: the head for latents re-expressed as ``z' = z Q`` (Q orthogonal, d x d).

    The first layer reads ``[z, g − z]``; with ``z = z' Qᵀ`` its weight blocks become ``W Q``
    column-block-wise, so ``head'(z Q, g Q) == head(z, g)`` up to floating-point error.
    """
    d = head.latent_dim
    if q.shape != (d, d):
        raise ValueError(f"Q must be ({d}, {d}), got {tuple(q.shape)}")
    first = head.net[0]
    w = first.weight.double()
    qd = q.to(dtype=torch.float64, device=w.device)
    first.weight.copy_(torch.cat([w[:, :d] @ qd, w[:, d:] @ qd], dim=1).to(first.weight.dtype))
    return head


@dataclass(frozen=True)
class ReachabilityFit:
    """A fitted head and how the fit went.

    Attributes:
        head: the fitted :class:`ReachabilityHead` (eval mode).
        episodes: trajectories the pairs were drawn from.
        max_gap: largest time gap sampled, in env steps.
        final_loss: mean squared error (latent steps²) over the last 10 % of fit steps.
        holdout_spearman: rank correlation between predicted and true gaps on pairs from held-back
            trajectories (the last ~10 % of episodes, never fitted) — how well the head orders
            distances it has not seen.
    """

    head: ReachabilityHead
    episodes: int
    max_gap: int
    final_loss: float
    holdout_spearman: float


def reachability_cost(head: ReachabilityHead, aggregate: str = "final"):
    """A planner cost (``lensemble.eval.mpc.CostFn``) from a fitted head.

    ``cost(predicted (B, S, H, d), goal (B, 1, d)) -> (B, S)`` latent steps: ``r`` at the last
    predicted latent (``aggregate="final"``) or its minimum over the horizon (``"min"``, the
    closest approach). Each row is scored alone, so batching cannot change a plan.
    """
    if aggregate not in ("final", "min"):
        raise ConfigError(f"unknown reachability aggregate {aggregate!r}", remediation="use 'final' or 'min'")

    def cost(predicted: torch.Tensor, goal: torch.Tensor) -> torch.Tensor:
        if head.net[0].weight.device != predicted.device:  # [device] follow the planner's tensors
            head.to(predicted.device)
        r = head(predicted, goal.unsqueeze(-2))                        # (B, S, H)
        return r[..., -1] if aggregate == "final" else r.min(dim=-1).values

    return cost


def _sample_pairs(lengths: torch.Tensor, offsets: torch.Tensor, n: int, max_gap: int,
                  g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n (start index, end index, gap) triples into the flattened latents; gap uniform in
    [0, min(max_gap, T_e)] env steps, episode chosen in proportion to its frames."""
    e = torch.multinomial(lengths.double(), n, replacement=True, generator=g)
    t_len = lengths[e] - 1                                    # env steps in the episode
    cap = torch.clamp(t_len, max=max_gap)
    gap = (torch.rand(n, generator=g) * (cap + 1).double()).floor().long().clamp(max=cap)
    t0 = (torch.rand(n, generator=g) * (t_len - gap + 1).double()).floor().long().clamp(max=t_len - gap)
    start = offsets[e] + t0
    return start, start + gap, gap


def _spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra = a.argsort().argsort().double()
    rb = b.argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp_min(1e-12))


def fit_reachability(
    episode_latents: Sequence[torch.Tensor],
    *,
    action_block: int,
    max_gap: int = 50,
    steps: int = 2000,
    batch_size: int = 512,
    lr: float = 1e-3,
    hidden: int = 256,
    depth: int = 2,
    seed: int = 0,
) -> ReachabilityFit:
    """Regress a :class:`ReachabilityHead` on pairs from logged trajectories.

    Args:
        episode_latents: one (T_e + 1, d) tensor per episode: the frozen latents of every frame,
            at env-step resolution, in time order.
        action_block: env steps per latent step (labels are gaps / action_block latent steps).
        max_gap: largest time gap sampled, in env steps (cover the whole planning budget: pairs
            with short gaps only do not learn long distances).
        steps, batch_size, lr: AdamW regression schedule (MSE on latent steps).
        hidden, depth: the head's size.
        seed: the pair sampling and the head's initialisation.

    Returns:
        :class:`ReachabilityFit`.
    """
    eps = [z.detach().float() for z in episode_latents if z.shape[0] >= 2]
    if len(eps) < 2:
        raise ConfigError(f"a reachability fit needs at least 2 episodes of >= 2 frames, got {len(eps)}",
                          remediation="collect more trajectories for eval.reach_source")
    if max_gap < 1 or action_block < 1:
        raise ConfigError(f"max_gap and action_block must be >= 1, got {max_gap}, {action_block}")
    n_hold = max(1, len(eps) // 10)
    fit_eps, hold_eps = eps[:-n_hold], eps[-n_hold:]
    d = eps[0].shape[1]
    g = torch.Generator().manual_seed(int(seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        head = ReachabilityHead(d, hidden, depth)

    def flat(group):
        lengths = torch.tensor([z.shape[0] for z in group])
        offsets = torch.cumsum(lengths, 0) - lengths
        return torch.cat(group), lengths, offsets

    z_all, lengths, offsets = flat(fit_eps)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    tail = max(1, steps // 10)
    losses = []
    head.train()
    for step in range(int(steps)):
        i, j, gap = _sample_pairs(lengths, offsets, batch_size, max_gap, g)
        loss = (head(z_all[i], z_all[j]) - gap.float() / action_block).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= steps - tail:
            losses.append(loss.detach().item())
    head.eval().requires_grad_(False)
    z_h, len_h, off_h = flat(hold_eps)
    i, j, gap = _sample_pairs(len_h, off_h, 4096, max_gap, g)
    with torch.no_grad():
        rho = _spearman(head(z_h[i], z_h[j]), gap.double())
    return ReachabilityFit(head=head, episodes=len(fit_eps), max_gap=int(max_gap),
                           final_loss=sum(losses) / len(losses), holdout_spearman=rho)


__all__ = ["ReachabilityHead", "ReachabilityFit", "fit_reachability", "reachability_cost", "rotate_head_basis_"]
