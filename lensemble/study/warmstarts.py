"""A study's warm starts kept in its committed folder, so that it resumes from what is committed.

Every arm of a seed starts from that seed's warm start, so a resumed study must use the very
checkpoint its finished runs used. Training is not bit-identical across CPUs (oneDNN and MKL pick
their kernels per machine; :mod:`lensemble.numerics`), so retraining a lost warm start elsewhere gives
another one. Measured on 2026-12-06: the pooled study's seed-0 warm start, trained on an Intel Xeon
(AVX-512), hashed ``847ad0a4…``; retrained from the same data (probe ``67e78ea0…``) and code on an
AMD EPYC (Zen 4) it hashed ``30ebbc83…``, and the study refused to go on, because its scratch
folder, the only copy, had gone with the first machine.

So a study copies each warm start's checkpoint (``header.json`` and the fp32 weights, 4.9 MB at
the CPU preset) into ``<study>/warmstarts/<run_id>/`` as soon as it exists, and restores it from
there, hash-checked, when its scratch folder is gone. Warm starts train on the public split only
(``PlannedRun.source == "public"``), so the copy moves no silo's data; the write still goes
through the residency guard.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from lensemble.artifacts.checkpoint import load_checkpoint, read_header
from lensemble.data.residency import guard_export
from lensemble.errors import ArtifactError

WARMSTARTS = "warmstarts"


def kept_path(study_dir: str | Path, run_id: str) -> Path:
    """Where the study folder keeps the checkpoint of warm start ``run_id``."""
    return Path(study_dir) / WARMSTARTS / run_id


def holds(folder: str | Path, expected_hash: str) -> bool:
    """Whether ``folder`` holds checkpoint ``expected_hash``: its weights are read and hashed, not
    only its header (issue 47: a scratch copy whose weights changed under an intact header was
    used, and kept)."""
    if not (Path(folder) / "header.json").exists():
        return False
    try:
        load_checkpoint(folder, expected_hash=expected_hash)
    except ArtifactError:  # CheckpointIntegrityError and an unreadable header alike
        return False
    return True


def keep(study_dir: str | Path, run_id: str, folder: str | Path) -> Path:
    """Copy the checkpoint ``folder`` into the study folder (once: a kept copy with the same content
    hash is left alone; one with another hash is an error, since finished runs may depend on it).

    Both are compared by content: ``folder``'s weights are verified against its header before they
    are copied (CheckpointIntegrityError otherwise), and a kept copy whose header names the same
    hash but whose weights no longer match it (corrupted) is replaced by the verified ``folder``."""
    dest = kept_path(study_dir, run_id)
    want = load_checkpoint(folder).header["content_hash"]  # raises on weights that do not match the header
    if (dest / "header.json").exists():
        have = read_header(dest)["content_hash"]
        if have != want:
            raise ValueError(f"{dest} keeps warm start {have[:12]}…, not {want[:12]}…: remove it only if no "
                             "finished run of the study used it")
        if holds(dest, want):
            return dest
        # same warm start by its header, damaged weights: the verified copy replaces it
    guard_export(dest)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    if dest.exists():
        shutil.rmtree(dest)  # only a damaged copy of this very warm start gets here
    os.replace(tmp, dest)  # a study killed mid-copy leaves a .tmp folder, never half a warm start
    return dest


def restore(study_dir: str | Path, run_id: str, dest: str | Path, expected_hash: str) -> bool:
    """Put the kept warm start ``run_id`` back at ``dest`` (its scratch checkpoint folder) after
    verifying its weights against ``expected_hash`` (the recorded summary's). False when none is kept."""
    src = kept_path(study_dir, run_id)
    if not (src / "header.json").exists():
        return False
    load_checkpoint(src, expected_hash=expected_hash)  # raises on a corrupted or substituted copy
    dest = Path(dest)
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dest)
    return True


def machine_difference(recorded: dict | None, current: dict) -> str:
    """A phrase naming how the machine that trained a recorded run differs from this one (two
    :func:`lensemble.numerics.numerics_record` dicts), or "" when they look alike."""
    if not recorded:
        return "the recorded run names no machine"
    keys = ("cpu", "torch_cpu_capability")
    if all(recorded.get(k) == current.get(k) for k in keys):
        return ""
    then = " / ".join(str(recorded.get(k)) for k in keys)
    here = " / ".join(str(current.get(k)) for k in keys)
    return f"it was trained on {then} and this machine is {here}"
