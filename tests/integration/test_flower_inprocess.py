"""The real ServerApp and ClientApp on the in-process grid, with the fake sides (fake_federation.py).

Fast: no Ray, no sockets. Covers the round loop, config plumbing with and without
``context.run_config``, wire-byte accounting, the egress guard, failing and slow nodes, retries.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path

import fake_federation as fake
import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from lensemble.errors import FaultToleranceExceeded, ResidencyViolation
from lensemble.federation.flower import RUN_CONFIG_DEFAULTS
from lensemble.federation.flower.client_app import make_client_app
from lensemble.federation.flower.local_grid import LocalGrid, serve_on_local_grid
from lensemble.federation.flower.records import (
    arrays_to_record,
    config_to_record,
    content_to_reply,
    metrics_to_record,
    record_nbytes,
    record_to_arrays,
    record_to_config,
    reply_to_content,
)
from lensemble.federation.flower.server_app import make_server_app
from lensemble.federation.messages import Reply

ROOT = Path(__file__).resolve().parents[2]


def server(rc=None):
    return make_server_app(fake.Coordinator, run_config=rc)


def client(rc=None):
    return make_client_app(fake.participant_round, run_config=rc)


def _prepare(tmp_path: Path, overrides: str = "", behaviour: dict | None = None) -> tuple[Path, dict]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if behaviour:
        (run_dir / "behaviour.json").write_text(json.dumps(behaviour))
    rc = {"overrides": f"experiment=micro {overrides}".strip(), "run-dir": str(run_dir),
          "progress": True, "node-state-dir": str(run_dir / "nodes")}
    return run_dir, rc


def _lines(run_dir: Path, name: str = "rounds.jsonl") -> list[dict]:
    path = run_dir / name
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _run(tmp_path, overrides="", behaviour=None, num_nodes=2):
    run_dir, rc = _prepare(tmp_path, overrides, behaviour)
    serve_on_local_grid(server(rc), client(rc), num_nodes, run_config=rc)
    return run_dir


@pytest.mark.parametrize("plumbing", ["context", "baked"])
def test_two_nodes_two_rounds(tmp_path, plumbing):
    """Both replies reach the coordinator every round, whichever way the run config arrives."""
    run_dir, rc = _prepare(tmp_path)
    if plumbing == "context":  # like `flwr run`: apps read context.run_config
        serve_on_local_grid(server(), client(), 2, run_config=rc)
    else:  # like flwr's run_simulation: empty context.run_config, config baked into the apps
        serve_on_local_grid(server(rc), client(rc), 2, run_config={})
    rounds = _lines(run_dir)
    assert [r["round"] for r in rounds] == [0, 1]
    for r in rounds:
        assert r["participants"] == ["silo-0", "silo-1"]
        assert r["failures"] == {}
        assert r["probe_shapes"] == {"silo-0": [4, 2], "silo-1": [4, 2]}
    # participant state persisted on local disk across rounds; str metrics never left; bool -> int
    assert [r["metrics"]["silo-1"]["rounds_seen"] for r in rounds] == [1, 2]
    assert (run_dir / "nodes" / "silo-1" / "rounds_seen.txt").read_text() == "2"
    assert "note" not in rounds[0]["metrics"]["silo-0"] and rounds[0]["metrics"]["silo-0"]["ok"] == 1
    # the coordinator's public extras reached every participant
    extras = fake.Coordinator.extras
    assert rounds[0]["metrics"]["silo-1"]["extras_sum"] == sum(float(v.sum()) for v in extras.values())
    # bytes on the wire: global and extras once per node, plus each reply's delta and probe arrays
    glob = arrays_to_record({**{k: np.zeros(s, np.float32) for k, s in fake.SHAPES.items()}, **extras})
    delta = arrays_to_record({"fp32": np.zeros(fake.NUMEL, np.float32)})
    probe = arrays_to_record({"embeddings": np.zeros((4, 2), np.float32)})
    assert rounds[0]["wire_bytes"] == 2 * record_nbytes(glob) + 2 * (record_nbytes(delta) + record_nbytes(probe))
    # outer step with lr 1: the mean of 0.1 and 0.2, twice
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds"] == 2
    np.testing.assert_allclose(summary["global"]["a"], [0.3] * 3, rtol=1e-6)


def test_resume_runs_only_remaining_rounds(tmp_path):
    run_dir = _run(tmp_path, "federation.rounds=1")
    rc = {"overrides": "experiment=micro federation.rounds=2", "run-dir": str(run_dir),
          "node-state-dir": str(run_dir / "nodes")}
    serve_on_local_grid(server(rc), client(rc), 2)
    assert [r["round"] for r in _lines(run_dir)] == [0, 1]


def test_egress_guard_refuses_extra_fields_and_records():
    good = Reply(round_index=0, payload={"fp32": np.zeros(7, np.float32)},
                            probe_embeddings=np.zeros((4, 2), np.float32), metrics={"loss": 1.0})
    content = reply_to_content(good, partition_id=3)
    assert set(content.keys()) == {"delta", "probe", "metrics"}
    back, pid = content_to_reply(content, Reply)
    assert pid == 3 and back.metrics == {"loss": 1.0}

    leaky = fake.LeakyReply(**vars(good), raw_observations=np.zeros((1, 4, 4, 3), np.uint8))
    with pytest.raises(ResidencyViolation, match="raw_observations"):
        reply_to_content(leaky, partition_id=0)
    hidden = Reply(round_index=0, payload={"fp32": np.zeros(7, np.float32), "obs": np.zeros(3)},
                              probe_embeddings=good.probe_embeddings, metrics={})
    with pytest.raises(ResidencyViolation):
        reply_to_content(hidden, partition_id=0)
    with pytest.raises(ResidencyViolation):
        reply_to_content(Reply(0, good.payload, good.probe_embeddings,
                                          {"x": np.zeros(2)}), partition_id=0)
    with pytest.raises(ResidencyViolation, match="reserved"):
        reply_to_content(Reply(0, good.payload, good.probe_embeddings,
                                          {"lensemble/partition-id": 7}), partition_id=0)
    # the server refuses a reply carrying anything beyond the three records
    smuggled = RecordDict({**dict(content.items()), "raw": arrays_to_record({"x": np.zeros(2)})})
    with pytest.raises(ResidencyViolation):
        content_to_reply(smuggled, Reply)
    extra_cfg = RecordDict({**dict(content.items()), "note": ConfigRecord({"path": "/data/site0"})})
    with pytest.raises(ResidencyViolation):
        content_to_reply(extra_cfg, Reply)


def test_leaking_participant_stops_the_run(tmp_path, caplog):
    """The guard refuses on the participant; the fail-closed error then stops the federation. The
    coordinator learns the class only; the details stay in the participant's own log."""
    with pytest.raises(ResidencyViolation, match="fail-closed error: ResidencyViolation") as info:
        _run(tmp_path, "federation.min_participants=1", {"leak": {"1": [0]}})
    assert "raw_observations" not in str(info.value)
    assert "raw_observations" in caplog.text  # logged at the site
    assert _lines(tmp_path / "run") == []  # nothing committed


