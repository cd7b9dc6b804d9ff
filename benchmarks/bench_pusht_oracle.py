"""Benchmark: PushT's oracle simulator (``lensemble.eval.pusht_sim``) against the env's own step.

The oracle rolls every CEM sample out on a shadow pymunk space restored to the episode's state.
The reference, measured in the same run, is the same action sequences stepped through the env
itself (``PushTEnv.step`` on the live env, which also builds its observation and info). The ratio
is env-steps per second of the shadow over the env's; the script also prints what one planning
call of the strict protocol's CEM (300 samples × 30 iterations × horizon 5 × block 5) costs per
episode at that rate, and checks that both paths end in the same state.

    .venv/bin/python benchmarks/bench_pusht_oracle.py                 # 64 sequences of 25 env steps
    .venv/bin/python benchmarks/bench_pusht_oracle.py --sequences 8   # the smoke test's size

Measured on the shared 2-core host (room study and test suite running, 64 sequences): shadow
2,852 env steps/s against env.step 1,600 (ratio 1.78); one CEM call 78.9 s per episode; last-step
difference 0.36 px (the contact solver's warm-start cache; tests/unit/test_pusht_sim.py). The
first, per-sample scalar version ran at 1.45× and a version that read the agent back from pymunk
every tick at 0.86×: property reads cost as much as physics ticks.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from lensemble.envs.adapter import make_env, set_single_thread
from lensemble.envs.factors import PUSHT
from lensemble.eval.pusht_sim import PushTDynamics, pusht_embedding


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=64, help="action sequences per path")
    ap.add_argument("--steps", type=int, default=25, help="env steps per sequence (5 latent steps of 5)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    set_single_thread()
    block = 5
    horizon = max(1, args.steps // block)
    n_steps = horizon * block
    rng = np.random.default_rng(args.seed)
    acts = rng.uniform(-1, 1, (args.sequences, horizon, block * 2)).astype(np.float32)
    with make_env(PUSHT, 64) as env:
        env.reset(args.seed)
        start = env.unwrapped._get_obs().copy()
        dyn = PushTDynamics.from_envs([env])
        sim = dyn.take(torch.tensor([0])).repeat(args.sequences)
        z0 = pusht_embedding(start).repeat(args.sequences, 1)
        t = time.perf_counter()
        pred = sim.rollout(z0, torch.from_numpy(acts), block)
        shadow_s = time.perf_counter() - t

        # the reference: the env itself, re-posed at the start before each sequence
        snapshot = dyn.take(torch.tensor([0])).starts[0]
        worst = 0.0
        t = time.perf_counter()
        for i in range(args.sequences):
            _restore_live(env, snapshot)
            for a in acts[i].reshape(n_steps, 2):
                env.unwrapped.step(a)
            worst = max(worst, float((pusht_embedding(env.unwrapped._get_obs()) - pred[i, -1]).abs().max()))
        env_s = time.perf_counter() - t
    steps = args.sequences * n_steps
    print(f"shadow: {steps / shadow_s:,.0f} env steps/s ({shadow_s:.2f} s for {steps}); "
          f"env.step: {steps / env_s:,.0f} env steps/s ({env_s:.2f} s)")
    print(f"ratio shadow/env steps/s: {env_s / shadow_s:.2f}")
    call = 300 * 30 * 25  # env steps of one strict-protocol CEM call
    print(f"one CEM call (300 x 30, 25 env steps): {call / (steps / shadow_s):.1f} s per episode at this rate")
    print(f"max |embedding difference| shadow vs env at the last step: {worst:.2e} px")


def _restore_live(env, snapshot) -> None:
    """Put the live env's two bodies back at ``snapshot`` (the shadow's restore, on the real space)."""
    from lensemble.eval.pusht_sim import _bodies, _write

    agent, block = _bodies(env.unwrapped.space)
    _write(agent, snapshot[0])
    _write(block, snapshot[1])


if __name__ == "__main__":
    main()
