"""The episode runner: latent-MPC, random and oracle episodes in lock-step, one batched plan call per step.

:func:`run_closed_loop` plays the control part of the closed-loop protocol
(:mod:`lensemble.eval.closed_loop`, steps 2-5) for a list of :class:`~lensemble.eval.goals.EpisodeSpec`;
:func:`planner_plan_fn` wraps a :class:`~lensemble.eval.mpc.Planner` over the model's predictor as
the :data:`PlanFn` it calls.

Several episodes run side by side in one process (``parallel``): their planning calls are batched
into one :meth:`Planner.plan` call, i.e. one predictor rollout of B·S sequences per CEM iteration.
Envs step in lock-step, an episode leaves the batch when it succeeds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np
import torch

from lensemble.config.schema import EvalConfig
from lensemble.config.seeds import numpy_rng
from lensemble.errors import ConfigError, EvaluationError
from lensemble.eval.controls import RandomActionPolicy
from lensemble.eval.goals import EpisodeSpec, GoalProtocol, pose_task
from lensemble.eval.mpc import CostFn, Planner, module_device
from lensemble.eval.oracle_sim import oracle_model
from lensemble.eval.reports import EpisodeRecord
from lensemble.eval.routes import RouteTracker

#: ``plan_fn(z_hist (B, T0, d), past_actions (B, T0-1, A·b) | None, z_goal (B, d), init | None,
#: *, streams=[episode index per row]) -> (actions (B, H, A·b), next_init | None)``. ``init`` is
#: what the previous call returned as ``next_init`` for these rows (warm start), already shifted
#: past the executed steps; ``streams`` names each row's planner noise stream (Planner.plan).
PlanFn = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


# ================================================================================== results
@dataclass
class EpisodeOutcome:
    """What happened in one episode (distances in env state units, e.g. 224-px pixels for TwoRoom)."""

    index: int
    success: bool
    steps: int                 # env actions executed
    start_distance: float      # ground-truth distance to the goal at the start
    final_distance: float      # ... when the episode ended
    plan_calls: int
    route_valid: bool | None = None   # every step entered the wall only through a door (None: no wall)
    cross_wall: bool | None = None    # the goal lay in the other room (None: no wall)


@dataclass
class ClosedLoopResult:
    """All episodes of one closed-loop run, with the wall time of the control loops."""

    episodes: list[EpisodeOutcome] = field(default_factory=list)
    seconds: float = 0.0       # control loops only (goal posing excluded)
    plan_seconds: float = 0.0  # of which inside plan_fn

    @property
    def n_successes(self) -> int:
        return sum(e.success for e in self.episodes)

    @property
    def actions(self) -> int:
        return sum(e.steps for e in self.episodes)

    @property
    def time_per_action_ms(self) -> float:
        return 1000.0 * self.seconds / max(self.actions, 1)

    @property
    def success_rate(self) -> float:
        return self.n_successes / max(len(self.episodes), 1)

    @property
    def n_route_valid_successes(self) -> int | None:
        """Successes whose route was valid; None when some episode has no route validity."""
        if any(e.route_valid is None for e in self.episodes):
            return None
        return sum(e.success and bool(e.route_valid) for e in self.episodes)

    @property
    def n_cross_wall(self) -> int | None:
        """Tasks whose goal lay across the wall; None when some episode has no wall."""
        if any(e.cross_wall is None for e in self.episodes):
            return None
        return sum(bool(e.cross_wall) for e in self.episodes)

    @property
    def n_cross_wall_successes(self) -> int | None:
        """Successes on those tasks; None when some episode has no wall."""
        if self.n_cross_wall is None:
            return None
        return sum(e.success and bool(e.cross_wall) for e in self.episodes)

    def records(self, specs: Sequence[EpisodeSpec]) -> list[EpisodeRecord]:
        """The per-episode records of an :class:`EvalReport` (episode seeds from ``specs``)."""
        seeds = {s.index: s.seed for s in specs}
        return [EpisodeRecord(index=e.index, seed=seeds[e.index], success=e.success, steps=e.steps,
                              start_distance=e.start_distance, final_distance=e.final_distance,
                              route_valid=e.route_valid, cross_wall=e.cross_wall)
                for e in sorted(self.episodes, key=lambda e: e.index)]


# ================================================================================== episodes
def _to_chw(frames: Sequence[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.stack(frames))).permute(0, 3, 1, 2)


def planner_plan_fn(model, planner: Planner, receding_horizon: int, execute: str = "best",
                    cost_fn: CostFn | None = None) -> PlanFn:
    """Wrap :class:`Planner` as a :data:`PlanFn` over the model's predictor.

    ``execute`` chooses what the env runs: ``"best"`` (default, what ``evaluate`` and the study
    use) the cheapest candidate evaluated; ``"mean"`` the final sampling mean (the elite mean for
    CEM, as stable-worldmodel's solvers return).

    The history of each plan call is digested once (:meth:`Predictor.prepare`: for a banded
    predictor, every block's keys and values over the observed latents), then the planner's
    ``iterations`` rollouts continue it for all B·S candidates (:meth:`Predictor.rollout_from`,
    rows b·S..b·S+S−1 belonging to environment b). The warm start for the next call is the plan
    shifted by the ``receding_horizon`` latent steps that will have been executed by then.
    ``cost_fn`` replaces the planner's L1 energy (:func:`lensemble.eval.costs.planning_cost`).
    """
    if execute not in ("best", "mean"):
        raise ConfigError(f"execute must be 'best' or 'mean', got {execute!r}")
    pred = model.predictor
    s = planner.num_samples

    def plan(z_hist, past, z_goal, init, streams=None):
        dev = module_device(pred)  # [device] plan where the predictor is (a no-op on the CPU)
        z_hist, z_goal = z_hist.to(dev), z_goal.to(dev)
        past = past.to(dev) if past is not None else None
        init = init.to(dev) if init is not None else None
        with torch.inference_mode():
            state = pred.prepare(z_hist, past)

        def rollout_fn(z_rep, actions):
            # z_rep is z_hist repeated S times (the planner's row layout); the prepared state
            # already holds it, per environment.
            if z_rep.shape[0] != state.batch * s:
                raise EvaluationError(f"planner rows {z_rep.shape[0]} != {state.batch} histories x {s} samples")
            return pred.rollout_from(state, actions)

        result = planner.plan(rollout_fn, z_hist, z_goal, init_mean=init, streams=streams, cost_fn=cost_fn)
        return (result.actions if execute == "best" else result.mean), planner.next_init(result, receding_horizon)

    return plan


def run_closed_loop(
    model,
    envs: Sequence,
    specs: Sequence[EpisodeSpec],
    eval_cfg: EvalConfig,
    *,
    plan_fn: PlanFn | None,
    eval_seed: int = 0,
    advance: Callable[[int], None] | None = None,
    oracle: Planner | None = None,
    goals: GoalProtocol | None = None,
) -> ClosedLoopResult:
    """Run ``specs`` in chunks of ``len(envs)`` episodes side by side.

    ``plan_fn=None`` runs the random-action control instead of MPC (``model`` may then be None);
    ``oracle`` (a :class:`Planner` over ``action_block``-step blocks) plans on TwoRoom's true
    dynamics instead. Goals are posed with :func:`~lensemble.eval.goals.pose_task` under
    ``goals`` (default: the strict protocol of ``eval_cfg``; the dataset-goal protocol needs
    ``GoalProtocol.from_config(cfg)``); only the control loops are timed.
    """
    protocol = goals if goals is not None else GoalProtocol.from_eval(eval_cfg)
    if protocol.goal_offset != eval_cfg.goal_offset:
        raise ConfigError(f"goal protocol offset {protocol.goal_offset} != eval.goal_offset {eval_cfg.goal_offset}",
                          remediation="build the protocol from the same config: GoalProtocol.from_config(cfg)")
    out = ClosedLoopResult()
    for lo in range(0, len(specs), len(envs)):
        chunk = list(specs[lo : lo + len(envs)])
        pool = list(envs[: len(chunk)])
        tasks = [pose_task(env, spec, protocol, eval_seed) for env, spec in zip(pool, chunk, strict=True)]
        starts, goals_img = [t.start for t in tasks], [t.goal for t in tasks]
        if oracle is not None:
            res = _oracle_chunk(pool, chunk, eval_cfg, oracle, model.cfg.action_block if model is not None else 1)
        elif plan_fn is None:
            policies = [RandomActionPolicy(numpy_rng(eval_seed, "eval", s.index, "random")) for s in chunk]
            res = _random_chunk(pool, chunk, policies, eval_cfg.budget)
        else:
            res = _mpc_chunk(model, pool, chunk, starts, goals_img, eval_cfg, plan_fn)
        cross = {spec.index: task.cross_wall for spec, task in zip(chunk, tasks, strict=True)}
        out.episodes.extend(replace(e, cross_wall=cross[e.index]) for e in res.episodes)
        out.seconds += res.seconds
        out.plan_seconds += res.plan_seconds
        if advance is not None:
            advance(len(chunk))
    return out


def _random_chunk(envs, specs, policies, budget: int) -> ClosedLoopResult:
    res = ClosedLoopResult()
    for env, spec, policy in zip(envs, specs, policies, strict=True):
        d0 = env.distance_to_goal()
        route = RouteTracker(env)
        t0 = time.perf_counter()
        success, steps = False, 0
        while steps < budget and not success:
            _, _, success = route.step(policy(env))
            steps += 1
        res.seconds += time.perf_counter() - t0
        res.episodes.append(EpisodeOutcome(spec.index, success, steps, d0, env.distance_to_goal(), 0, route.valid))
    return res


def _mpc_chunk(model, envs, specs, starts, goals, eval_cfg: EvalConfig, plan_fn: PlanFn) -> ClosedLoopResult:
    """B episodes in lock-step: one batched plan call for the active ones, then
    ``receding_horizon`` latent steps of ``action_block`` env steps each."""
    b = len(envs)
    block = model.cfg.action_block
    a_dim = envs[0].info.action_dim
    w = model.predictor.context  # latents that can still reach a prediction
    low = np.asarray(envs[0].info.action_low, np.float32)
    high = np.asarray(envs[0].info.action_high, np.float32)
    d0 = [env.distance_to_goal() for env in envs]
    routes = [RouteTracker(env) for env in envs]

    t_start = time.perf_counter()
    with torch.inference_mode():
        z_goal = model.encoder(_to_chw(goals)).float().clone()
        z_hist = model.encoder(_to_chw(starts)).float().clone()[:, None]  # (B, T0=1, d)
    past = torch.zeros(b, 0, a_dim * block)                                # (B, T0-1, A·b)
    frames = list(starts)
    active = np.ones(b, dtype=bool)
    success = np.zeros(b, dtype=bool)
    steps = np.zeros(b, dtype=int)       # env actions executed per episode
    calls = np.zeros(b, dtype=int)
    elapsed = 0                          # env steps since the start, same for every active episode
    init: torch.Tensor | None = None     # (B, H, A·b) warm start for every row
    plan_seconds = 0.0
    while active.any() and elapsed < eval_cfg.budget:
        rows = np.flatnonzero(active)
        idx = torch.from_numpy(rows)
        hist = z_hist[idx]
        prev = past[idx] if hist.shape[1] > 1 else None
        tp = time.perf_counter()
        # One noise stream per episode: its plan does not depend on which episodes share the batch.
        actions, nxt = plan_fn(hist, prev, z_goal[idx], init[idx] if init is not None else None,
                               streams=[specs[r].index for r in rows])
        plan_seconds += time.perf_counter() - tp
        calls[rows] += 1
        init = _store_init(init, b, idx, nxt)
        # (B_active, H, b, A): latent step r of row k is the b env actions plan[k, r].
        plan = np.clip(actions.detach().float().cpu().numpy().reshape(len(rows), -1, block, a_dim), low, high)
        for r in range(min(eval_cfg.receding_horizon, plan.shape[1])):
            elapsed = _play_block(plan[:, r], rows, routes, active, success, steps, elapsed, eval_cfg.budget, frames)
            if not active.any() or elapsed >= eval_cfg.budget:
                break
            # Close the latent step: encode the new frames, slide the history window (W latents,
            # W-1 action blocks between them). Finished rows keep stale values; they never plan again.
            with torch.inference_mode():
                z_new = model.encoder(_to_chw([frames[row] for row in rows])).float().clone()
            z_next = z_hist[:, -1].clone()
            z_next[idx] = z_new
            blk = torch.zeros(b, block * a_dim)
            blk[idx] = torch.from_numpy(plan[:, r].reshape(len(rows), -1))
            z_hist = torch.cat([z_hist, z_next[:, None]], dim=1)[:, -w:]
            past = torch.cat([past, blk[:, None]], dim=1)
            past = past[:, past.shape[1] - (z_hist.shape[1] - 1):]
    return _outcomes(envs, specs, routes, d0, success, steps, calls, time.perf_counter() - t_start, plan_seconds)


def _oracle_chunk(envs, specs, eval_cfg: EvalConfig, planner: Planner, block: int) -> ClosedLoopResult:
    """:func:`_mpc_chunk` with the true dynamics in place of the world model: the state, the goal
    and the rollouts are :func:`lensemble.eval.oracle_sim.oracle_model`'s (TwoRoom's batched step,
    PushT's pymunk physics on shadow spaces, Reacher's MuJoCo rollouts).
    """
    b = len(envs)
    low = np.asarray(envs[0].info.action_low, np.float32)
    high = np.asarray(envs[0].info.action_high, np.float32)
    a_dim = envs[0].info.action_dim
    d0 = [env.distance_to_goal() for env in envs]
    routes = [RouteTracker(env) for env in envs]
    dynamics, oracle_state, goal = oracle_model(envs)
    t_start = time.perf_counter()
    active = np.ones(b, dtype=bool)
    success = np.zeros(b, dtype=bool)
    steps = np.zeros(b, dtype=int)
    calls = np.zeros(b, dtype=int)
    elapsed = 0
    init: torch.Tensor | None = None
    plan_seconds = 0.0
    while active.any() and elapsed < eval_cfg.budget:
        rows = np.flatnonzero(active)
        idx = torch.from_numpy(rows)
        pos = torch.from_numpy(np.stack([oracle_state(envs[r]) for r in rows]))
        sim = dynamics.take(idx).repeat(planner.num_samples)
        tp = time.perf_counter()
        # sim is bound now: plan() calls the rollout before the loop moves on
        result = planner.plan(lambda z_rep, acts, sim=sim: sim.rollout(z_rep, acts, block), pos, goal[idx],
                              init_mean=init[idx] if init is not None else None,
                              streams=[specs[r].index for r in rows])
        plan_seconds += time.perf_counter() - tp
        calls[rows] += 1
        init = _store_init(init, b, idx, planner.next_init(result, eval_cfg.receding_horizon))
        plan = np.clip(result.actions.numpy().reshape(len(rows), -1, block, a_dim), low, high)
        for r in range(min(eval_cfg.receding_horizon, plan.shape[1])):
            elapsed = _play_block(plan[:, r], rows, routes, active, success, steps, elapsed, eval_cfg.budget)
            if not active.any() or elapsed >= eval_cfg.budget:
                break
    return _outcomes(envs, specs, routes, d0, success, steps, calls, time.perf_counter() - t_start, plan_seconds)


def _store_init(init: torch.Tensor | None, b: int, idx: torch.Tensor, nxt: torch.Tensor | None) -> torch.Tensor | None:
    """The warm-start table (B, H, A·b) with rows ``idx`` set to ``nxt`` (made on first use)."""
    if nxt is None:
        return init
    if init is None:
        init = torch.zeros(b, *nxt.shape[1:])
    init[idx] = nxt.detach().float().cpu()
    return init


def _play_block(block_actions: np.ndarray, rows, routes, active, success, steps, elapsed: int, budget: int,
                frames: list | None = None) -> int:
    """One latent step in lock-step: env action j of ``block_actions`` (B_active, b, A) for every
    still-active row, up to ``budget`` env steps in all; marks successes (the env's own test,
    nothing else), keeps each row's new frame in ``frames`` when given. Returns the new elapsed."""
    for j in range(block_actions.shape[1]):
        if elapsed >= budget:
            break
        for k, row in enumerate(rows):
            if active[row]:
                frame, _, done = routes[row].step(block_actions[k, j])
                if frames is not None:
                    frames[row] = frame
                steps[row] += 1
                if done:
                    success[row] = True
                    active[row] = False
        elapsed += 1
    return elapsed


def _outcomes(envs, specs, routes, d0, success, steps, calls, seconds: float, plan_seconds: float) -> ClosedLoopResult:
    """The lock-step chunk's per-episode outcomes."""
    res = ClosedLoopResult(seconds=seconds, plan_seconds=plan_seconds)
    for k, (env, spec) in enumerate(zip(envs, specs, strict=True)):
        res.episodes.append(EpisodeOutcome(spec.index, bool(success[k]), int(steps[k]), d0[k],
                                           env.distance_to_goal(), int(calls[k]), routes[k].valid))
    return res


__all__ = ["ClosedLoopResult", "EpisodeOutcome", "PlanFn", "planner_plan_fn", "run_closed_loop"]
