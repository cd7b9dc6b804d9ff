"""Reacher's true dynamics for the oracle planner: the env's own MuJoCo model, rolled out in C.

The oracle (``evaluate(..., policy="oracle")``) plans with the MPC protocol's planner on the true
dynamics instead of the world model, so its success is the ceiling of the planner and the
protocol (docs/evaluation.md). For Reacher the rollouts are ``mujoco.rollout.rollout``: every
sampled action sequence starts from the live env's full physics state (``mj_getState``,
``mjSTATE_FULLPHYSICS``) and is stepped as ``swm/ReacherDMControl-v0`` steps it (the action is the
actuators' control, each env step repeated for ``ACTION_REPEAT`` physics steps). It reproduces the
env's trajectory to float precision (tests/unit/test_reacher_sim.py). Cost: 300 samples × 25 env
steps (one CEM iteration of the strict protocol) take about 25 ms on one core.

The planner scores an embedded state with its L1 energy. :func:`reacher_embedding` maps the
joint angles to (cos θ₁, sin θ₁, θ₂): the shoulder is an unlimited hinge (cos/sin make its wrap at
±π harmless; near the goal a unit of chord is a unit of angle), the wrist is limited to ±160° and
enters as it is. Success is every joint within 0.05 rad of the goal pose
(:mod:`lensemble.envs.reacher`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

#: Physics steps per env step (stable-worldmodel's DMControlWrapper.action_repeat).
ACTION_REPEAT = 2
EMBED_DIM = 3


def reacher_embedding(state) -> torch.Tensor:
    """(..., ≥ 2) joint angles first (the adapter's state layout) -> (..., 3) float32."""
    q = torch.as_tensor(np.asarray(state, dtype=np.float64)[..., :2])
    return torch.stack([torch.cos(q[..., 0]), torch.sin(q[..., 0]), q[..., 1]], dim=-1).float()


def _mujoco():
    import mujoco
    import mujoco.rollout

    return mujoco


@dataclass
class ReacherDynamics:
    """Reacher's physics for N rows, each one episode's env (the :class:`TwoRoomDynamics` interface).

    :meth:`take` snapshots the live envs' physics states (the planning call's start), :meth:`repeat`
    lays rows out as the planner's B·S, :meth:`rollout` rolls each row's action sequence out.
    """

    envs: list
    rows: list[int]
    starts: np.ndarray  # (N, nstate) float64: mjSTATE_FULLPHYSICS of each row's env at take()
    # episode index -> its MjData scratch for mujoco.rollout, made once and shared by take() and
    # repeat() copies (a chunk's envs are not reset, so their models stay the same)
    scratch: dict = field(default_factory=dict)

    @classmethod
    def from_envs(cls, envs) -> ReacherDynamics:
        dyn = cls(list(envs), [], np.zeros((0, 0)))
        return dyn.take(torch.arange(len(envs)))

    def take(self, idx: torch.Tensor) -> ReacherDynamics:
        """Rows ``idx`` of the episodes, starting from their envs' current state."""
        mj = _mujoco()
        spec = mj.mjtState.mjSTATE_FULLPHYSICS
        rows = [int(i) for i in idx.reshape(-1).tolist()]
        starts = []
        for r in rows:
            physics = self.envs[r].physics
            s = np.empty(mj.mj_stateSize(physics.model.ptr, spec))
            mj.mj_getState(physics.model.ptr, physics.data.ptr, s, spec)
            starts.append(s)
        return ReacherDynamics(self.envs, rows, np.stack(starts) if starts else np.zeros((0, 0)), self.scratch)

    def repeat(self, times: int) -> ReacherDynamics:
        """Each row repeated ``times`` times in a row (the planner's B·S layout)."""
        return ReacherDynamics(self.envs, [r for r in self.rows for _ in range(times)],
                               np.repeat(self.starts, times, axis=0), self.scratch)

    def rollout(self, z0: torch.Tensor, actions: torch.Tensor, block: int) -> torch.Tensor:
        """Embedded states after each latent step: actions (N, H, block·2) -> (N, H, 3) float32.

        ``z0`` (N, 3) is the planner's repeated start embedding; it must match the snapshot
        :meth:`take` made.
        """
        mj = _mujoco()
        n, h, _ = actions.shape
        if n != len(self.rows):
            raise ValueError(f"{n} action rows for {len(self.rows)} simulator rows")
        start = reacher_embedding(self.starts[:, 1:3])  # FULLPHYSICS: time, then qpos
        if not torch.allclose(z0.reshape(n, -1)[:, :EMBED_DIM].float(), start, atol=1e-4):
            raise ValueError("the planner's start state is not the simulator's snapshot (take() after the env moved?)")
        # The env casts actions to float32 first (EnvAdapter.step); so does this.
        ctrl = actions.reshape(n, h * block, 2).to(torch.float32).numpy().astype(np.float64)
        ctrl = np.repeat(ctrl, ACTION_REPEAT, axis=1)
        out = np.empty((n, h, 2))
        for e in dict.fromkeys(self.rows):  # one model per episode (factors can change its masses)
            idx = np.flatnonzero(np.asarray(self.rows) == e)
            model = self.envs[e].physics.model.ptr
            if e not in self.scratch:
                self.scratch[e] = mj.MjData(model)
            states, _ = mj.rollout.rollout(model, self.scratch[e], self.starts[idx], ctrl[idx])
            ends = states[:, block * ACTION_REPEAT - 1::block * ACTION_REPEAT]  # after each latent step
            out[idx] = ends[:, :h, 1:3]
        return reacher_embedding(out)


__all__ = ["ACTION_REPEAT", "EMBED_DIM", "ReacherDynamics", "reacher_embedding"]
