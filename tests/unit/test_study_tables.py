"""Known answers for the study report's derived tables (communication, sweep − ladder)."""

import pytest

from lensemble.study.tables import communication_rows, paired_vs_ladder


def _arm(bytes_per_round, rounds, success_by_seed):
    return {"curves": {"fed/comm_bytes": {"mean": [bytes_per_round] * rounds}},
            "success": {"mean": sum(success_by_seed.values()) / len(success_by_seed)},
            "per_seed": {s: {"success": v} for s, v in success_by_seed.items()}}


def _groups():
    budget = {"inner_steps": 50, "rounds": 4, "participants": 2, "participant_steps": 200}
    return {
        "ladder": {"default": {"key": None, "budget": budget,
                               "arms": {"naive": _arm(1000.0, 4, {"0": 0.5, "1": 0.7}), "central": {"per_seed": {}}},
                               "runs": {"naive": {"0": ["naive-s0"], "1": ["naive-s1"]}}}},
        "int8": {"True": {"key": "federation.quantize_int8",
                          "budget": budget, "arms": {"naive": _arm(250.0, 4, {"0": 0.4, "1": 0.5})},
                          "runs": {"naive": {"0": ["int8-True-naive-s0"], "1": ["int8-True-naive-s1"]}}}},
        "inner_steps": {"10": {"key": "federation.inner_steps",
                               "budget": {**budget, "inner_steps": 10, "rounds": 20},
                               "arms": {"naive": _arm(1000.0, 20, {"0": 0.6, "1": 0.8})}, "runs": {}}},
        "width": {"256": {"key": "model.embed_dim", "budget": budget,
                          "arms": {"naive": _arm(3000.0, 4, {"0": 0.5, "1": 0.7})}, "runs": {}}},
    }


def test_communication_rows_count_bytes_against_per_step_synchronisation():
    rows = {(r["group"], r["point"]): r for r in communication_rows(_groups())}
    lad = rows[("ladder", "default")]
    assert lad["total"] == 4000 and lad["per_step_sync"] == 200_000 and lad["reduction"] == 50
    assert lad["reduction_vs_float32"] == pytest.approx(50)
    i8 = rows[("int8", "True")]
    # int8 puts a quarter of the bytes on the wire: 4 × H against float32 per-step synchronisation
    assert i8["total"] == 1000 and i8["reduction_vs_float32"] == pytest.approx(200)
    h10 = rows[("inner_steps", "10")]
    assert h10["rounds"] == 20 and h10["total"] == 20_000 and h10["reduction_vs_float32"] == pytest.approx(10)
    # another model's payload is not comparable with the ladder's float32 payload
    assert rows[("width", "256")]["reduction_vs_float32"] is None
    assert rows[("width", "256")]["reduction"] == 50


def test_paired_vs_ladder_is_the_mean_per_seed_difference_with_a_t_interval():
    r = paired_vs_ladder(_groups(), "int8", "True", "naive")
    assert r["n"] == 2 and r["mean"] == pytest.approx(-0.15)
    # differences -0.1 and -0.2: sd 0.0707, t(0.975, 1) = 12.706 -> half-width 0.635
    assert r["ci"][0] == pytest.approx(-0.15 - 0.6353, abs=1e-3) and r["ci"][1] == pytest.approx(-0.15 + 0.6353, abs=1e-3)
    assert paired_vs_ladder(_groups(), "int8", "True", "anchor") is None


def test_achieved_precision_is_the_t_mde_of_the_observed_spread_and_the_2delta_bar():
    from scipy import stats

    from lensemble.study.tables import achieved_precision

    q = achieved_precision({"sd": 0.1, "n": 8, "ci": [-0.05, 0.12], "delta": 0.15}, alpha=0.0125, power=0.8)
    # noncentral t: at the MDE the registered test rejects with probability 0.8
    ncp = q["achieved_mde"] * 8 ** 0.5 / 0.1
    assert stats.nct.sf(stats.t.ppf(1 - 0.0125, 7), 7, ncp) == pytest.approx(0.8, abs=1e-6)
    assert q["ci_width"] == pytest.approx(0.17) and q["narrower_than_2delta"] is True
    wide = achieved_precision({"sd": 0.1, "n": 8, "ci": [-0.2, 0.2], "delta": 0.15}, alpha=0.0125, power=0.8)
    assert wide["narrower_than_2delta"] is False
    assert achieved_precision({"sd": None, "n": 1, "ci": None, "delta": 0.15}, alpha=0.05, power=0.8) == \
        {"achieved_mde": None, "ci_width": None, "narrower_than_2delta": None}


