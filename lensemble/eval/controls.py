"""The closed loop's controls: the goal-posing expert and the random-action control.

Both are callables ``policy(env) -> action`` over an :class:`~lensemble.envs.EnvAdapter`, like the
collection policies, and both draw from their own ``numpy.random.Generator`` so an evaluation
episode is a pure function of its seed.

- :func:`goal_expert` drives the env for ``goal_offset`` steps to pose the strict protocol's goal
  (:mod:`lensemble.eval.goals`). For TwoRoom it is stable-worldmodel's door-aware ``ExpertPolicy``
  steering to the env's *own* target, so "the state k expert steps ahead" is progress along a real
  route to it. That target is not always in the other room: in stable-worldmodel 0.1.1 it was
  across the wall in 83 of the first 200 evaluation resets, and 25 steps do not always reach the
  door, so about a fifth of strict goals lie across the wall (docs/evaluation.md). (The collection
  expert follows random waypoints instead, which suits data coverage.) PushT has no packaged
  solver, so the collection's block-seeking expert is used, without noise.
- :class:`RandomActionPolicy` is the control for closed-loop success: uniform actions in the env's
  bounds, a fresh one every env step. Any planner worth reporting must beat it.
"""

from __future__ import annotations

import numpy as np

from lensemble.envs.adapter import EnvAdapter
from lensemble.envs.factors import TWOROOM
from lensemble.envs.policies import make_expert


class RandomActionPolicy:
    """Uniform random actions in [action_low, action_high], float32 (A,), one per env step."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def reset(self, env: EnvAdapter) -> None:  # stateless; kept for the policy protocol
        pass

    def __call__(self, env: EnvAdapter) -> np.ndarray:
        low = np.asarray(env.info.action_low, np.float32)
        high = np.asarray(env.info.action_high, np.float32)
        return self.rng.uniform(low, high).astype(np.float32)


class _TwoRoomTargetExpert:
    """stable-worldmodel's TwoRoom ``ExpertPolicy`` steered to the env's current target."""

    def __init__(self):
        from stable_worldmodel.envs.two_room import ExpertPolicy

        self._expert = ExpertPolicy(action_noise=0.0)

    def reset(self, env: EnvAdapter) -> None:
        self._expert.set_env(env.env)

    def __call__(self, env: EnvAdapter) -> np.ndarray:
        action = self._expert.get_action({"state": env.agent_position(), "goal_state": env.goal_state()})
        return np.clip(np.asarray(action, np.float32).reshape(env.info.action_dim), -1.0, 1.0)


def goal_expert(env: EnvAdapter, rng: np.random.Generator):
    """The noise-free expert that poses evaluation goals for ``env`` (see the module docstring)."""
    if env.env_id == TWOROOM:
        return _TwoRoomTargetExpert()
    return make_expert(env, rng, noise=0.0)


__all__ = ["RandomActionPolicy", "goal_expert"]
