"""The study end to end on the `tiny` preset (micro config, 2 seeds, 2 silos, 2 rounds): plan,
registry before any run, runs, resume, amendments, analysis and report. Wiring only: the verdicts
of a micro study mean nothing, so no test looks at which verdict came out."""

import json
import re
import shutil

import pytest
import yaml
from study_synthetic import synthetic_study

from lensemble.cli import study_command
from lensemble.data.residency import mark_silo_folder
from lensemble.errors import ConfigError, ResidencyViolation
from lensemble.study import runner
from lensemble.study.analysis import analyze
from lensemble.study.files import write_summary
from lensemble.study.plan import expand_sweep, normalize_overrides, overrides_from_config, plan_study
from lensemble.study.report import FIGURES
from lensemble.study.spec import load_study_spec

VERDICTS = ("confirmed", "falsified", "inconclusive")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    kw = dict(name="tiny", out=root / "results", scratch=root / "scratch", progress=False)
    ov = [f"data.root={root / 'data'}"]
    planned = study_command(ov, plan_only=True, **kw)
    study_dir = root / "results" / "tiny"
    assert (study_dir / "registry.yaml").exists() and (study_dir / "plan.json").exists()
    assert not list((study_dir / "runs").glob("*.json")) if (study_dir / "runs").exists() else True
    assert planned.executed == 0 and planned.report is None

    seen = []
    real_run = runner._Runner.run

    def spy(self, run):
        # The registry is on disk, unchanged, before the first run starts.
        if not seen:
            reg = yaml.safe_load((study_dir / "registry.yaml").read_text())
            seen.append(reg["registry_hash"])
        return real_run(self, run)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner._Runner, "run", spy)
        result = study_command(ov, **kw)
    assert seen, "no run was executed"
    return {"root": root, "kw": kw, "ov": ov, "dir": study_dir, "result": result, "first_hash": seen[0]}


