"""Where a planned TwoRoom episode spends its time (issue 34, item 3): encoder, rollout, cost, noise,
the rest of CEM's bookkeeping, env physics and rendering.

Runs the closed loop ``evaluate`` runs (``run_closed_loop`` + ``planner_plan_fn``, ``--parallel``
episodes side by side) on a checkpoint, with CPU-time counters (``time.process_time``: one torch
thread, so the counts do not inflate with the machine's load) wrapped around:

* ``encoder``  - every ``model.encoder`` call (start, goal, and after each latent step);
* ``rollout``  - ``Predictor.prepare`` + ``rollout_from`` (the planner's model calls);
* ``cost``     - the L1 energy on every iteration's predictions;
* ``noise``    - the planner's sampling noise;
* ``cem``      - the rest of ``Planner.plan`` (candidates, clipping, top-k, refit, best-so-far);
* ``render``   - ``EnvAdapter.render`` (TwoRoom's torch renderer at 224 px + area resize);
* ``physics``  - the rest of ``EnvAdapter.step``;
* ``other``    - the loop's remaining bookkeeping (total − the above).

Prints one row per part (CPU-s, share, ms per planned action) and the extrapolation to a
100-episode evaluation. ``--precision bf16`` plans under bf16 autocast (forced where the CPU has
no bf16 units, and said so).

    .venv/bin/python benchmarks/profile_planned_episode.py --episodes 8
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections import defaultdict

import torch

import lensemble.eval.mpc as mpc
from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.config.seeds import derive
from lensemble.envs.adapter import EnvAdapter, env_info, make_env
from lensemble.eval.closed_loop import episode_specs, eval_factor_values, planner_plan_fn, run_closed_loop
from lensemble.model.precision import FORCE_ENV, autocast, bf16_support
from lensemble.model.world_model import world_model_from_state
from lensemble.study.spec import load_study_spec

CHECKPOINT = "runs/pooled-pilot/seed-0/central-control-8b67b36fcc70/run/checkpoints/step-000400"
SPENT: dict[str, float] = defaultdict(float)
_ACTIVE: list[str] = []  # the part being timed; a nested part's time is not counted twice


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.process_time()
        _ACTIVE.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _ACTIVE.pop()
            dt = time.process_time() - t0
            SPENT[name] += dt
            if _ACTIVE:
                SPENT[_ACTIVE[-1]] -= dt  # exclusive times: the outer part loses what the inner took
    return wrapper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=CHECKPOINT)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides on the room study's config")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config([*load_study_spec("region").overrides, "data.root=runs/pooled-pilot/data", *args.overrides])
    if args.precision == "bf16" and not bf16_support().available:
        os.environ[FORCE_ENV] = "1"
        print(f"bf16 FORCED: {bf16_support().reason}")
    ck = load_checkpoint(args.checkpoint)
    model = world_model_from_state(ck.architecture, ck.tensors).eval()
    info, block = env_info(cfg.env.id), model.cfg.action_block
    planner = mpc.Planner.from_config(cfg.eval, action_dim=info.action_dim * block,
                                      action_low=torch.tensor(info.action_low).repeat(block),
                                      action_high=torch.tensor(info.action_high).repeat(block),
                                      seed=derive(cfg.eval.seed, "eval", "planner"))
    values, _ = eval_factor_values(cfg, cfg.env.id, "heldout")
    specs = episode_specs(cfg.eval.seed, args.episodes, values)
    envs = [make_env(cfg.env.id, model.cfg.img_size) for _ in range(min(args.parallel, args.episodes))]

    # wrap the parts (exclusive CPU times)
    model.encoder.forward = timed("encoder", model.encoder.forward)
    pred = model.predictor
    pred.prepare = timed("rollout", pred.prepare)
    pred.rollout_from = timed("rollout", pred.rollout_from)
    mpc.latent_l1_cost = timed("cost", mpc.latent_l1_cost)
    mpc.Planner._noise = timed("noise", mpc.Planner._noise)
    mpc.Planner._plan = timed("cem", mpc.Planner._plan)
    EnvAdapter.render = timed("render", EnvAdapter.render)
    EnvAdapter.step = timed("physics", EnvAdapter.step)

    plan_fn = planner_plan_fn(model, planner, cfg.eval.receding_horizon)
    t0, c0 = time.perf_counter(), time.process_time()
    with autocast("bf16") if args.precision == "bf16" else contextlib.nullcontext():
        res = run_closed_loop(model, envs, specs, cfg.eval, plan_fn=plan_fn, eval_seed=cfg.eval.seed)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    for env in envs:
        env.close()
    actions = sum(e.steps for e in res.episodes)
    latent_steps = actions / block
    SPENT["other (loop, task posing)"] = cpu - sum(SPENT.values())
    print(f"{args.episodes} episodes ({args.precision}, {args.parallel} side by side): {res.n_successes}/"
          f"{len(res.episodes)} solved, {actions} env actions = {latent_steps:.0f} latent steps, "
          f"{cpu:.1f} CPU-s ({wall:.1f} s wall on a shared machine)")
    print(f"{'part':28s} {'CPU-s':>8s} {'share':>7s} {'ms/action':>10s}")
    for name, s in sorted(SPENT.items(), key=lambda kv: -kv[1]):
        print(f"{name:28s} {s:8.2f} {100 * s / cpu:6.1f}% {1e3 * s / actions:10.2f}")
    print(f"per planned env action: {1e3 * cpu / actions:.1f} CPU-ms; per episode {cpu / args.episodes:.2f} CPU-s; "
          f"a 100-episode evaluation ~ {100 * cpu / args.episodes:.0f} CPU-s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
