"""A study resumed on other data refuses: the finished runs' probe hashes against this machine's.

The same settings can collect other frames under other library versions (the simulator, rendering,
the resize kernel) or, before collection pinned MKL's code path, on another CPU: issue 32 found a
fresh install whose seed 0 probe hashed 1391d231… where the committed room study recorded 67e78ea0…
— Intel MKL's AVX-512 path in the renderer (lensemble/numerics.py). Pairing new runs with old ones
would then compare models trained and scored on different data, so :func:`check_data` refuses and
names what differs.
"""

from __future__ import annotations

from lensemble.artifacts.manifest import library_versions
from lensemble.config.loader import load_config
from lensemble.data.store import data_dir, ensure_data
from lensemble.errors import ConfigError
from lensemble.study.plan import PlannedRun, StudyPlan


def check_data(plan: StudyPlan, done: dict[str, dict], todo: list[PlannedRun]) -> None:
    """Refuse to resume a study on other data than its finished runs used.

    For every data folder that both finished and remaining runs use, collect (or read) it now and
    compare its probe's content hash with the one the finished runs recorded; a difference means
    the same settings produce other frames here (other library versions: the simulator, rendering,
    the resize kernel), and pairing new runs with the old ones would compare different data.
    """
    def folder(rid: str):
        return data_dir(plan.configs.get(rid) or load_config(plan.runs[rid].overrides)).name

    recorded: dict[str, dict[str, dict]] = {}   # data folder -> probe hash -> a summary that recorded it
    for rid, s in done.items():
        if rid in plan.runs and s.get("probe_hash"):
            recorded.setdefault(folder(rid), {}).setdefault(s["probe_hash"], s)
    checked: set[str] = set()
    for run in todo:
        key = folder(run.run_id)
        if key not in recorded or key in checked:
            continue
        checked.add(key)
        _, summary = ensure_data(plan.configs.get(run.run_id) or load_config(run.overrides), progress=False)
        now_hash = summary["probe"]["content_hash"]
        if now_hash in recorded[key]:
            continue
        old_hash, old = next(iter(recorded[key].items()))
        raise ConfigError(
            f"seed {run.seed}'s data ({key}) collects a probe with hash {now_hash[:12]}… here, but the study's finished "
            f"runs (e.g. {old['run_id']}) used {old_hash[:12]}…: the same settings give other frames on this machine, "
            f"and new runs would not pair with the old ones. {version_difference(old.get('library_versions'))}",
            remediation="install the versions the results were produced with (pip install -c constraints.txt -e "
                        "'.[dev]', README) and collect with this version's workers (they pin MKL's code path: "
                        "lensemble/numerics.py), or run a new study (--name)")


def version_difference(then: dict | None) -> str:
    """The libraries whose versions differ between ``then`` (a summary's) and this environment."""
    if not then:
        return ("The finished runs did not record library versions; constraints.txt holds the versions the "
                "committed results were produced with.")
    now = library_versions()
    diff = [f"{k} {then.get(k)} then, {now.get(k)} now" for k in sorted(set(then) | set(now))
            if k != "lensemble" and then.get(k) != now.get(k)]
    return "Library versions that differ: " + ("; ".join(diff) if diff else "none (another cause)") + "."


__all__ = ["check_data", "version_difference"]
