"""What outlives a SIGKILLed driver can neither run on nor write (issue 33, item 3), piece by piece:
the delegated run-folder hold, the guardian that reaps the tree, the ServerApp's owner watch and
the parent-death signal. The whole chain on a real ``lensemble run`` is
tests/integration/test_flwr_runtime_teardown.py."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from lensemble.errors import RunOwnerGone
from lensemble.federation.flower.server_app import watch_owner
from lensemble.federation.locks import DELEGATE_ENV, lock_folder, process_alive, start_time

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and prctl")

# A stand-in driver: holds the folder, prints {"env": delegate_env, "pids": [...]}, then obeys
# stdin ("release", "done") until killed. With "tree", it also starts the guardian and a child in
# a session of its own (as the SuperLink starts SuperExec) that has a child of its own.
DRIVER = r"""
import json, os, subprocess, sys, time
from pathlib import Path
from lensemble.federation.locks import delegate_env, lock_folder
folder, mode = sys.argv[1], sys.argv[2]
hold = lock_folder(folder, what="run folder")
out = {"env": delegate_env(folder), "pids": []}
guardian = None
if mode in ("tree", "parent-death"):
    from lensemble.federation.flower.guardian import start_guardian
    from lensemble.federation.flower.processes import die_with_parent
    if mode == "tree":
        guardian = start_guardian(Path(folder) / "guardian.log")
        out["guardian"] = guardian.popen.pid
    child = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; g = subprocess.Popen(['sleep', '300']); print(g.pid, flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True, start_new_session=(mode == "tree"),
        preexec_fn=die_with_parent() if mode == "parent-death" else None)
    out["pids"] = [child.pid, int(child.stdout.readline())]
    if guardian is not None:
        guardian.watch(child.pid)
print(json.dumps(out), flush=True)
for line in sys.stdin:
    if line.strip() == "release":
        hold.release()
    if line.strip() == "done" and guardian is not None:
        for pid in out["pids"]:
            os.kill(pid, 9)
        guardian.done()
    print("ok", flush=True)
"""


def _driver(folder, mode="plain"):
    env = {k: v for k, v in os.environ.items() if k != DELEGATE_ENV}  # a driver of its own, not a delegate
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(folder), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line, "the stand-in driver did not start"
    return proc, json.loads(line)


def _tell(proc, word):
    proc.stdin.write(word + "\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ok"


def _gone_within(pids, deadline_s):
    starts = {p: start_time(p) for p in pids}
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not any(process_alive(p, s) for p, s in starts.items() if s is not None):
            return True
        time.sleep(0.1)
    return False


def _kill(proc, pids=()):
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def test_delegated_hold_refuses_once_the_driver_is_killed(tmp_path, monkeypatch):
    proc, info = _driver(tmp_path / "run")
    try:
        monkeypatch.setenv(DELEGATE_ENV, info["env"][DELEGATE_ENV])
        hold = lock_folder(tmp_path / "run", what="run folder")  # the driver holds the flock: delegated
        assert hold.delegated
        hold.verify()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        with pytest.raises(RunOwnerGone, match=f"PID {proc.pid}.* is gone"):
            hold.verify()
        with pytest.raises(RunOwnerGone):  # nor can a process started for it take the folder now
            lock_folder(tmp_path / "run", what="run folder")
    finally:
        _kill(proc)


def test_delegated_hold_refuses_once_another_run_holds_the_folder(tmp_path, monkeypatch):
    proc, info = _driver(tmp_path / "run")
    second = None
    try:
        monkeypatch.setenv(DELEGATE_ENV, info["env"][DELEGATE_ENV])
        hold = lock_folder(tmp_path / "run", what="run folder")
        _tell(proc, "release")  # the driver lives on but let go; a rerun takes the folder
        second, _ = _driver(tmp_path / "run")
        with pytest.raises(RunOwnerGone, match=f"now names PID {second.pid}"):
            hold.verify()
    finally:
        _kill(proc)
        if second is not None:
            _kill(second)


def test_guardian_reaps_a_detached_tree_when_the_driver_is_killed(tmp_path):
    proc, info = _driver(tmp_path / "run", "tree")
    pids = info["pids"]  # a child in its own session and its grandchild
    try:
        time.sleep(1.5)  # the guardian records the tree every 0.5 s
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone_within(pids + [info["guardian"]], 20), "the guardian left the tree running"
        assert "killed 2 process(es)" in (tmp_path / "run" / "guardian.log").read_text()
    finally:
        _kill(proc, pids)


def test_guardian_told_done_kills_nothing(tmp_path):
    proc, info = _driver(tmp_path / "run", "tree")
    try:
        time.sleep(1.0)
        _tell(proc, "done")  # the driver stopped its tree itself (here: SIGKILL by PID)
        assert _gone_within([info["guardian"]], 20)
        assert "killed" not in (tmp_path / "run" / "guardian.log").read_text()
    finally:
        _kill(proc, info["pids"])


def test_a_direct_child_dies_with_its_parent(tmp_path):
    proc, info = _driver(tmp_path / "run", "parent-death")
    child, grandchild = info["pids"]
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone_within([child], 20), "PR_SET_PDEATHSIG did not end the child"
    finally:
        _kill(proc, [child, grandchild])


def test_server_app_watch_ends_an_orphan(tmp_path, monkeypatch):
    proc, info = _driver(tmp_path / "run")
    gone = threading.Event()
    reasons = []
    try:
        monkeypatch.setenv(DELEGATE_ENV, info["env"][DELEGATE_ENV])
        assert watch_owner(poll_s=0.1, on_gone=lambda why: (reasons.append(why), gone.set()))
        time.sleep(0.5)
        assert not gone.is_set()  # the driver lives: nothing happens
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert gone.wait(10), "the watch did not notice the driver's death"
        assert f"PID {proc.pid}" in reasons[0]
    finally:
        _kill(proc)
    monkeypatch.delenv(DELEGATE_ENV)
    assert not watch_owner()  # outside a driver's tree it does nothing
