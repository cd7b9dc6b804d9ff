"""Equal success, measured: the CPU preset trained in bf16 against the same preset trained in fp32 (issue 34).

Two arms differ only in ``train.precision``: the same root seed (data collection, initial weights,
batch stream), the default recipe (the CPU preset with the multi-step rollout loss, trained
centrally on the pooled silos for ``--steps`` steps, one thread), both scored with the fp32 planner
on the same strict TwoRoom tasks (``eval.seed`` fixes tasks, goals and planner noise) with the
ladder (one-step and rollout errors, the position probe). Outcomes are paired task by task: exact
McNemar on the discordant tasks and a paired bootstrap interval of the success difference
(lensemble.eval.stats). Training time is CPU-s of the training process (the data are collected
before the clock starts), so the ratio is the training step's, measured on the real recipe.

On a machine without bf16 matrix units ``train.precision=bf16`` falls back to fp32 (and says so);
the bf16 arm would then equal the fp32 one, so this script refuses to run there.

Each arm (training and evaluation) is cached under ``--out`` as ``arm-<precision>.json``; the
comparison is written to ``--out/bf16-training.json`` and ``.md``.

    nohup nice -n 10 .venv/bin/python examples/bf16_training_success.py > bf16-train.log 2>&1 &
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
from lensemble.data.store import ensure_data
from lensemble.eval.closed_loop import evaluate
from lensemble.eval.stats import mcnemar_exact, paired_difference, wilson_interval
from lensemble.model.precision import bf16_support
from lensemble.training.trainer import train_local

#: the ladder's rungs reported beside success (EvalReport fields; the same evaluation computes them)
LADDER_KEYS = ("one_step_error", "copy_last_error", "rollout_composite", "probe_r2", "effective_dim")


def arm(precision: str, args) -> dict:
    """Train the preset at ``train.precision=precision`` and score it with the fp32 planner; cached."""
    path = Path(args.out) / f"arm-{precision}.json"
    if path.exists():
        return json.loads(path.read_text())
    run = Path(args.scratch) / precision
    cfg = load_config([f"train.steps={args.steps}", "train.checkpoint_every=0", f"run_dir={run}",
                       "train.threads=1", f"root_seed={args.seed}", f"eval.seed={args.seed}",
                       f"data.root={args.data_root}", f"train.precision={precision}"])
    ensure_data(cfg, progress=False)  # before the clock: both arms share the collection
    c0, w0 = time.process_time(), time.perf_counter()
    res = train_local(cfg, source="pooled", run_dir=run / "central", progress=False)
    train_cpu, train_wall = time.process_time() - c0, time.perf_counter() - w0
    print(f"trained {precision}: {train_cpu:.0f} CPU-s, pred {res.final_metrics.get('loss/pred'):.4f}", flush=True)
    eval_cfg = load_config([f"run_dir={run}", f"root_seed={args.seed}", f"eval.seed={args.seed}",
                            f"data.root={args.data_root}"])  # the fp32 planner for both arms
    c0, w0 = time.process_time(), time.perf_counter()
    rep = evaluate(str(res.checkpoint_dir), eval_cfg.env.id, cfg=eval_cfg, episodes=args.episodes, split="heldout",
                   progress=False, ladder=True, parallel=8)
    eps = sorted(rep.episodes, key=lambda e: e.index)
    out = {"train_precision": precision, "checkpoint": str(res.checkpoint_dir), "checkpoint_hash": res.checkpoint_hash,
           "config_hash": cfg.config_hash(), "steps": args.steps, "final_train_metrics": res.final_metrics,
           "train_cpu_s": round(train_cpu, 1), "train_wall_s": round(train_wall, 1),
           "n": rep.n_episodes, "successes": rep.n_successes, "success": [bool(e.success) for e in eps],
           "episode_index": [e.index for e in eps], "goal_spec_hash": rep.goal_spec_hash,
           "eval_cpu_s": round(time.process_time() - c0, 1), "eval_wall_s": round(time.perf_counter() - w0, 1),
           "ladder": {k: getattr(rep, k) for k in LADDER_KEYS}}
    path.write_text(json.dumps(out, indent=1, default=str))
    return out


def write_report(out: Path, res: dict) -> None:
    (out / "bf16-training.json").write_text(json.dumps(res, indent=1))
    a32, a16 = res["arms"]["fp32"], res["arms"]["bf16"]
    d = res["bf16_minus_fp32"]
    rows = ["| arm | success, Wilson 95 % | train CPU-s | train CPU-s / step | one-step / copy | rollout (composite) | probe R² | eff. dim |",
            "|---|---|---|---|---|---|---|---|"]
    for p, a in (("fp32", a32), ("bf16", a16)):
        w, lad = res["wilson"][p], a["ladder"]
        rows.append(f"| trained in {p} | {a['successes']}/{a['n']} = {a['successes'] / a['n']:.0%} "
                    f"[{w[0]:.0%}, {w[1]:.0%}] | {a['train_cpu_s']:.0f} | {a['train_cpu_s'] / a['steps']:.3f} "
                    f"| {lad['one_step_error']:.3f} / {lad['copy_last_error']:.3f} | {lad['rollout_composite']:.3f} "
                    f"| {lad['probe_r2']:.3f} "
                    f"| {lad['effective_dim']:.1f} |")
    lines = [
        "# The CPU preset trained in bf16 against the same preset trained in fp32 (issue 34)", "",
        f"Default recipe (the CPU preset with the rollout loss), {a32['steps']} steps centrally on the pooled silos, "
        f"root seed {res['seed']} (same data, initial weights and batches in both arms); both scored with the fp32 "
        f"planner on the same {res['episodes']} strict TwoRoom tasks (goal-spec {a32['goal_spec_hash'][:12]}); "
        f"one thread. Machine: {res['cpu']}; torch {res['torch']}.", "", *rows, "",
        f"Paired (bf16 − fp32, per task): {d['estimate']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] "
        f"(BCa bootstrap over tasks); discordant tasks {d['bf16_only']} solved only by the bf16-trained model, "
        f"{d['fp32_only']} only by the fp32-trained one; exact McNemar p = {d['mcnemar_p']:.3f}.", "",
        f"Training time ratio fp32 / bf16: {a32['train_cpu_s'] / a16['train_cpu_s']:.2f}x (CPU-s of the "
        "training process, data collected before the clock; the machine's other core was busy).", "",
        f"Command: `{res['command']}` (each arm is cached in this folder as arm-<precision>.json).", ""]
    (out / "bf16-training.md").write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="root_seed and eval.seed")
    ap.add_argument("--data-root", default="data")
    ap.add_argument("--scratch", default="runs/bf16-training", help="where the two training runs go")
    ap.add_argument("--out", default="docs/results/bf16-training")
    ap.add_argument("--arms", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"],
                    help="run only these arms (each is cached; a later run with both compares them)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    support = bf16_support("cpu")
    if not support.available:
        raise SystemExit(f"{support.reason}: train.precision=bf16 would run fp32 here, so the arms would not differ")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    arms = {p: arm(p, args) for p in args.arms}
    if len(arms) < 2:
        return 0
    a32, a16 = arms["fp32"], arms["bf16"]
    if a32["episode_index"] != a16["episode_index"] or a32["goal_spec_hash"] != a16["goal_spec_hash"]:
        raise SystemExit("the arms did not play the same tasks")
    s32, s16 = np.array(a32["success"], float), np.array(a16["success"], float)
    mc, diff = mcnemar_exact(s16, s32), paired_difference(s16, s32, seed=0)
    res = {"command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]), "seed": args.seed,
           "episodes": args.episodes, "cpu": support.reason, "torch": torch.__version__, "threads": 1,
           "arms": {"fp32": a32, "bf16": a16},
           "wilson": {p: wilson_interval(a["successes"], a["n"]).as_tuple() for p, a in (("fp32", a32), ("bf16", a16))},
           "bf16_minus_fp32": {"estimate": diff.estimate, "ci95": list(diff.ci.as_tuple()), "bf16_only": mc.a_only,
                               "fp32_only": mc.b_only, "mcnemar_p": mc.p_value}}
    write_report(Path(args.out), res)
    print((Path(args.out) / "bf16-training.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
