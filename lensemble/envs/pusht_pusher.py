"""A goal-directed scripted pusher for PushT: goal-directed demonstrations at no planning cost.

The published PushT world models learn from expert pushes toward goal poses; ours learned from a
block-seeking script that rarely finishes a push (docs/model.md). The true-physics oracle solves
the tasks but costs 0.84 CPU-s per action at the protocol's CEM budget (4.7 CPU-hours for 200
episodes). This controller needs none: from the state alone it steers the agent behind the block
and pushes it toward the goal pose, with a sideways offset that turns it.

Geometry (canvas px, the env's pymunk frame; ``state`` = agent x, y, block x, y, θ, …). The T's
centre of mass sits ``COM_OFFSET`` = (0, 45) px from its origin in the body frame (the mean of its
bar's and stem's centroids, ``PushTEnv.add_tee``). With ``u`` the unit vector from the block's
origin to the goal's and ``v = (−u_y, u_x)``, a push along ``u`` at the lateral offset ``o·v`` from
the centre of mass has torque ``(−R u + o v) × u = −o``: so ``o = −k_rot · Δθ`` (clipped to ±45 px)
turns the block toward the goal angle while it travels. Each call:

1. *pushing* (for ``PUSH_STEPS`` env steps after reaching the pre-contact point): the relative
   target is 40 px along ``u``;
2. else, at the pre-contact point ``com − STANDOFF·u + o·v`` (within 20 px): start pushing;
3. else, if that point lies more than 35° around the block from the agent, or the agent is within
   80 px of the centre of mass: orbit at ``ORBIT`` px, at most 40° per step, so that the agent
   goes round the block instead of through it;
4. else: head straight for the pre-contact point.

The relative action is (target − agent) / 100 px (the env's action scale), clipped to [−1, 1].

Tuned on the env's own tasks (reset seeds 100-139, noise-free, success = the env's rule within
300 env steps; ``examples/pusht_pusher_check.py --grid``: k_rot ∈ {20, 40, 80}, push steps ∈ {2, 4,
8, 12, 16}, standoff ∈ {85, 95}): 36/40 at k_rot 40, 8 push steps, standoff 95, against 1/40 with
the torque sign flipped, 3/40 without turning and 2/40 for the block seeker
(``examples/pusht_pusher_check.py``); 2 push steps solve almost nothing (it turns back before the
push lands). ``tests/unit/test_pusht_pusher.py`` holds the known-answer cases.

As a collection expert (``data.expert=goal_pusher``) it pursues a sequence of goal poses drawn from
its own generator (position uniform in [``GOAL_LOW``, ``GOAL_HIGH``]² px, angle uniform), a fresh
one when the block reaches the current one (the env's success rule) or after ``PATIENCE`` steps.
"""

from __future__ import annotations

import math

import numpy as np

from lensemble.envs.reacher import wrap_angle  # the one angle wrap of the envs (numpy, [−π, π))

COM_OFFSET = np.array([0.0, 45.0])  # px, body frame: the T's centre of mass from its origin
K_ROT = 40.0            # px of lateral offset per rad of angle error
MAX_OFFSET = 45.0       # px: beyond this the agent would push the T's bar tip, not its body
STANDOFF = 95.0         # px from the centre of mass to the pre-contact point (T half-extent + agent)
ORBIT = 115.0           # px: the radius the agent circles the block at
PUSH_STEPS = 8          # env steps of pushing once in place
PUSH_REACH = 40.0       # px: the relative target while pushing
SUCCESS_PX, SUCCESS_RAD = 20.0, math.pi / 9   # PushTEnv.eval_state's rule (its one home here)
GOAL_LOW, GOAL_HIGH = 120.0, 392.0            # px: goal positions keep the T inside the 512 px canvas
PATIENCE = 150          # env steps before a goal is given up
ACTION_SCALE = 100.0    # px per unit action (PushTEnv.action_scale)


def _rotation(theta: float) -> np.ndarray:
    c, s = math.cos(theta), math.sin(theta)
    return np.array([[c, -s], [s, c]])


def block_pose_error(state, goal) -> tuple[float, float]:
    """(px between the block's origin and the goal's, |Δθ| in rad) for a PushT state and a goal
    pose (x, y, θ): what the env's success rule compares (< 20 px and < π/9)."""
    s, g = np.asarray(state, float), np.asarray(goal, float)
    return float(np.linalg.norm(g[:2] - s[2:4])), abs(float(wrap_angle(g[2] - s[4])))


