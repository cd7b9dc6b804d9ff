"""Smaller planning budgets against the published one, same model, same tasks (issue 34, item 3).

Each arm is a set of ``eval.*`` overrides (the planner family, samples, iterations, top-k,
precision) on one checkpoint and the same strict TwoRoom tasks (``eval.seed`` fixes tasks, goals
and planner noise streams). Outcomes are paired task by task against the first arm (the
reference): exact McNemar on the discordant tasks and a paired bootstrap interval of the success
difference (lensemble.eval.stats). CPU-s are the evaluating process's, one thread, so they scale
with the machine's load: compare arms of one run, not across runs.

An arm that is not distinguishably worse than the reference is a candidate for a faster budget; a
default would change only on a pre-registered comparison with a tolerance (here: reported, not
decided).

    nohup nice -n 10 .venv/bin/python examples/planner_budget_pilot.py --checkpoint CKPT > budget.log 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lensemble.config import load_config
from lensemble.eval.closed_loop import evaluate
from lensemble.eval.stats import mcnemar_exact, paired_difference, wilson_interval
from lensemble.study.spec import load_study_spec

#: arm -> eval overrides; the first is the reference (the published CEM budget, bf16 where supported)
ARMS = {
    "cem-300x30": ["eval.planner=cem", "eval.num_samples=300", "eval.iterations=30", "eval.topk=30"],
    "cem-100x30": ["eval.planner=cem", "eval.num_samples=100", "eval.iterations=30", "eval.topk=10"],
    "icem-100x30": ["eval.planner=icem", "eval.num_samples=100", "eval.iterations=30", "eval.topk=10"],
    "cem-300x10": ["eval.planner=cem", "eval.num_samples=300", "eval.iterations=10", "eval.topk=30"],
}


def run_arm(name: str, args, base: list[str]) -> dict:
    """Evaluate ``args.checkpoint`` under arm ``name``'s overrides; cached in ``--out``."""
    path = Path(args.out) / f"arm-{name}.json"
    if path.exists():
        return json.loads(path.read_text())
    cfg = load_config([*base, *ARMS[name]])
    c0, w0 = time.process_time(), time.perf_counter()
    rep = evaluate(args.checkpoint, cfg.env.id, cfg=cfg, episodes=args.episodes, split="heldout", progress=False,
                   ladder=False, parallel=8)
    eps = sorted(rep.episodes, key=lambda e: e.index)
    out = {"arm": name, "overrides": ARMS[name], "precision": rep.precision, "n": rep.n_episodes,
           "successes": rep.n_successes, "success": [bool(e.success) for e in eps],
           "episode_index": [e.index for e in eps], "goal_spec_hash": rep.goal_spec_hash,
           "time_per_action_ms": rep.time_per_action_ms, "planning_samples": rep.planning_samples,
           "cpu_s": round(time.process_time() - c0, 1), "wall_s": round(time.perf_counter() - w0, 1)}
    path.write_text(json.dumps(out, indent=1))
    print(f"{name}: {out['successes']}/{out['n']}, {out['cpu_s']} CPU-s ({rep.precision})", flush=True)
    return out


def compare(arms: dict[str, dict]) -> list[dict]:
    """Each arm against the first: paired difference, McNemar, CPU-s per 100 episodes."""
    names = list(arms)
    ref = arms[names[0]]
    rows = []
    for name in names:
        a = arms[name]
        if a["episode_index"] != ref["episode_index"] or a["goal_spec_hash"] != ref["goal_spec_hash"]:
            raise SystemExit(f"{name} did not play the reference's tasks")
        s, r = np.array(a["success"], float), np.array(ref["success"], float)
        mc, diff = mcnemar_exact(s, r), paired_difference(s, r, seed=0)
        rows.append({"arm": name, "successes": a["successes"], "n": a["n"],
                     "wilson": list(wilson_interval(a["successes"], a["n"]).as_tuple()),
                     "minus_reference": diff.estimate, "ci95": list(diff.ci.as_tuple()),
                     "only_this": mc.a_only, "only_reference": mc.b_only, "mcnemar_p": mc.p_value,
                     "cpu_s_per_100": 100 * a["cpu_s"] / a["n"], "ms_per_action": a["time_per_action_ms"],
                     "precision": a["precision"]})
    return rows


def write_report(out: Path, rows: list[dict], res: dict) -> None:
    (out / "budget.json").write_text(json.dumps({**res, "rows": rows}, indent=1))
    lines = ["# Planning budgets against the published one, same model and tasks (issue 34)", "",
             f"Checkpoint `{res['checkpoint']}`; {res['episodes']} strict TwoRoom tasks (the room study's setting, "
             f"goal-spec {res['goal_spec_hash'][:12]}); one thread; each arm against `{rows[0]['arm']}`.", "",
             "| arm | precision | success [Wilson 95 %] | − reference [95 %] | only this / only ref, McNemar p "
             "| CPU-s per 100 episodes | ms per action |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['precision']} | {r['successes']}/{r['n']} [{r['wilson'][0]:.0%}, "
                     f"{r['wilson'][1]:.0%}] | {r['minus_reference']:+.2f} [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}] "
                     f"| {r['only_this']} / {r['only_reference']}, p = {r['mcnemar_p']:.3f} "
                     f"| {r['cpu_s_per_100']:.0f} | {r['ms_per_action']:.0f} |")
    lines += ["", f"Command: `{res['command']}` (arms cached in this folder as arm-<name>.json). CPU-s scale with "
              "the machine's load: compare arms of this run only.", ""]
    (out / "budget.md").write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a CPU-preset checkpoint of the room study's setting")
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="root_seed and eval.seed of the checkpoint's study seed")
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--precision", default="auto", choices=("fp32", "bf16", "auto"))
    ap.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    ap.add_argument("--out", default="docs/results/planner-budget")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    base = [*load_study_spec("region").overrides, f"root_seed={args.seed}", f"eval.seed={args.seed}",
            f"data.root={args.data_root}", f"eval.precision={args.precision}"]
    arms = {name: run_arm(name, args, base) for name in args.arms}
    rows = compare(arms)
    first = next(iter(arms.values()))
    res = {"command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]), "checkpoint": args.checkpoint,
           "episodes": args.episodes, "goal_spec_hash": first["goal_spec_hash"], "torch": torch.__version__}
    write_report(Path(args.out), rows, res)
    print((Path(args.out) / "budget.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
