"""DMControl Reacher behind the :class:`~lensemble.envs.adapter.EnvAdapter` surface.

stable-worldmodel 0.1.1 wraps dm_control's two-link planar arm as ``swm/ReacherDMControl-v0``
(MuJoCo physics, 0.02 s per physics step, every env step repeats its action for 2 of them). The
actions are the two joint torques scaled to [-1, 1]. The package's own goal-reaching rule is its
``qpos_match`` task: success when every joint is within 0.05 rad of a target pose. Lensemble
poses goals the same way as for the other envs (the state an expert or a behaviour episode
reached ``goal_offset`` steps later, shown as a goal image of the arm in that pose), so a goal is
a pose and success is that rule, with one correction: the shoulder is an unlimited hinge, so its
difference is wrapped to [−π, π) (a full turn is the same pose on screen; the package compares
raw angles).

State (S=6, float32): shoulder angle, wrist angle (rad); their velocities (rad/s); the fingertip's
x, y (m, arena frame; the probe's dimensions, since angles wrap). Only the first four are
settable; the fingertip follows from them.

Rendering: MuJoCo draws with OpenGL; on a machine without a display Lensemble selects Mesa's
software EGL (``MUJOCO_GL=egl``, Debian packages ``libegl1 libegl-mesa0 libgl1-mesa-dri``,
installed by ``scripts/install-system-deps.sh``). ``MUJOCO_GL=osmesa`` (``libosmesa6``) works
too when set before Lensemble starts. Frames are drawn at the native 224 px and area-resized like
the other envs' (about 30 ms per frame on one core, against 14 ms drawn at 64 px directly; the
area average keeps the thin arm's sub-pixel position, which a 0.05 rad goal needs).
"""

from __future__ import annotations

import os

import numpy as np

from lensemble.envs.adapter import EnvAdapter, resize_frame
from lensemble.errors import ConfigError

#: Per-joint tolerance (rad) of a reached pose: stable-worldmodel's ``ReacherQPosMatchTask``.
QPOS_TOLERANCE = 0.05
#: Debian packages of the headless GL that ``MUJOCO_GL=egl`` loads.
EGL_PACKAGES = ("libegl1", "libegl-mesa0", "libgl1-mesa-dri")


def wrap_angle(x):
    """Angles (rad, any shape) wrapped to [−π, π)."""
    return (np.asarray(x, dtype=np.float64) + np.pi) % (2 * np.pi) - np.pi


def pose_difference(q, q_goal) -> np.ndarray:
    """q − q_goal per joint (rad), shoulder wrapped (unlimited hinge), wrist not (limited to ±160°).

    ``q``, ``q_goal``: (..., 2) joint angles; returns (..., 2) float64.
    """
    d = np.asarray(q, dtype=np.float64) - np.asarray(q_goal, dtype=np.float64)
    return np.stack([wrap_angle(d[..., 0]), d[..., 1]], axis=-1)


def pose_error(q, q_goal) -> np.ndarray:
    """|:func:`pose_difference`| per joint (rad), (..., 2) float64."""
    return np.abs(pose_difference(q, q_goal))


def select_headless_gl() -> None:
    """Use Mesa's software EGL unless the user chose a GL backend (before MuJoCo is imported)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])


class ReacherAdapter(EnvAdapter):
    """``swm/ReacherDMControl-v0``: goals are arm poses (module docstring)."""

    def __init__(self, env_id: str, img_size: int = 64, *, single_thread: bool = True):
        select_headless_gl()
        try:
            super().__init__(env_id, img_size, single_thread=single_thread)
        except ImportError as exc:
            raise ConfigError(f"{env_id} needs MuJoCo and dm_control ({exc})",
                              remediation='pip install -c constraints.txt -e ".[dev]" (they are dependencies)') from None
        self._goal = np.zeros(self.info.state_dim, np.float32)
        self._goal_img: np.ndarray | None = None

    # dm_control rebuilds its Environment (and Physics) whenever a factor changes the model, so
    # the physics is always looked up, never kept.
    @property
    def physics(self):
        return self.unwrapped.env.physics

    def reset(self, seed: int, factors=None) -> np.ndarray:
        try:
            frame = super().reset(seed, factors)
        except Exception as exc:  # dm_control reports a missing GL library only when it first draws
            if "EGL" in str(exc) or "OSMesa" in str(exc) or "GL" in type(exc).__name__:
                raise ConfigError(
                    f"MuJoCo cannot draw headless with MUJOCO_GL={os.environ.get('MUJOCO_GL')}: {exc}",
                    remediation=f"install the Debian packages {' '.join(EGL_PACKAGES)} "
                                "(scripts/install-system-deps.sh), or libosmesa6 with MUJOCO_GL=osmesa") from None
            raise
        # dm_control ends an episode after 20 s (500 env steps) and then silently starts a new one
        # on the next step; an evaluation that poses a goal and then plans may run longer.
        inner = getattr(self.unwrapped.env, "_env", None)
        if inner is not None and hasattr(inner, "_step_limit"):
            inner._step_limit = float("inf")
        self._goal = self.state()  # until a goal is posed: the start pose (the env has no pose target)
        self._goal_img = None
        return frame

    def step(self, action):
        a = np.asarray(action, dtype=np.float32).reshape(self.info.action_dim)
        self.env.step(a)
        return self.render(), self.state(), self.reached()

    def reached(self) -> bool:
        """Whether every joint is within :data:`QPOS_TOLERANCE` of the goal pose."""
        return self.distance_to_goal() < QPOS_TOLERANCE

    def state(self) -> np.ndarray:
        d = self.physics.data
        finger = self.physics.named.data.geom_xpos["finger", :2]
        return np.concatenate([d.qpos[:2], d.qvel[:2], finger]).astype(np.float32)

    def agent_position(self) -> np.ndarray:
        """The fingertip (x, y) in m, float32 (2,)."""
        return self.state()[4:6].copy()

    def set_state(self, state) -> None:
        self._require_reset()
        s = np.asarray(state, dtype=np.float64).reshape(-1)
        self.unwrapped.set_state(s[:2].copy(), s[2:4].copy())

    def goal_state(self) -> np.ndarray:
        """The goal pose in the state layout (6,); only the angles define it."""
        return self._goal.copy()

    def set_goal_state(self, state) -> None:
        self._require_reset()
        s = np.asarray(state, dtype=np.float32).reshape(-1)
        if s.size < 2:
            raise ValueError(f"a Reacher goal needs the two joint angles, got {s.size} value(s)")
        current = self.state()
        goal = current.copy()
        goal[: min(s.size, self.info.state_dim)] = s[: self.info.state_dim]
        goal[2:4] = 0.0  # the goal image shows a pose, not a motion
        self.set_state(goal)
        goal[4:6] = self.state()[4:6]  # the fingertip where that pose puts it
        self._goal_img = np.asarray(self.env.render())
        self.set_state(current)
        self._goal = goal

    def goal_image(self) -> np.ndarray:
        """The arm drawn in the goal pose (the start pose until a goal is posed)."""
        self._require_reset()
        if self._goal_img is None:
            self.set_goal_state(self._goal)
        return resize_frame(self._goal_img, self.img_size)

    def distance_to_goal(self) -> float:
        """The larger joint error to the goal pose (rad); success below :data:`QPOS_TOLERANCE`."""
        return float(pose_error(self.physics.data.qpos[:2], self._goal[:2]).max())


__all__ = ["EGL_PACKAGES", "QPOS_TOLERANCE", "ReacherAdapter", "pose_difference", "pose_error",
           "select_headless_gl", "wrap_angle"]
