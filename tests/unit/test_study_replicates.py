"""Training replicates in the study (issue 44): the batch-stream label, the plan, the three-level
bootstrap and its known answer, the replicate spread and the power model that uses it."""

import json
import math

import numpy as np
import pytest

from lensemble.config.loader import load_config
from lensemble.config.seeds import batch_labels, derive
from lensemble.errors import ConfigError
from lensemble.study import power as pw
from lensemble.study.analysis import analyze, paired_comparison
from lensemble.study.plan import plan_study
from lensemble.study.registry import build_registry, load_registry, sync_registry
from lensemble.study.replicates import nested_bootstrap
from lensemble.study.report import replicate_lines
from lensemble.study.rho import rho_claim, simulated_rho_outcomes
from lensemble.study.spec import load_study_spec


# ------------------------------------------------------------------------------------ the run
def test_a_replicate_changes_the_batch_stream_and_nothing_else_and_replicate_0_is_the_run_of_before():
    assert batch_labels(0) == ()
    assert derive(3, "batches", *batch_labels(0), "pooled") == derive(3, "batches", "pooled")
    assert derive(3, "batches", *batch_labels(1), "pooled") != derive(3, "batches", "pooled")
    assert derive(3, "batches", *batch_labels(1), "pooled") != derive(3, "batches", *batch_labels(2), "pooled")
    with pytest.raises(TypeError):
        batch_labels(-1)
    base = load_config(["experiment=micro"])
    zero = load_config(["experiment=micro", "train.replicate=0"])
    one = load_config(["experiment=micro", "train.replicate=1"])
    assert "replicate" not in base.model_dump()["train"]          # left out of the dump at 0
    assert zero.config_hash() == base.config_hash() != one.config_hash()
    with pytest.raises(ConfigError):
        load_config(["experiment=micro", "train.replicate=-1"])


# ------------------------------------------------------------------------------------ the plan
def test_replicate_0_is_the_plan_without_replicates_and_replicate_r_adds_only_its_batch_order():
    plain = plan_study(load_study_spec("tiny", sweeps=[]))
    spec = load_study_spec("tiny", ["replicates=3"], sweeps=[])
    reps = plan_study(spec)
    for rid, run in plain.runs.items():                        # every run of before, unchanged
        assert reps.runs[rid].spec_hash == run.spec_hash and reps.runs[rid].overrides == run.overrides
    new = {rid: r for rid, r in reps.runs.items() if rid not in plain.runs}
    assert {r.kind for r in new.values()} == {"single", "federated"}       # no new warm start, no new eval-only run
    for rid, run in new.items():
        base = rid.rsplit("-r", 1)[0]
        r = int(rid.rsplit("-r", 1)[1])
        assert r in (1, 2) and run.overrides == sorted(plain.runs[base].overrides + [f"train.replicate={r}"])
        assert reps.warmstart_of(run) == plain.warmstart_of(plain.runs[base])
        assert reps.configs[rid].train.replicate == r
    cell = reps.groups["ladder"]["default"]
    assert cell["arms"] == plain.groups["ladder"]["default"]["arms"]       # replicate 0
    assert cell["replicates"]["naive"]["0"] == [["naive-s0"], ["naive-s0-r1"], ["naive-s0-r2"]]
    assert cell["replicates"]["local"]["1"][2] == ["local-silo0-s1-r2", "local-silo1-s1-r2"]
    assert cell["replicates"]["warmstart_only"]["0"] == [["warmstart_only-s0"]]   # trains nothing: one
    assert "replicates" not in plain.groups["ladder"]["default"]
    reg = build_registry(spec, reps)
    assert reg["design"]["replicates"]["per_seed_and_arm"] == 3
    assert reg["analysis"]["power_analysis"]["n_replicates"] == 3
    assert "replicates" not in build_registry(load_study_spec("tiny", sweeps=[]), plain)["design"]
    with pytest.raises(ConfigError, match="study's replicates"):
        plan_study(load_study_spec("tiny", sweeps=[], run_overrides=["train.replicate=1"]))


