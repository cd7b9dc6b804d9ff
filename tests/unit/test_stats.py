"""Statistics against worked answers (hand calculations and scipy)."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from lensemble.errors import EvaluationError
from lensemble.eval import stats

P7 = [0.001, 0.008, 0.02, 0.04, 0.06, 0.10, 0.20]


def test_holm_rejects_exactly_first_two():
    res = stats.holm(P7, alpha=0.05)
    assert res.reject == (True, True, False, False, False, False, False)
    # (m - i + 1)·p_(i) with a running max: 7·0.001, 6·0.008, 5·0.02, 4·0.04 ...
    assert res.adjusted[:4] == pytest.approx([0.007, 0.048, 0.10, 0.16])
    assert all(a <= 1.0 for a in res.adjusted)


def test_holm_keeps_input_order_and_is_monotone():
    shuffled = [P7[i] for i in (3, 0, 6, 1, 2, 5, 4)]
    res = stats.holm(shuffled)
    assert res.reject == (False, True, False, True, False, False, False)
    order = np.argsort(shuffled)
    assert np.all(np.diff(np.array(res.adjusted)[order]) >= 0)


def test_wilson_25_of_50_by_hand():
    z = sps.norm.ppf(0.975)
    n, p = 50, 0.5
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    ci = stats.wilson_interval(25, 50)
    assert (ci.low, ci.high) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert (ci.low, ci.high) == pytest.approx((0.3664, 0.6336), abs=1e-4)
    scipy_ci = sps.binomtest(25, 50).proportion_ci(method="wilson")
    assert (ci.low, ci.high) == pytest.approx((scipy_ci.low, scipy_ci.high), abs=1e-10)


def test_wilson_zero_of_ten():
    ci = stats.wilson_interval(0, 10)
    z2 = sps.norm.ppf(0.975) ** 2
    assert ci.low == 0.0
    assert ci.high == pytest.approx(z2 / (10 + z2), abs=1e-12)  # closed form at k = 0
    assert ci.high == pytest.approx(0.2775, abs=1e-4)


def test_rate_checks():
    with pytest.raises(EvaluationError):
        stats.wilson_interval(11, 10)
    with pytest.raises(EvaluationError):
        stats.wilson_interval(1, 0)


def test_mde_matches_design_note():
    # "At ~25 % success, 50 episodes give ±6 points of standard error": sqrt(0.25·0.75/50) ≈ 0.061.
    mde = stats.mde_two_proportions(0.25, 50, alpha=0.05, power=0.8)
    # The simple form (z_a + z_b)·sqrt(2)·SE is 0.243; the pooled/unpooled solution is a bit larger.
    assert 0.22 < mde < 0.30
    assert stats.mde_two_proportions(0.25, 200) < mde  # more episodes, smaller MDE


def test_mde_paired():
    z = sps.norm.ppf(0.975) + sps.norm.ppf(0.8)
    assert stats.mde_paired(0.1, 10) == pytest.approx(z * 0.1 / math.sqrt(10))
    assert stats.mde_paired(0.1, 5, distribution="t") > stats.mde_paired(0.1, 5)
    n = stats.units_for_paired(0.1, 0.1)
    assert n == math.ceil((z * 0.1 / 0.1) ** 2)


def test_bootstrap_coverage_on_normal_sample():
    rng = np.random.default_rng(123)
    hits = {"bca": 0, "percentile": 0}
    trials = 150
    for t in range(trials):
        x = rng.normal(2.0, 1.0, size=30)
        for method in hits:
            _, ci = stats.bootstrap_ci(x, n_boot=1000, seed=t, method=method)
            hits[method] += ci.contains(2.0)
    for method, h in hits.items():
        assert 0.86 <= h / trials <= 0.99, (method, h / trials)


def test_bootstrap_is_seeded():
    x = np.random.default_rng(0).normal(size=12)
    a = stats.bootstrap_ci(x, n_boot=500, seed=7)
    b = stats.bootstrap_ci(x, n_boot=500, seed=7)
    c = stats.bootstrap_ci(x, n_boot=500, seed=8)
    assert a == b and a != c


def test_paired_difference_detects_shift_and_null():
    rng = np.random.default_rng(5)
    base = rng.normal(0.3, 0.1, size=12)
    res = stats.paired_difference(base + 0.05 + rng.normal(0, 0.01, 12), base, n_boot=2000)
    assert res.ci.low > 0 and res.ci.contains(res.estimate)
    assert res.p_value < 0.01 and res.n == 12
    noise = rng.normal(0, 0.01, 6)
    null = stats.paired_difference(base + np.concatenate([noise, -noise]), base, n_boot=2000)
    assert null.estimate == pytest.approx(0.0, abs=1e-12)
    assert null.ci.low < 0 < null.ci.high and null.p_value > 0.5


def test_permutation_test():
    d = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    # Exact: only the all-positive flip reaches the observed mean on each side -> 2/32.
    assert stats.paired_permutation_pvalue(d) == pytest.approx(2 / 32)
    assert stats.paired_permutation_pvalue(d, alternative="greater") == pytest.approx(1 / 32)
    big = np.random.default_rng(1).normal(0.0, 1.0, 40)
    p = stats.paired_permutation_pvalue(big, n_perm=2000, seed=3)
    assert 0 < p <= 1 and p == stats.paired_permutation_pvalue(big, n_perm=2000, seed=3)


def test_compare_proportions():
    res = stats.compare_proportions(20, 50, 10, 50)
    assert res.difference == pytest.approx(0.2)
    assert res.ci.low > 0 and res.ci.contains(0.2)
    # Pooled z by hand.
    pooled = 30 / 100
    z = 0.2 / math.sqrt(pooled * 0.7 * (2 / 50))
    assert res.p_value == pytest.approx(2 * sps.norm.sf(z))
    same = stats.compare_proportions(0, 10, 0, 10)
    assert same.p_value == 1.0 and same.ci.low < 0 < same.ci.high
    fisher = stats.compare_proportions(9, 10, 1, 10, test="fisher")
    assert fisher.p_value == pytest.approx(sps.fisher_exact([[9, 1], [1, 9]]).pvalue)


@pytest.mark.parametrize(
    "est,ci,delta,direction,label",
    [
        (0.10, (0.05, 0.15), 0.08, "increase", "confirmed"),
        (0.10, (0.05, 0.15), 0.20, "increase", "falsified"),  # whole CI below δ
        (-0.05, (-0.10, -0.01), 0.05, "increase", "falsified"),  # wrong direction
        (0.10, (-0.02, 0.22), 0.08, "increase", "inconclusive"),  # CI contains 0
        (0.05, (0.01, 0.12), 0.08, "increase", "inconclusive"),  # > 0 but estimate short of δ
        (-0.10, (-0.15, -0.05), 0.08, "decrease", "confirmed"),
        (0.10, (0.05, 0.15), 0.08, "decrease", "falsified"),
        (0.01, (-0.02, 0.03), 0.05, "increase", "falsified"),  # δ excluded even though 0 is not
    ],
)
def test_verdict_rule(est, ci, delta, direction, label):
    assert stats.verdict(est, ci, delta=delta, direction=direction).label == label


def test_verdict_never_confirms_against_the_interval():
    # A large estimate is not enough when the interval reaches 0, nor when a p-value fails.
    assert stats.verdict(0.5, (0.0, 1.0), delta=0.1).label == "inconclusive"
    assert stats.verdict(0.2, (0.05, 0.3), delta=0.1, p_value=0.2).label == "inconclusive"
    with pytest.raises(EvaluationError):
        stats.verdict(0.1, (0.2, 0.0), delta=0.1)
    with pytest.raises(EvaluationError):
        stats.verdict(0.1, (0.0, 0.2), delta=-0.1)
    with pytest.raises(EvaluationError):
        stats.verdict(float("nan"), (0.0, 0.2), delta=0.1)


# ---------------------------------------------------------------- the registered paired t tests
def test_paired_t_test_matches_scipy_and_tests_against_delta():
    d = np.array([0.10, 0.20, 0.05, 0.30, 0.15, 0.12])
    t = stats.paired_t_test(d, delta=0.1, direction="increase")
    ref = sps.ttest_1samp(d, 0.0, alternative="greater")
    assert t.p_confirm == pytest.approx(ref.pvalue, rel=1e-12)
    # Falsification: H0 "mean >= δ" against "mean < δ".
    assert t.p_falsify == pytest.approx(sps.ttest_1samp(d, 0.1, alternative="less").pvalue, rel=1e-12)
    lo, hi = sps.t.interval(0.95, 5, loc=d.mean(), scale=sps.sem(d))
    assert (t.ci.low, t.ci.high) == pytest.approx((lo, hi))
    # "decrease" mirrors it exactly.
    m = stats.paired_t_test(-d, delta=0.1, direction="decrease")
    assert (m.p_confirm, m.p_falsify) == pytest.approx((t.p_confirm, t.p_falsify))
    two = stats.paired_t_test(d, delta=0.1, two_sided=True)
    assert two.p_confirm == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue, rel=1e-12)
    # Zero spread: a common difference on the tested side is certain, elsewhere not.
    flat = stats.paired_t_test(np.full(4, 0.05), delta=0.1)
    assert flat.p_confirm == 0.0 and flat.p_falsify == 0.0
    with pytest.raises(EvaluationError):
        stats.paired_t_test([0.1], delta=0.1)


def test_t_test_holds_its_level_confirming_and_falsifying():
    # A known answer by simulation: at n = 6, the one-sided t rejects a true null 5 % of the time.
    rng = np.random.default_rng(0)
    null = rng.normal(0.0, 20.0, size=(4000, 6))
    at_delta = rng.normal(10.0, 20.0, size=(4000, 6))
    conf = np.mean([stats.paired_t_test(x, delta=10.0).p_confirm <= 0.05 for x in null])
    fals = np.mean([stats.paired_t_test(x, delta=10.0).p_falsify <= 0.05 for x in at_delta])
    assert abs(conf - 0.05) < 0.012 and abs(fals - 0.05) < 0.012


@pytest.mark.parametrize("p_confirm, p_falsify, estimate, label", [
    (0.001, 1.0, 0.5, "confirmed"),
    (0.001, 1.0, 0.05, "inconclusive"),     # significant but short of δ, δ not ruled out
    (0.6, 0.001, 0.01, "falsified"),
    (0.3, 0.3, 0.05, "inconclusive"),
])
def test_test_verdict(p_confirm, p_falsify, estimate, label):
    v = stats.test_verdict(estimate, (estimate - 0.1, estimate + 0.1), delta=0.1, direction="increase",
                           p_confirm=p_confirm, p_falsify=p_falsify)
    assert v.label == label


def test_hierarchical_bootstrap_and_stratified_permutation():
    rng = np.random.default_rng(1)
    # Constant episode differences: no spread, a point interval.
    est, ci, se = stats.hierarchical_bootstrap([np.full(5, 0.2), np.full(5, 0.2)], n_boot=500)
    assert est == pytest.approx(0.2) and (ci.low, ci.high) == pytest.approx((0.2, 0.2)) and se == pytest.approx(0.0)
    per_seed = [rng.choice([-1.0, 0.0, 0.0, 1.0], 20) for _ in range(6)]
    est, ci, se = stats.hierarchical_bootstrap(per_seed, n_boot=4000, seed=0)
    assert est == pytest.approx(np.mean([a.mean() for a in per_seed]))
    assert ci.low < est < ci.high and se > 0
    # Its variance is the seed-level one plus the episode resampling (roughly (n-1)/n·S²/n + mean within/n).
    means = np.array([a.mean() for a in per_seed])
    within = np.mean([a.var() / a.size for a in per_seed])
    expected = math.sqrt(((means.var()) + within) / len(per_seed))
    assert se == pytest.approx(expected, rel=0.1)
    # Stratified episode-level sign flips: all episodes +1 is as extreme as it gets.
    p = stats.stratified_permutation_pvalue([np.ones(8), np.ones(8)], n_perm=999, seed=0)
    assert p == pytest.approx(1 / 1000)
    p_null = stats.stratified_permutation_pvalue(per_seed, n_perm=4000, seed=0)
    assert 0.0 < p_null <= 1.0


def test_mcnemar_exact_by_hand():
    # 6 tasks only A solves, 1 only B, 3 both, 2 neither: p = P(|X - 3.5| >= 2.5), X ~ Bin(7, 1/2)
    a = [1] * 6 + [0] + [1] * 3 + [0] * 2
    b = [0] * 6 + [1] + [1] * 3 + [0] * 2
    r = stats.mcnemar_exact(a, b)
    assert (r.a_only, r.b_only) == (6, 1)
    assert r.p_value == pytest.approx(2 * (1 + 7) / 2**7)
    # one-sided: P(X >= 6) = 8 / 128; the concordant pairs change nothing
    assert stats.mcnemar_exact(a + [1, 1, 0], b + [1, 1, 0], alternative="greater").p_value == pytest.approx(8 / 128)
    assert stats.mcnemar_exact([True, False], [True, False]).p_value == 1.0  # no discordant pair


def test_mcnemar_exact_rejects_bad_input():
    with pytest.raises(EvaluationError):
        stats.mcnemar_exact([1, 0, 1], [1, 0])
    with pytest.raises(EvaluationError):
        stats.mcnemar_exact([0.5, 1.0], [1.0, 0.0])
