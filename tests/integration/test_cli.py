"""The `lensemble` command as a user calls it (typer's runner, tiny configs)."""

import json

import pytest
from typer.testing import CliRunner

from lensemble.cli import app, parse_seeds
from lensemble.errors import ConfigError

runner = CliRunner()


def test_help_lists_the_commands():
    out = runner.invoke(app, ["--help"]).output
    for cmd in ("config", "data", "train", "warmstart", "run", "evaluate", "study", "drift"):
        assert cmd in out


def test_parse_seeds():
    assert parse_seeds("0-2,7") == [0, 1, 2, 7] and parse_seeds("3") == [3]
    for bad in ("", "a-b", ","):
        with pytest.raises(ConfigError):
            parse_seeds(bad)


def test_bad_override_fails_cleanly():
    res = runner.invoke(app, ["config", "federation.outer_lr=-1"])
    assert res.exit_code == 2 and "federation.outer_lr" in res.output


def test_collect_train_run_drift_evaluate(tmp_path):
    base = ["experiment=micro", f"data.root={tmp_path / 'data'}", f"run_dir={tmp_path / 'run'}"]
    res = runner.invoke(app, ["data", "collect", *base])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["run", "--engine", "inprocess", "--eval-episodes", "2", *base])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "run" / "report.md").is_file() and "Report: " in res.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    collection = next((tmp_path / "data").iterdir())
    probe = next((collection / "public").glob("probe-*.npz"))
    rounds = [str(tmp_path / "run" / "rounds" / f"round-000{t}" / "model") for t in (0, 1)]
    res = runner.invoke(app, ["drift", *rounds, "--probe", str(probe), "--out", str(tmp_path / "drift.json")])
    assert res.exit_code in (0, 2), res.output  # 2: degenerate micro frames are reported, not hidden
    if res.exit_code == 0:
        assert "pairwise_residual" in (tmp_path / "drift.json").read_text()
    else:
        assert "procrustes_degenerate" in res.output
    # --degenerate mask never fails on degenerate frames: the pair is listed, not hidden.
    res = runner.invoke(app, ["drift", *rounds, "--probe", str(probe), "--degenerate", "mask",
                              "--out", str(tmp_path / "drift-mask.json")])
    assert res.exit_code == 0, res.output
    masked = json.loads((tmp_path / "drift-mask.json").read_text())
    assert "degenerate_pairs" in masked and all(
        (masked["pairwise_angle_deg"][p] is None) == (p in masked["degenerate_pairs"]) for p in masked["pairwise_angle_deg"])
    res = runner.invoke(app, ["evaluate", rounds[-1], "--episodes", "2", "--no-ladder",
                              "--out", str(tmp_path / "eval.json"), *base])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["n_episodes"] == 2 and 0.0 <= report["success_rate"] <= 1.0
    # the report goes beside --out, and its path is the last line printed
    md = (tmp_path / "eval.md").read_text()
    assert f"{report['n_successes']}/2" in md and report["goal_spec_hash"][:16] in md
    assert (tmp_path / "eval.html").is_file() and (tmp_path / "eval-figures" / "success.png").is_file()
    assert res.output.strip().splitlines()[-1].startswith(f"Report: {tmp_path / 'eval.md'}")
    # without --out: in the checkpoint's run folder, never over the run's own report.md
    res = runner.invoke(app, ["evaluate", rounds[-1], "--episodes", "2", "--no-ladder", "--policy", "random", *base])
    assert res.exit_code == 0, res.output
    # one folder per checkpoint, policy, split and evaluation seed (issue 33: seeds no longer overwrite)
    (folder,) = (tmp_path / "run" / "evaluations").glob("round-0001-random-heldout-seed*")
    assert (folder / "report.md").is_file() and (folder / "eval.json").is_file()
    assert res.output.strip().splitlines()[-1].startswith(f"Report: {folder / 'report.md'}")
    assert (tmp_path / "run" / "report.md").read_text().startswith("# Run `micro`")


def test_run_with_baselines_reports_rho_in_summary_json(tmp_path):
    """`lensemble run --baselines`: the local models and the twin train at the federation's budget
    from its warm start, run the federated model's tasks, and summary.json carries every arm and ρ."""
    from lensemble.artifacts.checkpoint import read_header

    base = ["experiment=micro", f"data.root={tmp_path / 'data'}", f"run_dir={tmp_path / 'run'}"]
    res = runner.invoke(app, ["run", "--engine", "inprocess", "--no-eval", "--baselines", *base])
    assert res.exit_code == 2 and "--baselines compares planning success" in res.output
    assert not (tmp_path / "run").exists()  # refused before any work
    res = runner.invoke(app, ["run", "--engine", "inprocess", "--eval-episodes", "3", "--baselines", *base])
    assert res.exit_code == 0, res.output
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    ev = summary["evaluation"]
    arms = ("federated", "warmstart", "random", "local-0", "local-1", "twin")
    assert set(ev["arms"]) == set(arms) and ev["episodes"] == 3
    for arm in arms:  # one task set: every arm's goal-spec hash is the federated model's
        rec = ev["arms"][arm]
        assert rec["goal_spec_hash"] == ev["goal_spec_hash"], arm
        assert rec["episodes"] == 3 and 0 <= rec["successes"] <= 3 and len(rec["success_ci"]) == 2
        report = json.loads((run / rec["report"]).read_text())
        assert report["goal_spec_hash"] == ev["goal_spec_hash"] and report["n_successes"] == rec["successes"]
    # the federation's budget (2 rounds x H = 3 at batch 16; the twin at 2 x 16), from its warm start
    assert ev["baselines"] == {"local_steps": 6, "local_batch_size": 16, "twin_steps": 6, "twin_batch_size": 32,
                               "local_success_rate": (ev["arms"]["local-0"]["success_rate"]
                                                      + ev["arms"]["local-1"]["success_rate"]) / 2}
    for arm in ("local-0", "local-1", "twin"):
        header = read_header(run / "baselines" / arm / "checkpoints" / "step-000006")
        assert header["parent_hash"] == summary["warmstart_hash"]
        assert header["content_hash"] == ev["arms"][arm]["checkpoint_hash"]
    gap = ev["gap_recovery"]
    assert gap["units"] == "tasks" and gap["n_units"] == 3 and gap["reference"] == "twin"
    answer = [line for line in res.output.splitlines() if line.startswith("The federated model planned")]
    assert len(answer) == 1
    if gap["defined"]:
        assert f"federation recovered ρ = {gap['rho']:.2f}" in answer[0]
    else:
        assert "so gap recovery ρ is undefined" in answer[0] and "ρ =" not in answer[0]
    md = (run / "report.md").read_text()
    assert "| local model of silo-0 |" in md and "| data-parallel twin |" in md and "paired bootstrap over" in md
    # a second run reuses the rounds, the baselines and every evaluation
    res = runner.invoke(app, ["run", "--engine", "inprocess", "--eval-episodes", "3", "--baselines", *base])
    assert res.exit_code == 0, res.output
    assert "reused baselines/twin" in res.output and "train pooled" not in res.output
    assert json.loads((run / "summary.json").read_text())["evaluation"] == ev
