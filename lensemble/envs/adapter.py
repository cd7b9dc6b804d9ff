"""The one door to stable-worldmodel (pinned ``==0.1.1``): pixels, goal images, state, factors.

``make_env("swm/TwoRoom-v1", img_size=64)`` gives an :class:`EnvAdapter` that

- applies factors of variation at reset (dotted keys, e.g. ``{"agent.color": [0, 128, 255]}``),
  and the coverage factor ``agent.region`` (TwoRoom), which the env has no variation for: the
  start and the target are re-drawn inside the region's x range (:meth:`EnvAdapter.reset`);
- renders observations at the env's native 224 px and area-resizes them to ``img_size`` (area
  averaging keeps the small agent dot visible instead of aliasing it away);
- exposes the goal image (PushT puts one in ``info``; TwoRoom keeps it in ``_target_img``, the
  agent drawn at the target), the ground-truth state and the action bounds;
- can set the state and the goal state, so an evaluator can pose "reach the state the expert
  reached k steps later" with a matching goal image.

Ground-truth state vectors (float32):

- TwoRoom (S=10): agent x, y; target x, y; then (x, y) of up to 3 door centres (zeros when absent).
  Pixel units of the 224 px frame.
- PushT (S=7): agent x, y; block x, y; block angle (rad, in [0, 2π)); agent velocity x, y.
  Units of the 512 px physics canvas.
- Reacher (S=6): joint angles, joint velocities, fingertip x, y (:mod:`lensemble.envs.reacher`).

All three take 2-d actions in [-1, 1]: a velocity direction for TwoRoom (scaled by the agent
speed), a relative position target for PushT (scaled by 100 canvas px), the two joint torques
for Reacher.

Env processes should run torch single-threaded: TwoRoom renders with torch, and on a small shared
machine intra-op threads make each frame an order of magnitude slower. ``single_thread=True``
(the default) sets that for the whole process.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from lensemble.envs.factors import (
    ADAPTER_FACTORS,
    PUSHT,
    REACHER,
    REGION_FACTOR,
    TWOROOM,
    factor_catalog,
    supported_envs,
    to_env_value,
    to_json_value,
)
from lensemble.errors import ConfigError

#: Native render size of both environments (px). Observations are resized from this.
NATIVE_SIZE = 224


@dataclass(frozen=True)
class EnvInfo:
    """Static facts about an environment, as the rest of Lensemble needs them."""

    env_id: str
    action_dim: int
    state_dim: int
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]
    state_names: tuple[str, ...]
    success_radius: float  # distance (state units) under which the env reports success


_INFO = {
    TWOROOM: EnvInfo(
        TWOROOM, 2, 10, (-1.0, -1.0), (1.0, 1.0),
        ("agent_x", "agent_y", "target_x", "target_y",
         "door0_x", "door0_y", "door1_x", "door1_y", "door2_x", "door2_y"),
        16.0,
    ),
    PUSHT: EnvInfo(
        PUSHT, 2, 7, (-1.0, -1.0), (1.0, 1.0),
        ("agent_x", "agent_y", "block_x", "block_y", "block_angle", "agent_vx", "agent_vy"),
        20.0,
    ),
    # lensemble/envs/reacher.py: joint angles and velocities, then the fingertip; success is a
    # pose within 0.05 rad per joint.
    REACHER: EnvInfo(
        REACHER, 2, 6, (-1.0, -1.0), (1.0, 1.0),
        ("shoulder", "wrist", "shoulder_vel", "wrist_vel", "finger_x", "finger_y"),
        0.05,
    ),
}


def env_info(env_id: str) -> EnvInfo:
    """Static facts about ``env_id``; ConfigError if the adapter does not support it."""
    if env_id not in _INFO:
        raise ConfigError(
            f"unknown environment {env_id!r}",
            remediation=f"use one of {supported_envs()} (env.id / --env)",
        )
    return _INFO[env_id]


def set_single_thread() -> None:
    """One torch and one OpenCV thread in this process.

    Rendering and resizing are small per-frame jobs; on a shared machine, thread pools only add
    contention (TwoRoom's torch renderer gets ~10x slower with two threads on two busy cores).
    """
    import cv2
    import torch

    torch.set_num_threads(1)
    cv2.setNumThreads(1)


def _import_swm():
    # Importing stable_worldmodel registers the swm/* gym ids. It warns about optional backends
    # (ale-py) that we never use; keep that noise out of the user's terminal.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import stable_worldmodel  # noqa: F401
        from stable_worldmodel.utils import get_in
    return get_in


def resize_frame(frame: np.ndarray, img_size: int) -> np.ndarray:
    """Area-resize an (h, w, 3) uint8 frame to (img_size, img_size, 3) uint8."""
    if frame.shape[0] == img_size and frame.shape[1] == img_size:
        return np.ascontiguousarray(frame)
    import cv2

    return cv2.resize(frame, (img_size, img_size), interpolation=cv2.INTER_AREA)


class EnvAdapter:
    """One stable-worldmodel environment behind a small, env-agnostic surface.

    Frames are (img_size, img_size, 3) uint8 (HWC, RGB); states are float32 vectors of
    ``info.state_dim``; actions are float32 vectors of ``info.action_dim`` within
    [``info.action_low``, ``info.action_high``].
    """

    def __init__(self, env_id: str, img_size: int = 64, *, single_thread: bool = True):
        self.info = env_info(env_id)
        self.env_id = env_id
        self.img_size = int(img_size)
        if self.img_size < 8:
            raise ConfigError(f"img_size {img_size} is too small", remediation="use model.img_size >= 16")
        if single_thread:
            set_single_thread()
        self._get_in = _import_swm()
        import gymnasium as gym

        kwargs = {"resolution": NATIVE_SIZE} if env_id == PUSHT else {}
        # The passive checker only re-validates spaces on every call; we drive the env ourselves.
        self.env = gym.make(env_id, disable_env_checker=True, **kwargs)
        self.unwrapped = self.env.unwrapped
        self._vspace = self.unwrapped.variation_space
        # The variation space keeps per-key initial values that persist across resets; remember the
        # package defaults so factors set for one episode do not leak into the next.
        self._defaults = {k: copy.deepcopy(self._space(k).init_value) for k in self._vspace.names()}
        self._touched: set[str] = set()
        self._factors: dict[str, Any] = {}
        # agent.region's x range (env px); None: no restriction (also for the whole arena, whose
        # start/target sampling stays the env's own)
        self.region: tuple[float, float] | None = None
        if env_id == TWOROOM:
            self._install_mask_cache()
        self._reset_done = False

    # ------------------------------------------------------------------ factors
    def variation_names(self) -> list[str]:
        """Every dotted factor key the env accepts (not only the catalogued ones)."""
        return list(self._vspace.names())

    def _space(self, key: str):
        try:
            return self._get_in(self._vspace, key.split("."))
        except (KeyError, TypeError):
            raise ConfigError(
                f"{self.env_id} has no factor of variation {key!r}",
                remediation=f"use one of {self.variation_names()}",
            ) from None

    def _apply_factors(self, factors: Mapping[str, Any]) -> None:
        # Factors become the variation space's *initial* values rather than post-reset overrides:
        # the env then samples the per-episode randomness (positions) under constraints that
        # already see the requested values (e.g. an agent radius that must fit the door).
        adapter = {k: v for k, v in factors.items() if k in ADAPTER_FACTORS}
        factors = {k: v for k, v in factors.items() if k not in ADAPTER_FACTORS}
        self.region = self._check_region(adapter[REGION_FACTOR]) if REGION_FACTOR in adapter else None
        for key in self._touched - set(factors):
            self._space(key).set_init_value(copy.deepcopy(self._defaults[key]))
        for key, value in factors.items():
            space = self._space(key)
            try:
                space.set_init_value(to_env_value(space, value))
            except (ValueError, AssertionError) as exc:
                raise ConfigError(
                    f"value {value!r} is not valid for factor {key!r} of {self.env_id}: {exc}",
                    remediation="pick a value inside the factor's range (see lensemble.envs.factor_catalog)",
                ) from None
        self._touched = set(factors)
        self._factors = {k: to_json_value(v) for k, v in {**factors, **adapter}.items()}

    def _check_region(self, value) -> tuple[float, float] | None:
        if self.env_id != TWOROOM:
            raise ConfigError(f"{REGION_FACTOR} is a TwoRoom factor; {self.env_id} has no rooms",
                              remediation="use a factor from lensemble.envs.factor_catalog(env_id)")
        arr = np.asarray(value, dtype=np.float64).reshape(-1)
        lo, hi = (float(arr[0]), float(arr[1])) if arr.size == 2 else (np.nan, np.nan)
        if not 0.0 <= lo < hi <= NATIVE_SIZE:
            raise ConfigError(f"{REGION_FACTOR} {value!r} is not an x range inside [0, {NATIVE_SIZE}]",
                              remediation="pick a value from lensemble.envs.factor_catalog(env_id)")
        return None if (lo, hi) == (0.0, float(NATIVE_SIZE)) else (lo, hi)

    def factor_values(self, keys=None) -> dict[str, Any]:
        """Current values of the given factor keys (default: the catalogued ones), JSON-ready.
        ``agent.region`` reads the adapter's range (the whole arena when none was set)."""
        keys = list(keys) if keys is not None else list(factor_catalog(self.env_id))
        return {k: (self._factors.get(k, [0, NATIVE_SIZE]) if k in ADAPTER_FACTORS
                    else to_json_value(self._space(k).value)) for k in keys}

    # ------------------------------------------------------------------ episode control
    def reset(self, seed: int, factors: Mapping[str, Any] | None = None) -> np.ndarray:
        """Start an episode; returns the first frame (img_size, img_size, 3) uint8.

        ``seed`` fixes everything the env samples (start and target positions); ``factors`` maps
        dotted keys to values (JSON-ready or numpy), unspecified ones take the package defaults.
        """
        self._apply_factors(dict(factors or {}))
        # gymnasium seeds numpy generators with the value; keep it in the 32-bit range every
        # backend accepts.
        with warnings.catch_warnings():
            # PushT's scalar factor defaults trip gymnasium's "casting to array" notice on every
            # reset; it is about the package's own values, not ours.
            warnings.filterwarnings("ignore", message=".*Casting input x to numpy array.*")
            self.env.reset(seed=int(seed) % (2**31 - 1))
        self._reset_done = True
        if self.region is not None:
            self._place_in_region(seed)
        return self.render()

    def _place_in_region(self, seed: int) -> None:
        # The whole arena keeps the env's own start/target sampling (the catalog's transfer value);
        # a narrower range re-draws both, from a stream of the reset seed the env does not use.
        rng = np.random.default_rng([int(seed) % 2**32, 0x7265_6769])  # "regi"
        u = self.unwrapped
        start = self._region_position(rng)
        # A target within two success radii would make the task trivial (success at the start).
        for _ in range(1000):
            target = self._region_position(rng)
            if np.linalg.norm(target - start) >= 2 * self.info.success_radius:
                break
        u._set_state(start)
        u._set_goal_state(target)  # re-renders the target image

    def _region_position(self, rng: np.random.Generator) -> np.ndarray:
        p = self.sample_free_position(rng, tries=1000)
        if p is None:
            raise ConfigError(f"no free agent position in {REGION_FACTOR} {self.region}",
                              remediation="widen the region or shrink agent.radius")
        return p

    def sample_free_position(self, rng: np.random.Generator, tries: int = 100) -> np.ndarray | None:
        """A uniform TwoRoom agent position (2,) float32 inside the borders and outside the wall
        (door openings allowed), with x inside ``agent.region`` when one is set; None after
        ``tries`` rejected draws. The start, the target and the collection expert's waypoints
        are drawn with it; one ``rng.uniform`` call per draw for (x, y)."""
        self._require_reset()
        u = self.unwrapped
        radius = float(u.variation_space["agent"]["radius"].value.item())
        lo = u.BORDER_SIZE + radius + 1.0
        hi = u.IMG_SIZE - u.BORDER_SIZE - radius - 1.0
        x_lo, x_hi = (max(lo, self.region[0]), min(hi, self.region[1])) if self.region else (lo, hi)
        for _ in range(tries):
            p = rng.uniform([x_lo, lo], [x_hi, hi]).astype(np.float32)
            if u._constrain_agent_not_in_wall(p):  # a position inside the wall is unreachable
                return p
        return None

    def step(self, action) -> tuple[np.ndarray, np.ndarray, bool]:
        """Apply one action (A,) and return (frame (H, W, 3) uint8, state (S,) float32, success)."""
        a = np.asarray(action, dtype=np.float32).reshape(self.info.action_dim)
        _, _, terminated, _, _ = self.env.step(a)
        return self.render(), self.state(), bool(terminated)

    def render(self) -> np.ndarray:
        """The current frame, (img_size, img_size, 3) uint8."""
        return resize_frame(np.asarray(self.env.render()), self.img_size)

    def state(self) -> np.ndarray:
        """Ground-truth state (S,) float32 (layout in the module docstring)."""
        obs = self.unwrapped._get_obs()
        if isinstance(obs, dict):  # not the case for 0.1.1's two envs, kept for safety
            obs = obs["state"]
        if hasattr(obs, "detach"):
            obs = obs.detach().cpu().numpy()
        return np.asarray(obs, dtype=np.float32).reshape(self.info.state_dim)

    def agent_position(self) -> np.ndarray:
        """Agent (x, y) in env units, float32 (2,)."""
        return self.state()[:2].copy()

    def goal_state(self) -> np.ndarray:
        """The goal in state units: TwoRoom (2,) target position; PushT (7,) goal state."""
        u = self.unwrapped
        if self.env_id == TWOROOM:
            return u.target_position.detach().cpu().numpy().astype(np.float32)
        return np.asarray(u.goal_state, dtype=np.float32)

    def goal_image(self) -> np.ndarray:
        """The goal rendered as an observation, (img_size, img_size, 3) uint8.

        TwoRoom: the scene with the agent drawn at the target position. PushT: the scene with
        agent and block at the goal state.
        """
        self._require_reset()
        u = self.unwrapped
        if self.env_id == TWOROOM:
            img = u._target_img.detach().cpu().numpy().transpose(1, 2, 0)
        else:
            img = np.asarray(u._goal)
        return resize_frame(img, self.img_size)

    def set_state(self, state) -> None:
        """Move the env to a ground-truth state (the layout :meth:`state` returns).

        TwoRoom: only the agent position (state[:2]) is settable; target and doors come from
        reset/factors (use :meth:`set_goal_state` for the target). PushT: agent, block and agent
        velocity; pymunk advances one 10 ms physics tick to apply it.
        """
        self._require_reset()
        s = np.asarray(state, dtype=np.float64).reshape(-1)
        if self.env_id == TWOROOM:
            self.unwrapped._set_state(s[:2].astype(np.float32))
        else:
            self.unwrapped._set_state(s[: self.info.state_dim])

    def set_goal_state(self, state) -> None:
        """Make ``state`` (a full state vector or, for TwoRoom, an (x, y) agent position) the goal.

        Success is then judged against it and :meth:`goal_image` shows it. This is how the
        evaluator poses "goal = the state the expert reached k steps ahead".
        """
        self._require_reset()
        s = np.asarray(state, dtype=np.float64).reshape(-1)
        u = self.unwrapped
        if self.env_id == TWOROOM:
            u._set_goal_state(s[:2].astype(np.float32))
            return
        goal = s[: self.info.state_dim].copy()
        current = self.state().astype(np.float64)
        # PushT renders its goal image by posing the scene at the goal and drawing it; do the same,
        # then put the scene back where it was.
        u._set_state(goal)
        u._goal = u.render()
        u._set_goal_state(goal)
        u._set_state(current)

    def distance_to_goal(self) -> float:
        """Euclidean distance between the agent (TwoRoom) or the state (PushT, first 4 dims) and the goal."""
        if self.env_id == TWOROOM:
            return float(np.linalg.norm(self.agent_position() - self.goal_state()))
        return float(np.linalg.norm(self.state()[:4] - self.goal_state()[:4]))

    def close(self) -> None:
        self.env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ internals
    def _require_reset(self) -> None:
        if not self._reset_done:
            raise RuntimeError("call reset() before querying or setting the env state")

    def _install_mask_cache(self) -> None:
        # TwoRoom recomputes its wall and door masks on every frame although they only change at
        # reset. Memoise them on the parameters they depend on: identical pixels, ~15 % less
        # render time. The masks are only read by the renderer, so sharing them is safe.
        u = self.unwrapped
        original = u._wall_and_door_masks
        cache: dict = {}

        def cached():
            key = (
                int(u.wall_axis), int(u.wall_thickness), int(u.num_doors),
                tuple(float(x) for x in u.door_positions[: u.num_doors]),
                tuple(float(x) for x in u.door_sizes[: u.num_doors]),
            )
            if key not in cache:
                if len(cache) > 16:
                    cache.clear()
                cache[key] = original()
            return cache[key]

        u._wall_and_door_masks = cached


def make_env(env_id: str, img_size: int = 64, *, single_thread: bool = True) -> EnvAdapter:
    """Create the adapter for ``env_id`` (``swm/TwoRoom-v1``, ``swm/PushT-v1`` or
    ``swm/ReacherDMControl-v0``, the last in :mod:`lensemble.envs.reacher`).

    Raises ConfigError for any other id.
    """
    env_info(env_id)  # fail fast, before importing the simulator
    if env_id == REACHER:
        from lensemble.envs.reacher import ReacherAdapter  # imports this module: import it late

        return ReacherAdapter(env_id, img_size, single_thread=single_thread)
    return EnvAdapter(env_id, img_size, single_thread=single_thread)
