"""The true dynamics the oracle planner rolls out, per environment, and the state it scores.

The oracle (``evaluate(..., policy="oracle")``, :func:`lensemble.eval.episode_runner._oracle_chunk`)
is the MPC protocol's planner with the world model replaced by the environment's own dynamics,
batched over the planner's samples; its L1 energy scores an embedded state against the embedded
goal:

- TwoRoom: the agent position (px), :class:`~lensemble.eval.routes.TwoRoomDynamics`.
- PushT: :func:`~lensemble.eval.pusht_sim.pusht_embedding`, :class:`~lensemble.eval.pusht_sim.PushTDynamics`.
- Reacher: :func:`~lensemble.eval.reacher_sim.reacher_embedding`,
  :class:`~lensemble.eval.reacher_sim.ReacherDynamics`.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from lensemble.envs.factors import PUSHT, REACHER, TWOROOM
from lensemble.eval.pusht_sim import PushTDynamics, pusht_embedding
from lensemble.eval.reacher_sim import ReacherDynamics, reacher_embedding
from lensemble.eval.routes import TwoRoomDynamics

#: The envs whose true dynamics the oracle can roll out.
ORACLE_ENVS = (TWOROOM, PUSHT, REACHER)


def oracle_model(envs) -> tuple[object, Callable[[object], np.ndarray], torch.Tensor]:
    """(dynamics over ``envs``, env -> embedded state (D,), embedded goals (B, D) float32)."""
    env_id = envs[0].env_id
    if env_id == PUSHT:
        return (PushTDynamics.from_envs(envs), lambda env: pusht_embedding(env.state()).numpy(),
                pusht_embedding(np.stack([env.goal_state() for env in envs])))
    if env_id == REACHER:
        return (ReacherDynamics.from_envs(envs), lambda env: reacher_embedding(env.state()).numpy(),
                reacher_embedding(np.stack([env.goal_state() for env in envs])))
    if env_id == TWOROOM:
        goal = np.stack([env.goal_state()[:2] for env in envs]).astype(np.float32)
        return TwoRoomDynamics.from_envs(envs), lambda env: env.agent_position(), torch.from_numpy(goal)
    raise ValueError(f"no true dynamics for {env_id} (oracle: {ORACLE_ENVS})")


__all__ = ["ORACLE_ENVS", "oracle_model"]