def reached(state, goal) -> bool:
    """The env's success rule for ``goal``."""
    dp, dth = block_pose_error(state, goal)
    return dp < SUCCESS_PX and dth < SUCCESS_RAD


def pursue(env, act, goal, steps: int) -> tuple[tuple[float, float], tuple[float, float], bool]:
    """Step the raw PushT env (physics and state, no frame drawn) with ``act(state) -> action``
    toward ``goal`` for at most ``steps`` env steps, stopping at success. Returns (start error, end
    error, reached) with the errors of :func:`block_pose_error`. The pusher's check and tests use it."""
    s = env.state()
    start = block_pose_error(s, goal)
    for _ in range(steps):
        env.unwrapped.step(act(s))
        s = env.state()
        if reached(s, goal):
            return start, block_pose_error(s, goal), True
    return start, block_pose_error(s, goal), False


class GoalPusher:
    """The controller of the module docstring, toward one goal pose at a time (``self.goal``).

    Stateful only in its push counter; ``act(state)`` returns the relative action (2,) float32.
    """

    def __init__(self, goal=None, *, k_rot: float = K_ROT, push_steps: int = PUSH_STEPS,
                 standoff: float = STANDOFF):
        self.goal = None if goal is None else np.asarray(goal, float)
        self.k_rot, self.push_steps, self.standoff = float(k_rot), int(push_steps), float(standoff)
        self._pushing = 0

    def reset(self) -> None:
        self._pushing = 0

    def act(self, state) -> np.ndarray:
        s = np.asarray(state, float)
        agent, origin, theta = s[:2], s[2:4], float(s[4])
        com = origin + _rotation(theta) @ COM_OFFSET
        e_p = self.goal[:2] - origin
        e_th = float(wrap_angle(self.goal[2] - theta))
        dist = float(np.linalg.norm(e_p))
        # Near the goal position only the angle is left: push along a fixed axis (the turn it
        # makes moves the block, and the next calls bring it back).
        u = e_p / dist if dist > 8.0 else np.array([1.0, 0.0])
        v = np.array([-u[1], u[0]])
        offset = float(np.clip(-self.k_rot * e_th, -MAX_OFFSET, MAX_OFFSET))
        pre = com - self.standoff * u + offset * v
        if self._pushing > 0:
            self._pushing -= 1
            target = agent + PUSH_REACH * u
        elif np.linalg.norm(agent - pre) < 20.0:
            self._pushing = self.push_steps
            target = agent + PUSH_REACH * u
        else:
            r_agent, r_pre = agent - com, pre - com
            at = math.atan2(r_agent[1], r_agent[0])  # the agent's bearing around the block
            turn = float(wrap_angle(math.atan2(r_pre[1], r_pre[0]) - at))
            if abs(turn) > math.radians(35) or np.linalg.norm(r_agent) < 80.0:
                step = math.copysign(min(abs(turn), math.radians(40)), turn)
                angle = at + step
                target = com + ORBIT * np.array([math.cos(angle), math.sin(angle)])
            else:
                target = pre
        return np.clip((target - agent) / ACTION_SCALE, -1.0, 1.0).astype(np.float32)


class PushTGoalPusherExpert:
    """``data.expert=goal_pusher``: :class:`GoalPusher` toward a sequence of random goal poses, with
    Gaussian action noise of std ``noise`` (the collection's ``policy(env)`` interface)."""

    def __init__(self, rng: np.random.Generator, noise: float = 0.0):
        self.rng = rng
        self.noise = float(noise)
        self.pusher = GoalPusher()
        self._left = 0

    def _draw(self) -> None:
        xy = self.rng.uniform(GOAL_LOW, GOAL_HIGH, size=2)
        self.pusher.goal = np.array([xy[0], xy[1], self.rng.uniform(0.0, 2 * math.pi)])
        self.pusher.reset()
        self._left = PATIENCE

    def reset(self, env) -> None:
        self.pusher.goal = None

    def __call__(self, env) -> np.ndarray:
        s = env.state()
        if self.pusher.goal is None or self._left <= 0 or reached(s, self.pusher.goal):
            self._draw()
        self._left -= 1
        action = self.pusher.act(s)
        if self.noise > 0:
            action = action + self.rng.normal(0.0, self.noise, size=2)
        return np.clip(action, -1.0, 1.0).astype(np.float32)
