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
    folder = tmp_path / "run" / "evaluations" / "round-0001-random-heldout"
    assert (folder / "report.md").is_file() and (folder / "eval.json").is_file()
    assert res.output.strip().splitlines()[-1].startswith(f"Report: {folder / 'report.md'}")
    assert (tmp_path / "run" / "report.md").read_text().startswith("# Run `micro`")
