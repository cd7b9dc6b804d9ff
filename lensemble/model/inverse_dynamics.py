"""Inverse-dynamics head: estimate the action block taken between two consecutive latents.

    â_t = MLP([h_t, h_{t+1} − h_t]),   h = in_proj(z)   (the predictor's input layer, width C)

Trained with ``objective.lambda_inverse`` (MSE against the actions actually taken), it makes the
encoder keep what the agent's own action changed, which a pure prediction loss can satisfy
without (shared/notes/planning-levers.md: EB-JEPA collapses from 97 % to 1 % without it).

Gauge: the head never sees z directly. It reads ``in_proj(z)``, and the latent-basis change
z -> z Q maps ``in_proj.weight -> W Q`` (:func:`lensemble.model.world_model.rotate_latent_basis_`),
so ``in_proj(z Q)`` under the rotated model equals ``in_proj(z)`` under the old one: the head's own
weights are gauge invariant and need no reparametrisation, and neither the Procrustes backstop nor
the frame anchor touches them. The head is part of the world model's state, so it federates like
the predictor (averaged with every other parameter).
"""

from __future__ import annotations

import torch
from torch import nn


class InverseDynamicsHead(nn.Module):
    """MLP (2·width -> hidden -> A·b) on a pair of in_proj features.

    ``width`` is the predictor width C, ``hidden`` ``ModelConfig.inverse_head``, ``action_in``
    the action block size A·b (env actions in [-1, 1], b of them concatenated). The predictor
    that owns it initialises its weights with its own convention.
    """

    def __init__(self, width: int, hidden: int, action_in: int):
        super().__init__()
        if hidden < 1:
            raise ValueError(f"the inverse-dynamics head needs hidden >= 1, got {hidden}")
        self.net = nn.Sequential(nn.Linear(2 * width, hidden), nn.GELU(), nn.Linear(hidden, action_in))

    def forward(self, h_t: torch.Tensor, h_next: torch.Tensor) -> torch.Tensor:
        """Features h_t, h_next (..., C) -> estimated action blocks (..., A·b).

        The difference h_next − h_t is what an action changes; h_t says where it acted (the same
        push moves the agent differently against a wall or a block)."""
        if h_t.shape != h_next.shape:
            raise ValueError(f"feature shapes differ: {tuple(h_t.shape)} vs {tuple(h_next.shape)}")
        return self.net(torch.cat([h_t, h_next - h_t], dim=-1))


__all__ = ["InverseDynamicsHead"]
