"""The opt-in study baselines of issue 32 on the `tiny` preset: the data-parallel twin, the
per-silo central control and naive FedAvg with the per-silo objective; ρ against the registered
reference (the twin) and the descriptive table against both references. Plans and synthetic
summaries only: nothing trains."""

import pytest
from study_synthetic import synthetic_study

from lensemble.errors import ConfigError
from lensemble.study.analysis import analyze
from lensemble.study.plan import estimate_seconds, plan_study
from lensemble.study.registry import build_registry
from lensemble.study.spec import load_study_spec

BASELINES = "baselines=[warmstart_only,central,twin,central_persilo,local,naive_silo]"
POOLED = "objective.sigreg_scope=pooled"  # micro's own objective is per-silo


def _spec(seeds=(0, 1), extra=(), run_overrides=(POOLED,)):
    return load_study_spec("tiny", [BASELINES, "registry.rho_reference=twin", "registry.min_seeds=3", *extra],
                           seeds=list(seeds), sweeps=[], run_overrides=list(run_overrides))


def test_each_baseline_gets_its_budget_and_objective():
    plan = plan_study(_spec())
    cfg = plan.configs
    b = plan.groups["ladder"]["default"]["budget"]
    per, c, batch = b["participant_steps"], b["participants"], b["batch_size"]
    assert (cfg["twin-s0"].train.steps, cfg["twin-s0"].train.batch_size) == (per, c * batch)
    assert (cfg["central-s0"].train.steps, cfg["central-s0"].train.batch_size) == (c * per, batch)
    persilo = cfg["central_persilo-s0"]
    assert persilo.train.steps == c * per and persilo.train.silo_batches
    assert (persilo.train.silo_statistics, persilo.objective.sigreg_scope, persilo.objective.bn_scope) == \
        ("both", "silo", "batch")
    assert cfg["naive_silo-s0"].gauge.rung == "naive" and cfg["naive_silo-s0"].objective.sigreg_scope == "silo"
    assert cfg["naive-s0"].objective.sigreg_scope == "pooled"
    assert {plan.runs[r].source for r in ("twin-s0", "central-s0", "central_persilo-s0")} == {"pooled"}
    # the twin's C x batch costs C x a step: its training costs what the centralized arm's C x steps cost
    kinds = estimate_seconds(_spec(), plan)["per_kind_seconds"]
    assert kinds["single:twin"] == kinds["single:central"] > 0


def test_with_the_per_silo_objective_already_the_base_naive_silo_is_naive_and_shares_its_run():
    plan = plan_study(_spec(run_overrides=()))
    arms = plan.groups["ladder"]["default"]["arms"]
    assert arms["naive_silo"]["0"] == arms["naive"]["0"]


def test_the_registry_names_the_twin_and_the_objective_comparison():
    spec = _spec()
    reg = build_registry(spec, plan_study(spec))
    c3 = next(c for c in reg["claims"] if c["id"] == "C3")
    assert c3["reference"] == "twin" and "S_twin" in c3["hypothesis"]
    obj = next(c for c in reg["ladder_comparisons"] if c["id"] == "L.objective.success")
    assert (obj["treatment"], obj["control"], obj["direction"]) == ("naive", "naive_silo", "increase")
    assert not any(c["id"].startswith("L.naive_silo") for c in reg["ladder_comparisons"])


def test_a_reference_that_is_not_a_baseline_is_refused():
    with pytest.raises(ConfigError, match="rho_reference"):
        load_study_spec("tiny", ["registry.rho_reference=twin"], sweeps=[])


def test_rho_is_decided_against_the_twin_and_described_against_both(tmp_path):
    # the anchored rung recovers 60 % of local -> twin, but only 40 % of local -> central (rates in 40ths)
    rates = {"warmstart_only": 0.2, "local": 0.2, "twin": 0.7, "central": 0.95, "central_persilo": 0.3,
             "naive_silo": 0.2, "naive": 0.5, "anchor": 0.5}
    def values(arm, seed):  # success, drift, effective dimension; a per-seed jitter of one episode in 40
        return rates[arm] + 0.025 * ((seed * 7) % 3 - 1), 10.0, 5.0

    out = analyze(synthetic_study(tmp_path, values, [BASELINES, "registry.rho_reference=twin"], run_overrides=[POOLED]))
    c3 = next(c for c in out["claims"] if c["id"] == "C3")
    assert c3["rho"]["reference"] == "twin" and c3["rho"]["rho"] == pytest.approx(0.6, abs=0.02)
    table = {(r["arm"], r["reference"]): r for r in out["rho_table"]}
    assert table[("anchor", "central")]["rho"] == pytest.approx(0.4, abs=0.02)
    assert table[("naive_silo", "twin")]["rho"] == pytest.approx(0.0, abs=0.02)
    obj = next(r for r in out["ladder_comparisons"] if r["id"] == "L.objective.success")
    assert obj["estimate"] == pytest.approx(0.3, abs=0.01)


def test_a_resume_on_other_data_refuses_and_names_the_library_difference(monkeypatch):
    from lensemble.study import datacheck

    plan = plan_study(_spec(seeds=(0,)))
    done_id = plan.warmstart[0]
    todo = [r for rid, r in plan.runs.items() if rid != done_id and r.seed == 0]
    done = {done_id: {"run_id": done_id, "probe_hash": "a" * 64, "library_versions": {"numpy": "0.0.1"}}}
    monkeypatch.setattr(datacheck, "ensure_data", lambda cfg, progress: (None, {"probe": {"content_hash": "b" * 64}}))
    with pytest.raises(ConfigError, match=r"bbbbbbbbbbbb… here.*aaaaaaaaaaaa….*numpy 0\.0\.1 then"):
        datacheck.check_data(plan, done, todo)
    monkeypatch.setattr(datacheck, "ensure_data", lambda cfg, progress: (None, {"probe": {"content_hash": "a" * 64}}))
    datacheck.check_data(plan, done, todo)                          # the same data: nothing to say
    datacheck.check_data(plan, {}, todo)                            # nothing finished: nothing to compare
