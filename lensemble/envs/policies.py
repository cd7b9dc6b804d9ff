"""Data-collection policies: a scripted expert per env, held random actions, and their mixture.

Every policy is a callable ``policy(env) -> action`` taking an :class:`EnvAdapter` and returning a
float32 (A,) action inside the env's bounds. Each owns a ``numpy.random.Generator``, so an
episode is a pure function of its seed. Call ``policy.reset(env)`` at the start of every episode.

- TwoRoom expert: the package's ``ExpertPolicy`` (door-aware navigation) steered to a sequence of
  random waypoints. A fresh waypoint is drawn whenever the agent reaches the current one, so one
  long episode contains several room-to-room crossings instead of idling at the target. Under the
  coverage factor ``agent.region`` the waypoints stay in the episode's x range (one room: no
  crossings from the expert; only random segments can leave it).
- PushT "expert": 0.1.1 ships no solver for PushT, only a contact-seeking data policy. Ours is a
  block-seeking scripted policy in the same spirit: it aims the pusher at a random point near the
  block and re-aims every few steps, which produces frequent pushes.
- Reacher expert: a joint-space PD controller (torque = k_p·Δq − k_d·q̇, clipped) steered to
  random poses; a fresh pose is drawn when every joint is within 0.1 rad of it or after 30 steps,
  so an episode sweeps the arm through many poses (the goals are poses too).
- PushT goal pusher (``data.expert=goal_pusher``): pushes the block to a sequence of random goal
  poses (:mod:`lensemble.envs.pusht_pusher`), goal-directed demonstrations like the published
  datasets'.
- Held random: uniform actions, each held for 1..``max_hold`` steps (smooth, exploratory motion).
- Mixed: segments of 1..10 steps, each random with probability ``random_share`` and otherwise
  noisy expert, so ``random_share`` is the expected fraction of random steps.
"""

from __future__ import annotations

import numpy as np

from lensemble.envs.adapter import PUSHT, REACHER, TWOROOM, EnvAdapter
from lensemble.envs.pusht_pusher import PushTGoalPusherExpert
from lensemble.envs.reacher import pose_difference, pose_error
from lensemble.errors import ConfigError


class HeldRandomPolicy:
    """Uniform random actions in the env bounds, each repeated for 1..max_hold steps."""

    def __init__(self, rng: np.random.Generator, max_hold: int = 10):
        self.rng = rng
        self.max_hold = int(max_hold)
        self._action = None
        self._left = 0

    def reset(self, env: EnvAdapter) -> None:
        self._left = 0

    def __call__(self, env: EnvAdapter) -> np.ndarray:
        if self._left <= 0:
            low = np.asarray(env.info.action_low, np.float32)
            high = np.asarray(env.info.action_high, np.float32)
            self._action = self.rng.uniform(low, high).astype(np.float32)
            self._left = int(self.rng.integers(1, self.max_hold + 1))
        self._left -= 1
        return self._action.copy()


class TwoRoomExpert:
    """Door-aware waypoint follower for TwoRoom, with Gaussian action noise of std ``noise``."""

    def __init__(self, rng: np.random.Generator, noise: float = 0.0):
        from stable_worldmodel.envs.two_room import ExpertPolicy

        self.rng = rng
        self.noise = float(noise)
        self._expert = ExpertPolicy(action_noise=0.0)  # noise is ours, drawn from self.rng
        self._waypoint = None

    def reset(self, env: EnvAdapter) -> None:
        self._expert.set_env(env.env)
        self._waypoint = self._draw_waypoint(env)

    def _draw_waypoint(self, env: EnvAdapter) -> np.ndarray:
        p = env.sample_free_position(self.rng)  # inside agent.region when one is set
        return env.goal_state() if p is None else p

    def __call__(self, env: EnvAdapter) -> np.ndarray:
        pos = env.agent_position()
        if self._waypoint is None or np.linalg.norm(pos - self._waypoint) < env.info.success_radius:
            self._waypoint = self._draw_waypoint(env)
        action = self._expert.get_action({"state": pos, "goal_state": self._waypoint})
        action = np.asarray(action, np.float32).reshape(2)
        if self.noise > 0:
            action = action + self.rng.normal(0.0, self.noise, size=2).astype(np.float32)
        return np.clip(action, -1.0, 1.0).astype(np.float32)


