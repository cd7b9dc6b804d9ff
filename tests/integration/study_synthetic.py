"""A study folder of synthetic run summaries on the `tiny` preset's plan, for analysis tests:
nothing trains; each run's summary is written from a function of its arm and seed."""

import json

from lensemble.study.plan import plan_study
from lensemble.study.registry import build_registry, sync_registry
from lensemble.study.spec import load_study_spec


def synthetic_study(tmp_path, values, overrides=(), rounds=None, run_overrides=()):
    """A 6-seed tiny plan whose summaries are written from ``values(arm, seed) -> (success, drift, dim)``
    (``rounds(arm, seed, drift) -> round records`` replaces the default two rounds of full-rotation drift;
    ``run_overrides`` go to every run)."""
    spec = load_study_spec("tiny", ["registry.min_seeds=3", *overrides], seeds=list(range(6)), sweeps=[],
                           run_overrides=list(run_overrides))
    plan = plan_study(spec)
    d = tmp_path / "tiny"
    d.mkdir(parents=True)
    (d / "plan.json").write_text(json.dumps(plan.to_json()))
    sync_registry(d, build_registry(spec, plan), runs_done=0)
    for rid, run in plan.runs.items():
        summary = {"run_id": rid, "kind": run.kind, "arm": run.arm, "seed": run.seed, "spec_hash": run.spec_hash,
                   "seconds": {"train": 1.0, "eval": 1.0}}
        if run.kind != "warmstart":
            success, drift, dim = values(run.arm, run.seed)
            n = 40
            summary["eval"] = {"success_rate": round(success * n) / n, "n_successes": round(success * n),
                               "n_episodes": n, "effective_dim": dim, "latent_std": 1.0}
            if run.kind == "federated":
                summary["rounds"] = (rounds(run.arm, run.seed, drift) if rounds else
                                     [{"gauge/drift_angle_deg": drift * f} for f in (0.5, 1.0)])
        (d / "runs").mkdir(exist_ok=True)
        (d / "runs" / f"{rid}.json").write_text(json.dumps(summary))
    return d
