"""The paired interval for two success rates on the same tasks (Newcombe 1998, method 10), and the
run report's use of it: paired when both EvalReports recorded their episodes on one task set,
the unpaired hybrid score interval otherwise."""

import json
from pathlib import Path

import numpy as np
import pytest

from lensemble.config import load_config
from lensemble.errors import EvaluationError
from lensemble.eval.reports import EvalReport
from lensemble.eval.stats import (
    compare_paired_proportions,
    compare_proportions,
    mcnemar_exact,
    paired_table,
)
from lensemble.report.answer import compare_success, paired_outcomes, success_sentence
from lensemble.report.run_eval import RunEvaluation
from lensemble.report.run_report import ARM_LABEL, answer_lines, comparison_rows
from lensemble.report.run_summary import COMPARISONS, evaluation_block

GOAL = "ab" * 32


def outcomes(both: int, a_only: int, b_only: int, neither: int) -> tuple[np.ndarray, np.ndarray]:
    """Paired outcome vectors (n,) with the given 2x2 table."""
    counts = [both, a_only, b_only, neither]
    return np.repeat([1, 1, 0, 0], counts).astype(bool), np.repeat([1, 0, 1, 0], counts).astype(bool)


# ------------------------------------------------------------------------------- the interval
@pytest.mark.parametrize("table", [(3, 3, 3, 3), (2, 4, 1, 2), (5, 0, 7, 0),
                                   (3, 2, 2, 2)])  # the last: 0 < ad − bc <= n/2, corrected to φ = 0
def test_zero_correlation_gives_the_unpaired_interval(table):
    both, a_only, b_only, neither = table
    n = sum(table)
    paired = compare_paired_proportions(*outcomes(*table))
    unpaired = compare_proportions(both + a_only, n, both + b_only, n)
    assert paired.difference == pytest.approx(unpaired.difference)
    assert paired.ci.as_tuple() == pytest.approx(unpaired.ci.as_tuple(), abs=1e-12)
    assert paired.ci.method == "newcombe-paired" and paired.test == "mcnemar-exact"


# Newcombe (1998), Table II, method 10, as reproduced by the R package propint's tests
# (m-Py/propint, tests/testthat/test_Two_Dependent_Props_CI.R), and the Cavo et al. (2012) table of
# Fagerland, Lydersen & Laake's "Statistical Analysis of Contingency Tables" (R package
# contingencytables, Newcombe_square_and_add_CI_paired_2x2): four decimals.
@pytest.mark.parametrize("table,low,high", [
    ((36, 12, 2, 0), 0.0569, 0.3404),
    ((18, 12, 2, 18), 0.0562, 0.3290),
    ((53, 0, 0, 1), -0.0729, 0.0729),
    ((0, 30, 0, 0), 0.8395, 1.0),
    ((59, 6, 16, 80), -0.1186, -0.0046),
])
def test_published_examples(table, low, high):
    c = compare_paired_proportions(*outcomes(*table))
    assert c.difference == pytest.approx((table[1] - table[2]) / sum(table))
    assert c.ci.as_tuple() == pytest.approx((low, high), abs=5e-5)
    assert c.p_value == mcnemar_exact(*outcomes(*table)).p_value


def test_coverage_and_width_with_positively_correlated_outcomes():
    # p_a = 0.68, p_b = 0.50: 39 % both, 29 % A only, 11 % B only, 21 % neither (φ ≈ 0.21).
    # The unpaired interval ignores the correlation: it over-covers and is wider.
    rng = np.random.default_rng(20240601)
    truth, n, draws = 0.18, 100, 2000
    covered, paired_width, unpaired_width = 0, 0.0, 0.0
    for table in rng.multinomial(n, [0.39, 0.29, 0.11, 0.21], size=draws):
        both, a_only, b_only, _ = (int(x) for x in table)
        paired = compare_paired_proportions(*outcomes(*table)).ci
        unpaired = compare_proportions(both + a_only, n, both + b_only, n).ci
        covered += paired.contains(truth)
        paired_width += paired.high - paired.low
        unpaired_width += unpaired.high - unpaired.low
    assert 0.93 <= covered / draws <= 0.975
    assert paired_width < unpaired_width


@pytest.mark.parametrize("a", [np.random.default_rng(3).random(30) < 0.4, np.ones(12, bool), np.zeros(5, bool)])
def test_identical_outcomes_show_no_difference(a):
    c = compare_paired_proportions(a, a.copy())
    assert c.difference == 0.0 and c.ci.contains(0.0) and c.p_value == 1.0
    assert -1.0 <= c.ci.low <= c.ci.high <= 1.0


def test_bad_inputs_raise():
    with pytest.raises(EvaluationError, match="differ in length"):
        compare_paired_proportions([1, 0, 1], [1, 0])
    with pytest.raises(EvaluationError, match="binary"):
        compare_paired_proportions([1, 0.5, 1], [1, 0, 0])
    with pytest.raises(EvaluationError, match="binary"):
        compare_paired_proportions([1, 2], [1, 0])
    with pytest.raises(EvaluationError, match="1-D"):
        compare_paired_proportions([[1, 0]], [[1, 0]])
    with pytest.raises(EvaluationError, match="at least 1"):
        compare_paired_proportions([], [])
    with pytest.raises(EvaluationError, match="alpha"):
        compare_paired_proportions([1, 0], [0, 1], alpha=1.5)
    assert paired_table([True, True, False, False], [True, False, True, False]) == (1, 1, 1, 1)


# ------------------------------------------------------------------------------- the words
def first(k: int, n: int = 40) -> list[bool]:
    """Tasks 0..k-1 solved, the rest not: nested outcomes, as correlated as counts allow."""
    return [i < k for i in range(n)]