def test_raising_node_with_quorum_one_round_completes(tmp_path):
    run_dir = _run(tmp_path, "federation.min_participants=1", {"raise": {"1": [0]}})
    rounds = _lines(run_dir)
    assert rounds[0]["participants"] == ["silo-0"]
    (reason,) = rounds[0]["failures"].values()
    # named by its silo although it never replied before (issue 33: it was node-<flower id>)
    assert list(rounds[0]["failures"]) == ["silo-1"]
    # only the class crosses the silo boundary, never the message (it may hold private values)
    assert reason.startswith("failed: RuntimeError") and "on purpose" not in reason
    assert rounds[1]["participants"] == ["silo-0", "silo-1"]
    assert rounds[1]["failures"] == {}


def test_raising_node_with_quorum_two_exhausts_retries(tmp_path):
    with pytest.raises(FaultToleranceExceeded):
        _run(tmp_path, "federation.min_participants=2 federation.round_retries=1", {"raise": {"1": "*"}})
    run_dir = tmp_path / "run"
    attempts = _lines(run_dir, "attempts.jsonl")
    assert [a["round"] for a in attempts] == [0, 0]  # 1 + round_retries attempts, then it propagates
    assert all(len(a["failures"]) == 1 for a in attempts)
    assert _lines(run_dir) == []