def _claims_rows(md: str) -> dict[str, str]:
    rows = {}
    for line in md.splitlines():
        m = re.match(r"\| (C[1-4]) .*?\| \*\*(\w+)\*\* \|", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_full_study_runs_every_planned_run_once(tiny):
    r, d = tiny["result"], tiny["dir"]
    plan = json.loads((d / "plan.json").read_text())
    assert r.failed == {}
    assert r.executed == r.planned == len(plan["runs"])
    assert sorted(p.stem for p in (d / "runs").glob("*.json")) == sorted(plan["runs"])
    # The severity sweep's value 1.0 is the ladder's own setting: those runs are shared, not redone.
    sev = plan["groups"]["severity"]["1.0"]["arms"]
    assert sev["anchor"]["0"] == ["anchor-s0"] and sev["central"]["1"] == ["central-s1"]
    # Summaries are small, hold hashes and metrics; the only checkpoints in docs/results are the kept
    # warm starts (public data; lensemble/study/warmstarts.py), and no data lives there.
    s = json.loads((d / "runs" / "anchor-s0.json").read_text())
    for key in ("config_hash", "manifest_hash", "checkpoint_hash", "warmstart_hash", "probe_hash", "spec_hash"):
        assert isinstance(s[key], str) and len(s[key]) == 64, key
    assert len(s["rounds"]) == 2 and "gauge/global_effective_dim" in s["rounds"][-1]
    assert 0.0 <= s["eval"]["success_rate"] <= 1.0 and s["eval"]["n_episodes"] == 2
    weights = sorted(p.relative_to(d).parts[:2] for p in d.rglob("*.safetensors"))
    assert weights == [("warmstarts", "warmstart")] and not list(d.rglob("*.npz")), weights
    # The code commit comes from the run's own manifest (40 hex digits, "+dirty" when edited).
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", s["git_sha"]), s["git_sha"]
    # Every episode is recorded, and every arm of a seed played the same ones (one goal spec).
    eps = s["eval"]["episodes"]
    assert len(eps) == 2 and all(e["route_valid"] in (True, False) for e in eps)
    naive = json.loads((d / "runs" / "naive-s0.json").read_text())["eval"]
    assert naive["goal_spec_hash"] == s["eval"]["goal_spec_hash"]
    assert [(e["index"], e["seed"]) for e in naive["episodes"]] == [(e["index"], e["seed"]) for e in eps]
    assert s["probe_split"]["num_landmarks"] + s["probe_split"]["num_measurement"] == s["probe_split"]["num_probe"]
    # The warm start records its own step count; the warm-start-only arm trains nothing.
    warm = json.loads((d / "runs" / "warmstart.json").read_text())
    assert warm["steps"]["warmstart_steps"] == 60
    wso = json.loads((d / "runs" / "warmstart_only-s1.json").read_text())
    assert wso["kind"] == "evaluate" and wso["steps"]["train_steps"] == 0
    assert wso["checkpoint_hash"] == warm["checkpoint_hash"] and wso["eval"]["n_episodes"] == 2
    # Every arm of seed 0 started from the one study-level warm start.
    ws = json.loads((d / "runs" / "warmstart.json").read_text())["checkpoint_hash"]
    for rid in ("anchor-s0", "naive-s1", "central-s0", "local-silo1-s1"):
        assert json.loads((d / "runs" / f"{rid}.json").read_text())["warmstart_hash"] == ws


def test_registry_fields(tiny):
    reg = yaml.safe_load((tiny["dir"] / "registry.yaml").read_text())
    assert reg["registry_hash"] == tiny["first_hash"] and reg["amendments"] == []
    assert [c["id"] for c in reg["claims"]] == ["C1", "C2", "C3", "C4"]
    for comp in reg["claims"][0]["components"] + reg["claims"][1]["components"]:
        for key in ("metric", "treatment", "control", "direction", "delta", "mde"):
            assert key in comp, key
    assert reg["claims"][2]["threshold"] == 0.5
    pw = reg["analysis"]["power_analysis"]
    assert pw["n_seeds"] == 2 and "t test" in pw["test"]
    # Before any run, per Holm family: can it confirm, and is it powered at its δ at the planned size?
    fams = pw["families"]
    assert set(fams) == {"confirmatory", "ladder"} and fams["confirmatory"]["size"] == 4
    assert fams["ladder"]["size"] == len(reg["ladder_comparisons"])
    for f in fams.values():
        assert f["can_confirm"] is True and f["powered_at_delta"] == []   # 2 seeds: no power at δ
        assert f["first_holm_threshold"] == pytest.approx(0.05 / f["size"])
    assert pw["components"]["success"]["power_at_delta_first_holm_step"] < 0.8
    # budget: total — the centralized arm takes the federation's total optimizer steps.
    budget = reg["design"]["step_budget"]
    assert budget["participant_steps"] == 6 and budget["central_steps"] == 12 == 2 * 6
    assert "federation's total" in budget["statement"] and "warmstart_only" in reg["design"]["arms"]
    assert "data.root" not in " ".join(reg["design"]["base_overrides"])


def test_report_structure(tiny):
    d = tiny["dir"]
    md = (d / "report.md").read_text()
    rows = _claims_rows(md)
    assert sorted(rows) == ["C1", "C2", "C3", "C4"]
    assert all(v in VERDICTS for v in rows.values())
    html = (d / "report.html").read_text()
    assert "<table>" in html and html.count("<img") >= 6
    for label in rows.values():
        assert f"<strong>{label}</strong>" in html
    for name in FIGURES + ("sweep_severity.png",):
        path = d / "figures" / name
        assert path.exists() and path.stat().st_size > 1000, name
        assert f"figures/{name}" in md
    analysis = json.loads((d / "analysis.json").read_text())
    assert {c["id"]: c["label"] for c in analysis["claims"]} == rows
    assert analysis["status"]["complete"] and analysis["status"]["done"] == tiny["result"].planned
    assert [r["value"] for r in analysis["sweeps"]["severity"]] == ["0.0", "1.0"]
    # Provenance: one code commit and one warm start for every run, and both named in the report.
    prov = analysis["provenance"]
    assert sum(prov["git_sha"].values()) == tiny["result"].planned
    ws = json.loads((d / "runs" / "warmstart.json").read_text())["checkpoint_hash"]
    assert prov["warmstart_hash"] == {ws: tiny["result"].planned - 1}
    assert f"| warm start | `{ws}` |" in md and "| code commit |" in md


def test_rerun_skips_finished_runs_and_resumes_missing_ones(tiny, monkeypatch):
    again = study_command(tiny["ov"], **tiny["kw"])
    assert again.executed == 0 and again.skipped == again.planned
    # Lose two summaries; one run then crashes: it is recorded as failed, not as done.
    d = tiny["dir"]
    for rid in ("naive-s1", "lambda_anc-3.0-anchor-s0"):
        (d / "runs" / f"{rid}.json").unlink()
    real = runner._Runner._execute

    def flaky(self, run):
        if run.run_id == "naive-s1":
            raise RuntimeError("injected failure")
        return real(self, run)

    monkeypatch.setattr(runner._Runner, "_execute", flaky)
    partial = study_command(tiny["ov"], **tiny["kw"])
    assert partial.executed == 1 and list(partial.failed) == ["naive-s1"]
    assert (d / "runs" / "naive-s1.failed.json").exists()
    assert not partial.analysis["status"]["complete"]
    assert "partial" in (d / "report.md").read_text()
    monkeypatch.setattr(runner._Runner, "_execute", real)
    done = study_command(tiny["ov"], jobs=2, **tiny["kw"])  # the retry runs in a worker process
    assert done.executed == 1 and done.failed == {} and done.analysis["status"]["complete"]
    assert not (d / "runs" / "naive-s1.failed.json").exists()


def test_changed_settings_of_finished_runs_are_refused(tiny):
    with pytest.raises(ConfigError, match="other settings"):
        study_command(tiny["ov"] + ["train.lr=0.002"], **tiny["kw"])


def test_registry_change_after_runs_needs_an_amendment(tiny, tmp_path):
    out = tmp_path / "results"
    shutil.copytree(tiny["dir"], out / "tiny")
    kw = {**tiny["kw"], "out": out}
    change = ["study.registry.rho_threshold=0.6"]
    with pytest.raises(ConfigError, match="amend"):
        study_command(tiny["ov"] + change, **kw)
    res = study_command(tiny["ov"] + change, amend="threshold fixed from the pilot's severity curve", **kw)
    assert res.executed == 0
    reg = yaml.safe_load((out / "tiny" / "registry.yaml").read_text())
    (amendment,) = reg["amendments"]
    assert amendment["reason"].startswith("threshold fixed") and amendment["runs_done"] == res.planned
    assert amendment["previous_hash"] == tiny["first_hash"] != amendment["new_hash"] == reg["registry_hash"]
    assert {"path": "analysis.rho_threshold", "old": 0.5, "new": 0.6} in amendment["changes"]
    assert reg["registered_at"] == yaml.safe_load((tiny["dir"] / "registry.yaml").read_text())["registered_at"]
    c3 = next(c for c in res.analysis["claims"] if c["id"] == "C3")
    assert c3["rho"]["threshold"] == 0.6
    assert "Amendments to the registry" in (out / "tiny" / "report.md").read_text()


def test_report_rebuilds_from_committed_files_alone(tiny, tmp_path):
    d = tmp_path / "results" / "tiny"
    shutil.copytree(tiny["dir"], d)
    for p in [d / "report.md", d / "report.html", d / "analysis.json", *d.glob("figures/*")]:
        p.unlink()
    res = study_command([], name="tiny", out=tmp_path / "results", scratch=tmp_path / "no-scratch",
                           progress=False, report_only=True)
    assert res.executed == 0 and not (tmp_path / "no-scratch").exists()
    old = json.loads((tiny["dir"] / "analysis.json").read_text())
    assert {c["id"]: c["label"] for c in res.analysis["claims"]} == {c["id"]: c["label"] for c in old["claims"]}
    assert (d / "report.html").exists() and all((d / "figures" / n).exists() for n in FIGURES)


def test_study_files_never_land_in_a_silo_folder(tiny, tmp_path):
    """Summaries, the analysis and the report are shared files: none may be written inside a
    silo's private folder (guard_export), and a refused write leaves nothing behind."""
    silo = tmp_path / "silo_0"
    mark_silo_folder(silo, 0)
    with pytest.raises(ResidencyViolation):
        write_summary(silo / "tiny", "naive-s0", {"run_id": "naive-s0"})
    assert not (silo / "tiny").exists()
    shutil.copytree(tiny["dir"], silo / "tiny")
    (silo / "tiny" / "analysis.json").unlink()
    with pytest.raises(ResidencyViolation):
        study_command([], name="tiny", out=silo, progress=False, report_only=True)
    assert not (silo / "tiny" / "analysis.json").exists()


# ------------------------------------------------------------------- planning only (no runs)
def test_a_partition_by_embodiment_on_another_env_registers():
    """Issue 35: a study whose silos own Reacher's upper-arm densities plans runs on Reacher, each
    run's config split by that factor (the env group's own colour split overridden)."""
    from lensemble.config import load_config

    spec = load_study_spec("reacher")
    plan = plan_study(spec)
    assert set(plan.groups["ladder"]["default"]["arms"]) == {"warmstart_only", "central", "twin", "local",
                                                             "naive", "anchor"}
    for run in plan.runs.values():
        cfg = load_config(list(run.overrides))
        assert cfg.env.id == "swm/ReacherDMControl-v0" and cfg.data.partition_factor == "agent.arm_density"


def test_cpu_preset_plan_shares_runs_across_cells():
    spec = load_study_spec("cpu")
    plan = plan_study(spec)
    ladder = plan.groups["ladder"]["default"]
    assert set(ladder["arms"]) == {"central", "local", "naive", "sketch", "backstop", "anchor", "distill", "fork_a"}
    budget = ladder["budget"]
    assert budget["central_steps"] == budget["local_steps"] == budget["rounds"] * budget["inner_steps"]
    fork = plan.runs[ladder["arms"]["fork_a"][str(spec.seeds[0])][0]]
    assert "model.encoder_frozen=true" in fork.overrides and "gauge=naive" in fork.overrides
    for group in plan.groups.values():
        for point in group.values():
            for arm, per_seed in point["arms"].items():
                for ids in per_seed.values():
                    assert all(i in plan.runs for i in ids)
                    if arm == "local":
                        assert len(ids) == point["budget"]["participants"]
    # An H sweep that keeps rounds × H fixed needs no new baselines: they are the ladder's.
    if "inner_steps" in plan.groups:
        for point in plan.groups["inner_steps"].values():
            assert point["budget"]["participant_steps"] == budget["participant_steps"]
            if "central" in point["arms"]:
                assert point["arms"]["central"] == ladder["arms"]["central"]
    # Every seed of a run is one of the study's, and every id is unique and file-safe.
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", rid) for rid in plan.runs)


def test_overrides_from_config_round_trip(micro_cfg):
    from lensemble.config import load_config

    again = load_config(overrides_from_config(micro_cfg))
    assert again.config_hash() == micro_cfg.config_hash()
    anchored = load_config(overrides_from_config(micro_cfg) + ["gauge=anchor"])
    assert anchored.gauge.anchor == "A" and anchored.gauge.anchor_landmarks == micro_cfg.gauge.anchor_landmarks


def test_sweep_overrides_use_hydra_multirun_syntax():
    assert expand_sweep("gauge.lambda_anc=0.1,1,10") == ("gauge.lambda_anc", ["0.1", "1", "10"])
    assert expand_sweep("data.severity=range(0,1.01,0.5)") == ("data.severity", ["0.0", "0.5", "1.0"])
    assert normalize_overrides(["b=1", "a=2", "b=3"]) == ["a=2", "b=3"]
    with pytest.raises(ConfigError):
        load_study_spec("tiny", ["rungs=[naive,bogus]"])


# ------------------------------------------------------------------- the decision rules, on synthetic summaries
def test_decisions_confirm_clear_effects_and_falsify_absent_ones(tmp_path):
    table = {"central": (0.5, None, 20.0), "local": (0.1, None, 18.0), "naive": (0.1, 60.0, 3.0),
             "warmstart_only": (0.1, None, 18.0),
             "anchor": (0.45, 5.0, 19.0)}

    def clear(arm, seed):
        s, drift, dim = table[arm]
        jitter = 0.01 * ((seed * 7) % 5 - 2)
        return s + jitter, (drift or 0.0) * (1 + jitter), dim + 10 * jitter

    labels = {c["id"]: c for c in analyze(synthetic_study(tmp_path / "a", clear))["claims"]}
    assert labels["C1"]["label"] == "confirmed" and labels["C2"]["label"] == "confirmed"
    assert labels["C3"]["label"] == "confirmed" and 0.5 < labels["C3"]["rho"]["rho"] < 1.0
    assert labels["C4"]["label"] == "inconclusive"  # no sweep ran
    # Holm over the four components of C1 and C2; the claim's p is its components' largest.
    c2 = labels["C2"]["components"][0]
    assert c2["p_adjusted"] <= 0.05 and labels["C2"]["p_adjusted"] == c2["p_adjusted"]
    c1 = labels["C1"]["components"]
    assert labels["C1"]["p_adjusted"] == max(r["p_adjusted"] for r in c1)
    assert all(r["pairing"] == "seed" for r in c1 if r["metric"] == "success")   # no episodes recorded

    def no_anchor_effect(arm, seed):
        s, drift, dim = clear(arm, seed)
        if arm == "anchor":
            s, drift = clear("local", seed)[0], clear("naive", seed)[1] + 0.5 * (seed % 2 - 0.5)
        return s, drift, dim

    labels = {c["id"]: c for c in analyze(synthetic_study(tmp_path / "b", no_anchor_effect))["claims"]}
    assert labels["C2"]["label"] == "falsified"          # anchored drift no lower than naive
    assert labels["C3"]["label"] in ("falsified", "inconclusive")
    assert labels["C3"]["rho"]["rho"] is None or labels["C3"]["rho"]["rho_ci"][1] < 0.5
    for c in labels.values():                             # never confirmed against its own interval
        for comp in c.get("components", []):
            if comp["label"] == "confirmed":
                lo, hi = comp["ci"]
                assert (lo > 0) if comp["direction"] == "increase" else (hi < 0)


def _with_episodes(d, n=40):
    """Rewrite the synthetic summaries with per-episode records: seed s's episodes are shared by
    every arm (one goal spec), episode e succeeds when e < the arm's success count (so arms are
    strongly correlated episode by episode, as real arms are)."""
    for path in (d / "runs").glob("*.json"):
        summary = json.loads(path.read_text())
        ev = summary.get("eval")
        if not ev:
            continue
        k = ev["n_successes"]
        ev["goal_spec_hash"] = f"{summary['seed']:064d}"
        ev["episodes"] = [{"index": e, "seed": 1000 * summary["seed"] + e, "success": e < k, "steps": 10,
                           "start_distance": 90.0, "final_distance": 5.0 if e < k else 50.0, "route_valid": True}
                          for e in range(n)]
        path.write_text(json.dumps(summary))


def _anchor_degenerate(arm, seed, drift):
    """The anchored arm's full rotation unidentifiable in every round (recorded as absent), its
    subspace angle measured; naive's both measured. Round 1 of seed 0's anchor lacks even that."""
    out = []
    for t, f in enumerate((0.5, 1.0)):
        r = {"round": t, "gauge/drift_subspace_angle_deg": drift * f / 4}
        if arm == "anchor":
            r["gauge/drift_degenerate"] = 1
            if seed == 0 and t == 1:
                del r["gauge/drift_subspace_angle_deg"]
        else:
            r["gauge/drift_angle_deg"] = drift * f
        out.append(r)
    return out


def _clear(arm, seed):
    s, drift, dim = {"central": (0.5, None, 20.0), "local": (0.1, None, 18.0), "naive": (0.1, 60.0, 3.0),
                     "warmstart_only": (0.1, None, 18.0), "anchor": (0.45, 5.0, 19.0)}[arm]
    jitter = 0.01 * ((seed * 7) % 5 - 2)
    return s + jitter, (drift or 0.0) * (1 + jitter), dim + 10 * jitter


def test_drift_claims_measure_the_registered_drift_metric(tmp_path):
    full = {c["id"]: c for c in analyze(synthetic_study(tmp_path / "full", _clear, rounds=_anchor_degenerate))["claims"]}
    # The full-rotation angle is unmeasured on the anchored arm: no drift claim can be decided.
    assert full["C2"]["label"] == "inconclusive" and full["C2"]["components"][0]["metric"] == "drift_mean"
    d = synthetic_study(tmp_path / "sub", _clear, ["registry.drift_metric=subspace"], rounds=_anchor_degenerate)
    reg = yaml.safe_load((d / "registry.yaml").read_text())
    c2 = next(c for c in reg["claims"] if c["id"] == "C2")
    assert c2["components"][0]["metric"] == "drift_subspace_mean" and "principal subspace" in c2["hypothesis"]
    assert "subspace" in c2["components"][0]["metric_definition"]
    sub = {c["id"]: c for c in analyze(d)["claims"]}
    # Seed 0's anchor has a round without a value: its mean is unmeasured, five seeds decide.
    assert sub["C2"]["components"][0]["n"] == 5 and sub["C2"]["label"] == "confirmed"
    assert sub["C1"]["components"][0]["metric"] == "drift_subspace_final"


def _replay_record(run_id, value, *, equal=True, rnd=1):
    return {"run_id": run_id, "verified": equal, "replayed_rounds": [
        {"round": rnd, "metrics": {"gauge/drift_subspace_angle_deg": value, "gauge/drift_angle_deg": 999.0},
         "state_bitwise_equal": {"silo-0": equal, "silo-1": True}, "global_hash_equal": None,
         "recorded_max_abs_diff": 0.0}]}


def test_remeasured_rounds_fill_missing_values_only_when_verified(tmp_path):
    d = synthetic_study(tmp_path / "sub", _clear, ["registry.drift_metric=subspace"], rounds=_anchor_degenerate)
    anchor0 = next(p.stem for p in (d / "runs").glob("anchor*s0*.json"))
    (d / "remeasured").mkdir()
    # A replay whose state did not reproduce is ignored: the value stays missing.
    (d / "remeasured" / f"{anchor0}.json").write_text(json.dumps(_replay_record(anchor0, 1.5, equal=False)))
    a = analyze(d)
    assert a["remeasured"] == {} and next(c for c in a["claims"] if c["id"] == "C2")["components"][0]["n"] == 5
    (d / "remeasured" / f"{anchor0}.json").write_text(json.dumps(_replay_record(anchor0, 1.5)))
    a = analyze(d)
    assert a["remeasured"] == {anchor0: [1]} and any("re-measured by replaying" in n for n in a["notes"])
    assert next(c for c in a["claims"] if c["id"] == "C2")["components"][0]["n"] == 6
    # A round the run kept no state for counts when the replay committed the saved global model.
    rec = _replay_record(anchor0, 1.5)
    rec["replayed_rounds"][0].update(state_bitwise_equal={"silo-0": None, "silo-1": None})
    (d / "remeasured" / f"{anchor0}.json").write_text(json.dumps(rec))
    assert analyze(d)["remeasured"] == {}
    rec["replayed_rounds"][0]["global_hash_equal"] = True
    (d / "remeasured" / f"{anchor0}.json").write_text(json.dumps(rec))
    assert analyze(d)["remeasured"] == {anchor0: [1]}
    # A recorded value is never replaced: the replay's full angle fills only where none was recorded.
    naive0 = next(p.stem for p in (d / "runs").glob("naive*s0*.json"))
    (d / "remeasured" / f"{naive0}.json").write_text(json.dumps(_replay_record(naive0, 123.0)))
    assert analyze(d)["remeasured"] == {anchor0: [1]}
    from lensemble.study.analysis import fill_remeasured
    from lensemble.study.files import load_remeasured, load_summaries
    filled, _ = fill_remeasured(load_summaries(d), load_remeasured(d))
    assert filled[anchor0]["rounds"][1]["gauge/drift_angle_deg"] == 999.0  # absent before: filled
    assert filled[naive0]["rounds"][1]["gauge/drift_subspace_angle_deg"] != 123.0


def test_old_summaries_fall_back_to_seed_pairing_and_say_so(tmp_path):
    def flat(arm, seed):
        return 0.3 + 0.01 * (seed % 3), 40.0 + seed, 10.0 + 0.1 * seed

    d = synthetic_study(tmp_path / "old", flat)
    a = analyze(d)
    assert a["pairing"]["seed"] > 0 and a["pairing"]["episode"] == 0
    assert any("per-episode records" in n for n in a["notes"])
    assert any("per-episode outcomes" in x for x in a["superseded"])
    _with_episodes(d)
    b = analyze(d)
    assert b["pairing"]["seed"] == 0 and b["pairing"]["episode"] > 0
    assert not any("per-episode outcomes" in x for x in b["superseded"])
    row = next(r for r in b["ladder_comparisons"] if r["metric"] == "success")
    assert row["pairing"] == "episode" and row["n_episode_pairs"] == 6 * 40
    assert row["hierarchical_ci"][0] <= row["estimate"] <= row["hierarchical_ci"][1]
    # Episode pairing reproduces the per-seed rate difference exactly.
    old = next(r for r in a["ladder_comparisons"] if r["id"] == row["id"])
    assert row["estimate"] == pytest.approx(old["estimate"]) and row["p_value"] == pytest.approx(old["p_value"])
    v = row["variance"]
    assert v["per_seed_difference"] == pytest.approx(row["sd"] ** 2) and v["between_seed"] >= 0


def test_region_preset_plan_keeps_data_and_gives_a_wider_model_its_own_warm_start():
    spec = load_study_spec("region")
    plan = plan_study(spec)
    ladder = plan.groups["ladder"]["default"]
    assert ladder["budget"]["central_steps"] == 2 * ladder["budget"]["local_steps"] == 400
    # C = 4 over two rooms: four local models, each on half the episodes of a C = 2 silo
    four = plan.groups["participants"]["4"]
    assert len(four["arms"]["local"]["0"]) == 4
    cfg4 = plan.configs[four["arms"]["naive"]["0"][0]]
    cfg2 = plan.configs[ladder["arms"]["naive"]["0"][0]]
    assert cfg4.data.num_silos * cfg4.data.episodes_per_silo == cfg2.data.num_silos * cfg2.data.episodes_per_silo
    for seed, ids in plan.groups["participants"]["2"]["arms"]["naive"].items():
        assert ids == ladder["arms"]["naive"][seed]  # C = 2 is the ladder's own setting: shared runs
    # the wider encoder cannot load the study's warm start: its runs start from their own
    wide = plan.groups["width"]["256"]
    for per_seed in wide["arms"].values():
        for seed, ids in per_seed.items():
            for rid in ids:
                ws = plan.warmstart_of(plan.runs[rid])
                assert ws != plan.warmstart[int(seed)]
                assert plan.runs[ws].kind == "warmstart"
                assert plan.configs[ws].model.embed_dim == 256 == plan.configs[rid].model.embed_dim
    # and only the point's own seeds get one (the width point runs 3 of the 8 seeds)
    assert sorted(r for r in plan.runs if r.startswith("width-256-warmstart")) == \
        [f"width-256-warmstart-s{s}" for s in spec.sweeps["width"].seeds]
    # every other sweep point shares the seed's warm start (all arms of a seed start together)
    for rid, run in plan.runs.items():
        if run.kind != "warmstart" and not rid.startswith("width-"):
            assert plan.warmstart_of(run) == plan.warmstart[run.seed]
    # the severity points below 1 share nothing with the ladder but the warm start
    assert plan.groups["severity"]["1.0"]["arms"]["anchor"]["0"] == ladder["arms"]["anchor"]["0"]
    assert plan.groups["severity"]["0.5"]["arms"]["anchor"]["0"] != ladder["arms"]["anchor"]["0"]


def test_sweep_step_factor_scales_only_that_sweeps_training_seconds():
    from lensemble.study.plan import estimate_seconds

    spec = load_study_spec("region")
    plan = plan_study(spec)
    plain = spec.model_copy(update={"cost_model": spec.cost_model.model_copy(update={"sweep_step_factor": {}})})
    a, b = estimate_seconds(spec, plan)["per_group_hours"], estimate_seconds(plain, plan)["per_group_hours"]
    assert {k for k in a if a[k] != b[k]} == {"width"}
    cm = spec.cost_model
    evals = sum(1 for r in plan.runs.values() if r.cells and r.cells[0].startswith("width/") and r.kind != "warmstart")
    eval_h = evals * (plan.configs[next(iter(plan.runs))].eval.episodes * cm.episode + cm.ladder) / 3600
    # (a - eval) = 2.5 (b - eval): the factor multiplies training, never evaluation
    assert a["width"] - eval_h == pytest.approx(2.5 * (b["width"] - eval_h), abs=0.02)


def test_per_seed_warm_starts_train_in_the_worker_pool(tmp_path):
    # jobs=2 trains the two seeds' warm starts side by side in workers, then every arm of a seed
    # starts from its own seed's warm start.
    kw = dict(name="tiny-ws", preset="tiny", out=tmp_path / "results", scratch=tmp_path / "scratch", progress=False)
    ov = [f"data.root={tmp_path / 'data'}", "study.warmstart=seed", "study.baselines=[warmstart_only]",
          "study.rungs=[naive]"]
    res = study_command(ov, sweeps=["none"], jobs=2, **kw)
    assert res.failed == {} and res.analysis["status"]["complete"]
    runs = res.study_dir / "runs"
    warm = {s: json.loads((runs / f"warmstart-s{s}.json").read_text())["checkpoint_hash"] for s in (0, 1)}
    assert warm[0] != warm[1]
    for s in (0, 1):
        for rid in (f"warmstart_only-s{s}", f"naive-s{s}"):
            assert json.loads((runs / f"{rid}.json").read_text())["warmstart_hash"] == warm[s]


def test_first_moves_named_groups_ahead_without_touching_the_plan():
    spec = load_study_spec("region")
    plan = plan_study(spec)
    todo = [r for r in plan.runs.values() if r.kind != "warmstart"]
    ordered = runner._prioritised(todo, plan, ["dp", "severity"])
    assert sorted(r.run_id for r in ordered) == sorted(r.run_id for r in todo)  # a reordering only
    groups = [{c.split("/", 1)[0] for c in r.cells} for r in ordered]
    n_dp = sum("dp" in g for g in groups)
    assert n_dp and all("dp" in g for g in groups[:n_dp])
    # severity next, including its 1.0 point (shared with the ladder: it ranks by its listed group)
    n_sev = sum("severity" in g and "dp" not in g for g in groups)
    assert all("severity" in g for g in groups[n_dp:n_dp + n_sev])
    rest = ordered[n_dp + n_sev:]
    assert rest == [r for r in todo if r in rest]  # plan order otherwise
    assert runner._prioritised(todo, plan, []) == todo
    with pytest.raises(ConfigError, match="does not plan"):
        runner._prioritised(todo, plan, ["severty"])


def test_warm_starts_are_kept_in_the_study_folder(tiny):
    summaries = {p.stem: json.loads(p.read_text()) for p in (tiny["dir"] / "runs").glob("*.json")
                 if not p.name.endswith(".failed.json")}
    warm = {k: v for k, v in summaries.items() if v["kind"] == "warmstart"}
    assert warm
    for run_id, s in warm.items():
        header = json.loads((tiny["dir"] / "warmstarts" / run_id / "header.json").read_text())
        assert header["content_hash"] == s["checkpoint_hash"]


def test_a_stopped_study_runs_nothing_more_and_its_report_says_why(tiny, tmp_path):
    out = tmp_path / "results"
    shutil.copytree(tiny["dir"], out / "tiny")
    kw = {**tiny["kw"], "out": out, "scratch": tmp_path / "no-scratch"}
    gone = next(p for p in sorted((out / "tiny" / "runs").glob("*.json"))
                if json.loads(p.read_text())["kind"] != "warmstart")
    gone.unlink()  # a planned run that is not done
    reason = "study.stopped='Its inputs were lost with the machine.'"
    with pytest.raises(ConfigError, match="amend"):  # stopping a registered study is an amendment
        study_command(tiny["ov"] + [reason], **kw)
    res = study_command(tiny["ov"] + [reason], amend="the inputs of the last runs are lost", **kw)
    assert res.executed == 0 and not gone.exists() and not (tmp_path / "no-scratch").exists()
    reg = yaml.safe_load((out / "tiny" / "registry.yaml").read_text())
    assert reg["stopped"] == "Its inputs were lost with the machine."
    md = (out / "tiny" / "report.md").read_text()
    assert f"**stopped** at {res.planned - 1} of {res.planned} runs" in md
    assert "Its inputs were lost with the machine." in md and "rerun the same command" not in md
    assert "stopped" not in yaml.safe_load((tiny["dir"] / "registry.yaml").read_text())  # unset: no key
