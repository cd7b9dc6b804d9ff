"""The fault-injection hook (federation/faults.py) and the folder locks (federation/locks.py)."""

import pickle
import subprocess
import sys
import time

import numpy as np
import pytest

from lensemble.errors import FolderInUse, RoundError
from lensemble.federation.faults import faulty
from lensemble.federation.locks import LOCK_NAME, held_by_this_process, lock_folder
from lensemble.federation.messages import NodeSpec, Reply


def honest(cfg, node, global_arrays, round_config, extras=None):
    return Reply(int(round_config["round"]), {"fp32": np.ones(3, np.float32)}, np.ones((4, 2), np.float32),
                 {"loss": 1.0})


NODE = NodeSpec(1, None, "/nonexistent")


def _ask(participant, t, node=NODE):
    return participant(None, node, {}, {"round": t})


def test_each_fault_does_what_it_says():
    plan = {(0, 1): "crash", (1, 1): "nan-delta", (2, 1): "nan-embeddings",
            (3, 1): "wrong-shape-embeddings", (4, 1): "wrong-round", (5, 1): "slow:0.2", ("*", 0): "crash"}
    p = faulty(honest, plan)
    with pytest.raises(RoundError, match="injected crash"):
        _ask(p, 0)
    assert np.isnan(_ask(p, 1).payload["fp32"]).all()
    assert np.isnan(_ask(p, 2).probe_embeddings).all()
    assert _ask(p, 3).probe_embeddings.shape == (5, 3)
    assert _ask(p, 4).round_index == 5
    start = time.monotonic()
    assert _ask(p, 5).metrics == {"loss": 1.0}
    assert time.monotonic() - start >= 0.2
    assert _ask(p, 6).round_index == 6  # nothing planned: the honest reply
    with pytest.raises(RoundError):  # "*": every round of partition 0
        _ask(p, 9, NodeSpec(0, None, "/nonexistent"))


def test_hang_blocks_then_never_answers():
    p = faulty(honest, {(0, 1): "hang"}, hang_s=0.3)
    start = time.monotonic()
    with pytest.raises(RoundError, match="hang"):
        _ask(p, 0)
    assert time.monotonic() - start >= 0.3


def test_plans_are_checked_and_the_wrapper_pickles():
    with pytest.raises(ValueError, match="unknown fault"):
        faulty(honest, {(0, 1): "explode"})
    with pytest.raises(ValueError, match="keys"):
        faulty(honest, {0: "crash"})
    p = pickle.loads(pickle.dumps(faulty(honest, {(0, 1): "crash"})))  # Ray ships the ClientApp
    with pytest.raises(RoundError):
        _ask(p, 0)


def test_folder_lock_is_reentrant_here_and_refused_elsewhere(tmp_path):
    hold = lock_folder(tmp_path / "run", what="run folder")
    again = lock_folder(tmp_path / "run")  # same process: re-entered
    assert held_by_this_process(tmp_path / "run")
    code = ("import sys; from lensemble.federation.locks import lock_folder\n"
            "try:\n    lock_folder(sys.argv[1], what='run folder')\n"
            "except Exception as e:\n    print(type(e).__name__, e.message)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=120).stdout
    assert out.startswith("FolderInUse run folder") and "PID " in out and "pytest" in out
    again.release()
    assert held_by_this_process(tmp_path / "run")  # one hold left
    hold.release()
    assert not held_by_this_process(tmp_path / "run")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                         timeout=120).stdout
    assert out == ""  # free again
    assert (tmp_path / "run" / LOCK_NAME).exists()


def test_folder_in_use_is_a_lensemble_error():
    assert FolderInUse("x").code == "folder_in_use"
