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
