"""Evaluation tasks: which episodes, how their goals are posed (``eval.goal_source``), their hash.

A task is an :class:`EpisodeSpec` (an env seed and factor values). Two goal protocols turn it into
a start state and a goal (docs/evaluation.md):

* ``"expert"`` (**strict**, the default): reset with the episode's seed, run the noise-free goal
  expert (:func:`lensemble.eval.controls.goal_expert`) for ``goal_offset`` env steps; the state
  it reaches is the goal, the reset state the start (:func:`pose_goal`).
* ``"dataset"`` (**dataset-goal**, the published LeWM protocol): run a fresh held-out episode of
  the collection's own behaviour policy (:func:`lensemble.data.collect.collect_episode`: the
  noisy expert mixed with held random actions), seeded with ``derive(seed, "dataset-goal")`` so
  it is never one of the training episodes; start = its state at t0, goal = its state at
  t0 + ``goal_offset``, with t0 uniform in [0, ``data.steps_per_episode`` − ``goal_offset``]
  (:func:`pose_dataset_goal`).

Either way the env ends at the start with the goal posed (:meth:`EnvAdapter.set_goal_state`:
the env's own success test and goal image refer to it). The planner, the budget and the success
criterion do not depend on the protocol.

**Cross-wall tasks** (TwoRoom): a task's goal lies across the wall when start and goal are on
opposite sides of the wall's centre line, stable-worldmodel's own ``check_other_room`` rule
(:func:`lensemble.eval.routes.crosses_wall`). Recorded per episode (None without a wall).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lensemble.config.hashing import json_digest
from lensemble.config.seeds import derive, numpy_rng
from lensemble.data.collect import collect_episode
from lensemble.errors import ConfigError
from lensemble.eval.controls import goal_expert
from lensemble.eval.routes import crosses_wall, tworoom_geometry

#: The goal protocols (``eval.goal_source``).
GOAL_SOURCES = ("expert", "dataset")
#: Version tag of the goal-posing protocol, part of the goal-spec hash.
GOAL_PROTOCOL = "lensemble.goal.v1:expert-offset"
#: Seed label of the held-out behaviour episodes of the dataset-goal protocol.
DATASET_GOAL_TAG = "dataset-goal"


@dataclass(frozen=True)
class EpisodeSpec:
    """One evaluation task: the env seed and factor values of episode ``index``."""

    index: int
    seed: int
    factors: dict


def episode_specs(eval_seed: int, n: int, factor_values: Sequence[dict]) -> list[EpisodeSpec]:
    """Episode i: seed ``derive(eval_seed, "eval", i)``, factors ``factor_values[i mod len]``."""
    values = list(factor_values) or [{}]
    return [EpisodeSpec(i, derive(eval_seed, "eval", i), dict(values[i % len(values)])) for i in range(n)]


def goal_spec_hash(env_id: str, goal_offset: int, budget: int, specs: Sequence[EpisodeSpec],
                   goal_source: str = "expert") -> str:
    """SHA-256 of the goal-spec parameters: protocol tag, env, offset, budget, seeds, factors, and
    the goal source when it is not ``"expert"`` (so every strict hash stored before the dataset
    protocol existed stays what it was)."""
    blob = {"protocol": GOAL_PROTOCOL, "env": env_id, "goal_offset": int(goal_offset), "budget": int(budget),
            "seeds": [s.seed for s in specs], "factors": [s.factors for s in specs]}
    if goal_source != "expert":
        blob["goal_source"] = str(goal_source)
    return json_digest(blob)


@dataclass(frozen=True)
class GoalProtocol:
    """How :func:`pose_task` poses goals.

    ``source``: ``"expert"`` or ``"dataset"``; ``goal_offset``: env steps from start to goal;
    ``episode_steps`` and ``random_share``: the behaviour episodes' length and random-action share
    (the collection's ``data.steps_per_episode`` and ``data.random_action_share``; used by
    ``"dataset"`` only).
    """

    source: str = "expert"
    goal_offset: int = 25
    episode_steps: int = 100
    random_share: float = 0.5
    expert: str = "scripted"  # the collection's data.expert, which the dataset protocol's episodes replay

    def __post_init__(self):
        if self.source not in GOAL_SOURCES:
            raise ConfigError(f"unknown goal source {self.source!r}", remediation=f"eval.goal_source: one of {GOAL_SOURCES}")
        if self.goal_offset < 1:
            raise ConfigError(f"goal_offset must be >= 1, got {self.goal_offset}")
        if self.source == "dataset" and self.goal_offset > self.episode_steps:
            raise ConfigError(f"eval.goal_offset={self.goal_offset} exceeds data.steps_per_episode={self.episode_steps}",
                              remediation="a dataset goal lies inside one behaviour episode: lower eval.goal_offset")
        if not 0.0 <= self.random_share <= 1.0:
            raise ConfigError(f"random_share must be in [0, 1], got {self.random_share}")

    @classmethod
    def from_config(cls, cfg) -> "GoalProtocol":
        """The protocol of a :class:`~lensemble.config.schema.LensembleConfig` (its eval and data sections)."""
        return cls(cfg.eval.goal_source, cfg.eval.goal_offset, cfg.data.steps_per_episode,
                   cfg.data.random_action_share, cfg.data.expert)

    @classmethod
    def from_eval(cls, eval_cfg) -> "GoalProtocol":
        """The protocol of an ``EvalConfig`` alone: only the strict one needs nothing else."""
        if eval_cfg.goal_source != "expert":
            raise ConfigError(f"eval.goal_source={eval_cfg.goal_source!r} needs the collection's settings",
                              remediation="pass goals=GoalProtocol.from_config(cfg) to run_closed_loop")
        return cls("expert", eval_cfg.goal_offset)


@dataclass(frozen=True)
class PosedTask:
    """A task after posing: the env sits at ``start`` with the goal set.

    ``start``, ``goal``: (H, W, 3) uint8 frames (the start observation and the goal image);
    ``cross_wall``: whether the goal lies across TwoRoom's wall (None without a wall); ``t0``: the
    start's step in the behaviour episode (dataset protocol; None for the strict one).
    """

    start: np.ndarray
    goal: np.ndarray
    cross_wall: bool | None
    t0: int | None = None


# ---------------------------------------------------------------------------------------- posing
def pose_goal(env, spec: EpisodeSpec, goal_offset: int, eval_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The strict protocol: reset ``env`` for ``spec``, make the state ``goal_offset`` expert steps
    ahead its goal, return to the start. Returns (start frame, goal image), each (H, W, 3) uint8."""
    env.reset(spec.seed, spec.factors)
    start = env.state()
    expert = goal_expert(env, numpy_rng(eval_seed, "eval", spec.index, "goal"))
    expert.reset(env)
    for _ in range(goal_offset):
        env.step(expert(env))
    env.set_goal_state(env.state())
    env.set_state(start)
    return env.render(), env.goal_image()


