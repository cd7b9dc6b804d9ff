"""The Flower apps on real Flower processes on 127.0.0.1, and the FAB they ship in.

- the FAB: under 10 MB, holds lensemble/ and configs/*.yaml, nothing else from the checkout;
- one SuperLink + two SuperNodes (insecure loopback) running two rounds via
  ``flwr run . <federation> --stream`` with the fake sides (fake_apps.py, slow);
- TLS + node authentication: a registered EC key gets in, an unregistered one is refused (slow).

The fake apps reach the ServerApp / ClientApp processes through PYTHONPATH (tests are not part of
the FAB). Every process started here is stopped by PID in a finally block.
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import flower_processes as sl
import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKES_PATH = {"PYTHONPATH": str(Path(__file__).resolve().parent)}
FAB_MAX_BYTES = 10 * 1024 * 1024


def use_fake_apps(app: Path, clientapp: str = "clientapp") -> None:
    """Point the staged app's components at the fake sides (tests/integration/fake_apps.py)."""
    pyproject = app / "pyproject.toml"
    text = pyproject.read_text()
    for real, fake in (("lensemble.federation.flower.server_app:app", "fake_apps:serverapp"),
                       ("lensemble.federation.flower.client_app:app", f"fake_apps:{clientapp}")):
        assert real in text
        text = text.replace(real, fake)
    pyproject.write_text(text)


def test_fab_is_small_and_carries_the_configs(tmp_path):
    app = sl.stage_app(ROOT, tmp_path / "lensemble")
    for junk in ("tests/test_x.py", "tests/helper.py", "docs/x.md", "benchmarks/b.py", "examples/e.py",
                 "runs/r/metrics.jsonl", "data/shards.json"):
        (app / junk).parent.mkdir(parents=True, exist_ok=True)
        (app / junk).write_text("{}\n")
    out = tmp_path / "out"
    out.mkdir()
    res = sl.flwr_cli(["build", "--app", str(app)], home=tmp_path / "home", cwd=out)
    assert res.returncode == 0, res.stdout + res.stderr
    (fab,) = out.glob("*.fab")
    assert fab.stat().st_size < FAB_MAX_BYTES
    names = zipfile.ZipFile(fab).namelist()
    assert "configs/config.yaml" in names and "configs/experiment/micro.yaml" in names
    assert "lensemble/federation/flower/server_app.py" in names
    assert "lensemble/config/loader.py" in names
    tops = {n.split("/")[0] for n in names}
    assert tops == {"pyproject.toml", "lensemble", "configs", ".info"}, tops


@pytest.mark.slow
def test_superlink_two_supernodes_two_rounds(tmp_path):
    app = sl.stage_app(ROOT, tmp_path / "lensemble")  # same FAB as the checkout, without its .venv
    use_fake_apps(app)
    run_dir = tmp_path / "run"
    procs: list[sl.FlowerProcess] = []
    try:
        _, cli_home = sl.start_loopback_federation(tmp_path, procs, env_extra=FAKES_PATH)
        run_config = (f"overrides='experiment=micro federation.rounds=2 federation.round_timeout_s=120' "
                      f"run-dir='{run_dir}'")
        res = sl.flwr_cli(["run", ".", "loopback", "--stream", "--run-config", run_config],
                          home=cli_home, cwd=app, timeout_s=300, env_extra=FAKES_PATH)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out
        assert "[lensemble] round 2/2: 2/2 replies" in out, out
        rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rounds] == [0, 1]
        assert all(r["participants"] == ["silo-0", "silo-1"] and not r["failures"] for r in rounds)
        assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
        assert (tmp_path / "state1" / "silo-1" / "rounds_seen.txt").read_text() == "2"
    finally:
        sl.stop_all(reversed(procs))
    assert not any(p.alive() for p in procs)


@pytest.mark.slow
def test_unregistered_supernode_is_refused(tmp_path):
    tls = sl.make_tls_files(tmp_path / "certs")
    good_key, good_pub = sl.make_node_key(tmp_path / "keys", "site0")
    bad_key, _ = sl.make_node_key(tmp_path / "keys", "intruder")
    procs: list[sl.FlowerProcess] = []
    try:
        link = sl.start_superlink(tmp_path, tls=tls, enable_supernode_auth=True)
        procs.append(link)
        address = f"{sl.LOOPBACK}:{link.port}"
        cli_home = tmp_path / "cli-home"
        sl.write_cli_config(cli_home, {"secure": {"address": address, "root-certificates": str(tls.ca_cert)}})
        reg = sl.flwr_cli(["supernode", "register", str(good_pub), "secure"], home=cli_home)
        assert reg.returncode == 0 and "registered" in reg.stdout, reg.stdout + reg.stderr

        common = dict(superlink=address, root_certificates=tls.ca_cert, ready_timeout_s=None)
        good = sl.start_supernode(tmp_path, "site0", node_config={"partition-id": 0},
                                  auth_private_key=good_key, **common)
        procs.append(good)
        bad = sl.start_supernode(tmp_path, "intruder", node_config={"partition-id": 1},
                                 auth_private_key=bad_key, **common)
        procs.append(bad)

        code = bad.wait_exit(90)
        assert code not in (None, 0), bad.log_text()
        assert "Failed to activate SuperNode" in bad.log_text() or "305" in bad.log_text()

        deadline = time.monotonic() + 60
        online = []
        while time.monotonic() < deadline:
            res = sl.flwr_cli(["supernode", "list", "secure", "--format", "json"], home=cli_home)
            if res.returncode == 0:
                online = [n for n in json.loads(res.stdout)["nodes"] if n["status"] == "online"]
                if online:
                    break
            time.sleep(1)
        assert len(online) == 1, res.stdout + res.stderr
        assert good.alive(), good.log_text()
    finally:
        sl.stop_all(reversed(procs))
    assert not any(p.alive() for p in procs)


