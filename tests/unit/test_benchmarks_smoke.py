"""Smoke tests: the train-step and federation benchmarks run at their smallest size and print
their result lines. No timing is asserted (2 shared cores): only that the ratios are printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str, timeout: int = 600) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", FLWR_TELEMETRY_ENABLED="0")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_bench_train_step_small_prints_ratio():
    out = _run("bench_train_step.py", "--small", "--reps", "2", "--steps", "2", "--warmup", "1",
               "--threads", "1")
    assert re.search(r"^ratio InnerLoop/bare steps/s: \d+\.\d+ \(goal >= 0\.9\)", out, re.M), out
    assert re.search(r"^diagnostics cost: ", out, re.M), out


def test_bench_federation_small_prints_overhead_and_bytes(tmp_path):
    out = _run("bench_federation.py", "--small", "--rounds", "1", "--inner-steps", "1",
               "--workdir", str(tmp_path))
    for engine in ("inprocess", "flower"):
        assert re.search(rf"^overhead share {engine}: median -?\d+\.\d+% of the round", out, re.M), out
        for codec in ("fp32", "int8"):
            assert re.search(rf"^bytes {engine} {codec}: uplink delta rel diff [+-]\d+\.\d+%", out, re.M), out
    # the codec's byte prediction is exact for the in-process engine (no wire framing at all)
    assert "bytes inprocess fp32: uplink delta rel diff +0.000%" in out, out


def test_bench_secagg_small_prints_the_ratios(tmp_path):
    out = _run("bench_secagg.py", "--small", "--rounds", "1", "--inner-steps", "1", "--warmstart-steps", "5",
               "--workdir", str(tmp_path))
    assert re.search(r"^ratio secure/plain bytes per round: \d+\.\d+x \(protobuf \d+\.\d+x\); "
                     r"seconds per round: \d+\.\d+x; seconds beyond compute: -?\d+\.\d+x", out, re.M), out


def test_bench_pooled_small_prints_the_ratios(tmp_path):
    out = _run("bench_pooled.py", "--small", "--rounds", "1", "--inner-steps", "1", "--warmstart-steps", "5",
               "--workdir", str(tmp_path), "objective.summary_clips=8")
    assert re.search(r"^ratio pooled/silo bytes per round: \d+\.\d+x \(protobuf \d+\.\d+x\); without the kept "
                     r"global: \d+\.\d+x; seconds per round: \d+\.\d+x; seconds beyond compute: -?\d+\.\d+x",
                     out, re.M), out


def test_bench_drift_mask_prints_the_ratios_and_identical_reports():
    out = _run("bench_drift_mask.py", "-C", "4", "--reps", "1", timeout=120)
    assert re.search(r"ratio mask/raise \d+\.\d+; reports identical: True", out), out
    assert re.search(r"\(ratio \d+\.\d+, for \d+ pairs instead of \d+\)", out), out
    assert "subspace angles to the global: 4 of 4 measured" in out, out


def test_bench_pusht_oracle_prints_the_ratio_and_the_difference():
    out = _run("bench_pusht_oracle.py", "--sequences", "4")
    assert re.search(r"^ratio shadow/env steps/s: \d+\.\d+$", out, re.M), out
    m = re.search(r"^max \|embedding difference\| shadow vs env at the last step: (\S+) px$", out, re.M)
    assert m and float(m.group(1)) < 2.0, out  # within a tenth of PushT's 20 px success tolerance


def test_bench_precision_small_prints_ratios_and_peak_shares():
    out = _run("bench_precision.py", "--small", "--reps", "1")
    assert re.search(r"^peak matmul: fp32 \d+\.\d GFLOP/s, bf16 \d+\.\d GFLOP/s", out, re.M), out
    for name in ("train step", "plan call"):
        m = re.search(rf"^{name}: (\d+\.\d+) GFLOP per \w+; fp32 .* of its peak\); bf16 .* of its peak\)$", out, re.M)
        assert m and float(m.group(1)) > 0, out  # FLOPs counted from the model's shapes
        assert re.search(rf"^ratio {name} fp32/bf16 time: \d+\.\d+x", out, re.M), out


def test_bench_compile_small_prints_eager_and_compiled_ratios():
    import shutil

    import pytest

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("torch.compile's CPU backend needs a C++ compiler")
    out = _run("bench_compile.py", "--small", "--reps", "1")
    for name in ("plan", "train"):
        for p in ("fp32", "bf16"):
            assert re.search(rf"^{name} {p}: eager \d+ ms, compiled \d+ ms \(eager/compiled \d+\.\d\dx; ", out, re.M), out
