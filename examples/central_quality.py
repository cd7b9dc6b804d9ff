"""Train one centralized (pooled) model and score it against the controls that cannot be gamed.

    .venv/bin/python examples/central_quality.py --steps 1200 --episodes 30 objective.lambda_sig=0.1

Prints, for the trained model, a random-action policy and a random-initialised model with the same
planner: closed-loop success (the environment's own success flag), one-step latent error against
the copy-last-latent baseline, the state probe R², effective dimension and latent std. Writes
everything to <out>/quality.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from lensemble.artifacts.checkpoint import save_checkpoint
from lensemble.config import load_config
from lensemble.eval.closed_loop import evaluate
from lensemble.model.world_model import architecture, build_world_model
from lensemble.training.trainer import train_local


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--out", default="runs/quality")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.out)
    cfg = load_config([f"train.steps={args.steps}", "train.checkpoint_every=0", f"run_dir={out}", *args.overrides])
    started = time.perf_counter()
    res = train_local(cfg, source="pooled", run_dir=out / "central")
    result = {"train_seconds": round(time.perf_counter() - started, 1), "checkpoint_hash": res.checkpoint_hash,
              "final_metrics": res.final_metrics, "overrides": args.overrides, "steps": args.steps}
    untrained = build_world_model(cfg.model, init_seed=123)
    save_checkpoint(out / "random_init", untrained.state_dict(), kind="world_model",
                    architecture=architecture(cfg.model))
    arms = (("central_mpc", res.checkpoint_dir, "mpc"), ("random_actions", res.checkpoint_dir, "random"),
            ("random_init_mpc", out / "random_init", "mpc"))
    for name, ckpt, policy in arms:
        rep = evaluate(ckpt, cfg.env.id, cfg=cfg, episodes=args.episodes, policy=policy,
                       ladder=policy == "mpc")
        result[name] = json.loads(rep.model_dump_json())
        print(f"{name:16s} success {rep.n_successes}/{rep.n_episodes}  one-step {rep.one_step_error}  "
              f"copy {rep.copy_last_error}  probe R2 {rep.probe_r2}  eff-dim {rep.effective_dim}  "
              f"std {rep.latent_std}", flush=True)
        (out / "quality.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
