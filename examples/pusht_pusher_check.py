"""How well the PushT goal pusher (lensemble/envs/pusht_pusher.py) solves the env's own tasks, with
its controls, and the parameter grid it was tuned on (issue 35).

Each task is a PushT reset (seed s: the env's start and goal poses); the pusher runs noise-free on
the raw env (physics and state, no frame drawn) for up to ``--steps`` env steps; success is the
env's rule (block within 20 px and π/9 of the goal pose). Printed per arm: successes, and the mean
pose error at the start and at the end in success-threshold units (px / 20 + |Δθ| / (π/9)).

    .venv/bin/python examples/pusht_pusher_check.py                 # seeds 100-139: pusher and controls
    .venv/bin/python examples/pusht_pusher_check.py --grid          # the tuning grid (≈ 1 CPU-minute)
"""

from __future__ import annotations

import argparse
import itertools
import math

import numpy as np

from lensemble.envs.adapter import make_env
from lensemble.envs.factors import PUSHT
from lensemble.envs.policies import PushTExpert
from lensemble.envs.pusht_pusher import GoalPusher, pursue


def score(env, make_act, seeds, steps: int) -> tuple[int, float, float]:
    """(successes, mean start error, mean end error) in threshold units over ``seeds``."""
    hits, starts, ends = 0, [], []
    for seed in seeds:
        env.reset(seed)
        goal = np.asarray(env.unwrapped.goal_pose, float)
        start, end, hit = pursue(env, make_act(goal), goal, steps)
        hits, starts, ends = hits + hit, starts + [start], ends + [end]

    def units(e):
        return float(np.mean([dp / 20.0 + dth / (math.pi / 9) for dp, dth in e]))
    return hits, units(starts), units(ends)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--grid", action="store_true", help="k_rot × push steps × standoff, as tuned")
    args = ap.parse_args()
    env = make_env(PUSHT, 64)
    seeds = range(args.first_seed, args.first_seed + args.tasks)
    print(f"PushT, reset seeds {seeds.start}-{seeds.stop - 1}, up to {args.steps} env steps, noise-free")
    if args.grid:
        for k, steps, standoff in itertools.product([20, 40, 80], [2, 4, 8, 12, 16], [85, 95]):
            def make(g, k=k, n=steps, so=standoff):
                return GoalPusher(g, k_rot=k, push_steps=n, standoff=so).act
            hits, _, end = score(env, make, seeds, args.steps)
            print(f"k_rot {k:3d}  push steps {steps:2d}  standoff {standoff}: {hits}/{args.tasks}, end error {end:.2f}")
        return 0
    rng = np.random.default_rng(0)
    arms = {
        "goal pusher": lambda g: GoalPusher(g).act,
        "control: torque sign flipped (k_rot = -40)": lambda g: GoalPusher(g, k_rot=-40.0).act,
        "control: no turning (k_rot = 0)": lambda g: GoalPusher(g, k_rot=0.0).act,
        "control: the block seeker (goal-agnostic)": lambda g: (lambda s, e=PushTExpert(rng): e(env)),
    }
    for name, make in arms.items():
        hits, start, end = score(env, make, seeds, args.steps)
        print(f"{name}: {hits}/{args.tasks} solved; error {start:.2f} -> {end:.2f} (threshold units)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