def test_slow_node_is_dropped_without_hanging(tmp_path):
    start = time.monotonic()
    run_dir = _run(tmp_path, "federation.min_participants=1 federation.round_timeout_s=1.0",
                   {"sleep": {"1": {"0": 2.5}}})
    elapsed = time.monotonic() - start
    rounds = _lines(run_dir)
    assert [r["round"] for r in rounds] == [0, 1]
    assert rounds[0]["participants"] == ["silo-0"]
    assert list(rounds[0]["failures"].values()) == ["did not reply within 1 s"]
    assert elapsed < 15, elapsed  # two round timeouts plus start-up, never the sleeper's backlog


_HUNG_NODE_RUN = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
import fake_federation as fake
from lensemble.federation.faults import faulty
from lensemble.federation.flower.client_app import make_client_app
from lensemble.federation.flower.local_grid import serve_on_local_grid
from lensemble.federation.flower.server_app import make_server_app
run_dir = sys.argv[1]
rc = {"overrides": "experiment=micro federation.rounds=4 federation.min_participants=1 "
                   "federation.round_timeout_s=2", "run-dir": run_dir, "progress": True,
      "node-state-dir": run_dir + "/nodes"}
client = make_client_app(faulty(fake.participant_round, {(1, 1): "hang"}, hang_s=3600), run_config=rc)
start = time.monotonic()
serve_on_local_grid(make_server_app(fake.Coordinator, run_config=rc), client, 2, run_config=rc)
print(json.dumps({"served_s": time.monotonic() - start}), flush=True)
"""


def test_hung_node_costs_one_deadline_and_the_process_exits(tmp_path):
    """Case 3 on the Flower in-process grid: a node hung in its ClientApp from round 1 on costs
    round 1 one deadline, is sent nothing while its message is outstanding, the healthy node
    carries every round, and the process exits although the hung node's thread never returns."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.run([sys.executable, "-c", _HUNG_NODE_RUN, str(run_dir), str(Path(fake.__file__).parent)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = json.loads(proc.stdout.strip().splitlines()[-1])["served_s"]
    rounds = _lines(run_dir)
    assert [r["participants"] for r in rounds] == [["silo-0", "silo-1"]] + [["silo-0"]] * 3
    assert rounds[1]["failures"] == {"silo-1": "did not reply within 2 s"}
    for r in rounds[2:]:
        assert r["failures"]["silo-1"].startswith("is still busy with round 1")
    assert served < 2 + 8, served  # one deadline, not one per round
    assert "silo-1 did not reply within 2 s; quorum 1 met by silo-0" in proc.stderr


def test_dp_egress_is_enforced_by_the_client_app(tmp_path):
    """Whatever participant function runs, with privacy on the ClientApp refuses a reply that
    carries probe embeddings or un-noised metrics (the fake sends both), and that stops the run."""
    with pytest.raises(ResidencyViolation, match="fail-closed"):
        _run(tmp_path, "privacy=dp federation.min_participants=1")
    assert _lines(tmp_path / "run") == []


def test_too_few_nodes_online_fails_after_the_deadline(tmp_path):
    run_dir, rc = _prepare(tmp_path, "federation.round_timeout_s=1.0 federation.round_retries=0")
    app = client(rc)
    grid = LocalGrid(app, 2, run_config=rc)
    grid.offline.add(list(grid.get_node_ids())[1])
    start = time.monotonic()
    with pytest.raises(FaultToleranceExceeded, match="online"):
        serve_on_local_grid(server(rc), app, 2, grid=grid)
    assert time.monotonic() - start < 10


def test_records_round_trip():
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "q": np.array([-3, 4], np.int8)}
    rec = arrays_to_record(arrays)
    assert list(rec.keys()) == ["q", "w"]
    back = record_to_arrays(rec)
    for k in arrays:
        np.testing.assert_array_equal(back[k], arrays[k])
        assert back[k].dtype == arrays[k].dtype
    assert record_nbytes(rec) == sum(len(a.data) for a in rec.values())
    cfg = {"round-index": np.int64(2), "lr": 0.5, "name": "x", "flag": True}
    assert record_to_config(config_to_record(cfg)) == {"round-index": 2, "lr": 0.5, "name": "x", "flag": True}
    m = metrics_to_record({"a": True, "b": np.float32(1.5), "c": 3, "s": "dropped"})
    assert isinstance(m, MetricRecord) and dict(m) == {"a": 1, "b": 1.5, "c": 3}


