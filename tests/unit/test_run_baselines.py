"""`lensemble run --baselines`: gap recovery ρ over one seed's tasks, the words of the answer line,
the baselines' budget, and the evaluation block of summary.json, on fabricated EvalReports."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lensemble.config import load_config
from lensemble.errors import EvaluationError
from lensemble.eval.reports import EvalReport
from lensemble.report.answer import gap_sentence, rate_text
from lensemble.report.baselines import (
    TASK_METHOD,
    TWIN,
    BaselineResult,
    TrainedBaseline,
    baseline_arms,
    baseline_config,
    gap_over_tasks,
    source_of,
)
from lensemble.report.run_eval import RunEvaluation
from lensemble.report.run_report import answer_lines
from lensemble.report.run_summary import evaluation_block
from lensemble.study.gap import GapRecovery

GOAL = "ab" * 32


def report(successes, *, goal=GOAL, order=None, planner="cem", checkpoint="ef") -> EvalReport:
    """An EvalReport whose episode i (seed 100 + i) succeeded iff successes[i]."""
    n = len(successes)
    episodes = [dict(index=i, seed=100 + i, success=bool(s), steps=5, start_distance=50.0,
                     final_distance=5.0 if s else 40.0) for i, s in enumerate(successes)]
    if order is not None:
        episodes = [episodes[i] for i in order]
    k = int(sum(bool(s) for s in successes))
    return EvalReport(success_rate=k / n, n_episodes=n, n_successes=k, planning_samples=1, time_per_action_ms=1.0,
                      env_id="swm/TwoRoom-v1", goal_spec_hash=goal, seed=0, config_hash="cd" * 32,
                      checkpoint_hash=checkpoint * 32, planner=planner, episodes=episodes)


def first(k, n=40):
    """Tasks 0..k-1 solved, the rest not."""
    return [i < k for i in range(n)]


def joint_task_bootstrap(fed, local, twin, n_boot, seed, alpha=0.05):
    """The reference: draw task indices once per replicate for all three arms; percentile of the
    ratio of mean differences (0/0 replicates dropped), order statistics."""
    fed, local, twin = (np.asarray(x, dtype=float) for x in (fed, local, twin))
    idx = np.random.default_rng(seed).integers(0, fed.size, size=(n_boot, fed.size))
    num, den = (fed - local)[idx].mean(-1), (twin - local)[idx].mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = num / den
    rho = rho[~np.isnan(rho)]
    return tuple(float(x) for x in np.quantile(rho, [alpha / 2, 1 - alpha / 2], method="inverted_cdf"))


# ------------------------------------------------------------------------------- ρ over tasks
def test_halfway_is_half_and_the_interval_resamples_tasks_jointly():
    # locals solve tasks 0-3, the twin 0-31, federation 0-17: (18 - 4) / (32 - 4) = 0.5
    locals_ = [report(first(4)), report(first(4))]
    gap = gap_over_tasks(report(first(18)), locals_, report(first(32)), n_boot=2000, seed=3)
    assert gap.defined and gap.rho == pytest.approx(0.5)
    assert gap.numerator == pytest.approx(14 / 40) and gap.denominator == pytest.approx(28 / 40)
    assert gap.rho_ci == pytest.approx(joint_task_bootstrap(first(18), first(4), first(32), 2000, 3))
    assert gap.rho_ci[0] < 0.5 < gap.rho_ci[1]
    assert gap.n_seeds == 40 and gap.method == TASK_METHOD and "task" in gap.method


def test_federation_equal_to_the_twin_on_every_task_is_exactly_one():
    # Resampled jointly, every replicate's numerator equals its denominator: the interval is [1, 1].
    # Resampling the arms separately would spread it.
    twin = first(30)
    gap = gap_over_tasks(report(twin), [report(first(5)), report(first(9))], report(twin), n_boot=1000)
    assert gap.rho == pytest.approx(1.0) and gap.rho_ci == pytest.approx((1.0, 1.0))


def test_s_local_is_the_mean_of_the_local_models_per_task():
    # local-0 solves tasks 0-9, local-1 tasks 30-39: S_local = 0.5 on 20 tasks, 0 elsewhere
    a, b = first(10), [i >= 30 for i in range(40)]
    fed, twin = first(25), first(35)
    gap = gap_over_tasks(report(fed), [report(a), report(b)], report(twin), n_boot=500, seed=1)
    local = (np.array(a, float) + np.array(b, float)) / 2
    assert gap.numerator == pytest.approx(np.mean(np.array(fed, float) - local))
    assert gap.denominator == pytest.approx(np.mean(np.array(twin, float) - local))
    assert gap.rho_ci == pytest.approx(joint_task_bootstrap(fed, local, twin, 500, 1))


def test_tasks_pair_by_episode_whatever_the_record_order():
    order = list(range(39, -1, -1))
    plain = gap_over_tasks(report(first(18)), [report(first(4))], report(first(32)), n_boot=500)
    shuffled = gap_over_tasks(report(first(18), order=order), [report(first(4))], report(first(32), order=order),
                              n_boot=500)
    assert shuffled == plain


def test_no_gap_is_undefined():
    same = [i % 3 == 0 for i in range(40)]
    gap = gap_over_tasks(report(first(20)), [report(same)], report(same), n_boot=500)
    assert not gap.defined and gap.rho is None and gap.rho_ci is None and "S_twin - S_local" in gap.reason and "contains 0" in gap.reason


def test_other_tasks_or_a_single_task_refuse():
    with pytest.raises(EvaluationError, match="different tasks"):
        gap_over_tasks(report(first(5)), [report(first(2))], report(first(9), goal="12" * 32))
    with pytest.raises(EvaluationError, match="at least 2 tasks"):
        gap_over_tasks(report([True]), [report([False])], report([True]))


# ------------------------------------------------------------------------------- the budget
def test_baselines_train_the_federations_budget():
    cfg = load_config(["experiment=micro"])  # 2 silos, 2 rounds x H = 3, batch 16
    assert baseline_arms(cfg) == ["local-0", "local-1", TWIN]
    assert [source_of(a) for a in baseline_arms(cfg)] == ["silo-0", "silo-1", "pooled"]
    local, twin = baseline_config(cfg, "local-1", 2), baseline_config(cfg, TWIN, 2)
    assert (local.train.steps, local.train.batch_size) == (6, 16)
    assert (twin.train.steps, twin.train.batch_size) == (6, 32)
    assert local.model == cfg.model and local.eval == cfg.eval and twin.objective == cfg.objective


# ------------------------------------------------------------------------------- the words
def _gap(**over) -> GapRecovery:
    base = dict(defined=True, reason=None, rho=0.5, rho_ci=(0.314, 0.716), numerator=0.35,
                numerator_ci=(0.2, 0.5), denominator=0.7, denominator_ci=(0.55, 0.825), n_seeds=40,
                n_boot=10_000, alpha=0.05, seed=0, method=TASK_METHOD)
    base.update(over)
    return GapRecovery(**base)


def test_a_clear_gap_names_rho_with_its_interval():
    text = gap_sentence(_gap(), [0.1, 0.1], (32, 40))
    assert text == ("Against baselines trained from the same warm start at the same budget and scored on the same "
                    "40 tasks, the 2 local models (each silo alone) planned 10 % on average and the data-parallel "
                    f"twin (the silos' data pooled) {rate_text(32, 40)}: federation recovered ρ = 0.50 [0.31, 0.72] "
                    "of the twin − local gap (+70 points [+55, +82]; 95 % paired bootstrap over the tasks, one seed).")


def test_no_gap_says_rho_is_undefined():
    text = gap_sentence(_gap(defined=False, reason="contains 0", rho=None, rho_ci=None, denominator=0.05,
                             denominator_ci=(-0.1, 0.2)), [0.4], (18, 40))
    assert text.endswith(": the twin − local gap (+5 points [-10, +20]) is not distinguishable from 0 on these "
                         "tasks, so gap recovery ρ is undefined; this run cannot say how much of the gap federation "
                         "recovers.")
    assert "ρ =" not in text


def test_infinite_bounds_and_a_negative_gap_are_said_as_such():
    text = gap_sentence(_gap(rho=-1.5, rho_ci=(-math.inf, -0.2), denominator=-0.2, denominator_ci=(-0.4, -0.05)),
                        [0.5], (12, 40))
    assert "ρ = -1.50 [−∞, -0.20]" in text and "the local models planned better than the twin" in text
    assert "not computed: one task" in gap_sentence(None, [0.5], (1, 1), why="one task")


def _evaluation(fed, warm, rnd) -> RunEvaluation:
    reports = {"federated": report(fed), "warmstart": report(warm), "random": report(rnd, planner="random")}
    return RunEvaluation(len(fed), reports, {a: Path(f"eval/{a}.json") for a in reports})


def _baselines(fed_report, locals_, twin) -> BaselineResult:
    reports = {f"local-{i}": report(s) for i, s in enumerate(locals_)} | {TWIN: report(twin)}
    trained = {a: TrainedBaseline(a, Path(a), "ab" * 32, 6, 32 if a == TWIN else 16, 1.0, False) for a in reports}
    gap = gap_over_tasks(fed_report, [r for a, r in reports.items() if a != TWIN], reports[TWIN], n_boot=1000)
    return BaselineResult(reports, trained, gap)


@pytest.mark.parametrize("twin_k,defined", [(32, True), (4, False)])
def test_the_answer_line_carries_rho_only_when_there_is_a_gap(twin_k, defined):
    cfg = load_config(["experiment=micro"])
    ev = _evaluation(first(18), first(6), first(1))
    base = _baselines(ev.reports["federated"], [first(4), first(4)], first(twin_k))
    assert base.gap.defined is defined
    line = answer_lines(cfg, {"rounds": []}, ev, base)[0]
    assert line.startswith("The federated model planned 18/40")
    if defined:
        lo, hi = base.gap.rho_ci
        assert f"federation recovered ρ = {base.gap.rho:.2f} [{lo:.2f}, {hi:.2f}]" in line
    else:
        assert "so gap recovery ρ is undefined" in line and "ρ =" not in line
    assert "ρ" not in answer_lines(cfg, {"rounds": []}, ev)[0]  # without --baselines: no ρ


# ------------------------------------------------------------------------------- summary.json
def test_the_evaluation_block_reads_the_answer_from_one_file():
    cfg = load_config(["experiment=micro"])
    ev = _evaluation(first(18), first(6), first(1))
    base = _baselines(ev.reports["federated"], [first(4), first(8)], first(32))
    block = json.loads(json.dumps(evaluation_block(cfg, ev, base), allow_nan=False))
    assert set(block["arms"]) == {"federated", "warmstart", "random", "local-0", "local-1", TWIN}
    assert all(a["goal_spec_hash"] == block["goal_spec_hash"] == GOAL for a in block["arms"].values())
    fed = block["arms"]["federated"]
    assert (fed["successes"], fed["episodes"], fed["success_rate"]) == (18, 40, 0.45)
    assert fed["success_ci"] == list(ev.reports["federated"].success_ci) and fed["report"] == "eval/federated.json"
    assert set(block["comparisons"]) == {"federated-vs-random", "federated-vs-warmstart", "warmstart-vs-random"}
    assert block["comparisons"]["federated-vs-random"]["reading"] == "better"
    assert block["baselines"] == {"local_steps": 6, "local_batch_size": 16, "twin_steps": 6, "twin_batch_size": 32,
                                  "local_success_rate": pytest.approx(6 / 40)}
    g = block["gap_recovery"]
    assert g["defined"] and g["rho"] == pytest.approx(base.gap.rho) and g["rho_ci"] == list(base.gap.rho_ci)
    assert g["twin_minus_local"] == pytest.approx(26 / 40) and g["units"] == "tasks" and g["n_units"] == 40
    assert evaluation_block(cfg, ev)["gap_recovery"] is None and evaluation_block(cfg, None) is None


def test_infinite_rho_bounds_stay_valid_json():
    cfg = load_config(["experiment=micro"])
    ev = _evaluation(first(18), first(6), first(1))
    base = _baselines(ev.reports["federated"], [first(4)], first(32))
    base = BaselineResult(base.reports, base.trained, _gap(rho_ci=(0.2, math.inf)))
    g = json.loads(json.dumps(evaluation_block(cfg, ev, base), allow_nan=False))["gap_recovery"]
    assert g["rho_ci"] == [0.2, "inf"]
    missing = BaselineResult(base.reports, base.trained, None, "one task")
    g = evaluation_block(cfg, ev, missing)["gap_recovery"]
    assert g["error"] == "one task" and g["rho"] is None and not g["defined"]
