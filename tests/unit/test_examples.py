"""The example scripts still import and parse their arguments (a renamed module broke the planning
pilot once without any test noticing)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _example(name: str):
    """The example script ``examples/<name>.py`` imported as a module."""
    import importlib

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@pytest.mark.parametrize("script", ["planning_pilot.py", "central_quality.py", "partition_pilot.py", "bn_federation_pilot.py",
                                    "seed_spread.py", "bn_source_diagnostic.py", "remeasure_drift.py",
                                    "outer_step_diagnostic.py", "pooled_objective_pilot.py", "pooled_study_power.py",
                                    "study_seed_table.py", "reacher_pose_resolution.py", "bf16_training_success.py",
                                    "planner_budget_pilot.py", "pusht_pusher_check.py",
                                    "predictor_history.py", "measure_kappa.py", "latent_spread.py",
                                    "twin_dimensions.py"])
def test_example_imports_and_shows_its_help(script):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_pilot_variants_compose_into_valid_configs():
    planning_pilot = _example("planning_pilot")
    from lensemble.config import load_config

    for v in planning_pilot.VARIANTS:
        cfg = load_config(["experiment=micro", *planning_pilot.variant_overrides(v)])
        assert cfg.model.projector_norm in ("layernorm", "batchnorm")
    assert planning_pilot.arm_key("d", 0) == "d" and planning_pilot.arm_key("d", 2) == "d-s2"
    assert planning_pilot.report_stem("strict") == "pilot"
    with pytest.raises(SystemExit):
        planning_pilot.parse_seeds("1,x")


def _partition_pilot():
    return _example("partition_pilot")


def test_partition_pilot_plan_only_prints_cpu_hours_that_scale_with_steps(capsys):
    import re

    pilot = _partition_pilot()

    def total_hours(*argv):
        assert pilot.main(["--plan-only", *argv]) is None
        found = re.search(r"Total: ([0-9.]+) CPU-hours", capsys.readouterr().out)
        assert found, "no CPU-hours figure"
        return float(found.group(1))

    # the defaults: 5 candidates x (0.55 x (300 + 3 x 1500) + 4.5 x 4 x 100) CPU-s
    assert total_hours() == pytest.approx(5 * 4440 / 3600, abs=0.01)
    short, long = total_hours("--factors", "agent.speed", "--steps", "1000"), \
        total_hours("--factors", "agent.speed", "--steps", "3000")
    assert long - short == pytest.approx(3 * 2000 * 0.55 / 3600, abs=0.01)  # central + 2 locals


def test_partition_pilot_runs_every_arm_on_shared_tasks_and_resumes_from_its_cache(tmp_path, monkeypatch):
    import json

    pilot = _partition_pilot()
    out = tmp_path / "out"
    argv = ["--out", str(out), "--factors", "agent.speed", "--warmstart-steps", "5", "--steps", "5",
            "--episodes", "2", "experiment=micro", "eval.budget=5", f"data.root={tmp_path / 'data'}"]
    first = pilot.main(argv)
    result = json.loads((out / "partition-pilot.json").read_text())
    assert (out / "partition-pilot.md").read_text().startswith("# Partition pilot")
    cand = result["candidates"]["agent.speed"]
    assert set(cand["arms"]) == {"warmstart", "central", "local-0", "local-1", "random"}
    assert {len(a["success"]) for a in cand["arms"].values()} == {2}
    assert all(t["owner"] in (0, 1) for t in cand["tasks"])  # every held-out task is one silo's conditions
    assert cand["gap"]["estimate"] == pytest.approx(
        sum(cand["arms"]["central"]["success"]) / 2
        - sum(cand["arms"]["local-0"]["success"] + cand["arms"]["local-1"]["success"]) / 4)
    assert [r["factor"] for r in result["ranking"]] == ["agent.speed"]
    assert len(cand["phi"]) == 10  # every pair of the five arms
    warm = json.loads((out / "agent.speed" / "central" / "train.json").read_text())["init_checkpoint_hash"]
    assert warm == json.loads((out / "agent.speed" / "warmstart" / "train.json").read_text())["checkpoint_hash"]

    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*.json") if p.name == "train.json" or "cache" in p.parts}
    assert len(stamps) == 4 + 5  # four trained stages, five scored arms

    def boom(*a, **k):
        raise AssertionError("a cached stage ran again")

    for name in ("train_local", "train_warmstart", "evaluate"):
        monkeypatch.setattr(pilot, name, boom)
    again = pilot.main(argv)
    assert again["candidates"]["agent.speed"]["arms"] == first["candidates"]["agent.speed"]["arms"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    with pytest.raises(SystemExit, match="other settings"):  # a changed warm start is never mixed in
        pilot.main([*argv[:4], "--warmstart-steps", "6", *argv[6:]])

    # The transfer split is scored on request, from the cached training, on tasks of its own.
    monkeypatch.undo()
    extra = pilot.main([*argv, "--transfer-episodes", "2"])["candidates"]["agent.speed"]
    assert extra["arms"] == first["candidates"]["agent.speed"]["arms"]  # the held-out scores are reused
    tr = extra["transfer"]
    assert set(tr["arms"]) == set(extra["arms"]) and {a["rate"]["n"] for a in tr["arms"].values()} == {2}
    assert tr["goal_spec_hash"] != extra["goal_spec_hash"]
    assert "Transfer tasks (2" in (out / "partition-pilot.md").read_text()

    # Exported records (no checkpoints) rebuild the same report in a fresh --out.
    records = tmp_path / "records"
    pilot.main([*argv, "--export", str(records)])
    assert not list(records.rglob("*.pt")) and not list(records.rglob("run"))
    for name in ("train_local", "train_warmstart", "evaluate"):
        monkeypatch.setattr(pilot, name, boom)
    rebuilt = pilot.main(["--out", str(records), *argv[2:], "--transfer-episodes", "2", "--stage", "eval"])
    assert rebuilt["candidates"]["agent.speed"]["arms"] == extra["arms"]
    assert rebuilt["candidates"]["agent.speed"]["transfer"] == tr


def test_planning_pilot_costs_compose_and_the_wall_probe_rule():
    planning_pilot = _example("planning_pilot")
    from lensemble.config import load_config

    for name, overrides in planning_pilot.COSTS.items():
        cfg = load_config(["experiment=micro", *overrides])
        assert cfg.eval.cost == ("l1" if name == "l1" else "reachability")
    # the wall probe's rule: a prediction counts against the model when it lies nearer the wrong outcome
    import torch

    truth, alt = torch.zeros(3, 2), torch.tensor([[1.0, 0.0]] * 3)
    pred = torch.tensor([[0.2, 0.0], [0.8, 0.0], [0.5, 0.1]])
    assert planning_pilot.closer_to_alternative(pred, truth, alt).tolist() == [False, True, False]


def _seed_spread():
    return _example("seed_spread")


def test_seed_spread_refuses_pilots_on_different_tasks(tmp_path):
    import json

    mod = _seed_spread()
    for i, h in enumerate(("a", "b")):
        d = tmp_path / f"p{i}"
        d.mkdir()
        cand = {"goal_spec_hash": h, "arms": {}}
        (d / "partition-pilot.json").write_text(json.dumps(
            {"settings": {"overrides": [f"root_seed={i}"]}, "candidates": {"agent.region": cand}}))
    with pytest.raises(SystemExit, match="different tasks"):
        mod.main([str(tmp_path / "p0"), str(tmp_path / "p1")])


def test_planning_pilot_report_shows_what_the_latents_carry_per_state_dimension(tmp_path):
    planning_pilot = _example("planning_pilot")
    rate = {"successes": 1, "n": 50, "rate": 0.02, "wilson_95": [0.0, 0.1]}
    dims = {"agent_x": 0.04, "agent_y": 0.18, "block_x": 0.75, "block_y": 0.68}
    arms = {"random actions": {"rate": rate, "route_valid_rate": rate, "cross_wall_rate": [0, 0]},
            "(k) cnn": {"rate": rate, "route_valid_rate": rate, "cross_wall_rate": [0, 0],
                        "ladder": {"probe_r2": 0.41, "probe_r2_per_dim": dims}}}
    result = {"protocol": "strict", "steps": 2000, "episodes": 50, "goal_spec_hash": "30295110822d" * 2,
              "cross_wall_tasks": 0, "pixel_pca_probe": {"probe_r2": 0.55, "per_dim": [0.19, 0.24, 0.87, 0.92]},
              "arms": arms, "pooled": [], "paired": []}
    planning_pilot.write_report(tmp_path, result)
    text = (tmp_path / "pilot.md").read_text()
    assert "| arm | agent_x | agent_y | block_x | block_y |" in text
    assert "| pixel PCA (64 components) | 0.190 | 0.240 | 0.870 | 0.920 |" in text
    assert "| (k) cnn | 0.040 | 0.180 | 0.750 | 0.680 |" in text
    assert "| random actions | 0.040" not in text  # an arm without latents has no probe row


def test_pooled_study_power_reads_a_pilot_and_prints_the_planning_numbers(tmp_path, capsys):
    import json

    power = _example("pooled_study_power")
    rng = np.random.default_rng(0)
    rates = {"central-control": 0.85, "central-twin": 0.7, "fed-silo": 0.3, "fed-pooled": 0.65,
             "fed-pooled-anchor": 0.65, "local-0": 0.4, "local-1": 0.4}
    pilot = {"evaluations": {str(s): {a: {"success": (rng.random(50) < p + 0.05 * s).tolist()}
                                      for a, p in rates.items()} for s in range(3)}}
    (tmp_path / "pilot.json").write_text(json.dumps(pilot))
    out = tmp_path / "power.json"
    assert power.main(["--pilot", str(tmp_path / "pilot.json"), "--reps", "10", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["seeds"] == [0, 1, 2] and set(res["pairs"]) == {"naive-central", "naive-naive_silo", "anchor-naive"}
    assert 0.2 < res["rho_model"]["local"] < 0.6 and res["rho_power"]["rho=0"]["true_rho"] == 0.0
    assert "C3 at 8 seeds" in capsys.readouterr().out


def test_study_seed_table_reads_ladder_summaries_only(tmp_path):
    import json

    table = _example("study_seed_table").table
    runs = tmp_path / "s" / "runs"
    runs.mkdir(parents=True)

    def summary(name, arm, seed, wins, cells=("ladder/default",), silo=None):
        (runs / f"{name}.json").write_text(json.dumps({"arm": arm, "seed": seed, "silo": silo, "cells": list(cells),
                                                       "eval": {"n_successes": wins, "n_episodes": 50}}))

    summary("naive-s0", "naive", 0, 26)
    summary("naive-s1", "naive", 1, 36)
    summary("local-silo1-s0", "local", 0, 19, silo=1)
    summary("severity-0.5-naive-s0", "naive", 0, 7, cells=("severity/0.5",))  # another cell: not in the ladder
    (runs / "anchor-s0.failed.json").write_text("{}")
    text = table(tmp_path, "s", "ladder/default")
    lines = text.splitlines()
    assert lines[0] == "| arm (successes of 50) | s0 | s1 |"
    assert "| local, silo 1 (200 steps) | 19 | – |" in lines
    assert "| **naive FedAvg, pooled objective** | 26 | 36 |" in lines and "7" not in text.split("s1 |")[1]


def test_pose_resolution_recovers_a_known_encoder_and_places_an_error_on_its_curve():
    import torch

    mod = _example("reacher_pose_resolution")
    # a known encoder: the latent is k·pose (2 of 4 dims), so the latent MSE of poses δ apart
    # (max-joint) lies between k²δ²/4 (one joint moved) and k²δ²/2 (both by δ)
    k = 3.0
    draw = lambda pose: np.asarray(pose, float)  # noqa: E731 - the "frame" is the pose itself
    encode = lambda f: torch.cat([k * torch.as_tensor(f), torch.zeros(len(f), 2, dtype=torch.float64)], 1)  # noqa: E731
    goals = np.random.default_rng(1).uniform(-1, 1, (40, 2))
    deltas = [0.05, 0.1, 0.2, 0.4]
    mse = mod.pose_resolution(encode, draw, goals, deltas, np.random.default_rng(0))
    d2 = np.asarray(deltas) ** 2
    assert np.all(mse >= k * k * d2 / 4 - 1e-12) and np.all(mse <= k * k * d2 / 2 + 1e-12)
    med = np.median(mse, axis=0)
    # an error equal to the curve at 0.1 rad reads as 0.1 rad; outside the probed range, None
    assert mod.pose_equivalent(med[1], deltas, med) == pytest.approx(0.1)
    assert mod.pose_equivalent(10 * med[-1], deltas, med) is None


class _VelocityPredictor:
    """A known predictor: extrapolates z_t + (z_t − z_{t−1}) when it sees two latents, else copies."""

    history = 3

    def rollout(self, z_hist, actions, past_actions=None):
        nxt = z_hist[:, -1] if z_hist.shape[1] < 2 else 2 * z_hist[:, -1] - z_hist[:, -2]
        return nxt[:, None].expand(-1, actions.shape[1], -1)


def test_history_diagnostic_sees_velocity_only_with_two_latents():
    import torch

    mod = _example("predictor_history")
    # constant-velocity latents: z_t = z_0 + t·v, so extrapolating from 2+ latents is exact and
    # copying (the k = 1 rule) misses by |v|² per step
    e, n, d = 3, 6, 4
    v = torch.arange(1.0, d + 1)
    z = torch.zeros(e, n + 1, d) + torch.arange(n + 1.0)[None, :, None] * v
    err, copy = mod.errors_by_history(_VelocityPredictor(), z, torch.zeros(e, n, 2))
    assert err.shape == (3, e, n - 2) and copy.shape == (e, n - 2)
    per_dim = float((v ** 2).mean())
    assert np.allclose(err[0], per_dim) and np.allclose(copy, per_dim)
    assert np.allclose(err[1], 0) and np.allclose(err[2], 0)
    with pytest.raises(ValueError, match="shorter than the history"):
        mod.errors_by_history(_VelocityPredictor(), z[:, :3], torch.zeros(e, 2, 2))