@pytest.mark.slow
def test_stopped_supernode_costs_one_deadline_and_the_run_exits(tmp_path):
    """Case 3 through a real SuperLink: SuperNode 1 is frozen (SIGSTOP) once round 1 starts. Round
    1 waits one deadline for it; round 2 does not ask it again (its message is outstanding) and
    finishes with SuperNode 0 alone; ``flwr run`` then exits 0."""
    import os
    import queue
    import signal
    import subprocess
    import threading

    deadline_s = 60  # a healthy SuperNode answers in 5-30 s here (a fresh ClientApp process per message)
    app = sl.stage_app(ROOT, tmp_path / "lensemble")
    use_fake_apps(app)
    run_dir = tmp_path / "run"
    procs: list[sl.FlowerProcess] = []
    stopped: list[int] = []
    try:
        _, cli_home = sl.start_loopback_federation(tmp_path, procs, env_extra=FAKES_PATH)
        run_config = (f"overrides='experiment=micro federation.rounds=3 federation.min_participants=1 "
                      f"federation.round_timeout_s={deadline_s}' run-dir='{run_dir}'")
        argv = [str(sl.venv_bin() / "flwr"), "run", ".", "loopback", "--stream", "--run-config", run_config]
        cli = subprocess.Popen(argv, cwd=app, env=sl.flower_env(cli_home, FAKES_PATH), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in cli.stdout] + [lines.put(None)], daemon=True).start()
        out: list[str] = []
        end = time.monotonic() + 480
        while time.monotonic() < end:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            out.append(line)
            if "[lensemble] round 1/3:" in line and not stopped:
                os.kill(procs[2].pid, signal.SIGSTOP)  # freeze SuperNode 1: alive, silent
                stopped.append(procs[2].pid)
        code = cli.wait(timeout=max(1, end - time.monotonic()))
        text = "".join(out)
        assert code == 0, text
        assert stopped, text
        rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
        assert [r["participants"] for r in rounds] == [["silo-0", "silo-1"], ["silo-0"], ["silo-0"]], text
        # round 1 waits for it at most one deadline: until the deadline, or until the SuperLink
        # reports it offline (its heartbeats lapse 30-60 s after the freeze), whichever comes first
        (why,) = rounds[1]["failures"].values()
        assert list(rounds[1]["failures"]) == ["silo-1"]
        if why == f"did not reply within {deadline_s} s":
            assert rounds[1]["seconds"] >= deadline_s
        else:
            assert why.startswith("went offline (missed heartbeats)"), why
        assert f"silo-1 {why}; quorum 1 met by silo-0" in text
        # never asked again: round 2 names it busy (or nothing, once it is off the grid), and
        # costs no second deadline
        assert rounds[2]["failures"].get("silo-1", "is still busy with round 1").startswith("is still busy with round 1")
        assert rounds[2]["seconds"] < deadline_s
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        sl.stop_all(reversed(procs))
    assert not any(p.alive() for p in procs)


@pytest.mark.slow
def test_hung_client_on_the_ray_simulation_costs_one_deadline_and_flwr_run_returns(tmp_path):
    """Case 3 on Flower's Ray simulation (a simulation SuperLink, as ``--engine ray`` runs it):
    virtual client 1 hangs (for an hour) in round 2 of 4. Round 2 costs one deadline, round 3
    queues nothing behind the hung actor and finishes with client 0 alone, and when the ServerApp
    ends its busy actor is killed, so the simulation and ``flwr run`` return (before, Flower's
    runtime waited for the actor forever). Rounds 0-1 absorb Ray's start-up."""
    app = sl.stage_app(ROOT, tmp_path / "lensemble")
    use_fake_apps(app, "hung_clientapp")
    run_dir = tmp_path / "run"
    procs: list[sl.FlowerProcess] = []
    deadline_s = 45
    try:
        link = sl.start_superlink(tmp_path, simulation=True, env_extra=FAKES_PATH)
        procs.append(link)
        cli_home = tmp_path / "cli-home"
        sl.write_cli_config(cli_home, {"sim": {"address": f"{sl.LOOPBACK}:{link.port}", "insecure": True}})
        run_config = (f"overrides='experiment=micro federation.rounds=4 federation.min_participants=1 "
                      f"federation.round_timeout_s={deadline_s} federation.round_retries=3' run-dir='{run_dir}'")
        res = sl.flwr_cli(["run", ".", "sim", "--stream", "--run-config", run_config, "--federation-config",
                           "num-supernodes=2 client-resources-num-cpus=1"],
                          home=cli_home, cwd=app, timeout_s=600, env_extra=FAKES_PATH)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-4000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["rounds"] == 4, out[-4000:]  # finished, although client 1 still "runs"
        rounds = [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]
        assert [r["participants"] for r in rounds[2:]] == [["silo-0"], ["silo-0"]], out[-4000:]
        assert rounds[2]["failures"] == {"silo-1": f"did not reply within {deadline_s} s"}
        assert rounds[3]["failures"]["silo-1"].startswith("is still busy with round 2")
        assert rounds[3]["seconds"] < deadline_s  # no second deadline, no actor taken from silo-0
    finally:
        sl.stop_all(reversed(procs))
    assert not any(p.alive() for p in procs)
