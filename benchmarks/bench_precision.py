"""fp32 against bf16 on the two hot paths, with the machine's matmul limit beside them (issue 34).

In one run, one torch thread (``--threads``), interleaved (fp32, bf16, fp32, bf16, ...; medians):

* ``peak``  - the machine's matmul GFLOP/s at each precision: the best of ``torch.mm`` and
  ``F.linear`` on shapes the models use (a training batch's MLP layer, a square one), timed here and now;
* ``train`` - one ``InnerLoop.step`` of the configured model (the CPU preset, batch 64 by default)
  on synthetic clips, at ``train.precision=fp32`` and ``bf16``: forward, fp32 losses, backward, AdamW;
* ``plan``  - one planning call as ``evaluate`` makes it (``planner_plan_fn``: the predictor's
  ``prepare`` + ``--iterations`` CEM iterations of ``--envs`` x ``--samples`` rollouts of the
  horizon), fp32 against the same call under bf16 autocast.

For each: ms per call, GFLOP per call counted from the model's shapes (``torch.utils.flop_counter``:
every matmul, convolution and attention product, forward and backward), the achieved GFLOP/s and
its share of the measured peak at the same precision, and the ratio fp32 time / bf16 time.

bf16 only pays on bf16 matrix units (lensemble/model/precision.py). Where the CPU has none, the
option itself would fall back to fp32; this script then forces bf16 (``LENSEMBLE_FORCE_BF16=1``)
so the cost of bf16 without the hardware is measured, and says so in its first line.

    .venv/bin/python benchmarks/bench_precision.py                  # CPU preset, 8 x 300 samples
    .venv/bin/python benchmarks/bench_precision.py --small          # experiment=micro (seconds)
    .venv/bin/python benchmarks/bench_precision.py --checkpoint runs/x/checkpoints/step-000400

Only the ratios and shares measured within one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from lensemble.config import load_config
from lensemble.data.clips import ClipSampler
from lensemble.eval.closed_loop import planner_plan_fn
from lensemble.eval.mpc import Planner
from lensemble.model import build_world_model, sketch_for_step
from lensemble.model.precision import FORCE_ENV, autocast, bf16_support
from lensemble.training.loop import InnerLoop

PRECISIONS = ("fp32", "bf16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: (M, K, N) matmuls for the peak: a training batch's MLP layer (4096 tokens x 192 -> 768) and a
#: square one; --small uses a smaller pair.
PEAK_SHAPES = ((4096, 192, 768), (1024, 1024, 1024))
PEAK_SHAPES_SMALL = ((512, 128, 512), (256, 256, 256))


def interleaved(fns: dict, reps: int) -> dict[str, list[float]]:
    """Seconds of each ``fns[name]()`` call, the names alternating (a change in load hits all)."""
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def count_flops(fn) -> int:
    """FLOPs of one ``fn()`` call, counted from the shapes of its matrix products."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def matmul_peak(shapes, reps: int) -> dict[str, float]:
    """Best GFLOP/s over ``shapes`` at each precision (measured, interleaved), of ``torch.mm`` (B as
    (K, N)) and of ``F.linear`` (weight as (N, K), what the models run): without bf16 units torch's
    bf16 kernels differ by layout (measured 0.9 against 5.1 GFLOP/s), so the peak takes the best."""
    best = dict.fromkeys(PRECISIONS, 0.0)
    for m, k, n in shapes:
        g = torch.Generator().manual_seed(0)
        ops = {}
        for p in PRECISIONS:
            a = torch.randn(m, k, generator=g).to(DTYPES[p])
            b = torch.randn(k, n, generator=g).to(DTYPES[p])
            w = torch.randn(n, k, generator=g).to(DTYPES[p])
            torch.mm(a, b), F.linear(a, w)  # warm-up: kernel selection, allocation
            ops[f"{p} mm"] = (lambda a=a, b=b: torch.mm(a, b))
            ops[f"{p} linear"] = (lambda a=a, w=w: F.linear(a, w))
        for name, ts in interleaved(ops, reps).items():
            p = name.split()[0]
            best[p] = max(best[p], 2 * m * k * n / min(ts) / 1e9)
    return best


def synthetic_sampler(cfg, episodes: int = 8) -> ClipSampler:
    g = torch.Generator().manual_seed(0)
    t, h = cfg.data.steps_per_episode, cfg.model.img_size
    eps = [{"obs": torch.randint(0, 256, (t + 1, h, h, 3), generator=g, dtype=torch.uint8).numpy(),
            "actions": torch.randn(t, cfg.model.action_dim, generator=g).numpy(),
            "state": torch.randn(t + 1, 4, generator=g).numpy()} for _ in range(episodes)]
    return ClipSampler(eps, cfg.train.clip_len, cfg.model.action_block)


def train_calls(cfg, model_state, prepare=None) -> dict:
    """One InnerLoop per precision, same initial weights and batch stream; a call is one step.
    ``prepare(model)``, when given, runs on each model before its loop is built (bench_compile.py)."""
    sampler = synthetic_sampler(cfg)
    d, s = cfg.model.latent_dim, cfg.objective.sigreg_directions
    fns = {}
    for p in PRECISIONS:
        pcfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"precision": p, "warmup_steps": 0})})
        model = build_world_model(cfg.model, init_seed=0)
        model.load_state_dict(model_state)
        if prepare is not None:
            prepare(model)
        loop = InnerLoop(model, pcfg, sampler)
        gen = torch.Generator().manual_seed(0)
        sketch = sketch_for_step(cfg.root_seed, 0, d, s)
        fns[p] = (lambda loop=loop, gen=gen, sketch=sketch: loop.step(sketch, gen))
    return fns


