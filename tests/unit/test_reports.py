"""EvalReport: scalar-only, validated, JSON round trip."""

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from lensemble.errors import EvaluationError, ResidencyViolation
from lensemble.eval.reports import EvalReport
from lensemble.eval.stats import wilson_interval


def _fields(**over):
    base = dict(
        success_rate=0.25,
        n_episodes=8,
        n_successes=2,
        planning_samples=300 * 30,
        time_per_action_ms=12.5,
        env_id="swm/TwoRoom-v1",
        held_out_factors=("wall.color",),
        goal_spec_hash="ab" * 32,
        seed=0,
        config_hash="cd" * 32,
        checkpoint_hash="ef" * 32,
        planner="cem",
    )
    base.update(over)
    return base


def test_valid_report_fills_wilson_ci():
    r = EvalReport(**_fields())
    assert r.success_ci == pytest.approx(wilson_interval(2, 8).as_tuple())
    assert r.metrics()["eval/success_rate"] == 0.25


def test_json_round_trip():
    r = EvalReport(
        **_fields(
            one_step_error=0.1,
            rollout_error={1: 0.1, 10: 0.5, 20: 0.9},
            probe_r2=-0.2,
            effective_dim=12.0,
            transfer_success_rate=0.5,
        )
    )
    back = EvalReport.from_json(r.to_json())
    assert back == r
    assert back.rollout_error == {1: 0.1, 10: 0.5, 20: 0.9}


@pytest.mark.parametrize("rate,k", [(1.02, 8), (-0.1, 0)])
def test_out_of_range_rate_is_an_error_not_clamped(rate, k):
    with pytest.raises(EvaluationError):
        EvalReport(**_fields(success_rate=rate, n_successes=k))


def test_inconsistent_counts_and_ci():
    with pytest.raises(EvaluationError):
        EvalReport(**_fields(success_rate=0.5))
    with pytest.raises(EvaluationError):
        EvalReport(**_fields(success_ci=(0.0, 1.0)))
    with pytest.raises(EvaluationError):
        EvalReport(**_fields(transfer_success_rate=1.5))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_rejected(bad):
    with pytest.raises(EvaluationError):
        EvalReport(**_fields(one_step_error=bad))
    with pytest.raises(EvaluationError):
        EvalReport(**_fields(rollout_error={10: bad}))


@pytest.mark.parametrize(
    "value",
    [torch.tensor(0.3), torch.zeros(4), np.array(0.3), np.zeros((2, 2))],
)
def test_tensor_cannot_reach_a_report(value):
    with pytest.raises(ResidencyViolation):
        EvalReport(**_fields(probe_r2=value))
    with pytest.raises(ResidencyViolation):
        EvalReport(**_fields(rollout_error={10: value}))


def test_numpy_scalars_are_unwrapped_and_model_is_frozen():
    r = EvalReport(**_fields(latent_std=np.float32(0.5), seed=np.int64(3)))
    assert type(r.latent_std) is float and r.seed == 3
    with pytest.raises(ValidationError):
        r.success_rate = 1.0
    with pytest.raises(ValidationError):
        EvalReport(**_fields(unknown_field=1.0))


def test_write_round_trips_and_refuses_a_silo_folder(tmp_path):
    from lensemble.data.residency import mark_silo_folder

    r = EvalReport(**_fields())
    path = r.write(tmp_path / "out" / "report.json")
    assert EvalReport.from_json(path.read_text()) == r and path.read_text().endswith("\n")
    silo = tmp_path / "silo_0"
    mark_silo_folder(silo, 0)
    with pytest.raises(ResidencyViolation):
        r.write(silo / "reports" / "report.json")
    assert not (silo / "reports").exists()  # refused before anything was written


# ---------------------------------------------------------------- per-episode records
def _episodes(successes, routes=None):
    return [dict(index=i, seed=1000 + i, success=bool(s), steps=10 + i, start_distance=90.0,
                 final_distance=5.0 if s else 60.0, route_valid=None if routes is None else bool(routes[i]))
            for i, s in enumerate(successes)]


def test_episode_records_round_trip_and_must_add_up():
    succ = [1, 0, 1, 0, 0, 0, 0, 0]
    r = EvalReport(**_fields(episodes=_episodes(succ, routes=[1, 1, 0, 1, 1, 1, 1, 1]),
                             n_route_valid_successes=1, route_valid_success_rate=1 / 8))
    assert len(r.episodes) == 8 and r.episodes[2].route_valid is False
    assert EvalReport.from_json(r.to_json()) == r
    assert r.metrics()["eval/route_valid_success_rate"] == 1 / 8
    with pytest.raises(EvaluationError):   # the records disagree with n_successes
        EvalReport(**_fields(episodes=_episodes([1, 1, 1, 0, 0, 0, 0, 0])))
    with pytest.raises(EvaluationError):   # one record short
        EvalReport(**_fields(episodes=_episodes(succ)[:7]))
    with pytest.raises(EvaluationError):   # route-valid count disagrees with the records
        EvalReport(**_fields(episodes=_episodes(succ, routes=[1] * 8), n_route_valid_successes=1,
                             route_valid_success_rate=1 / 8))
    # A report written before the records existed still loads.
    assert EvalReport(**_fields()).episodes is None


def test_episode_records_hold_scalars_only():
    eps = _episodes([1, 0, 1, 0, 0, 0, 0, 0])
    eps[0]["final_distance"] = np.array([1.0, 2.0])
    with pytest.raises(ResidencyViolation):
        EvalReport(**_fields(episodes=eps))
    eps = _episodes([1, 0, 1, 0, 0, 0, 0, 0])
    eps[1]["start_distance"] = float("nan")
    with pytest.raises(EvaluationError):
        EvalReport(**_fields(episodes=eps))


def test_reports_on_the_same_tasks_pair_episode_by_episode():
    from lensemble.eval.reports import pair_episodes

    a = EvalReport(**_fields(episodes=_episodes([1, 0, 1, 0, 0, 0, 0, 0])))
    b = EvalReport(**_fields(episodes=list(reversed(_episodes([0, 0, 1, 1, 0, 0, 0, 0])))))
    pairs = pair_episodes(a, b)
    assert [(x.index, y.index) for x, y in pairs] == [(i, i) for i in range(8)]
    assert [int(x.success) - int(y.success) for x, y in pairs] == [1, 0, 0, -1, 0, 0, 0, 0]
    other = EvalReport(**_fields(goal_spec_hash="00" * 32, episodes=_episodes([1, 0, 1, 0, 0, 0, 0, 0])))
    with pytest.raises(EvaluationError):
        pair_episodes(a, other)
    with pytest.raises(EvaluationError):
        pair_episodes(a, EvalReport(**_fields()))


def test_the_planning_energy_is_recorded_and_rendered():
    from lensemble.report.eval_report import render_eval_markdown

    fit = {"cost": "reachability", "source": "public", "aggregate": "min", "episodes": 36, "max_gap": 50,
           "final_loss": 2.1, "holdout_spearman": 0.58, "fit_seconds": 3.0}
    r = EvalReport(**_fields(planning_cost=fit))
    assert EvalReport.model_validate_json(r.model_dump_json()).planning_cost == fit
    text = render_eval_markdown(r, "runs/x/checkpoints/step-1", split="heldout", figure="f.png", json_name="r.json")
    assert "reachability head fitted on the public trajectories" in text and "0.58" in text
    plain = render_eval_markdown(EvalReport(**_fields(planning_cost={"cost": "l1"})), "runs/x/checkpoints/step-1",
                                 split="heldout", figure="f.png", json_name="r.json")
    assert "reachability" not in plain
