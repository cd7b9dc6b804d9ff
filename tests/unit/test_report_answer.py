"""The words of a run report follow from its numbers: the success rule, and the drift and
communication sentences."""

import re

import pytest

from lensemble.eval.stats import compare_proportions, wilson_interval
from lensemble.report.answer import (
    communication_sentence,
    compare_success,
    drift_sentence,
    format_bytes,
    rate_text,
    reading_of,
    smallest_resolvable_difference,
    success_sentence,
)

FED, RND, WARM = "the federated model", "random actions", "the warm start"


def test_reading_rule():
    assert reading_of((0.01, 0.4)) == "better"
    assert reading_of((-0.4, -0.01)) == "worse"
    assert reading_of((-0.1, 0.3)) == reading_of((0.0, 0.3)) == reading_of((-0.3, 0.0)) == "indistinguishable"


@pytest.mark.parametrize("n", [2, 5, 20])
def test_every_count_pair_is_read_from_the_newcombe_interval(n):
    for ka in range(n + 1):
        for kb in range(n + 1):
            c = compare_success("a", ka, n, "b", kb, n)
            ref = compare_proportions(ka, n, kb, n).ci
            assert c.ci == pytest.approx((ref.low, ref.high))
            expected = "better" if ref.low > 0 else "worse" if ref.high < 0 else "indistinguishable"
            assert c.reading == expected
            if ka == kb:
                assert c.reading == "indistinguishable"


def test_the_briefs_example():
    text = success_sentence(FED, {FED: (6, 20), RND: (2, 20), WARM: (5, 20)}, [RND, WARM])
    assert text == ("The federated model planned 6/20 = 30 % [15, 52] against 2/20 for random actions and "
                    "5/20 for the warm start: not distinguishable from random actions (+20 points [-5, +43]) or "
                    "from the warm start (+5 points [-22, +31]) at this n.")


def test_better_and_worse_are_said_only_when_the_interval_excludes_zero():
    n = 20
    for kf in range(0, n + 1, 3):
        for kr in range(0, n + 1, 4):
            for kw in range(0, n + 1, 5):
                text = success_sentence(FED, {FED: (kf, n), RND: (kr, n), WARM: (kw, n)}, [RND, WARM])
                assert text.startswith(f"The federated model planned {rate_text(kf, n)} against {kr}/{n} for "
                                       f"random actions and {kw}/{n} for the warm start: ")
                for floor, k in ((RND, kr), (WARM, kw)):
                    reading = compare_success(FED, kf, n, floor, k, n).reading
                    said_better = f"better than {floor} (" in text
                    said_worse = f"worse than {floor} (" in text
                    said_same = re.search(rf"not distinguishable from (.* or from )?{floor}", text) is not None
                    assert (said_better, said_worse, said_same) == (
                        reading == "better", reading == "worse", reading == "indistinguishable"), text


def test_a_clear_win_names_the_difference():
    text = success_sentence(FED, {FED: (15, 20), RND: (2, 20), WARM: (5, 20)}, [RND, WARM])
    assert "better than random actions (+65 points [+35, +81])" in text
    assert "better than the warm start (+50 points" in text and "not distinguishable" not in text


def test_rate_text_is_the_wilson_interval():
    ci = wilson_interval(6, 20)
    assert rate_text(6, 20) == f"6/20 = 30 % [{100 * ci.low:.0f}, {100 * ci.high:.0f}]"
    assert rate_text(0, 2) == "0/2 = 0 % [0, 66]"


def test_smallest_resolvable_difference_shrinks_with_n():
    d20, d60 = smallest_resolvable_difference(20), smallest_resolvable_difference(60)
    assert 0 < d60 < d20 <= 1
    k = round(0.25 * 20)
    assert compare_success("a", k + round(d20 * 20), 20, "b", k, 20).reading == "better"
    assert compare_success("a", k + round(d20 * 20) - 1, 20, "b", k, 20).reading == "indistinguishable"


def test_drift_sentence_leads_with_the_variance_weighted_measures():
    rounds = [{"round": 0, "gauge/drift_angle_deg": 422.3, "gauge/drift_subspace_angle_deg": 29.51,
               "gauge/drift_rotation_share": 0.228, "gauge/angle_to_warmstart_deg": 425.6},
              {"round": 1, "gauge/drift_angle_deg": 529.6, "gauge/drift_subspace_angle_deg": 36.78,
               "gauge/drift_rotation_share": 0.5568, "gauge/angle_to_warmstart_deg": 577.1}]
    assert drift_sentence(rounds) == (
        "Frame drift of the participants from the global model, within the global model's 95 %-energy subspace "
        "of the public probe: 29.5° after round 1, 36.8° after round 2. After round 2 a rotation explained 56 % of "
        "the participants' disagreement with the global model. The full-space geodesic angle, which also counts "
        "the directions the embeddings barely use, is in the report's drift tables.")
    # the full-space numbers (hundreds of degrees) are not in the answer
    assert "422" not in drift_sentence(rounds) and "577" not in drift_sentence(rounds)
    many = [{"round": t, "gauge/drift_subspace_angle_deg": float(10 * t)} for t in range(8)]
    text = drift_sentence(many)
    assert "0.0° after round 1, 70.0° after round 8 (largest 70.0°, round 8)" in text
    assert "full-space" not in text and "rotation explained" not in text
    partly = drift_sentence([{"round": 0}, {"round": 1, "gauge/drift_subspace_angle_deg": 5.0}])
    assert "5.0° after round 2; 1 round(s) could not be measured." in partly


def test_drift_sentence_without_identifiable_frames_or_weighted_measures():
    degenerate = drift_sentence([{"round": 0, "gauge/drift_degenerate": 1}])
    assert "not identifiable" in degenerate and "°" not in degenerate
    masked = drift_sentence([{"round": 0, "gauge/drift_degenerate": 1, "gauge/drift_subspace_angle_deg": 4.31}])
    assert "subspace of the public probe: 4.3° after round 1" in masked
    assert "In 1 round(s) the full rotation was not identifiable" in masked
    # a run recorded before the variance-weighted measures: the full-space angle, labelled as such
    old = drift_sentence([{"round": 0, "gauge/drift_degenerate": 1}, {"round": 1, "gauge/drift_angle_deg": 5.0}])
    assert old == ("Frame drift of the participants from the global model (full-space geodesic angle on the public "
                   "probe; this run recorded no variance-weighted measure): 5.0° after round 2; 1 round(s) had "
                   "frames too degenerate to measure.")


def test_communication_sentence():
    rounds = [{"fed/comm_bytes": 19911680}] * 3
    text = communication_sentence(rounds, 50)
    assert text == ("Communication: 19.9 MB per round on the wire (3 rounds, 59.7 MB in all); synchronising "
                    "after each of the H = 50 inner steps would have sent 50× as much (995.6 MB per round).")
    assert format_bytes(999) == "999 B" and format_bytes(669952) == "670.0 KB" and format_bytes(2e12) == "2.0 TB"
    assert "no round recorded" in communication_sentence([{}], 3)


def test_communication_sentence_says_what_a_secure_coordinator_held():
    rounds = [{"fed/comm_bytes": 977156, "fed/secagg_participants": n, "fed/secagg_mean_error_bound": 9.5367e-7}
              for n in (3, 2)]
    text = communication_sentence(rounds, 3)
    assert text.endswith("Secure aggregation (Flower SecAgg+): the coordinator held only the sum of 2–3 updates "
                         "per round; its quantisation adds < 9.5e-07 per coordinate of the mean.")