# ---------------------------------------------------------------------- the known answer
# A simulated study whose truth is known: arm means fed 0.53, local 0.35, reference 0.65 (ρ = 0.6,
# fed − local = 0.18). Seed s lifts every arm by u_s ~ N(0, 0.05) and each arm by v ~ N(0, 0.08)
# (arm × seed); each training replicate adds w ~ N(0, 0.08); task k of the seed adds t ~ N(0, 0.1)
# to every run (shared); the outcome is Bernoulli. 8 seeds, 3 replicates, 50 tasks.
TRUTH = {"fed": 0.53, "local": 0.35, "ref": 0.65}
RHO, DIFF = (0.53 - 0.35) / (0.65 - 0.35), 0.53 - 0.35


def _simulated_study(rng, seeds=8, replicates=3, tasks=50, sd_seed=0.08, sd_replicate=0.08, sd_task=0.1):
    base = np.array([TRUTH["fed"], TRUTH["local"], TRUTH["ref"]])[None, :, None, None]
    p = (base + rng.normal(0, 0.05, (seeds, 1, 1, 1)) + rng.normal(0, sd_seed, (seeds, 3, 1, 1))
         + rng.normal(0, sd_replicate, (seeds, 3, replicates, 1)) + rng.normal(0, sd_task, (seeds, 1, 1, tasks)))
    return (rng.random((seeds, 3, replicates, tasks)) < np.clip(p, 0, 1)).astype(float)  # (seed, arm, rep, task)


def _per_seed(y, arm):
    """The analysis' per-seed values of one arm (replicate means, the replicates under "replicates")."""
    out = {}
    for s in range(y.shape[0]):
        reps = [{"success": float(r.mean()), "goal_spec_hash": f"g{s}",
                 "episodes": {(k, k): float(x) for k, x in enumerate(r)}} for r in y[s, arm]]
        out[s] = {"success": float(y[s, arm].mean()), "goal_spec_hash": f"g{s}", "replicates": reps,
                  "episodes": {(k, k): float(x) for k, x in enumerate(y[s, arm].mean(0))}}
    return out


def _task_only(y, rng, n_boot):
    """The naive interval: one training run per seed (replicate 0), the seeds fixed, only the
    tasks resampled (shared by the arms): it cannot see the seed or replicate spread."""
    seeds, _, _, tasks = y.shape
    idx = rng.integers(0, tasks, (n_boot, seeds, tasks))
    b = np.stack([y[s, :, 0][:, idx[:, s]].mean(-1) for s in range(seeds)]).mean(0).T   # (n_boot, arm)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (b[:, 0] - b[:, 1]) / (b[:, 2] - b[:, 1])
    return np.quantile(rho, [0.025, 0.975]), np.quantile(b[:, 0] - b[:, 1], [0.025, 0.975])


def test_the_hierarchical_interval_covers_the_true_rho_and_difference_at_the_stated_rate_and_tasks_alone_do_not():
    rng = np.random.default_rng(44)
    studies, n_boot = 200, 400
    hits = {"rho": 0, "diff": 0, "rho_tasks_only": 0, "diff_tasks_only": 0}
    for _ in range(studies):
        y = _simulated_study(rng)
        fed, local, ref = (_per_seed(y, a) for a in range(3))
        rho = rho_claim(fed, local, ref, threshold=0.5, alpha=0.05, n_boot=n_boot)
        assert rho["interval_method"].startswith("hierarchical bootstrap (seeds, replicates, paired episodes)")
        hits["rho"] += rho["defined"] and rho["rho_ci"][0] <= RHO <= rho["rho_ci"][1]
        diff = paired_comparison(fed, local, "success", "increase", delta=0.1, n_boot=n_boot, alternative="one-sided")
        hits["diff"] += diff["hierarchical_ci"][0] <= DIFF <= diff["hierarchical_ci"][1]
        (rlo, rhi), (dlo, dhi) = _task_only(y, rng, n_boot)
        hits["rho_tasks_only"] += rlo <= RHO <= rhi
        hits["diff_tasks_only"] += dlo <= DIFF <= dhi
    cover = {k: v / studies for k, v in hits.items()}
    tol = 3 * math.sqrt(0.95 * 0.05 / studies)                  # 3 binomial SEs: ±0.046
    assert abs(cover["rho"] - 0.95) <= tol and abs(cover["diff"] - 0.95) <= tol, cover
    # one run per seed and a bootstrap over tasks: about 2 in 3, far below the stated 95 %
    assert cover["rho_tasks_only"] < 0.8 and cover["diff_tasks_only"] < 0.8, cover


