"""Collection workers (lensemble/data/workers.py): fresh processes with MKL's COMPATIBLE code path.

The adversarial case for a pinned code path is a caller that has already run MKL in another mode:
a fork of it would inherit that mode, and its frames would depend on the CPU. The workers must
report COMPATIBLE whatever the caller did, keep task order, surface a worker's error, and never
re-run an unguarded caller script (what a multiprocessing spawn pool would do).
"""

import os
import subprocess
import sys
import textwrap

import pytest

from lensemble.data.workers import WorkerPool, serve
from lensemble.errors import CollectionError


def test_workers_run_compatible_mkl_whatever_the_caller_ran(tmp_path):
    # The caller: MKL in AVX2 mode, already used (set in a child process that then starts a pool).
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent("""
        import torch
        from lensemble.numerics import mkl_mode
        torch.exp(torch.randn(4096)); torch.randn(64, 64) @ torch.randn(64, 64)
        from lensemble.data.workers import WorkerPool
        pool = WorkerPool(1)
        print("caller", mkl_mode(), "workers", *pool.mkl_modes)
        pool.close()
    """))
    env = {**os.environ, "MKL_CBWR": "AVX2"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    if "caller no-mkl" in out.stdout:
        pytest.skip("torch without MKL: nothing to pin")
    # the caller keeps its own mode (AVX2 on an Intel CPU; MKL ignores that request on an AMD one and
    # runs its automatic choice, "AUTO", measured on a Zen 4 EPYC); its worker runs the pinned one
    words = out.stdout.split()
    caller, workers = words[words.index("caller") + 1], words[words.index("workers") + 1:]
    assert caller in ("AVX2", "AUTO", "BRANCH_OFF") and caller != "COMPATIBLE", out.stdout
    assert workers == ["COMPATIBLE"], out.stdout
    assert os.environ.get("MKL_CBWR") != "AVX2"  # the parent's environment is not touched


def test_pool_keeps_order_and_raises_worker_errors(monkeypatch):
    # Tasks of the real worker loop, served in-process through pipes: order and errors.
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    with os.fdopen(w1, "wb") as tasks_w:
        import pickle
        import struct

        for task in ((1,), (2,), ("boom",), None):
            data = pickle.dumps(task)
            tasks_w.write(struct.pack("<Q", len(data)) + data)

    def run(task):
        if task[0] == "boom":
            raise ValueError("bad task")
        return task[0] * 10

    with os.fdopen(r1, "rb", buffering=0) as tin, os.fdopen(w2, "wb") as rout:
        serve(run, tin, rout)
    from lensemble.data.workers import _receive

    with os.fdopen(r2, "rb", buffering=0) as rin:
        replies = [_receive(rin, 5.0) for _ in range(4)]
    assert replies[0][0] == "ready"
    assert replies[1] == ("ok", 10) and replies[2] == ("ok", 20)
    assert replies[3][0] == "error" and "bad task" in replies[3][1] and replies[3][2] == "ValueError"


def test_a_failing_task_raises_collection_error_and_stops_the_workers():
    pool = WorkerPool(2)
    procs = list(pool.procs)
    with pytest.raises(CollectionError, match="collection worker failed"):
        list(pool.map([("no-such-env", 16, 0, {}, 2, 0.5)]))
    assert all(p.poll() is not None for p in procs)


def test_an_unguarded_script_collects_once(tmp_path):
    # A spawn pool would re-run this module-level code in each worker (and hang restarting them).
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        from lensemble.config.schema import LensembleConfig
        from lensemble.data import collect_silos
        cfg = LensembleConfig.model_validate({{"model": {{"img_size": 16, "patch_size": 8}},
            "data": {{"num_silos": 2, "episodes_per_silo": 1, "steps_per_episode": 4, "heldout_episodes": 1,
                     "probe_frames": 4, "public_episodes": 1, "workers": 2}}}})
        collect_silos(cfg, {str(tmp_path / "data")!r}, progress=False)
        print("collected")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("collected") == 1