def test_run_config_defaults_match_pyproject():
    toml = tomllib.loads((ROOT / "pyproject.toml").read_text())
    app = toml["tool"]["flwr"]["app"]
    assert app["config"] == RUN_CONFIG_DEFAULTS
    assert app["components"] == {"serverapp": "lensemble.federation.flower.server_app:app",
                                 "clientapp": "lensemble.federation.flower.client_app:app"}


@pytest.mark.slow
def test_flwr_run_simulation_matches_the_framework_free_engine(tmp_path, monkeypatch, capfd):
    """Flower's supported path (``flwr run`` on a local simulation SuperLink, Ray inside) with the
    real apps: the same final checkpoint as the in-process engine, no deprecation banner, and no
    Flower process left behind."""
    from lensemble.config import load_config
    from lensemble.federation.flower.processes import descendants
    from lensemble.federation.inprocess import run_inprocess
    from lensemble.federation.simulation import run_federated_simulation

    monkeypatch.chdir(tmp_path)  # relative data.root resolves here for the CLI and the runtime alike
    cfg = load_config(["experiment=micro", "federation.rounds=1", "run_dir=run"])
    before = set(descendants(os.getpid()))
    summary = run_federated_simulation(cfg, engine="ray", progress=True)
    reference = run_inprocess(cfg, tmp_path / "reference", progress=False)
    assert summary["rounds_completed"] == 1
    assert summary["final_hash"] == reference["final_hash"]
    assert summary["rounds"][-1]["fed/participants"] == 2
    err = capfd.readouterr().err
    assert "[lensemble] round 1/1: 2/2 replies" in err, err[-3000:]
    assert "DEPRECATED" not in err
    assert set(descendants(os.getpid())) <= before  # SuperLink, SuperExec, simulation, Ray: all gone


def test_run_on_local_grid(tmp_path):
    from lensemble.config import load_config
    from lensemble.federation.simulation import run_on_local_grid

    cfg = load_config(["experiment=micro"])
    summary = run_on_local_grid(cfg, tmp_path / "run", progress=False, coordinator=fake.Coordinator,
                                participant=fake.participant_round)
    assert summary["rounds"] == cfg.federation.rounds
    assert len(_lines(tmp_path / "run")) == cfg.federation.rounds


def test_real_sides_match_the_framework_free_engine(tmp_path):
    """Real Coordinator and participants through the Flower apps (protobuf copies, threads) give
    bitwise the checkpoint chain of the framework-free in-process engine."""
    from lensemble.config import load_config
    from lensemble.federation.inprocess import run_inprocess
    from lensemble.federation.simulation import run_on_local_grid

    cfg = load_config(["experiment=micro"])
    flower = run_on_local_grid(cfg, tmp_path / "flower", progress=False)
    reference = run_inprocess(cfg, tmp_path / "reference", progress=False)
    assert flower["rounds_completed"] == reference["rounds_completed"] == cfg.federation.rounds
    assert flower["final_hash"] == reference["final_hash"]
    last = flower["rounds"][-1]
    assert last["fed/participants"] == 2 and last["dropped"] == {}
    assert last["fed/comm_bytes"] > 0


def test_busy_nodes_are_neither_asked_nor_counted():
    """wait_for_nodes: a busy node (message outstanding) is not waited for when enough others are
    free, and never counts towards the quorum: with every node busy it waits, then says so."""
    from lensemble.federation.flower.transport import wait_for_nodes

    class Grid:
        def get_node_ids(self):
            return [11, 22]

    start = time.monotonic()
    assert wait_for_nodes(Grid(), want=1, hope=2, deadline_s=5, busy=lambda: {11}) == [22]
    assert time.monotonic() - start < 1  # no grace wait for the busy one
    with pytest.raises(FaultToleranceExceeded, match="2 more still busy"):
        wait_for_nodes(Grid(), want=1, hope=2, deadline_s=0.3, poll_s=0.05, busy=lambda: {11, 22})
