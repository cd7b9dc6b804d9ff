"""TwoRoom routes: was a success reached through the door, and the oracle's true dynamics.

stable-worldmodel 0.1.1's TwoRoom tests the door only at a step's *end point*
(``TwoRoomEnv._apply_collisions`` looks up the door at the new position's coordinate along the
wall), so the straight path of a step can cut through wall pixels next to the door, and its
success flag cannot say whether an episode took a legal route. This module records that.

**Route validity.** A step from p0 to p1 is *legal* when the part of the agent centre's straight
path that lies inside the central wall stripe (``|x − 112| ≤ thickness // 2`` for the vertical
wall, the env's own wall mask) stays inside one door opening, widened by the env's own door margin
(``|y − door| ≤ size + 1.75`` px). An episode's route is valid when every step is legal. The disc's
radius is ignored (the centre path is checked), so this is the most lenient reading: a flagged step
put the agent's centre inside the wall. Only TwoRoom has walls; for other envs validity is None.

**Oracle dynamics.** :class:`TwoRoomDynamics` is the env's own step (velocity clamp, speed,
border clamp, the end-point door rule) batched over many positions in torch, with the env's mixed
float32/float64 arithmetic reproduced so that it matches ``env.step`` bit for bit
(tests/unit/test_routes.py). The oracle planner (:func:`lensemble.eval.closed_loop.evaluate` with
``policy="oracle"``) plans with it: the ceiling of the planner and protocol, with the true
simulator in place of the world model, wall bug included (its route validity shows whether it uses it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lensemble.envs.factors import TWOROOM

#: stable-worldmodel 0.1.1's TwoRoom door margin (``_apply_collisions``: ``door_margin = 1.75``).
DOOR_MARGIN = 1.75


@dataclass(frozen=True)
class WallGeometry:
    """The central wall of one TwoRoom episode, in the env's 224 px units.

    ``axis`` 1: a vertical wall at x = ``center`` (doors vary along y); 0: horizontal at y = center.
    ``doors``: (centre along the wall, half-extent) of each door.
    """

    axis: int
    center: float
    half_thickness: float
    doors: tuple[tuple[float, float], ...]
    margin: float = DOOR_MARGIN

    def openings(self) -> list[tuple[float, float]]:
        """Door openings as merged [low, high] intervals along the wall, margin included."""
        spans = sorted((c - s - self.margin, c + s + self.margin) for c, s in self.doors)
        merged: list[list[float]] = []
        for lo, hi in spans:
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        return [(lo, hi) for lo, hi in merged]


def tworoom_geometry(env) -> WallGeometry | None:
    """The wall of the episode ``env`` (an :class:`~lensemble.envs.EnvAdapter`) is playing; None
    for an env without one."""
    if getattr(env, "env_id", None) != TWOROOM:
        return None
    u = env.unwrapped
    n = int(u.num_doors)
    doors = tuple((float(u.door_positions[i]), float(u.door_sizes[i])) for i in range(n))
    return WallGeometry(int(u.wall_axis), float(u.WALL_CENTER), float(int(u.wall_thickness) // 2), doors)


def crosses_wall(start, goal, geom: WallGeometry) -> bool:
    """Whether ``goal`` lies in the other room from ``start`` (agent centres, (x, y), env px):
    strictly on opposite sides of the wall's centre line. This is stable-worldmodel's own
    ``check_other_room`` rule (legacy TwoRoom env): the coordinate across the wall (x for the
    vertical wall, axis 1; y for the horizontal one) against the wall position (112 px)."""
    i = 0 if geom.axis == 1 else 1
    a, b, c = float(np.asarray(start).reshape(-1)[i]), float(np.asarray(goal).reshape(-1)[i]), geom.center
    return bool((a < c < b) or (b < c < a))


def step_is_legal(p0, p1, geom: WallGeometry) -> bool:
    """Whether the straight path p0 -> p1 (agent centres, (x, y)) enters the wall stripe only
    inside a door opening (module docstring)."""
    p0 = np.asarray(p0, np.float64).reshape(2)
    p1 = np.asarray(p1, np.float64).reshape(2)
    across, along = (0, 1) if geom.axis == 1 else (1, 0)
    a0, a1 = p0[across], p1[across]
    lo_w, hi_w = geom.center - geom.half_thickness, geom.center + geom.half_thickness
    if a0 == a1:
        if not lo_w <= a0 <= hi_w:
            return True
        s_lo, s_hi = 0.0, 1.0
    else:
        sa, sb = sorted(((lo_w - a0) / (a1 - a0), (hi_w - a0) / (a1 - a0)))
        s_lo, s_hi = max(sa, 0.0), min(sb, 1.0)
        if s_lo > s_hi:
            return True  # the path never touches the stripe
    b0, b1 = p0[along] + s_lo * (p1[along] - p0[along]), p0[along] + s_hi * (p1[along] - p0[along])
    low, high = min(b0, b1), max(b0, b1)
    return any(lo <= low and high <= hi for lo, hi in geom.openings())


class RouteTracker:
    """Steps one env and records whether every step of its episode was legal.

    ``valid`` is None for an env without a wall; ``illegal_steps`` counts the flagged steps.
    """

    def __init__(self, env):
        self.env = env
        self.geometry = tworoom_geometry(env)
        self.illegal_steps = 0

    @property
    def valid(self) -> bool | None:
        return None if self.geometry is None else self.illegal_steps == 0

    def step(self, action):
        """``env.step(action)``, checking the path of the agent's centre."""
        if self.geometry is None:
            return self.env.step(action)
        p0 = self.env.agent_position()
        out = self.env.step(action)
        if not step_is_legal(p0, self.env.agent_position(), self.geometry):
            self.illegal_steps += 1
        return out


