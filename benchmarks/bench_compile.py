"""Does ``torch.compile`` (inductor, CPU) buy what bf16 alone did not? (issue 34, "tried").

After bf16 the two hot paths still miss the issue's targets (a training step 1.33-1.46x fp32's,
not 2x; a planning call 1.6-1.8x), and the profile puts what is left in small matmuls, autocast's
casts and elementwise work: what a fusing compiler is for. This script measures it, in one run,
one torch thread, interleaved (medians), against the same code uncompiled:

* ``plan``  - the planning call of ``bench_precision.py`` (8 envs x 300 samples x 3 CEM iterations,
  CPU preset) with ``Predictor.rollout_from`` compiled (``dynamic=False``: the planner's shapes are
  fixed within an evaluation);
* ``train`` - one ``InnerLoop.step`` with the encoder and the predictor compiled as modules
  (forward and, through AOTAutograd, backward).

It prints each variant's ms per call and the ratio to the uncompiled call at the same precision,
and the seconds the first calls spent compiling.

    .venv/bin/python benchmarks/bench_compile.py            # CPU preset (≈ 3 minutes)
    .venv/bin/python benchmarks/bench_compile.py --small    # experiment=micro (a wiring check)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_precision import interleaved, plan_calls, train_calls

from lensemble.config import load_config
from lensemble.model import build_world_model
from lensemble.model.precision import bf16_support


def compiled_plan_calls(cfg, model, envs: int, samples: int, iterations: int) -> dict:
    """``plan_calls`` whose predictor rollout runs compiled (one compiled function per precision)."""
    pred, eager = model.predictor, model.predictor.rollout_from
    out = {}
    for p, call in plan_calls(cfg, model, envs, samples, iterations).items():
        fn = torch.compile(eager, dynamic=False)

        def swapped(call=call, fn=fn):
            pred.rollout_from = fn
            try:
                return call()
            finally:
                pred.rollout_from = eager
        out[p] = swapped
    return out


def _compile_modules(model) -> None:
    model.encoder.compile(dynamic=False)
    model.predictor.compile(dynamic=False)


def compiled_train_calls(cfg, state: dict) -> dict:
    """``train_calls`` whose loops run a compiled encoder and predictor."""
    return train_calls(cfg, state, prepare=_compile_modules)


def compare(name: str, eager: dict, compiled: dict, reps: int) -> None:
    warm = {}
    for p, fn in compiled.items():  # the first two calls compile (and recompile once for the loop's state)
        t0 = time.perf_counter()
        fn(), fn()
        warm[p] = time.perf_counter() - t0
    fns = {**{f"{p}": f for p, f in eager.items()}, **{f"{p}+compile": f for p, f in compiled.items()}}
    times = {k: 1000 * statistics.median(v) for k, v in interleaved(fns, reps).items()}
    for p in eager:
        print(f"{name} {p}: eager {times[p]:.0f} ms, compiled {times[p + '+compile']:.0f} ms "
              f"(eager/compiled {times[p] / times[p + '+compile']:.2f}x; first two calls {warm[p]:.0f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="experiment=micro, 2 envs x 30 samples")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(["experiment=micro"] if args.small else [])
    print(f"machine: {bf16_support('cpu').reason}; torch {torch.__version__}; one thread")
    model = build_world_model(cfg.model, init_seed=0).eval()
    envs, samples = (2, 30) if args.small else (8, 300)
    compare("plan", plan_calls(cfg, model, envs, samples, 3), compiled_plan_calls(cfg, model, envs, samples, 3),
            args.reps)
    state = model.state_dict()
    compare("train", train_calls(cfg, state), compiled_train_calls(cfg, state), args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
