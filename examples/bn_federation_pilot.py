"""BatchNorm statistics under federation (issue 14, item 3): which statistics keep planning and
the gauge diagnostics sound?

Runs the default federation (`lensemble run`: the CPU preset, 2 silos, 3 DiLoCo rounds of 50
inner steps from a 300-step public warm start) twice from one warm start and one collection,
differing only in ``federation.bn_recalibration``:

    probe  the coordinator re-estimates the global encoder's BatchNorm statistics on the public
           probe after every outer step; participants do the same before embedding the probe
    none   the global keeps the warm start's statistics; participants embed with the momentum
           statistics of their inner steps

Then scores on the same ``--episodes`` strict held-out tasks (shared goal-spec hash):

    probe run, global as committed (probe statistics)
    probe run, global re-estimated on the silos' own training frames (what a silo that deploys
    the global model could do locally, without releasing anything: "silo statistics")
    none run, global as committed (warm-start statistics)
    the warm start, and random actions

and reads each run's gauge diagnostics per round (frame drift of the participants from the
global on the public probe, the backstop's aligned angle, effective dimension) from its metrics.
Writes ``<out>/bn-pilot.json`` and ``<out>/bn-pilot.md``; every stage is cached under ``--out``,
so re-running resumes. Command behind docs/model.md ("BatchNorm statistics under federation"):

    nice -n 19 .venv/bin/python examples/bn_federation_pilot.py --out runs/bn-pilot --episodes 100

(``--engine`` inprocess by default: the same rounds as Flower's engines without Ray's processes.)

Cost on the 2-core box: two runs of ~10 CPU-minutes each (the second reuses the warm start),
five evaluations of ~4.5 CPU-s per episode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from lensemble.artifacts.checkpoint import load_checkpoint, save_checkpoint
from lensemble.config import load_config
from lensemble.eval.closed_loop import evaluate
from lensemble.eval.stats import mcnemar_exact, wilson_interval
from lensemble.model.world_model import world_model_from_state
from lensemble.training.datasets import training_sampler
from lensemble.training.trainer import recalibrate_for_checkpoint

SETTINGS = ("probe", "none")
GAUGE_KEYS = ("gauge/drift_angle_deg", "gauge/drift_subspace_angle_deg", "gauge/drift_rotation_share",
              "gauge/global_effective_dim", "loss/pred")


def run_federation(out: Path, setting: str, base: list[str], warmstart: str | None, engine: str) -> dict:
    """`lensemble run --no-eval` in ``<out>/<setting>`` (cached by its summary.json)."""
    run_dir = out / setting
    summary = run_dir / "summary.json"
    if not summary.exists():
        args = [sys.executable, "-m", "lensemble", "run", "--no-eval", "--engine", engine, f"run_dir={run_dir}",
                f"federation.bn_recalibration={setting}", *base]
        if warmstart:
            args.append(f"federation.warmstart={warmstart}")
        env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
               "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        t0 = time.perf_counter()
        proc = subprocess.run(args, env=env, text=True, capture_output=True)
        (run_dir / "pilot-run.log").parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "pilot-run.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode:
            raise SystemExit(f"lensemble run ({setting}) failed; see {run_dir / 'pilot-run.log'}")
        print(f"federation {setting}: {time.perf_counter() - t0:.0f} s wall", flush=True)
    return json.loads(summary.read_text())


def round_metrics(run_dir: Path) -> list[dict]:
    """The coordinator's per-round gauge metrics (GAUGE_KEYS) from ``<run>/metrics.jsonl``."""
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "round" in rec:
            rows.append({"round": rec["round"], **{k: rec[k] for k in GAUGE_KEYS if k in rec}})
    return rows