# ================================================================================== the oracle
@dataclass
class TwoRoomDynamics:
    """stable-worldmodel 0.1.1's TwoRoom step, batched over N rows (each with its own episode).

    Build with :meth:`from_envs` (per-row speed, radius, wall and doors), then :meth:`step`
    positions (N, 2) float32 by actions (N, 2). Arithmetic follows ``TwoRoomEnv.step`` exactly:
    float32 tensors where the env keeps tensors, float64 where it uses Python floats.
    """

    speed: torch.Tensor        # (N,) float32 (the env's float32 value; used as a float32 scalar)
    radius: torch.Tensor       # (N,) float64
    axis: torch.Tensor         # (N,) bool: True for the vertical wall (axis 1)
    half: torch.Tensor         # (N,) float64, thickness // 2
    door_lo: torch.Tensor      # (N, D) float64, c - s - margin (+inf for absent doors)
    door_hi: torch.Tensor      # (N, D) float64, c + s + margin (-inf for absent doors)
    border: float = 14.0
    img: float = 224.0
    center: float = 112.0

    @classmethod
    def from_envs(cls, envs) -> TwoRoomDynamics:
        rows = []
        for env in envs:
            u = env.unwrapped
            vs = u.variation_space
            n = int(u.num_doors)
            pos = [float(u.door_positions[i]) for i in range(n)]
            size = [float(u.door_sizes[i]) for i in range(n)]
            rows.append((float(vs["agent"]["speed"].value.item()), float(vs["agent"]["radius"].value.item()),
                         int(u.wall_axis) == 1, float(int(u.wall_thickness) // 2), pos, size))
        width = max(len(r[4]) for r in rows)
        lo = torch.full((len(rows), width), torch.inf, dtype=torch.float64)
        hi = torch.full((len(rows), width), -torch.inf, dtype=torch.float64)
        for i, r in enumerate(rows):
            for j, (c, s) in enumerate(zip(r[4], r[5], strict=True)):
                lo[i, j], hi[i, j] = (c - s) - DOOR_MARGIN, (c + s) + DOOR_MARGIN
        u0 = envs[0].unwrapped
        return cls(torch.tensor([r[0] for r in rows], dtype=torch.float32),
                   torch.tensor([r[1] for r in rows], dtype=torch.float64),
                   torch.tensor([r[2] for r in rows]), torch.tensor([r[3] for r in rows], dtype=torch.float64),
                   lo, hi, float(u0.BORDER_SIZE), float(u0.IMG_SIZE), float(u0.WALL_CENTER))

    def take(self, idx: torch.Tensor) -> TwoRoomDynamics:
        """The rows ``idx`` (e.g. the episodes still running)."""
        return TwoRoomDynamics(self.speed[idx], self.radius[idx], self.axis[idx], self.half[idx], self.door_lo[idx],
                               self.door_hi[idx], self.border, self.img, self.center)

    def repeat(self, times: int) -> TwoRoomDynamics:
        """Each row repeated ``times`` times in a row (the planner's B·S layout)."""
        def rep(t):
            return t.repeat_interleave(times, dim=0)

        return TwoRoomDynamics(rep(self.speed), rep(self.radius), rep(self.axis), rep(self.half), rep(self.door_lo),
                               rep(self.door_hi), self.border, self.img, self.center)

    def step(self, pos: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Positions (N, 2) float32 after one env step with actions (N, 2)."""
        a = action.to(torch.float32).clamp(-1.0, 1.0)
        nxt = pos.to(torch.float32) + a * self.speed[:, None]
        r = self.radius
        lo_b, hi_b = self.border + r, self.img - self.border - r
        x2 = torch.minimum(torch.maximum(nxt[:, 0].double(), lo_b), hi_b)
        y2 = torch.minimum(torch.maximum(nxt[:, 1].double(), lo_b), hi_b)
        out = torch.stack([x2, y2], dim=1).to(torch.float32)
        c = self.center
        eff_low = (c - self.half) - r    # wall_left - r (or wall_top - r)
        eff_high = (c + self.half) + r
        v = self.axis
        start = torch.where(v, pos[:, 0], pos[:, 1]).double()            # the coordinate across the wall
        cross = torch.where(v, out[:, 0], out[:, 1]).double()
        along = torch.where(v, out[:, 1], out[:, 0]).double()
        in_door = ((self.door_lo <= along[:, None]) & (along[:, None] <= self.door_hi)).any(dim=1)
        first_side = start < c
        hit_low = first_side & (cross > eff_low) & ~in_door
        hit_high = ~first_side & (cross < eff_high) & ~in_door
        new_cross = torch.where(hit_low, (eff_low - 0.5).to(torch.float32),
                                torch.where(hit_high, (eff_high + 0.5).to(torch.float32), cross.to(torch.float32)))
        return torch.where(v[:, None], torch.stack([new_cross, out[:, 1]], 1), torch.stack([out[:, 0], new_cross], 1))

    def rollout(self, pos: torch.Tensor, actions: torch.Tensor, block: int) -> torch.Tensor:
        """Positions after each latent step: actions (N, H, block·2) -> (N, H, 2)."""
        n, h, _ = actions.shape
        acts = actions.reshape(n, h, block, 2)
        out = []
        p = pos.to(torch.float32)
        for k in range(h):
            for j in range(block):
                p = self.step(p, acts[:, k, j])
            out.append(p)
        return torch.stack(out, dim=1)


__all__ = ["DOOR_MARGIN", "RouteTracker", "TwoRoomDynamics", "WallGeometry", "step_is_legal", "tworoom_geometry"]
