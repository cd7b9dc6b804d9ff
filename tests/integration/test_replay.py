"""Replaying rounds of a finished run (lensemble.federation.replay, examples/remeasure_drift.py).

One tiny in-process federation of 3 rounds, run as the study runs them: from another working
folder, with the config's relative ``data.root`` ("data"). Every replay then passes ``data_root``.
The replays must reproduce the run bitwise (inner-optimizer states, committed model, recorded
drift metrics), fail verification when an input is wrong, and never write into the run folder.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from lensemble.config import load_config
from lensemble.errors import ArtifactError, CheckpointIntegrityError, ConfigError
from lensemble.federation import replay as replay_module
from lensemble.federation.inprocess import run_inprocess
from lensemble.federation.replay import replay_rounds, state_file, states_equal

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 3


@pytest.fixture(scope="module")
def finished(micro_warm_start):
    """(run folder, data root, scratch root) of a finished 3-round run whose data.root is relative."""
    _, root, ws = micro_warm_start("replay")
    study = root / "study"  # the folder the "study" runs in: data/ there is the collection
    study.mkdir()
    (study / "data").symlink_to(root / "data", target_is_directory=True)
    cfg = load_config(["experiment=micro", "data.root=data", f"federation.warmstart={ws}",
                       f"federation.rounds={ROUNDS}"])
    before = os.getcwd()
    os.chdir(study)
    try:
        run_inprocess(cfg, root / "run", progress=False)
    finally:
        os.chdir(before)
    return root / "run", root / "data", root


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_reproduced(r: dict) -> None:
    assert r["global_hash_equal"] is True
    assert r["compared"], "nothing recorded to compare"
    assert r["recorded_max_abs_diff"] <= 1e-12 and r["recorded_max_rel_diff"] <= 1e-12
    assert r["metrics"] is not None and "gauge/effective_dim" in r["metrics"]


def test_replaying_the_last_round_reproduces_its_state_model_and_drift(finished, tmp_path):
    run, data, _ = finished
    before = _snapshot(run)
    (r,) = replay_rounds(run, [ROUNDS - 1], work_dir=tmp_path / "work", data_root=data, progress=False)
    assert r["round"] == ROUNDS - 1
    assert r["start_state"] == {"silo-0": "saved", "silo-1": "saved"}
    assert r["state_bitwise_equal"] == {"silo-0": True, "silo-1": True}
    _assert_reproduced(r)
    recorded = json.loads((run / "summary.json").read_text())["rounds"][ROUNDS - 1]
    for key, value in r["metrics"].items():
        if key in recorded:
            assert value == recorded[key], key
    assert r["degenerate_mode"] in ("mask", "raise") and r["seconds"] > 0
    assert set(r["participant_seconds"]) == {"silo-0", "silo-1"}
    assert _snapshot(run) == before  # the run folder is only read
    assert (tmp_path / "work" / f"round-{ROUNDS - 1:04d}" / "drift.json").is_file()


def test_replaying_every_round_from_scratch_chains_its_own_states(finished, tmp_path):
    run, data, _ = finished
    out = replay_rounds(run, [2, 0, 1, 1], work_dir=tmp_path / "work", data_root=data, progress=False)
    assert [r["round"] for r in out] == [0, 1, 2]
    assert out[0]["start_state"] == {"silo-0": "none", "silo-1": "none"}
    assert out[1]["start_state"] == out[2]["start_state"] == {"silo-0": "replayed", "silo-1": "replayed"}
    assert out[0]["state_bitwise_equal"] == {"silo-0": None, "silo-1": None}  # the run kept rounds 1 and 2 only
    for r in out[1:]:
        assert r["state_bitwise_equal"] == {"silo-0": True, "silo-1": True}
    for r in out:
        _assert_reproduced(r)


def _tampered_copy(run: Path, dest: Path) -> Path:
    """A copy of the run whose silo-0 starts round 2 from a (slightly) wrong optimizer state."""
    shutil.copytree(run, dest, ignore=shutil.ignore_patterns(".lensemble.lock"))
    path = state_file(dest / "nodes" / "silo-0", 1)
    state = torch.load(path, weights_only=True)
    first = next(iter(state["optimizer"]["state"].values()))
    first["exp_avg"].view(-1)[0] += 1e-3
    torch.save(state, path)
    return dest


def test_a_wrong_start_state_fails_verification(finished, tmp_path):
    run, data, _ = finished
    bad = _tampered_copy(run, tmp_path / "tampered")
    (r,) = replay_rounds(bad, [ROUNDS - 1], work_dir=tmp_path / "work", data_root=data, progress=False)
    assert r["state_bitwise_equal"] == {"silo-0": False, "silo-1": True}
    assert r["state_mismatches"]["silo-0"] and not r["state_mismatches"]["silo-1"]
    assert r["global_hash_equal"] is False
    assert r["recorded_max_abs_diff"] > 0


def test_a_global_other_than_the_committed_one_is_refused(finished, tmp_path, monkeypatch):
    run, data, _ = finished
    real = replay_module.load_checkpoint

    def previous_round(folder, **kw):  # round 2's replay is sent round 0's global
        folder = Path(folder)
        if folder.parent.name == f"round-{ROUNDS - 2:04d}":
            folder = folder.parents[1] / f"round-{ROUNDS - 3:04d}" / folder.name
        return real(folder, **kw)

    monkeypatch.setattr(replay_module, "load_checkpoint", previous_round)
    with pytest.raises(CheckpointIntegrityError, match="differs from"):
        replay_rounds(run, [ROUNDS - 1], work_dir=tmp_path / "work", data_root=data, progress=False)


def test_a_missing_inner_state_is_refused_before_anything_runs(finished, tmp_path):
    run, data, _ = finished
    with pytest.raises(ArtifactError, match="state after round 0") as err:
        replay_rounds(run, [1], work_dir=tmp_path / "work", data_root=data, progress=False)
    assert "[0, 1]" in err.value.remediation
    assert not (tmp_path / "work").exists()


def test_bad_inputs_are_refused_with_a_clear_error(finished, tmp_path, monkeypatch):
    run, data, _ = finished
    with pytest.raises(ConfigError, match="not a committed round"):
        replay_rounds(run, [ROUNDS], work_dir=tmp_path / "a", data_root=data, progress=False)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    with pytest.raises(ArtifactError, match="not empty"):
        replay_rounds(run, [ROUNDS - 1], work_dir=busy, data_root=data, progress=False)
    # Without data_root the relative data.root resolves here, where there is no collection.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="no complete collection"):
        replay_rounds(run, [ROUNDS - 1], work_dir=tmp_path / "b", progress=False)
    monkeypatch.undo()
    edited = tmp_path / "edited"
    shutil.copytree(run, edited, ignore=shutil.ignore_patterns(".lensemble.lock"))
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["config"]["root_seed"] += 1
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="hashes to"):
        replay_rounds(edited, [ROUNDS - 1], work_dir=tmp_path / "c", data_root=data, progress=False)


def test_states_equal_names_what_differs():
    a = {"optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2)}}}, "steps_done": 3}
    b = {"optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.tensor([0.0, 1e-30])}}},
         "steps_done": 3}
    assert states_equal(a, a) == []
    assert states_equal(a, b) == ["/optimizer/state/0/exp_avg"]
    assert states_equal(a, {**a, "steps_done": 4}) == ["/steps_done"]
    assert states_equal({"x": torch.zeros(2)}, {"x": torch.zeros(2, dtype=torch.float64)}) == ["/x"]


def _remeasure_drift():
    import importlib

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        return importlib.import_module("remeasure_drift")
    finally:
        sys.path.pop(0)


def test_the_script_writes_one_file_per_run_and_fails_on_a_failed_verification(finished, tmp_path):
    run, data, _ = finished
    script = _remeasure_drift()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "good").symlink_to(run, target_is_directory=True)
    _tampered_copy(run, scratch / "bad")
    study = tmp_path / "study"
    (study / "runs").mkdir(parents=True)
    final = json.loads((run / "summary.json").read_text())["final_hash"]
    for rid in ("good", "bad"):
        (study / "runs" / f"{rid}.json").write_text(json.dumps({"kind": "federated", "checkpoint_hash": final}))
    (study / "runs" / "central.json").write_text(json.dumps({"kind": "single"}))
    assert script.federated_runs(study) == ["bad", "good"]
    argv = ["--study-dir", str(study), "--scratch", str(scratch), "--data-root", str(data), "--out",
            str(tmp_path / "out")]
    assert script.main([*argv, "--runs", "good", "--rounds", "final"]) == 0
    result = json.loads((tmp_path / "out" / "good.json").read_text())
    assert set(result) == {"run_id", "replayed_rounds", "verified", "failures", "git_sha", "command", "note"}
    assert result["verified"] is True and result["failures"] == []
    assert [r["round"] for r in result["replayed_rounds"]] == [ROUNDS - 1]
    assert result["command"].startswith("examples/remeasure_drift.py --study-dir")
    assert script.main([*argv, "--rounds", "final"]) == 1  # every federated run: bad fails, good passes
    bad_file = json.loads((tmp_path / "out" / "bad.json").read_text())
    assert bad_file["verified"] is False and bad_file["failures"]  # the analysis ignores this file
    bad = bad_file["replayed_rounds"][0]
    assert bad["state_bitwise_equal"]["silo-0"] is False
    lines = script.failures("bad", [bad])
    assert any("silo-0: replayed inner state differs" in x for x in lines)
    assert any("does not commit the saved global model" in x for x in lines)
    assert script.parse_rounds("all", 3) == [0, 1, 2] and script.parse_rounds("2,0", 3) == [0, 2]
    with pytest.raises(SystemExit):
        script.parse_rounds("3", 3)
    # A run that cannot be replayed is reported, and the others still run.
    assert script.main([*argv, "--runs", "good", "--rounds", "1", "--out", str(tmp_path / "out2")]) == 1
    assert not (tmp_path / "out2" / "good.json").exists()
