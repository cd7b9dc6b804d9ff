"""The goal protocols without an env: hashes, configs, the cross-wall rule, report counts."""

import pytest

from lensemble.config import load_config
from lensemble.errors import ConfigError, EvaluationError
from lensemble.eval.goals import GoalProtocol, episode_specs, goal_spec_hash
from lensemble.eval.reports import EvalReport, cross_wall_summary
from lensemble.eval.routes import WallGeometry, crosses_wall

TWOROOM = "swm/TwoRoom-v1"
COLORS = [{"agent.color": [255, 0, 0]}, {"agent.color": [0, 0, 255]}]

# Computed with the code before the dataset-goal protocol existed (commit 5174beb): the strict
# hash of every stored report must not move.
STRICT_HASHES = [
    ((0, 3, COLORS, 25, 50), "79783f291de019710c069cde57b89b5d75768957196387b5d4f079b16f155028"),
    ((7, 4, [], 5, 10), "7bc462823be5aefe50d393f0c60e235eee0fd52b28ae52d1f5bc4e4919cf9521"),
]


@pytest.mark.parametrize("args,digest", STRICT_HASHES)
def test_strict_goal_spec_hash_is_unchanged_and_dataset_differs(args, digest):
    seed, n, values, offset, budget = args
    specs = episode_specs(seed, n, values)
    assert goal_spec_hash(TWOROOM, offset, budget, specs) == digest
    assert goal_spec_hash(TWOROOM, offset, budget, specs, "expert") == digest
    dataset = goal_spec_hash(TWOROOM, offset, budget, specs, "dataset")
    assert len(dataset) == 64 and dataset != digest


def test_named_eval_configs():
    strict, protocol, dataset = (load_config([f"eval={name}"]) for name in ("strict", "protocol", "dataset_goal"))
    # strict is the schema's protocol under its name: the very same config
    assert strict.config_hash() == protocol.config_hash()
    assert strict.eval.goal_source == "expert" and strict.eval.episodes == 50
    assert dataset.eval.goal_source == "dataset" and dataset.eval.episodes == 50
    assert dataset.eval.model_copy(update={"goal_source": "expert"}) == strict.eval
    # the default source is left out of the dump (old hashes stay); the other one is hashed
    assert "goal_source" not in strict.model_dump(mode="json")["eval"]
    assert dataset.model_dump(mode="json")["eval"]["goal_source"] == "dataset"
    assert load_config(["eval.goal_source=dataset"]).eval.goal_source == "dataset"


def test_dataset_goal_must_fit_in_one_behaviour_episode():
    with pytest.raises(ConfigError, match="steps_per_episode"):
        load_config(["eval=dataset_goal", "data.steps_per_episode=20"])
    load_config(["eval=dataset_goal", "data.steps_per_episode=25"])   # t0 = 0 only: allowed
    with pytest.raises(ConfigError):
        GoalProtocol("dataset", goal_offset=26, episode_steps=25)
    with pytest.raises(ConfigError):
        GoalProtocol("clean")
    with pytest.raises(ConfigError, match="from_config"):
        GoalProtocol.from_eval(load_config(["eval=dataset_goal"]).eval)
    cfg = load_config(["eval=dataset_goal", "data.random_action_share=0.3"])
    assert GoalProtocol.from_config(cfg) == GoalProtocol("dataset", 25, 100, 0.3)


VERTICAL = WallGeometry(axis=1, center=112.0, half_thickness=5.0, doors=((100.0, 20.0),))
HORIZONTAL = WallGeometry(axis=0, center=112.0, half_thickness=5.0, doors=((100.0, 20.0),))


@pytest.mark.parametrize("geom,start,goal,across", [
    (VERTICAL, (100, 50), (120, 50), True),
    (VERTICAL, (150, 200), (20, 20), True),
    (VERTICAL, (100, 50), (110, 200), False),     # same side of x = 112, far apart in y
    (VERTICAL, (112, 50), (150, 50), False),      # on the line: neither room (strict inequalities)
    (HORIZONTAL, (50, 100), (50, 120), True),
    (HORIZONTAL, (20, 100), (200, 100), False),   # across in x, but the wall is horizontal
])
def test_cross_wall_known_answers(geom, start, goal, across):
    assert crosses_wall(start, goal, geom) is across
    assert crosses_wall(goal, start, geom) is across


def _report(**over):
    base = dict(success_rate=0.25, n_episodes=8, n_successes=2, planning_samples=1, time_per_action_ms=1.0,
                env_id=TWOROOM, goal_spec_hash="ab" * 32, seed=0, config_hash="cd" * 32,
                checkpoint_hash="ef" * 32, planner="random")
    base.update(over)
    return EvalReport(**base)


def _records(successes, cross):
    return [dict(index=i, seed=i, success=bool(s), steps=5, start_distance=50.0, final_distance=5.0 if s else 40.0,
                 route_valid=True, cross_wall=bool(c)) for i, (s, c) in enumerate(zip(successes, cross, strict=True))]


def test_cross_wall_counts_are_checked_and_summarised():
    succ, cross = [1, 0, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 1, 0, 0, 0]
    r = _report(episodes=_records(succ, cross), n_cross_wall_tasks=3, n_cross_wall_successes=1,
                goal_source="dataset")
    s = cross_wall_summary(r)
    assert s["share"] == 3 / 8 and (s["tasks"], s["successes"]) == (3, 1) and s["success_rate"] == 1 / 3
    assert s["same_room"]["tasks"] == 5 and s["same_room"]["successes"] == 1
    assert r.metrics()["eval/cross_wall_share"] == 3 / 8
    assert EvalReport.from_json(r.to_json()) == r
    with pytest.raises(EvaluationError, match="episode records"):
        _report(episodes=_records(succ, cross), n_cross_wall_tasks=3, n_cross_wall_successes=0)
    with pytest.raises(EvaluationError, match="come together"):
        _report(n_cross_wall_tasks=3)
    with pytest.raises(EvaluationError):
        _report(n_cross_wall_tasks=2, n_cross_wall_successes=3)
    old = _report()   # a report written before the protocol and the counts existed
    assert old.goal_source == "expert" and cross_wall_summary(old) is None
    assert "eval/cross_wall_share" not in old.metrics()
