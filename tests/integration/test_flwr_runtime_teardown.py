"""The ray engine's processes (SuperLink, SuperExec, simulation runtime, Ray) end with the run,
also when the run is stopped with SIGTERM (a scheduler, ``kill``) half-way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from lensemble.federation.flower.processes import descendants


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