def test_one_replicate_per_seed_keeps_the_interval_of_before():
    rng = np.random.default_rng(0)
    y = _simulated_study(rng, seeds=5, replicates=1)
    fed, local, ref = (_per_seed(y, a) for a in range(3))
    plain = [{s: {k: v for k, v in d[s].items() if k != "replicates"} for s in d} for d in (fed, local, ref)]
    a = rho_claim(*plain, threshold=0.5, alpha=0.05, n_boot=500)
    b = rho_claim(fed, local, ref, threshold=0.5, alpha=0.05, n_boot=500)    # one replicate: the same path
    assert a == b and "interval_method" not in a
    c = paired_comparison(plain[0], plain[1], "success", "increase", delta=0.1, n_boot=500, alternative="one-sided")
    d = paired_comparison(fed, local, "success", "increase", delta=0.1, n_boot=500, alternative="one-sided")
    assert c == d and "hierarchical_levels" not in c


def test_nested_bootstrap_without_spread_is_a_point_and_refuses_ragged_seeds():
    units = [[np.full((2, 4), 0.5), np.full((3, 4), 0.25)] for _ in range(3)]
    boot = nested_bootstrap(units, n_boot=200, seed=0)
    assert boot.shape == (200, 2) and np.allclose(boot, [0.5, 0.25])
    with pytest.raises(Exception, match="same tasks"):
        nested_bootstrap([[np.ones((2, 4)), np.ones((2, 3))]] * 2, n_boot=200)


# ------------------------------------------------------------------ the spread and the power
def test_replicate_spread_recovers_a_known_between_replicate_sd():
    rng = np.random.default_rng(1)
    got = []
    for _ in range(100):
        p = np.clip(0.5 + 0.1 * rng.standard_normal((10, 1)) + 0.06 * rng.standard_normal((10, 3)), 0, 1)
        y = rng.random((10, 3, 100)) < p[..., None]
        rates = y.mean(-1)
        got.append(pw.replicate_spread(rates, rates * (1 - rates) / 100))
    assert abs(np.mean([g["sd_moments"] ** 2 for g in got]) - 0.06 ** 2) < 0.0006   # seed spread removed
    assert all(g["df"] == 20 and g["sd_raw_upper80"] > g["sd_raw"] for g in got)
    assert math.isnan(pw.replicate_spread([[0.5], [0.4]], [[0.01], [0.01]])["sd_raw"])  # no replicates


def test_power_uses_the_replicate_spread_and_replicates_buy_power():
    kw = dict(n_seeds=5, n_episodes=50, baseline=0.4, sd_train=0.03, episode_correlation=0.3, alpha=0.05, reps=1000)
    before = pw.simulated_success_power(0.1, **kw)
    assert pw.success_sd(0.4, 50, 0.03, 0.3, replicates=1, sd_replicate=None) == pw.success_sd(0.4, 50, 0.03, 0.3)
    one = pw.simulated_success_power(0.1, **kw, replicates=1, sd_replicate=0.08)
    three = pw.simulated_success_power(0.1, **kw, replicates=3, sd_replicate=0.08)
    # a replicate spread the one-run model did not count costs power (0.65 -> 0.38); 3 replicates win it back (0.64)
    assert one < before - 0.15 and three > one + 0.15
    # the simulated per-seed difference has the planning formula's SD
    d = pw.simulate_success_replicated(np.random.default_rng(0), 4000, 4, 50, baseline=0.4, effect=0.1,
                                       sd_train=0.03, sd_replicate=0.08, replicates=3, episode_correlation=0.3)
    assert d.std() == pytest.approx(pw.success_sd(0.4, 50, 0.03, 0.3, replicates=3, sd_replicate=0.08), rel=0.08)
    assert d.mean() == pytest.approx(0.1, abs=0.01)


