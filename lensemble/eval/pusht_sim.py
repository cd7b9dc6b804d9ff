"""PushT's true simulator for the oracle planner: the env's own pymunk physics, rolled out per sample.

The oracle (``lensemble.eval.closed_loop.evaluate(..., policy="oracle")``) plans with the MPC
protocol's planner but replaces the world model by the true dynamics, so its success is the
ceiling of the planner and the protocol. TwoRoom's step is closed-form and batched
(:class:`~lensemble.eval.routes.TwoRoomDynamics`); PushT's is rigid-body contact, so
:class:`PushTDynamics` keeps *shadow* pymunk spaces (copies of the env's space, one per sample,
pooled across episodes of the same geometry) and, for every sampled action sequence, restores a
shadow's two bodies to the live env's state and steps it as ``PushTEnv.step`` does (the PD controller on the kinematic agent,
``n_substeps`` physics ticks per env step). Restoring the bodies is enough: a restored shadow
reproduces the env's trajectory to ≤ 1e-6 px over 5 env steps, contacts included (measured 0 to
6e-14 px); the contact solver's warm-start cache, the one thing not restored, lets a 25-step
horizon of random pushing drift by ≤ 0.4 px (tests/unit/test_pusht_sim.py).
``Space.copy`` alone is not: pymunk 7.3 unpickles a body's angle after its position, which moves
a body whose centre of gravity is off its origin (PushT's T block) by tens of pixels.

The planner needs a state it can score with its L1 energy. :func:`pusht_embedding` maps the
env state to (agent x, agent y, block x, block y, r·cos θ, r·sin θ) in canvas px, with
r = 20 / (π/9) px per rad: success is ‖Δ(agent, block)‖ < 20 px and |Δθ| < π/9, so a unit of
position and a unit of angle cost the same fraction of their success thresholds (the chord
2r·sin(Δθ/2) ≈ r·Δθ near the goal; cos/sin make the wrap at 2π harmless).

Cost: one env step is ``n_substeps`` (10) pymunk ticks plus the vectorised controller, with one
velocity write per tick and shadow (each pymunk property access costs about what a tick does);
a strict-protocol CEM call (300 samples × 30 iterations × 25 env steps) is 225 k env steps per
episode, ≈ 80 s on one loaded core (``benchmarks/bench_pusht_oracle.py``: 1.78× the env's own
``env.step`` rate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pymunk
import torch

from lensemble.envs.pusht_pusher import SUCCESS_PX, SUCCESS_RAD

# Success: ‖Δ(agent, block)‖ < 20 px and |Δθ| < π/9 (stable-worldmodel 0.1.1 PushTEnv.eval_state).
POSITION_TOLERANCE_PX, ANGLE_TOLERANCE_RAD = SUCCESS_PX, SUCCESS_RAD
ANGLE_SCALE_PX = POSITION_TOLERANCE_PX / ANGLE_TOLERANCE_RAD  # px per rad: one threshold costs one threshold
EMBED_DIM = 6


def pusht_embedding(state) -> torch.Tensor:
    """Env states (..., ≥ 5) -> (..., 6) float32: agent x, y; block x, y; r·cos θ, r·sin θ (px)."""
    s = torch.as_tensor(np.asarray(state, dtype=np.float64))
    theta = s[..., 4]
    out = torch.cat([s[..., :4], torch.stack([ANGLE_SCALE_PX * torch.cos(theta),
                                              ANGLE_SCALE_PX * torch.sin(theta)], dim=-1)], dim=-1)
    return out.to(torch.float32)


def _bodies(space: pymunk.Space) -> tuple[pymunk.Body, pymunk.Body]:
    """(kinematic agent, dynamic block) of a PushT space (it holds exactly these two bodies)."""
    kin = [b for b in space.bodies if b.body_type == pymunk.Body.KINEMATIC]
    dyn = [b for b in space.bodies if b.body_type == pymunk.Body.DYNAMIC]
    if len(kin) != 1 or len(dyn) != 1:
        raise ValueError(f"a PushT space has one kinematic agent and one dynamic block; got {len(kin)} and {len(dyn)}")
    return kin[0], dyn[0]


def _shadow_space(space: pymunk.Space) -> pymunk.Space:
    """A copy of ``space`` without its collision callbacks (they hold the env, which cannot be pickled;
    PushT's only one counts contact points for ``info`` and does not change the physics)."""
    handlers = space._handlers
    space._handlers = {}
    try:
        return space.copy()
    finally:
        space._handlers = handlers


BodyState = tuple[float, float, float, float, float, float]  # angle, x, y, vx, vy, angular velocity


def _read(body: pymunk.Body) -> BodyState:
    p, v = body.position, body.velocity
    return (body.angle, p.x, p.y, v.x, v.y, body.angular_velocity)


def _write(body: pymunk.Body, st: BodyState) -> None:
    body.angle = st[0]  # angle before position: setting the angle rotates about the centre of gravity
    body.position = (st[1], st[2])
    body.velocity = (st[3], st[4])
    body.angular_velocity = st[5]


@dataclass
class _Episode:
    """One env's physics constants and the geometry key of the shadow pool it rolls out on."""

    env: object
    key: tuple
    k_p: float
    k_v: float
    dt: float
    scale: float
    n_substeps: int


def _geometry_key(space: pymunk.Space) -> tuple:
    """What must match for two episodes to share shadow spaces: every shape's kind, size and
    material and every body's mass and moment (walls, agent and block; not their poses)."""
    shapes = []
    for sh in space.shapes:
        geo = (tuple(sh.get_vertices()) if isinstance(sh, pymunk.Poly)
               else (tuple(sh.a), tuple(sh.b)) if isinstance(sh, pymunk.Segment) else (tuple(sh.offset),))
        shapes.append((type(sh).__name__, sh.body.body_type, geo, sh.radius, sh.friction, sh.elasticity))
    bodies = tuple((b.body_type, b.mass, b.moment, tuple(b.center_of_gravity)) for b in space.bodies)
    return (tuple(shapes), bodies, space.iterations, space.damping, tuple(space.gravity))


@dataclass
class PushTDynamics:
    """PushT's physics for N rows, each one episode's env (the :class:`TwoRoomDynamics` interface).

    :meth:`take` snapshots the live envs' bodies (the planning call's start state), :meth:`repeat`
    lays rows out as the planner's B·S, :meth:`rollout` steps one restored shadow space per row
    of an episode at a time, the controller vectorised over them. Shadows are pooled by geometry
    (:func:`_geometry_key`), so episodes with the same shapes share one pool of S spaces
    (≈ 190 KB each) instead of holding B·S.
    """

    episodes: list[_Episode]
    pools: dict = field(default_factory=dict)              # geometry key -> [shadow space]
    rows: list[int] = field(default_factory=list)          # episode index of each row
    starts: list[tuple[BodyState, BodyState]] = field(default_factory=list)  # (agent, block) per row

    @classmethod
    def from_envs(cls, envs) -> PushTDynamics:
        eps = []
        for env in envs:
            u = env.unwrapped
            if not getattr(u, "relative", False):
                raise ValueError("the PushT oracle models relative actions (stable-worldmodel's default)")
            eps.append(_Episode(env, _geometry_key(u.space), float(u.k_p), float(u.k_v), float(u.dt),
                                float(u.action_scale), int(1 / (u.dt * u.control_hz))))
        dyn = cls(eps)
        return dyn.take(torch.arange(len(eps)))

    def take(self, idx: torch.Tensor) -> PushTDynamics:
        """Rows ``idx`` of the episodes, starting from their envs' current state."""
        rows = [int(i) for i in idx.reshape(-1).tolist()]
        starts = [tuple(_read(b) for b in _bodies(self.episodes[r].env.unwrapped.space)) for r in rows]
        return PushTDynamics(self.episodes, self.pools, rows, starts)

    def repeat(self, times: int) -> PushTDynamics:
        """Each row repeated ``times`` times in a row (the planner's B·S layout)."""
        return PushTDynamics(self.episodes, self.pools, [r for r in self.rows for _ in range(times)],
                             [s for s in self.starts for _ in range(times)])

    def _shadows(self, ep: _Episode, n: int) -> list[pymunk.Space]:
        pool = self.pools.setdefault(ep.key, [])
        while len(pool) < n:
            pool.append(_shadow_space(ep.env.unwrapped.space))
        return pool[:n]

    def rollout(self, z0: torch.Tensor, actions: torch.Tensor, block: int) -> torch.Tensor:
        """Embedded states after each latent step: actions (N, H, block·2) -> (N, H, 6) float32.

        ``z0`` (N, 6) is the planner's repeated start embedding; the start is the snapshot
        :meth:`take` made, which it must match.
        """
        n, h, _ = actions.shape
        if n != len(self.rows):
            raise ValueError(f"{n} action rows for {len(self.rows)} simulator rows")
        start = pusht_embedding(np.stack([_start_state(s) for s in self.starts]))
        if not torch.allclose(z0.reshape(n, -1)[:, :EMBED_DIM].float(), start, atol=1e-3):
            raise ValueError("the planner's start state is not the simulator's snapshot (take() after the env moved?)")
        acts = actions.reshape(n, h, block, 2).to(torch.float32).numpy()
        out = np.empty((n, h, 7), dtype=np.float64)
        order = np.asarray(self.rows)
        for e in dict.fromkeys(self.rows):              # each episode's rows together, in first-seen order
            idx = np.flatnonzero(order == e)
            ep = self.episodes[e]
            spaces = self._shadows(ep, len(idx))
            bodies = [_bodies(sp) for sp in spaces]
            for (agent, blk), i in zip(bodies, idx, strict=True):
                _write(agent, self.starts[i][0])
                _write(blk, self.starts[i][1])
            for k in range(h):
                for j in range(block):
                    _env_steps(ep, spaces, [b[0] for b in bodies], acts[idx, k, j])
                out[idx, k] = [_state(agent, blk) for agent, blk in bodies]
        return pusht_embedding(out)


_F32 = np.float32


def _env_steps(ep: _Episode, spaces, agents, actions: np.ndarray) -> None:
    """``PushTEnv.step`` (relative PD target) on M shadows at once: actions (M, 2) float32.

    The env computes in Python floats, NumPy float32 scalars and pymunk ``Vec2d``; under NumPy 2's
    promotion a Python float meeting a float32 is cast to float32 first. So the target
    (position + float32 action · scale), the position error, the acceleration and the updated
    velocity are all float32 values while ``k_v · (0 − v)`` is a float64 product. The arrays below
    do the same IEEE operations in the same order and precision; a plain float64 controller would
    miss by ≈ 1e-6 px per step and then diverge under contact (tests/unit/test_pusht_sim.py).

    The agent is kinematic: contacts never change its velocity, and Chipmunk moves it by
    p + (v + 0)·dt in doubles each tick, so its position is tracked here instead of read back
    (each pymunk property read costs about as much as a physics tick).
    """
    m = len(agents)
    pos = np.array([tuple(a.position) for a in agents], dtype=np.float64).reshape(m, 2)
    vel = np.array([tuple(a.velocity) for a in agents], dtype=np.float64).reshape(m, 2)
    target = pos.astype(_F32) + actions.astype(_F32) * _F32(ep.scale)
    kp, kv, dt32, dt = _F32(ep.k_p), ep.k_v, _F32(ep.dt), ep.dt
    for _ in range(ep.n_substeps):
        acc = (target - pos.astype(_F32)) * kp + ((0.0 - vel) * kv).astype(_F32)
        vel = (vel.astype(_F32) + acc * dt32).astype(np.float64)
        for a, v, sp in zip(agents, vel.tolist(), spaces, strict=True):
            a.velocity = v
            sp.step(dt)
        pos = pos + (vel + 0.0) * dt  # Chipmunk's kinematic update (cpBodyUpdatePosition, no bias)


def _state(agent: pymunk.Body, block: pymunk.Body) -> list[float]:
    """The env's state layout (7,): agent x, y; block x, y, angle mod 2π; agent velocity."""
    p, q, v = agent.position, block.position, agent.velocity
    return [p.x, p.y, q.x, q.y, block.angle % (2 * np.pi), v.x, v.y]


def _start_state(st: tuple[BodyState, BodyState]) -> np.ndarray:
    agent, block = st
    return np.array([agent[1], agent[2], block[1], block[2], block[0] % (2 * np.pi)], dtype=np.float64)


__all__ = ["ANGLE_SCALE_PX", "EMBED_DIM", "PushTDynamics", "pusht_embedding"]
