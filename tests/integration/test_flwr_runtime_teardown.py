"""The ray engine's processes (SuperLink, SuperExec, simulation runtime, Ray) end with the run,
also when the run is stopped with SIGTERM (a scheduler, ``kill``) half-way, and when its driver is
SIGKILLed (nothing can clean up then: the guardian, the parent-death signal and the delegated
run-folder lock do; issue 33)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from lensemble.federation.flower.processes import descendants, port_open, processes_mentioning
from lensemble.federation.locks import process_alive, start_time


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie is as good as gone
        stat = fh.read()
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


@pytest.mark.slow
def test_sigterm_stops_the_superlink_tree(tmp_path):
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    proc = subprocess.Popen([sys.executable, "-m", "lensemble", "run", "--no-eval", "experiment=micro",
                             "federation.rounds=3", "run_dir=run"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        family: list[int] = []
        while time.monotonic() < deadline:  # wait until the simulation runtime is up under the link
            family = descendants(proc.pid)
            names = []
            for pid in family:
                try:
                    names.append(open(f"/proc/{pid}/cmdline").read())
                except OSError:
                    pass
            if any("flwr-simulation" in n or "flower-superexec" in n for n in names):
                break
            assert proc.poll() is None, "the run ended before the runtime started"
            time.sleep(1.0)
        else:
            pytest.fail("the Flower simulation runtime never started")
        time.sleep(3.0)
        family = descendants(proc.pid)
        assert family
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
        end = time.monotonic() + 30
        while time.monotonic() < end and any(_alive(p) for p in family):
            time.sleep(0.5)
        assert not [p for p in family if _alive(p)]
    finally:
        if proc.poll() is None:
            proc.kill()


def _committed(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "rounds").glob("round-*") if (p / "state" / "header.json").exists())


def _port_holders(port: int) -> list[int]:
    # the SuperLink (--port N), SuperExec and flwr-simulation (127.0.0.1:N) name the port
    return sorted(set(processes_mentioning(f"--port {port} ")) | set(processes_mentioning(f"127.0.0.1:{port} ")))


@pytest.mark.slow
def test_sigkill_of_the_driver_leaves_nothing_running_nor_writing(tmp_path):
    """Issue 33, item 3: before, a SIGKILLed `lensemble run` left 12 processes that committed the
    remaining rounds into the run folder, and the rerun printed tracebacks."""
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    argv = [sys.executable, "-m", "lensemble", "run", "--no-eval", "experiment=micro", "federation.rounds=8",
            "run_dir=run"]
    run_dir = tmp_path / "run"
    log = open(tmp_path / "driver.log", "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    family: dict[int, int | None] = {}  # pid -> start time (a PID reused later is not ours)
    port = None

    def record() -> None:
        for pid in descendants(proc.pid):
            family.setdefault(pid, start_time(pid))

    def alive() -> set[int]:
        return {p for p, start in family.items() if start is not None and process_alive(p, start)}

    try:
        deadline = time.monotonic() + 300
        while not _committed(run_dir):  # a round committed: the federation is training
            assert proc.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no round was committed within 300 s"
            record()
            time.sleep(0.2)
        record()
        for pid in family:
            try:
                cmd = open(f"/proc/{pid}/cmdline").read().split("\0")
            except OSError:
                continue
            if any(c.endswith("flower-superlink") for c in cmd) and "--port" in cmd:
                port = int(cmd[cmd.index("--port") + 1])
        assert port is not None and len(family) >= 8, f"the run's tree was not seen: {sorted(family)}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        at_kill = _committed(run_dir)

        end = time.monotonic() + 30
        while time.monotonic() < end and (alive() or _port_holders(port)):
            time.sleep(0.5)
        left = sorted(alive() | set(_port_holders(port)))
        assert not left, f"{len(left)} process(es) outlived the driver: {left}"
        assert not port_open("127.0.0.1", port)
        assert _committed(run_dir) == at_kill  # nothing was committed after the driver died
        assert at_kill != [f"round-{t:04d}" for t in range(8)], "the run finished before the kill"

        rerun = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        out = rerun.stdout + rerun.stderr
        assert rerun.returncode == 0, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 8
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
        leftovers = alive() | (set(_port_holders(port)) if port else set())
        for pid in leftovers:  # by PID, only what this test's run started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