def test_episode_owners_follow_the_heldout_cycle_and_the_silos_homes():
    from lensemble.config import load_config
    from lensemble.eval.closed_loop import eval_factor_values, heldout_value_indices
    from lensemble.study.homes import episode_owners, split_by_owner

    cfg = load_config(["experiment=micro", "data.partition_factor=agent.region", "data.severity=1.0", "root_seed=3"])
    plan, seen = heldout_value_indices(cfg, cfg.env.id)
    owners = episode_owners(cfg, 6)
    values, _ = eval_factor_values(cfg, cfg.env.id, "heldout")
    for i, own in enumerate(owners):
        # episode i's factor value is the one the evaluation itself plays, and its owner holds it at home
        assert values[i % len(values)] == plan.factors(seen[i % len(seen)])
        assert len(own) == 1 and seen[i % len(seen)] in plan.home[own[0]]
    assert {o[0] for o in owners} == {0, 1}
    eps = [{"index": i, "success": i < 2} for i in range(6)]  # episodes 0 and 1 succeed: one per room
    split = split_by_owner(eps, owners, 2)
    assert split[owners[0][0]] == pytest.approx(1 / 3) and split[owners[1][0]] == pytest.approx(1 / 3)
    # severity 0: no silo owns a value at home, so nothing to split
    iid = load_config(["experiment=micro", "data.partition_factor=agent.region", "data.severity=0.0"])
    assert all(o == () for o in episode_owners(iid, 4))


def test_amendment_changes_name_the_leaf_that_changed():
    from lensemble.study.registry import diff_paths
    from lensemble.study.report import _amendment_changes

    old = [{"id": "C1", "delta": 10.0, "parts": [{"id": "a", "metric": "drift"}]}, {"id": "C2", "delta": 5.0}]
    new = [{"id": "C2", "delta": 5.0}, {"id": "C1", "delta": 10.0, "parts": [{"id": "a", "metric": "drift_sub"}]}]
    # Matched by id: the reordering is no change, the one edited field is the only leaf.
    assert diff_paths(old, new, "claims", into_lists=True) == [
        {"path": "claims[C1].parts[a].metric", "old": "drift", "new": "drift_sub"}]
    # As recorded in the registry (lists not descended), the same edit is one change of the list.
    assert diff_paths({"claims": old}, {"claims": new}) == [{"path": "claims", "old": old, "new": new}]
    # Lists of other lengths are one change; dicts descend; a missing key reads as None.
    assert diff_paths({"s": [0, 1, 2]}, {"s": [0, 1]}, "d", into_lists=True) == [
        {"path": "d.s", "old": [0, 1, 2], "new": [0, 1]}]
    assert diff_paths({"a": 1}, {"a": 1, "b": 2}, "x") == [{"path": "x.b", "old": None, "new": 2}]
    text = _amendment_changes([{"path": "claims", "old": old, "new": new}, {"path": "note", "old": "x" * 200, "new": "y"}])
    assert text.startswith("`claims[C1].parts[a].metric`: drift → drift_sub; `note`: ")
    assert "…" in text and len(text) < 300


def test_privacy_cost_reads_the_last_rounds_epsilon_and_the_points_mechanism():
    from lensemble.config import load_config
    from lensemble.study.report import _privacy_cost

    priv = load_config(["privacy=dp"]).privacy
    eps = {"mean": [1.5, 2.5, 3.25], "low": [1.0, 2.0, 3.0], "high": [2.0, 3.0, 3.5], "n": [2, 2, 2]}
    group = {"dp": {"key": "privacy", "arms": {"naive": {"curves": {"dp/epsilon": eps}}}}}
    (blank, line) = _privacy_cost(group)
    assert blank == ""
    assert "ε = 3.25 (range 3–3.5 over 2 seeds) after 3 rounds" in line
    assert f"δ = {priv.delta:g}" in line and f"σ = {priv.noise_multiplier:g}" in line
    # No DP: ε stays 0 (the coordinator logs 0 without a ledger) or is absent: no line.
    assert _privacy_cost({"x": {"key": "federation.inner_steps", "arms": {"naive": {"curves": {
        "dp/epsilon": {"mean": [0.0], "low": [0.0], "high": [0.0], "n": [2]}}}}}}) == []
    assert _privacy_cost({"x": {"key": "privacy", "arms": {"naive": {"curves": {}}}}}) == []


def test_numbers_that_cancel_print_as_zero():
    from lensemble.study.report import _num

    assert _num(0.34 - 0.32 - 0.02) == "0" and _num(-2.78e-17) == "0" and _num(1e-9) == "1e-09" and _num(0.1234) == "0.123"
