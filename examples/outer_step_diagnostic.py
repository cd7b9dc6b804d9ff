"""Does the outer optimizer cost a federated arm its planning? A diagnostic for the room study.

The study's federated arms run DiLoCo: after H inner steps the coordinator takes a Nesterov step
(``federation.outer_lr`` 0.7, ``outer_momentum`` 0.9) on the averaged pseudo-gradient. Over only
4 rounds that step moves the global further than the average participant moved (round 0 alone:
0.7 × (1 + 0.9) = 1.33 × the mean update, and the velocity keeps growing), so an arm can end below
its own warm start for reasons that have nothing to do with the gauge. This script re-runs one
finished federated run of a study with exactly its overrides, warm start and evaluation tasks,
changing only what ``--set`` names (default: plain FedAvg, the outer step = the mean update:
``outer_lr=1``, ``outer_momentum=0``, no Nesterov), and compares the two on the same episodes
(paired: exact McNemar on the discordant episodes).

Descriptive, outside the registry: the variant is not an arm of the study.

    PYTHONPATH=. .venv/bin/python examples/outer_step_diagnostic.py --study region --run naive-s0 \\
        --out docs/results/region-diagnostics/outer-step-naive-s0.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lensemble.config.loader import load_config
from lensemble.eval.closed_loop import evaluate
from lensemble.eval.stats import mcnemar_exact, wilson_interval
from lensemble.federation.simulation import run_federated_simulation
from lensemble.study.spec import load_study_spec

PLAIN_FEDAVG = ("federation.outer_lr=1.0", "federation.outer_momentum=0.0", "federation.nesterov=false")


def episode_outcomes(report: dict) -> dict[tuple[int, int], bool]:
    """{(episode index, episode seed): success} of an EvalReport as JSON."""
    return {(int(e["index"]), int(e["seed"])): bool(e["success"]) for e in report["episodes"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", default="region")
    ap.add_argument("--run", default="naive-s0", help="a finished federated run of the study")
    ap.add_argument("--results", default="docs/results", help="where the study's summaries are")
    ap.add_argument("--scratch", default=None, help="the study's scratch folder (default runs/study/<study>)")
    ap.add_argument("--set", nargs="*", default=list(PLAIN_FEDAVG), help="overrides that make the variant")
    ap.add_argument("--work", default=None, help="the variant's run folder (default <scratch>/<run>-variant)")
    ap.add_argument("--out", default=None, help="write the result here (JSON)")
    args = ap.parse_args(argv)
    summary = json.loads((Path(args.results) / args.study / "runs" / f"{args.run}.json").read_text())
    if summary.get("kind") != "federated":
        raise SystemExit(f"{args.run} is a {summary.get('kind')} run; this diagnostic is for federated runs")
    scratch = Path(args.scratch or f"runs/study/{args.study}")
    manifest = json.loads((scratch / args.run / "manifest.json").read_text())
    warmstart = manifest["config"]["federation"]["warmstart"]  # the very checkpoint the run started from
    work = Path(args.work or scratch / f"{args.run}-variant")
    cfg = load_config(list(summary["overrides"]) + list(args.set) + [f"run_dir={work}", f"federation.warmstart={warmstart}"])
    started = time.perf_counter()
    fed = run_federated_simulation(cfg, work, engine="inprocess", progress=True)
    if fed["warmstart_hash"] != summary["warmstart_hash"]:
        raise SystemExit("the variant did not start from the run's warm start")
    train_s = time.perf_counter() - started
    ev = load_study_spec(args.study).evaluation  # the study's own evaluation settings
    rep = json.loads(evaluate(fed["final_checkpoint"], cfg.env.id, cfg=cfg, split=ev.split, progress=False,
                              ladder=False, parallel=ev.parallel).to_json())
    base = summary["eval"]
    if rep["goal_spec_hash"] != base["goal_spec_hash"]:
        raise SystemExit("the variant was scored on other tasks than the run (goal_spec_hash differs)")
    a, b = episode_outcomes(rep), episode_outcomes(base)
    keys = sorted(a)
    test = mcnemar_exact([a[k] for k in keys], [b[k] for k in keys])
    rows = {}
    for label, r in (("as run", base), ("variant " + " ".join(args.set), rep)):
        ci = wilson_interval(r["n_successes"], r["n_episodes"])
        rows[label] = {"successes": r["n_successes"], "episodes": r["n_episodes"], "rate": r["success_rate"],
                       "wilson_95": [ci.low, ci.high]}
        print(f"{args.run} {label:70s} {r['n_successes']}/{r['n_episodes']} = {r['success_rate']:.2f} "
              f"[{ci.low:.2f}, {ci.high:.2f}]", flush=True)
    diff = rep["success_rate"] - base["success_rate"]
    print(f"paired on {len(keys)} episodes: variant − as run = {diff:+.2f}, exact McNemar p = {test.p_value:.3g} "
          f"({test.a_only} won by the variant only, {test.b_only} by the run only); training {train_s:.0f} s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "run": args.run, "variant": list(args.set), "rows": rows, "difference": diff,
            "mcnemar": {"p_value": test.p_value, "variant_only": test.a_only, "run_only": test.b_only},
            "drift_subspace_final": (fed["rounds"][-1] or {}).get("gauge/drift_subspace_angle_deg"),
            "train_seconds": round(train_s, 1), "goal_spec_hash": rep["goal_spec_hash"]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