class PushTExpert:
    """Block-seeking scripted policy for PushT, with Gaussian action noise of std ``noise``."""

    def __init__(self, rng: np.random.Generator, noise: float = 0.0, reach: float = 60.0):
        self.rng = rng
        self.noise = float(noise)
        self.reach = float(reach)  # aim points lie within this many canvas px of the block centre
        self._aim = None
        self._left = 0

    def reset(self, env: EnvAdapter) -> None:
        self._left = 0

    def __call__(self, env: EnvAdapter) -> np.ndarray:
        s = env.state()
        agent, block = s[:2], s[2:4]
        if self._left <= 0:
            self._aim = block + self.rng.uniform(-self.reach, self.reach, size=2).astype(np.float32)
            self._left = int(self.rng.integers(3, 9))
        self._left -= 1
        # Actions are relative position targets in units of the env's action scale (100 px).
        scale = float(getattr(env.unwrapped, "action_scale", 100.0))
        action = (self._aim - agent) / scale
        if self.noise > 0:
            action = action + self.rng.normal(0.0, self.noise, size=2)
        return np.clip(action, -1.0, 1.0).astype(np.float32)


class ReacherExpert:
    """Joint-space PD controller to random poses for Reacher, with Gaussian action noise.

    Gains: k_p = 1 per rad, k_d = 0.1 per rad/s (torque units of the [-1, 1] action) reach a pose
    1 rad away within 0.05 rad in about 20 env steps without overshoot; four times stiffer gains
    oscillate at the env's 0.04 s step (measured on stable-worldmodel 0.1.1, mujoco 3.17).
    """

    K_P, K_D = 1.0, 0.1
    WRIST_LIMIT = 2.6  # rad; the joint's range is ±2.79 (±160°): keep waypoints off the stop
    REACHED, PATIENCE = 0.1, 30  # rad; env steps before a pose is given up

    def __init__(self, rng: np.random.Generator, noise: float = 0.0):
        self.rng = rng
        self.noise = float(noise)
        self._pose = None
        self._left = 0

    def reset(self, env: EnvAdapter) -> None:
        self._pose = None

    def _draw(self) -> None:
        self._pose = np.array([self.rng.uniform(-np.pi, np.pi),
                               self.rng.uniform(-self.WRIST_LIMIT, self.WRIST_LIMIT)])
        self._left = self.PATIENCE

    def __call__(self, env: EnvAdapter) -> np.ndarray:
        s = env.state()
        q, qd = s[:2].astype(np.float64), s[2:4].astype(np.float64)
        if self._pose is None or self._left <= 0 or np.all(pose_error(q, self._pose) < self.REACHED):
            self._draw()
        self._left -= 1
        action = self.K_P * pose_difference(self._pose, q) - self.K_D * qd  # Δq toward the pose
        if self.noise > 0:
            action = action + self.rng.normal(0.0, self.noise, size=2)
        return np.clip(action, -1.0, 1.0).astype(np.float32)


def make_expert(env: EnvAdapter, rng: np.random.Generator, noise: float = 0.0, kind: str = "scripted"):
    """The scripted expert of ``env`` (see the module docstring), or ``kind="goal_pusher"`` on PushT
    (:class:`lensemble.envs.pusht_pusher.PushTGoalPusherExpert`; ``data.expert``)."""
    if kind == "goal_pusher":
        if env.env_id != PUSHT:
            raise ConfigError(f"data.expert=goal_pusher pushes PushT's block; this env is {env.env_id}",
                              remediation="use data.expert=scripted, or env=pusht")
        return PushTGoalPusherExpert(rng, noise)
    if kind != "scripted":
        raise ConfigError(f"unknown expert {kind!r}", remediation="data.expert: scripted or goal_pusher")
    if env.env_id == TWOROOM:
        return TwoRoomExpert(rng, noise)
    if env.env_id == PUSHT:
        return PushTExpert(rng, noise)
    if env.env_id == REACHER:
        return ReacherExpert(rng, noise)
    raise AssertionError(f"no expert for {env.env_id}")  # env_info already rejected unknown ids


class MixedPolicy:
    """Alternates noisy-expert and held-random segments of 1..``segment_max`` steps.

    Each segment is random with probability ``random_share``; with equal length distributions for
    both kinds, that is also the expected share of random steps.
    """

    def __init__(self, expert, random_policy, random_share: float, rng: np.random.Generator,
                 segment_max: int = 10):
        self.expert = expert
        self.random = random_policy
        self.random_share = float(random_share)
        self.rng = rng
        self.segment_max = int(segment_max)
        self._use_random = False
        self._left = 0

    def reset(self, env: EnvAdapter) -> None:
        self.expert.reset(env)
        self.random.reset(env)
        self._left = 0

    def __call__(self, env: EnvAdapter) -> np.ndarray:
        if self._left <= 0:
            self._use_random = bool(self.rng.random() < self.random_share)
            self._left = int(self.rng.integers(1, self.segment_max + 1))
        self._left -= 1
        return (self.random if self._use_random else self.expert)(env)
