"""The study folder's files: atomic writes that honour data residency, and the run summaries.

Everything the study writes into its folder (``docs/results/<study>/``) is meant to be committed
and shared, so every write goes through :func:`atomic_write`, which refuses a destination inside a
silo's private folder (:func:`lensemble.data.residency.guard_export`) before writing. The layout:

* ``runs/<run_id>.json``: the summary of one finished run; its presence is what "done" means;
* ``runs/<run_id>.failed.json``: the last failure of a run not yet done (retried on the next call);
* ``remeasured/<run_id>.json``: round metrics of a finished run re-measured by replaying its rounds
  (``examples/remeasure_drift.py``); they fill a recorded round's missing values, never replace one.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from lensemble.data.residency import guard_export

RUNS = "runs"
FAILED_SUFFIX = ".failed.json"


def now() -> str:
    """The current UTC time, ISO 8601 to the second (the timestamps of registry and summaries)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def atomic_write(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a reader (or a study
    killed mid-write) never sees half a file. Raises ResidencyViolation, before writing anything,
    when ``path`` lies inside a non-exportable silo folder."""
    path = Path(path)
    guard_export(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def summary_path(study_dir: str | Path, run_id: str) -> Path:
    """Where the summary of ``run_id`` lives in the study folder."""
    return Path(study_dir) / RUNS / f"{run_id}.json"


def failure_path(study_dir: str | Path, run_id: str) -> Path:
    """Where the last failure of ``run_id`` is recorded in the study folder."""
    return Path(study_dir) / RUNS / f"{run_id}{FAILED_SUFFIX}"


def write_summary(study_dir: str | Path, run_id: str, summary: dict) -> Path:
    """Write one run's summary (sorted keys, one-space indent: the committed format)."""
    path = summary_path(study_dir, run_id)
    atomic_write(path, json.dumps(summary, indent=1, sort_keys=True))
    return path


def load_summaries(study_dir: str | Path) -> dict[str, dict]:
    """Every finished run's summary in the study folder, by run id."""
    out = {}
    for p in sorted((Path(study_dir) / RUNS).glob("*.json")):
        if p.name.endswith(FAILED_SUFFIX):
            continue
        out[p.stem] = json.loads(p.read_text())
    return out


REMEASURED = "remeasured"


def _round_verified(r: dict) -> bool:
    """A replayed round committed the saved global, or reproduced every kept inner state bitwise."""
    states = r.get("state_bitwise_equal") or {}
    return r.get("global_hash_equal") is True or (bool(states) and all(v is True for v in states.values()))


def load_remeasured(study_dir: str | Path) -> dict[str, dict[int, dict]]:
    """Verified re-measured round metrics, ``{run_id: {round: metrics}}``.

    A replay file counts only when it says ``"verified": true`` (no check in it failed) and some
    round in it was verified: the replayed round committed the saved global model (same content
    hash), or every silo's replayed inner-optimizer state equals the one the run kept. Its rounds
    up to the last verified one are accepted (a later round derives from the earlier ones, so its
    equality vouches for them too); later unverified ones are not."""
    out: dict[str, dict[int, dict]] = {}
    for p in sorted((Path(study_dir) / REMEASURED).glob("*.json")):
        rec = json.loads(p.read_text())
        rounds = rec.get("replayed_rounds") or []
        if rec.get("verified") is not True:
            continue
        verified = [int(r["round"]) for r in rounds if _round_verified(r)]
        if not verified:
            continue
        out[str(rec.get("run_id", p.stem))] = {int(r["round"]): {**(r.get("metrics") or {}),
                                                                 **(r.get("pairwise_metrics") or {})}
                                               for r in rounds if int(r["round"]) <= max(verified)}
    return out


def load_failures(study_dir: str | Path) -> dict[str, dict]:
    """The recorded failures of runs not yet done, by run id."""
    return {p.name[: -len(FAILED_SUFFIX)]: json.loads(p.read_text())
            for p in sorted((Path(study_dir) / RUNS).glob(f"*{FAILED_SUFFIX}"))}


__all__ = ["atomic_write", "write_summary"]