def test_compare_success_is_paired_only_with_outcomes():
    unpaired = compare_success("a", 10, 40, "b", 4, 40)
    paired = compare_success("a", 10, 40, "b", 4, 40, outcomes=(first(10), first(4)))
    ref = compare_paired_proportions(first(10), first(4)).ci
    assert paired.ci == pytest.approx(ref.as_tuple()) and paired.interval == "newcombe-paired"
    assert unpaired.interval == "newcombe-hybrid-score"
    # the same counts: positively correlated outcomes tell them apart, the unpaired interval does not
    assert (paired.reading, unpaired.reading) == ("better", "indistinguishable")
    # different n cannot pair: unchanged
    other = compare_success("a", 10, 40, "b", 4, 39, outcomes=(first(10), first(4, 39)))
    assert other == compare_success("a", 10, 40, "b", 4, 39)
    with pytest.raises(EvaluationError, match="disagree with the counts"):
        compare_success("a", 11, 40, "b", 4, 40, outcomes=(first(10), first(4)))


def test_success_sentence_pairs_only_names_with_outcomes():
    fed, rnd, warm = "the federated model", "random actions", "the warm start"
    counts = {fed: (10, 40), rnd: (4, 40), warm: (4, 40)}
    text = success_sentence(fed, counts, [rnd, warm], {fed: first(10), rnd: first(4)})
    assert "better than random actions (" in text
    assert "not distinguishable from the warm start (" in text and text.endswith(") at this n.")
    assert success_sentence(fed, counts, [rnd, warm]) == success_sentence(fed, counts, [rnd, warm], {})


# ------------------------------------------------------------------------------- the run report
def report(successes, *, goal=GOAL, planner="cem", recorded=True, order=None) -> EvalReport:
    """An EvalReport whose episode i (seed 100 + i) succeeded iff successes[i]."""
    n, k = len(successes), int(sum(bool(s) for s in successes))
    episodes = [dict(index=i, seed=100 + i, success=bool(s), steps=5, start_distance=50.0,
                     final_distance=5.0 if s else 40.0) for i, s in enumerate(successes)]
    if order is not None:
        episodes = [episodes[i] for i in order]
    return EvalReport(success_rate=k / n, n_episodes=n, n_successes=k, planning_samples=1, time_per_action_ms=1.0,
                      env_id="swm/TwoRoom-v1", goal_spec_hash=goal, seed=0, config_hash="cd" * 32,
                      checkpoint_hash="ef" * 32, planner=planner, episodes=episodes if recorded else None)


def test_paired_outcomes_need_recorded_episodes_on_the_same_tasks():
    a, b = report(first(10)), report(first(4), order=list(range(39, -1, -1)))
    assert paired_outcomes(a, b) == (tuple(first(10)), tuple(first(4)))  # paired by index, not record order
    assert paired_outcomes(a, report(first(4), recorded=False)) is None
    assert paired_outcomes(a, report(first(4), goal="12" * 32)) is None
    assert paired_outcomes(a, report(first(4, 39))) is None


def _evaluation(fed, warm, rnd, **kw) -> RunEvaluation:
    reports = {"federated": report(fed, **kw), "warmstart": report(warm, **kw),
               "random": report(rnd, planner="random", **kw)}
    return RunEvaluation(len(fed), reports, {a: Path(f"eval/{a}.json") for a in reports})


def test_a_run_report_with_paired_episodes_uses_the_paired_interval():
    cfg = load_config(["experiment=micro"])
    ev = _evaluation(first(10), first(4), first(1))
    rows = comparison_rows(COMPARISONS, ev.reports, ARM_LABEL)
    assert rows[0] == "| comparison | difference [95 % Newcombe, paired] | reading |"
    fed_warm = compare_paired_proportions(first(10), first(4)).ci
    assert rows[3] == (f"| {ARM_LABEL['federated']} − {ARM_LABEL['warmstart']} | +15.0 points "
                       f"[{100 * fed_warm.low:+.1f}, {100 * fed_warm.high:+.1f}] | better |")
    block = json.loads(json.dumps(evaluation_block(cfg, ev), allow_nan=False))
    for key, record in block["comparisons"].items():
        assert record["interval"] == "newcombe-paired", key
    assert block["comparisons"]["federated-vs-warmstart"]["ci"] == pytest.approx(fed_warm.as_tuple())
    assert block["comparisons"]["federated-vs-warmstart"]["reading"] == "better"
    assert "better than the warm start (+15 points" in answer_lines(cfg, {"rounds": []}, ev)[0]


def test_a_run_report_without_episodes_falls_back_to_the_unpaired_interval():
    cfg = load_config(["experiment=micro"])
    ev = _evaluation(first(10), first(4), first(1), recorded=False)
    assert comparison_rows(COMPARISONS, ev.reports, ARM_LABEL)[0] == (
        "| comparison | difference [95 % Newcombe, unpaired] | reading |")
    block = evaluation_block(cfg, ev)
    assert {r["interval"] for r in block["comparisons"].values()} == {"newcombe-hybrid-score"}
    assert block["comparisons"]["federated-vs-warmstart"]["reading"] == "indistinguishable"
    assert "not distinguishable from the warm start (" in answer_lines(cfg, {"rounds": []}, ev)[0]
    # one report without episodes: its comparisons are unpaired, each row says which
    mixed = dict(ev.reports, federated=report(first(10)), warmstart=report(first(4)))
    rows = comparison_rows(COMPARISONS, mixed, ARM_LABEL)
    assert rows[0] == "| comparison | difference [95 % Newcombe, paired or unpaired] | reading |"
    assert rows[2].count("(unpaired)") == 1 and rows[3].count("(paired)") == 1
