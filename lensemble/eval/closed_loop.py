"""The closed loop: ``evaluate`` scores a checkpoint by latent MPC in the real environment, plus the ladder.

The protocol (DESIGN.md §7; defaults in ``configs/eval/``) for episode i of N:

1. The task: seed ``derive(eval.seed, "eval", i)`` and the episode's factor values.
2. Pose it (:mod:`lensemble.eval.goals`, ``eval.goal_source``). Strict (``"expert"``, default):
   reset with the seed, run the noise-free goal expert for ``goal_offset`` env steps; the state it
   reaches is the goal. Dataset-goal (``"dataset"``): start and goal are the states ``goal_offset``
   steps apart in a fresh held-out episode of the collection's behaviour policy. Either way the
   goal becomes the env's goal (so the env's own success test and its goal image refer to it) and
   the agent stands at the start; TwoRoom tasks record whether the goal lies across the wall.
3. Control for at most ``budget`` env steps. MPC: encode the current frame (with the last W latents
   and the action blocks between them when the predictor attends to a history) and the goal image,
   plan ``horizon`` latent steps with :class:`~lensemble.eval.mpc.Planner`, execute the first
   ``receding_horizon`` of them (each = ``action_block`` env steps of the planned block, clipped to
   the env's bounds), re-encode, re-plan. ``policy="random"`` instead takes uniform random actions:
   the control any planner must beat.
4. The episode succeeds when the environment itself reports success (its ``terminated`` flag after
   a step). Nothing the model computes ever decides success.
5. Every episode is recorded (seed, success, steps, start and final distance to the goal) and, for
   TwoRoom, whether its goal lay across the wall and whether its route was valid: every step's
   path entered the wall only through a door (:mod:`lensemble.eval.routes`; the env itself checks
   the door only at a step's end point).
   ``success_rate`` stays the env's flag; ``route_valid_success_rate`` counts successes with a
   valid route. ``policy="oracle"`` plans with the same planner on TwoRoom's true dynamics
   (positions instead of latents, L1 distance to the goal position): the planner/protocol ceiling.

Several episodes run side by side in one process (``parallel``): their planning calls are batched
into one :meth:`Planner.plan` call, i.e. one predictor rollout of B·S sequences per CEM iteration.
Envs step in lock-step, an episode leaves the batch when it succeeds. The episode runner
(:func:`run_closed_loop`, :func:`planner_plan_fn`) lives in :mod:`lensemble.eval.episode_runner`;
this module poses the request, runs it, adds the ladder and assembles the report.

``time_per_action_ms`` is wall time of the control loop (encoding, planning, env steps; goal
posing excluded) divided by the env actions executed, so with B episodes in parallel it is the
per-action cost amortised over the batch — the throughput a user of ``evaluate`` gets.
``planning_samples`` is num_samples × iterations (candidate sequences the model scores per plan).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from pydantic import ValidationError

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config.schema import EvalConfig, LensembleConfig
from lensemble.config.seeds import derive
from lensemble.data.collect import load_silo
from lensemble.data.partition import partition_silos
from lensemble.data.shards import EpisodeBatch, load_shard
from lensemble.data.store import ensure_data
from lensemble.envs.adapter import env_info, make_env
from lensemble.envs.factors import factor_spec, supported_envs
from lensemble.errors import ConfigError, EvaluationError
from lensemble.eval.costs import planning_cost
from lensemble.eval.episode_runner import (  # noqa: F401  (ClosedLoopResult, EpisodeOutcome, PlanFn: re-exported)
    ClosedLoopResult,
    EpisodeOutcome,
    PlanFn,
    planner_plan_fn,
    run_closed_loop,
)
from lensemble.eval.goals import (  # noqa: F401  (EpisodeSpec, pose_goal: re-exported, callers import them from here)
    GOAL_PROTOCOL,
    EpisodeSpec,
    GoalProtocol,
    episode_specs,
    goal_spec_hash,
    pose_goal,
    pose_task,
)
from lensemble.eval.ladder import LadderSettings, run_ladder
from lensemble.eval.mpc import Planner, WorldModelOnDevice
from lensemble.eval.oracle_sim import ORACLE_ENVS
from lensemble.eval.reports import EvalReport
from lensemble.model.world_model import world_model_from_state
from lensemble.observability.progress import progress_bar

SPLITS = ("heldout", "factor")
POLICIES = ("mpc", "random", "oracle")

# ================================================================================== validation
#: The most episodes one evaluation plays. 10,000 already pin a success rate to ±1 point (95 %, at
#: worst p = 0.5), finer than any effect a study registers, and take hours of planning per model on
#: a CPU; a larger number is a typo, and the task list alone would grow until the process is killed.
MAX_EPISODES = 10_000

def validate_request(env_id: str, cfg: LensembleConfig, *, split: str = "heldout", policy: str = "mpc",
                     episodes: int | None = None) -> EvalConfig:
    """Check everything cheap before anything heavy runs; returns the re-validated eval config.

    Unknown env id, split or policy -> EvaluationError; an invalid planner/eval config (also one
    built with ``model_construct``/``model_copy``, which skip pydantic validation) -> ConfigError.
    """
    if env_id not in supported_envs():
        raise EvaluationError(f"unknown environment {env_id!r}",
                              remediation=f"evaluate on one of {supported_envs()} (--env)")
    if split not in SPLITS:
        raise EvaluationError(f"unknown split {split!r}", remediation=f"use one of {SPLITS} (--split)")
    if policy not in POLICIES:
        raise EvaluationError(f"unknown policy {policy!r}", remediation=f"use one of {POLICIES} (--policy)")
    if policy == "oracle" and env_id not in ORACLE_ENVS:
        raise EvaluationError(f"the oracle planner needs the true dynamics; {env_id} has none here",
                              remediation=f"use --policy mpc or random on this env (oracle: {ORACLE_ENVS})")
    if episodes is not None and (isinstance(episodes, bool) or int(episodes) != episodes or episodes < 1):
        raise ConfigError(f"episodes must be a positive integer, got {episodes!r}",
                          remediation="pass --episodes N with N >= 1")
    try:
        eval_cfg = EvalConfig.model_validate(cfg.eval.model_dump())
    except ValidationError as exc:
        problems = "; ".join(f"eval.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid eval config: {problems}", remediation="fix the eval.* settings") from None
    asked = episodes if episodes is not None else eval_cfg.episodes
    if asked > MAX_EPISODES:  # [robust] issue 33: 1e9 was accepted and grew memory until killed
        raise ConfigError(f"{asked} evaluation episodes is more than {MAX_EPISODES:,}",
                          remediation=f"pass --episodes (or eval.episodes) of at most {MAX_EPISODES:,}; size it "
                                      "from the effect to detect (docs/evaluation.md), or split it over seeds")
    # The Planner checks its own arguments (families, topk, bounds ...): build a throw-away one.
    Planner.from_config(eval_cfg, action_dim=cfg.model.action_dim * cfg.model.action_block,
                        action_low=-1.0, action_high=1.0)
    return eval_cfg


# ================================================================================== factors
def _factor_label(key: str, value) -> str:
    return f"{key}={json.dumps(value, separators=(',', ':'))}"


def eval_factor_values(cfg: LensembleConfig, env_id: str, split: str) -> tuple[list[dict], tuple[str, ...]]:
    """The factor dicts evaluation episodes cycle through, and the held-out values as labels.

    - ``eval.heldout_factors`` non-empty: each entry is ``"key=<json value>"`` (that value) or a
      bare ``"key"`` (that factor's catalog transfer values). Episode i takes, for each key, the
      key's ``i mod n``-th value. These values are reported as held out.
    - else ``split="factor"``: the partition factor's transfer values (the collection's "factor"
      split: values no silo saw), reported as held out.
    - else ``split="heldout"``: the partition factor's values the silos saw (in distribution;
      the episodes themselves are new), nothing held out.
    """
    if cfg.eval.heldout_factors:
        per_key: dict[str, list] = {}
        for entry in cfg.eval.heldout_factors:
            key, sep, raw = entry.partition("=")
            key = key.strip()
            if sep:
                try:
                    per_key.setdefault(key, []).append(json.loads(raw))
                except json.JSONDecodeError:
                    raise ConfigError(f"eval.heldout_factors entry {entry!r}: value is not JSON",
                                      remediation='write e.g. agent.color=[255,0,0] or a bare key') from None
            else:
                spec = factor_spec(env_id, key)
                per_key.setdefault(key, []).extend(spec.values_at(spec.transfer))
        n = max(len(v) for v in per_key.values())
        values = [{k: v[i % len(v)] for k, v in per_key.items()} for i in range(n)]
        labels = tuple(_factor_label(k, x) for k, v in per_key.items() for x in v)
        return values, labels
    key = cfg.data.partition_factor
    if split == "factor":
        spec = factor_spec(env_id, key)
        vals = spec.values_at(spec.transfer)
        return [{key: v} for v in vals], tuple(_factor_label(key, v) for v in vals)
    plan, seen = heldout_value_indices(cfg, env_id)
    return [plan.factors(i) for i in seen], ()


def heldout_value_indices(cfg: LensembleConfig, env_id: str):
    """The silo plan of ``cfg`` and the catalog indices the ``heldout`` split cycles through, in
    order: episode i takes index ``seen[i mod len(seen)]`` (without ``eval.heldout_factors``)."""
    d = cfg.data
    plan = partition_silos(env_id, d.partition_factor, d.num_silos, d.episodes_per_silo, d.severity,
                           cfg.root_seed, d.heldout_episodes, d.shared_homes)
    return plan, sorted(set().union(*(plan.seen_by(c) for c in range(plan.num_silos))))


# ================================================================================== evaluate
def checkpoint_env(ckpt) -> str | None:
    """The environment a verified checkpoint was trained on, or None where nothing records it.

    Read from the run manifest the checkpoint belongs to: the nearest ``manifest.json`` above its
    folder (a federated round's is three levels up, a trained model's two) whose ``config_hash``
    is the checkpoint's own, so a manifest of some other run in a parent folder never counts.
    """
    want = ckpt.header.get("config_hash")
    if not want:
        return None
    for folder in list(Path(ckpt.path).resolve().parents)[:4]:
        path = folder / "manifest.json"
        if not path.is_file():
            continue
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if manifest.get("config_hash") == want:
            env = (manifest.get("config") or {}).get("env", {}).get("id")
            return str(env) if env else None
    return None


def evaluate(
    checkpoint: str | Path,
    env_id: str,
    *,
    cfg: LensembleConfig,
    episodes: int | None = None,
    split: str = "heldout",
    progress: bool = True,
    policy: str = "mpc",
    ladder: bool = True,
    transfer: bool = False,
    parallel: int = 8,
    ladder_settings=None,
    allow_other_env: bool = False,
) -> EvalReport:
    """Score ``checkpoint`` on ``env_id`` (see the module docstring for the protocol).

    Args:
        checkpoint: a checkpoint folder (verified by hash; any tampering raises
            :class:`~lensemble.errors.CheckpointIntegrityError`).
        env_id: ``"swm/TwoRoom-v1"`` or ``"swm/PushT-v1"``; anything else -> EvaluationError
            before any file is read or env is created.
        cfg: the run config; ``cfg.eval`` gives the protocol, ``cfg.data`` the factor split.
        episodes: closed-loop episodes (default ``cfg.eval.episodes``).
        split: ``"heldout"`` (new episodes, silo factor values) or ``"factor"`` (transfer values).
        policy: ``"mpc"`` (latent MPC with the checkpoint) or ``"random"`` (control).
        ladder: also compute the evaluation ladder on the collection's split (collects the data
            for ``cfg`` first if it is missing).
        transfer: with ``split="heldout"``, also run the closed loop on the transfer values and
            fill ``transfer_success_rate`` (with ``split="factor"`` it is the success rate).
        parallel: episodes run side by side (batched planning).
        ladder_settings: a :class:`~lensemble.eval.ladder.LadderSettings` (default protocol).
        allow_other_env: evaluate on ``env_id`` although the checkpoint was trained on another
            environment (its run manifest says which); refused with EvaluationError otherwise.

    Returns:
        :class:`EvalReport` (scalars only).
    """
    eval_cfg = validate_request(env_id, cfg, split=split, policy=policy, episodes=episodes)
    if isinstance(parallel, bool) or int(parallel) != parallel or parallel < 1:
        raise ConfigError(f"parallel must be a positive integer, got {parallel!r}")
    n = int(episodes if episodes is not None else eval_cfg.episodes)
    goals = GoalProtocol(eval_cfg.goal_source, eval_cfg.goal_offset, cfg.data.steps_per_episode,
                         cfg.data.random_action_share, cfg.data.expert)  # checked here, before the checkpoint is read

    ckpt = load_checkpoint(checkpoint)  # verifies the content hash before anything is returned
    own_env = checkpoint_env(ckpt)
    if own_env is not None and own_env != env_id and not allow_other_env:
        raise EvaluationError(
            f"checkpoint {Path(checkpoint)} was trained on {own_env}, not {env_id}",
            remediation=f"evaluate on {own_env}, or pass --allow-other-env (allow_other_env=True) "
                        "to measure transfer on purpose")
    model = world_model_from_state(ckpt.architecture, ckpt.tensors).eval()
    info = env_info(env_id)
    if model.cfg.action_dim != info.action_dim:
        raise EvaluationError(
            f"the checkpoint's model takes {model.cfg.action_dim}-d actions but {env_id} has {info.action_dim}",
            remediation="evaluate on the environment the checkpoint was trained on",
        )
    block = model.cfg.action_block
    planner = Planner.from_config(
        eval_cfg, action_dim=info.action_dim * block,
        action_low=torch.tensor(info.action_low).repeat(block),
        action_high=torch.tensor(info.action_high).repeat(block),
        seed=derive(eval_cfg.seed, "eval", "planner"),
    )

    values, held_out = eval_factor_values(cfg, env_id, split)
    specs = episode_specs(eval_cfg.seed, n, values)
    # Fitted before any env exists (a failed fit leaks nothing); the head never sees the tasks.
    cost_fn, cost_info = planning_cost(model, cfg, eval_cfg, progress=progress) if policy == "mpc" else (None, None)
    envs = [make_env(env_id, model.cfg.img_size) for _ in range(min(int(parallel), n))]
    # [device] closed loop on eval.device, [precision] under eval.precision
    on_device = WorldModelOnDevice(model, eval_cfg.device, eval_cfg.precision)
    try:
        plan_fn = planner_plan_fn(model, planner, eval_cfg.receding_horizon, cost_fn=cost_fn) if policy == "mpc" \
            else None
        oracle = _oracle_planner(eval_cfg, info, block) if policy == "oracle" else None
        on_device.__enter__()
        with progress_bar(f"evaluate {policy} {split}", n, enabled=progress) as advance:
            loop = run_closed_loop(model, envs, specs, eval_cfg, plan_fn=plan_fn, eval_seed=eval_cfg.seed,
                                   advance=advance, oracle=oracle, goals=goals)

        transfer_rate = None
        if split == "factor":
            transfer_rate = loop.success_rate
        elif transfer:
            t_values, _ = eval_factor_values(cfg.model_copy(update={"eval": eval_cfg.model_copy(
                update={"heldout_factors": []})}), env_id, "factor")
            t_specs = episode_specs(derive(eval_cfg.seed, "transfer"), n, t_values)
            planner.reset()
            with progress_bar(f"evaluate {policy} transfer", n, enabled=progress) as advance:
                if oracle is not None:
                    oracle.reset()
                t_loop = run_closed_loop(model, envs, t_specs, eval_cfg, plan_fn=plan_fn,
                                         eval_seed=derive(eval_cfg.seed, "transfer"), advance=advance, oracle=oracle,
                                         goals=goals)
            transfer_rate = t_loop.success_rate

        on_device.__exit__(None, None, None)  # [device] the ladder runs on the CPU
        ladder_fields: dict = {}
        if ladder:
            ladder_fields = _ladder_fields(model, cfg, env_id, split, values, envs[0], eval_cfg.seed,
                                           progress, ladder_settings)
    finally:
        on_device.__exit__(None, None, None)
        for env in envs:
            env.close()

    n_valid = loop.n_route_valid_successes
    return EvalReport(
        success_rate=loop.success_rate,
        n_episodes=n,
        n_successes=loop.n_successes,
        episodes=loop.records(specs),
        n_route_valid_successes=n_valid,
        route_valid_success_rate=None if n_valid is None else n_valid / n,
        planning_samples=eval_cfg.num_samples * eval_cfg.iterations if policy != "random" else 1,
        time_per_action_ms=loop.time_per_action_ms,
        env_id=env_id,
        held_out_factors=held_out,
        goal_spec_hash=goal_spec_hash(env_id, eval_cfg.goal_offset, eval_cfg.budget, specs, eval_cfg.goal_source),
        goal_source=eval_cfg.goal_source,
        n_cross_wall_tasks=loop.n_cross_wall,
        n_cross_wall_successes=loop.n_cross_wall_successes,
        seed=eval_cfg.seed,
        config_hash=cfg.config_hash(),
        checkpoint_hash=ckpt.content_hash,
        planner={"mpc": eval_cfg.planner, "oracle": f"oracle-{eval_cfg.planner}"}.get(policy, "random"),
        transfer_success_rate=transfer_rate,
        planning_cost=cost_info,
        precision=on_device.precision if policy == "mpc" else None,
        **ladder_fields,
    )


def _oracle_planner(eval_cfg: EvalConfig, info, block: int) -> Planner:
    """The planner of the MPC protocol, over the same action blocks, for the true dynamics."""
    return Planner.from_config(
        eval_cfg, action_dim=info.action_dim * block,
        action_low=torch.tensor(info.action_low).repeat(block),
        action_high=torch.tensor(info.action_high).repeat(block),
        seed=derive(eval_cfg.seed, "eval", "oracle"),
    )


def load_split(cfg: LensembleConfig, split: str, *, progress: bool = True):
    """(evaluation EpisodeBatch, train EpisodeBatches) of ``cfg``'s collection (collected if missing).

    ``split="heldout"``: every silo's held-out episodes; ``"factor"``: the transfer shard.
    """
    folder, summary = ensure_data(cfg, progress=progress)
    silos = [s["silo"] for s in summary["silos"]]
    train = [load_silo(folder, c, "train", summary) for c in silos]
    if split == "factor":
        rec = summary.get("splits", {}).get("factor", {})
        if not rec.get("path"):
            raise EvaluationError("the collection has no transfer (factor) split",
                                  remediation="set data.heldout_episodes > 0, or evaluate with ladder=False")
        return load_shard(folder / rec["path"], expected_hash=rec["hash"]), train
    held = [load_silo(folder, c, "heldout", summary) for c in silos if summary["silos"][c].get("heldout")]
    if not held:
        raise EvaluationError("the collection has no held-out episodes",
                              remediation="set data.heldout_episodes > 0, or evaluate with ladder=False")
    batch = EpisodeBatch(
        obs=np.concatenate([h.obs for h in held]), actions=np.concatenate([h.actions for h in held]),
        state=np.concatenate([h.state for h in held]), factors=[f for h in held for f in h.factors],
        meta={**held[0].meta, "silo": None, "split": "episode"},
    )
    return batch, train


def _ladder_fields(model, cfg, env_id, split, values, env, seed, progress, settings) -> dict:
    # The collection must match what the checkpoint sees: its resolution and this env.
    data_cfg = cfg.model_copy(update={"model": model.cfg, "env": cfg.env.model_copy(update={"id": env_id})})
    eval_batch, train = load_split(data_cfg, split, progress=progress)
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else None
    result = run_ladder(model, eval_batch, train, split=split, env=env, factor_values=values,
                        seed=derive(seed, "ladder"), settings=settings or LadderSettings(), progress=say)
    return {
        "one_step_error": result.one_step_error,
        "copy_last_error": result.copy_last_error,
        "train_one_step_error": result.train_one_step_error,
        "train_copy_last_error": result.train_copy_last_error,
        "rollout_error": result.rollout_error,
        "rollout_composite": result.rollout_composite,
        "intervention_error": result.intervention_error,
        "probe_r2": result.probe_r2,
        "pixel_pca_r2": result.pixel_pca_r2,
        "effective_dim": result.effective_dim,
        "latent_std": result.latent_std,
    }


__all__ = ["evaluate", "planner_plan_fn", "run_closed_loop"]