def test_claim_3_simulation_with_replicates_uses_the_replicate_analysis():
    kw = dict(local=0.4, reference=0.7, fed=0.4 + 0.9 * 0.3, n_seeds=6, n_episodes=50, sd_seed=0.05, sd_train=0.03,
              threshold=0.5, reps=30, n_boot=300)
    out = simulated_rho_outcomes(**kw, replicates=2, sd_replicate=0.05)
    assert out["replicates"] == 2 and out["confirmed"] >= 0.8
    assert "replicates" not in simulated_rho_outcomes(**kw)          # the one-run model of before


# ------------------------------------------------------------------- the analysis, end to end
def test_a_study_with_replicates_analyses_replicate_means_with_the_hierarchical_intervals(tmp_path):
    spec = load_study_spec("tiny", ["registry.min_seeds=3", "replicates=2"], seeds=list(range(6)), sweeps=[])
    plan = plan_study(spec)
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "plan.json").write_text(json.dumps(plan.to_json()))
    sync_registry(d, build_registry(spec, plan), runs_done=0)
    (d / "runs").mkdir()
    rate = {"central": 0.6, "local": 0.2, "naive": 0.3, "anchor": 0.5, "warmstart_only": 0.15}
    rng = np.random.default_rng(0)
    for rid, run in plan.runs.items():
        summary = {"run_id": rid, "kind": run.kind, "arm": run.arm, "seed": run.seed, "spec_hash": run.spec_hash,
                   "seconds": {"train": 1.0, "eval": 1.0}}
        if run.kind != "warmstart":
            outcomes = rng.random(40) < rate[run.arm] + 0.05 * (run.seed % 3)
            summary["eval"] = {"success_rate": float(outcomes.mean()), "n_successes": int(outcomes.sum()),
                               "n_episodes": 40, "effective_dim": 10.0, "latent_std": 1.0,
                               "goal_spec_hash": f"{run.seed:064d}",
                               "episodes": [{"index": e, "seed": e, "success": bool(o)} for e, o in enumerate(outcomes)]}
            if run.kind == "federated":
                summary["rounds"] = [{"gauge/drift_angle_deg": 10.0}]
        (d / "runs" / f"{rid}.json").write_text(json.dumps(summary))
    out = analyze(d, write=False)
    cell = out["groups"]["ladder"]["default"]
    naive = cell["arms"]["naive"]
    runs = {rid: json.loads((d / "runs" / f"{rid}.json").read_text()) for rid in ("naive-s0", "naive-s0-r1")}
    assert naive["per_seed"]["0"]["success"] == pytest.approx(np.mean([r["eval"]["success_rate"] for r in runs.values()]))
    assert naive["replicates"]["n"]["0"] == 2 and naive["replicates"]["spread"]["df"] == 6
    assert cell["replicate_runs"]["naive"]["0"] == [["naive-s0"], ["naive-s0-r1"]]
    c3 = next(c for c in out["claims"] if c["id"] == "C3")
    assert c3["rho"]["interval_method"] == "hierarchical bootstrap (seeds, replicates, paired episodes), percentile"
    success = [x for c in out["claims"] if c["id"] == "C1" for x in c["components"] if x["metric"] == "success"][0]
    assert success["hierarchical_levels"] == "seeds, replicates, paired episodes"
    assert success["replicates"]["treatment"]["0"] == 2 and success["pairing"] == "episode"
    assert set(success["variance"]) >= {"between_replicate_in_seed_mean", "between_seed"}
    table = replicate_lines(cell["arms"], load_registry(d)["design"])
    assert "2 per seed and arm" in table[1] and any(line.startswith("| naive FedAvg") or "naive" in line
                                                     for line in table[4:])
    assert replicate_lines({"naive": {"success": {}}}, {}) == []          # no replicates: no table, as before