def dataset_episode_seed(spec_seed: int) -> int:
    """Seed of the held-out behaviour episode behind task ``spec_seed`` (env reset and policy, as
    in collection); a distinct label, so it is never a training episode's seed."""
    return derive(spec_seed, DATASET_GOAL_TAG)


def dataset_start_time(spec_seed: int, goal_offset: int, episode_steps: int) -> int:
    """t0, uniform in [0, episode_steps − goal_offset], from its own stream (the behaviour
    episode's draws are exactly collection's)."""
    return int(numpy_rng(spec_seed, DATASET_GOAL_TAG, "t0").integers(0, episode_steps - goal_offset + 1))


def pose_dataset_goal(env, spec: EpisodeSpec, goal_offset: int, episode_steps: int,
                      random_share: float, expert: str = "scripted") -> tuple[np.ndarray, np.ndarray, int]:
    """The dataset-goal protocol (module docstring). Returns (start frame, goal image, t0).

    Only the first t0 + goal_offset steps of the behaviour episode are run: the policy is causal,
    so they are those of the full ``episode_steps``-step episode.
    """
    t0 = dataset_start_time(spec.seed, goal_offset, episode_steps)
    ep = collect_episode(env, dataset_episode_seed(spec.seed), spec.factors, t0 + goal_offset, random_share,
                         expert)
    env.set_goal_state(ep["state"][t0 + goal_offset])
    env.set_state(ep["state"][t0])
    return env.render(), env.goal_image(), t0


def goal_crosses_wall(env) -> bool | None:
    """Whether the goal posed on ``env`` lies across its wall, seen from the agent (None: no wall)."""
    geom = tworoom_geometry(env)
    if geom is None:
        return None
    return crosses_wall(env.agent_position(), env.goal_state(), geom)


def pose_task(env, spec: EpisodeSpec, protocol: GoalProtocol, eval_seed: int) -> PosedTask:
    """Pose ``spec`` on ``env`` under ``protocol``; the env is left at the start with the goal set."""
    t0 = None
    if protocol.source == "expert":
        start, goal = pose_goal(env, spec, protocol.goal_offset, eval_seed)
    else:
        start, goal, t0 = pose_dataset_goal(env, spec, protocol.goal_offset, protocol.episode_steps,
                                            protocol.random_share, protocol.expert)
    return PosedTask(start, goal, goal_crosses_wall(env), t0)


__all__ = ["GOAL_SOURCES", "EpisodeSpec", "GoalProtocol", "PosedTask", "episode_specs", "goal_spec_hash",
           "pose_dataset_goal", "pose_goal", "pose_task"]
