"""A study keeps its warm starts in its committed folder and resumes from them (issue 32: the
pooled study's warm starts were lost with the machine that trained them, and a retrained one
differs on another CPU)."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from lensemble.artifacts.checkpoint import read_header, save_checkpoint
from lensemble.errors import CheckpointIntegrityError, ConfigError
from lensemble.study import warmstarts
from lensemble.study.files import write_summary
from lensemble.study.runner import _Runner


def _ckpt(folder, value: float) -> str:
    return save_checkpoint(folder, {"w": torch.full((4, 3), value)}, kind="warmstart")


def test_keep_copies_once_and_refuses_another_warm_start(tmp_path):
    study = tmp_path / "study"
    h = _ckpt(tmp_path / "a", 1.0)
    kept = warmstarts.keep(study, "warmstart-s0", tmp_path / "a")
    assert kept == warmstarts.kept_path(study, "warmstart-s0")
    assert read_header(kept)["content_hash"] == h
    assert warmstarts.keep(study, "warmstart-s0", tmp_path / "a") == kept  # idempotent
    _ckpt(tmp_path / "b", 2.0)
    with pytest.raises(ValueError, match="keeps warm start"):
        warmstarts.keep(study, "warmstart-s0", tmp_path / "b")


def test_restore_checks_the_weights_against_the_recorded_hash(tmp_path):
    study = tmp_path / "study"
    assert warmstarts.restore(study, "warmstart-s0", tmp_path / "dest", "0" * 64) is False  # none kept
    h = _ckpt(tmp_path / "a", 1.0)
    warmstarts.keep(study, "warmstart-s0", tmp_path / "a")
    assert warmstarts.restore(study, "warmstart-s0", tmp_path / "dest", h) is True
    assert read_header(tmp_path / "dest")["content_hash"] == h
    with pytest.raises(CheckpointIntegrityError):  # a kept copy of another warm start than recorded
        warmstarts.restore(study, "warmstart-s0", tmp_path / "dest2", "f" * 64)
    # a corrupted kept copy (its weights' bytes changed, the header kept) is refused too
    weights = next(p for p in warmstarts.kept_path(study, "warmstart-s0").iterdir() if p.name != "header.json")
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointIntegrityError):
        warmstarts.restore(study, "warmstart-s0", tmp_path / "dest3", h)


def test_machine_difference_names_both_machines():
    intel = {"cpu": "Intel(R) Xeon(R) Processor", "torch_cpu_capability": "AVX512", "mkl_mode": "BRANCH_OFF"}
    amd = {"cpu": "AMD EPYC", "torch_cpu_capability": "AVX512", "mkl_mode": "BRANCH_OFF"}
    assert warmstarts.machine_difference(intel, dict(intel)) == ""
    text = warmstarts.machine_difference(intel, amd)
    assert "Intel(R) Xeon(R) Processor" in text and "AMD EPYC" in text
    assert "names no machine" in warmstarts.machine_difference(None, amd)


def _runner(tmp_path, executed: list, new_hash_value: float):
    study, scratch = tmp_path / "study", tmp_path / "scratch"
    plan = SimpleNamespace(runs={"warmstart-s0": SimpleNamespace(run_id="warmstart-s0")})
    runner = _Runner(SimpleNamespace(name="t"), plan, study, scratch, progress=False)

    def execute(run):  # stands in for training: writes a checkpoint where training would
        executed.append(run.run_id)
        h = _ckpt(scratch / run.run_id / "checkpoints" / "step-000003", new_hash_value)
        return {"checkpoint_hash": h, "checkpoint_rel": "checkpoints/step-000003",
                "numerics": {"cpu": "AMD EPYC", "torch_cpu_capability": "AVX512"}}

    runner._execute = execute
    return runner, study, scratch


def test_a_resume_without_the_scratch_copy_restores_the_kept_warm_start(tmp_path):
    executed: list = []
    runner, study, scratch = _runner(tmp_path, executed, 1.0)
    first = runner.warmstart_checkpoint("warmstart-s0")  # trained, recorded by the caller, kept
    rec = {"checkpoint_hash": read_header(first)["content_hash"], "checkpoint_rel": "checkpoints/step-000003",
           "numerics": {"cpu": "Intel(R) Xeon(R) Processor", "torch_cpu_capability": "AVX512"}}
    write_summary(study, "warmstart-s0", rec)
    assert executed == ["warmstart-s0"] and warmstarts.kept_path(study, "warmstart-s0").exists()

    shutil.rmtree(scratch)  # the machine that trained it is gone
    again, _, _ = _runner(tmp_path, executed, 2.0)  # retraining would now give other weights
    folder = again.warmstart_checkpoint("warmstart-s0")
    assert executed == ["warmstart-s0"]  # restored, not retrained
    assert read_header(folder)["content_hash"] == rec["checkpoint_hash"]


def test_a_lost_warm_start_that_retrains_differently_is_refused_naming_the_machines(tmp_path):
    executed: list = []
    runner, study, scratch = _runner(tmp_path, executed, 2.0)
    rec = {"checkpoint_hash": "a" * 64, "checkpoint_rel": "checkpoints/step-000003",
           "numerics": {"cpu": "Intel(R) Xeon(R) Processor", "torch_cpu_capability": "AVX512"}}
    (study / "runs").mkdir(parents=True)
    (study / "runs" / "warmstart-s0.json").write_text(json.dumps(rec))
    with pytest.raises(ConfigError) as err:
        runner.warmstart_checkpoint("warmstart-s0")
    text = str(err.value)
    assert "Intel(R) Xeon(R) Processor" in text and "AMD EPYC" in text and "not bit-identical" in text
    assert not warmstarts.kept_path(study, "warmstart-s0").exists()  # the differing one is not kept