def plan_calls(cfg, model, envs: int, samples: int, iterations: int) -> dict:
    """One planning call per precision on the same start histories and goals (fresh noise streams)."""
    a = cfg.model.action_dim * cfg.model.action_block
    ev = cfg.eval.model_copy(update={"num_samples": samples, "iterations": iterations,
                                     "topk": min(cfg.eval.topk, samples)})
    g = torch.Generator().manual_seed(1)
    w, d = cfg.model.history, cfg.model.latent_dim
    z_hist, past = torch.randn(envs, w, d, generator=g), torch.rand(envs, w - 1, a, generator=g) * 2 - 1
    goal = torch.randn(envs, d, generator=g)
    fns = {}
    for p in PRECISIONS:
        planner = Planner.from_config(ev, action_dim=a, action_low=-1.0, action_high=1.0, seed=0)
        plan = planner_plan_fn(model, planner, ev.receding_horizon)

        def call(plan=plan, planner=planner, p=p):
            planner.reset()  # the same noise every call: every call does the same work
            with autocast(p):
                return plan(z_hist, past, goal, None, streams=list(range(envs)))
        fns[p] = call
    return fns


def report(name: str, fns: dict, reps: int, peak: dict, unit: str) -> None:
    for fn in fns.values():
        fn()  # warm-up (kernels, allocator, autocast weight casts)
    flops = count_flops(fns["fp32"])
    times = interleaved(fns, reps)
    med = {p: statistics.median(ts) for p, ts in times.items()}
    parts = []
    for p in PRECISIONS:
        rate = flops / med[p] / 1e9
        parts.append(f"{p} {med[p] * 1e3:.1f} ms ({rate:.1f} GFLOP/s, {100 * rate / peak[p]:.1f}% of its peak)")
    print(f"{name}: {flops / 1e9:.3f} GFLOP per {unit}; " + "; ".join(parts))
    print(f"ratio {name} fp32/bf16 time: {med['fp32'] / med['bf16']:.2f}x "
          f"(reps fp32 {[round(t * 1e3) for t in times['fp32']]} ms, bf16 {[round(t * 1e3) for t in times['bf16']]} ms)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="experiment=micro and a small planner (seconds)")
    ap.add_argument("--checkpoint", default=None, help="plan with these weights (default: a fresh model)")
    ap.add_argument("--reps", type=int, default=5, help="timed calls per precision")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--envs", type=int, default=None, help="environments per planning call (default 8, --small 2)")
    ap.add_argument("--samples", type=int, default=None, help="CEM samples (default eval.num_samples)")
    ap.add_argument("--iterations", type=int, default=3,
                    help="CEM iterations per timed call (eval.iterations = 30 in a real call: 10x the work)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. train.batch_size=32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config([*(["experiment=micro"] if args.small else []), *args.overrides])
    support = bf16_support("cpu")
    forced = not support.available
    if forced:
        os.environ[FORCE_ENV] = "1"  # measure what bf16 costs here; the option itself would fall back
    print(f"machine: {support.reason}; threads {args.threads}; torch {torch.__version__}; "
          f"bf16 {'FORCED (the option would fall back to fp32 here)' if forced else 'native'}")
    peak = matmul_peak(PEAK_SHAPES_SMALL if args.small else PEAK_SHAPES, max(3, args.reps))
    print(f"peak matmul: fp32 {peak['fp32']:.1f} GFLOP/s, bf16 {peak['bf16']:.1f} GFLOP/s "
          f"(bf16/fp32 {peak['bf16'] / peak['fp32']:.2f}x)")

    if args.checkpoint:
        from lensemble.artifacts.checkpoint import load_checkpoint
        from lensemble.model.world_model import world_model_from_state
        ck = load_checkpoint(args.checkpoint)
        model = world_model_from_state(ck.architecture, ck.tensors)
        cfg = cfg.model_copy(update={"model": model.cfg})
    else:
        model = build_world_model(cfg.model, init_seed=0)
    print(f"model: {cfg.model.backbone} {cfg.model.img_size}px embed {cfg.model.embed_dim} depth {cfg.model.depth}, "
          f"d {cfg.model.latent_dim}, predictor {cfg.model.predictor_width}x{cfg.model.predictor_depth} "
          f"({cfg.model.predictor_attention}); batch {cfg.train.batch_size} x {cfg.train.clip_len} frames")
    report("train step", train_calls(cfg, model.state_dict()), args.reps, peak, "step")

    envs = args.envs or (2 if args.small else 8)
    samples = args.samples or cfg.eval.num_samples
    model.eval()
    print(f"planning call: {envs} envs x {samples} samples x {args.iterations} iterations, horizon "
          f"{cfg.eval.horizon}, history {cfg.model.history}")
    report("plan call", plan_calls(cfg, model, envs, samples, args.iterations), args.reps, peak, "call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