def silo_recalibrated(ckpt: str, cfg, dest: Path) -> Path:
    """The checkpoint with its BatchNorm statistics re-estimated on the silos' training frames
    (the trainer's own pre-checkpoint recalibration, on the pooled silo sampler)."""
    if (dest / "header.json").exists():
        return dest
    ck = load_checkpoint(ckpt)
    model = world_model_from_state(ck.architecture, ck.tensors)
    sampler, _ = training_sampler(cfg, "pooled", progress=False)
    recalibrate_for_checkpoint(model, cfg, sampler, "silo-statistics", 0)
    save_checkpoint(dest, model.state_dict(), kind="world_model", architecture=ck.architecture)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bn-pilot")
    ap.add_argument("--episodes", type=int, default=100)
    # inprocess: the same rounds without Ray's processes (the engines agree round for round,
    # tests/integration); on a loaded 2-core box Ray's start-up and workers cost more than the training
    ap.add_argument("--engine", default="inprocess", choices=("inprocess", "flower-inprocess", "ray"))
    ap.add_argument("overrides", nargs="*", help="config overrides for both runs and the evaluation")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    base = [f"data.root={out / 'data'}", *args.overrides]  # one collection for both runs

    summaries = {"probe": run_federation(out, "probe", base, None, args.engine)}
    warm_dirs = sorted((out / "probe" / "warmstart").glob("**/header.json"))
    warm = str(warm_dirs[-1].parent) if warm_dirs else None
    summaries["none"] = run_federation(out, "none", base, warm, args.engine)

    cfg = load_config(["eval=strict", *base])
    cache = out / "cache"
    cache.mkdir(exist_ok=True)
    arms = {
        "probe run, probe statistics": (summaries["probe"]["final_checkpoint"], "mpc"),
        "probe run, silo statistics": (None, "mpc"),
        "none run, warm-start statistics": (summaries["none"]["final_checkpoint"], "mpc"),
        "warm start": (warm, "mpc"),
        "random actions": (summaries["probe"]["final_checkpoint"], "random"),
    }
    arms["probe run, silo statistics"] = (str(silo_recalibrated(arms["probe run, probe statistics"][0], cfg,
                                                                out / "probe-silo-stats")), "mpc")
    results = {}
    for name, (ckpt, policy) in arms.items():
        path = cache / f"{name.replace(' ', '-').replace(',', '')}-{args.episodes}.json"
        if not path.exists():
            c0 = time.process_time()
            rep = evaluate(ckpt, cfg.env.id, cfg=cfg, episodes=args.episodes, policy=policy, ladder=False,
                           progress=False)
            eps = sorted(rep.episodes, key=lambda e: e.index)
            path.write_text(json.dumps({"success": [e.success for e in eps], "cross_wall": [e.cross_wall for e in eps],
                                        "goal_spec_hash": rep.goal_spec_hash,
                                        "cpu_seconds": round(time.process_time() - c0, 1)}))
        results[name] = json.loads(path.read_text())
        r = results[name]
        print(f"{name:34s} {sum(r['success'])}/{len(r['success'])}  eval {r['cpu_seconds']} CPU-s", flush=True)
    if len({r["goal_spec_hash"] for r in results.values()}) != 1:
        raise SystemExit("the arms were scored on different tasks")

    gauge = {s: round_metrics(out / s) for s in SETTINGS}
    ref = results["probe run, probe statistics"]["success"]
    lines = [f"# BatchNorm statistics under federation ({args.episodes} strict tasks, goal-spec "
             f"{next(iter(results.values()))['goal_spec_hash'][:12]})", "",
             "| arm | success | Wilson 95 % | across the wall | vs probe statistics (a only / b only, exact McNemar p) |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        k, n = sum(r["success"]), len(r["success"])
        ci = wilson_interval(k, n)
        cw = [s for s, c in zip(r["success"], r["cross_wall"], strict=True) if c]
        m = mcnemar_exact(r["success"], ref) if name != "probe run, probe statistics" else None
        cmp = "–" if m is None else f"{m.a_only} / {m.b_only}, p = {m.p_value:.3g}"
        lines.append(f"| {name} | {k}/{n} = {k / n:.0%} | [{ci.low:.0%}, {ci.high:.0%}] | {sum(cw)}/{len(cw)} | {cmp} |")
    lines += ["", "Gauge diagnostics per round (coordinator metrics):", "",
              "| run | round | " + " | ".join(GAUGE_KEYS) + " |", "|---|---|" + "---|" * len(GAUGE_KEYS)]
    for s in SETTINGS:
        for row in gauge[s]:
            lines.append(f"| {s} | {row['round']} | " + " | ".join(
                "–" if row.get(k) is None else f"{row[k]:.1f}" for k in GAUGE_KEYS) + " |")
    (out / "bn-pilot.json").write_text(json.dumps({"episodes": args.episodes, "overrides": args.overrides,
                                                   "arms": results, "gauge": gauge,
                                                   "summaries": summaries}, indent=1, default=str))
    (out / "bn-pilot.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
