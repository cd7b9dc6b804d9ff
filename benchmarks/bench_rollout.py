"""Predictor rollout throughput at the planner's batch sizes.

The CEM planner scores B = envs × num_samples candidate action sequences of length H per
iteration (defaults: 300 samples, horizon 5, 30 iterations per plan). This script times
``Predictor.rollout`` at the CPU preset (``ModelConfig()`` defaults unless overridden) in three
modes - autograd on, ``torch.no_grad`` and ``torch.inference_mode`` (``rollout_nograd``) - plus
the planner's path (``prepare`` the per-environment history once, then ``rollout_from`` for all
samples, under inference_mode) and a naive reference that re-runs the full teacher-forced
``forward`` on the growing window (the predictor's context) every step. ``--attention banded``
times the banded predictor, whose rollout caches keys and values.

Output: one row per (envs, history length, mode) with median and minimum milliseconds per rollout,
throughput in candidate-steps per second (B·H / t_min) and the implied seconds per 30-iteration
CEM plan (predictor only; encoding the current and goal frames is extra but done once per plan).

    python benchmarks/bench_rollout.py --threads 2 --envs 1 2 3 4
    python benchmarks/bench_rollout.py --threads 1 --envs 4 --history 1 3 5 --attention banded
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

from lensemble.config.schema import ModelConfig
from lensemble.model import build_world_model, count_parameters
from lensemble.model.predictor import reference_rollout


def time_it(fn, reps: int, warmup: int = 2) -> tuple[float, float]:
    """(median, min) wall seconds; min is the better estimate on a shared, noisy machine."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--horizon", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=30, help="CEM iterations per plan")
    ap.add_argument("--history", type=int, nargs="+", default=[1, 3], help="T0 latents given")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--attention", choices=["window", "banded"], default="window")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    cfg = ModelConfig(predictor_attention=args.attention)
    model = build_world_model(cfg, init_seed=0).to(args.device).eval()
    pred = model.predictor
    a_in = cfg.action_dim * cfg.action_block
    print(
        f"CPU preset: d={cfg.latent_dim}, width={cfg.predictor_width}, depth={cfg.predictor_depth}, "
        f"W={cfg.history}, {cfg.predictor_attention} attention (context {pred.context}), actions={a_in}; params total={count_parameters(model):,} "
        f"(encoder {count_parameters(model.encoder):,}, predictor {count_parameters(pred):,}); "
        f"threads={args.threads}, device={args.device}, torch {torch.__version__}"
    )
    g = torch.Generator().manual_seed(0)
    modes = {
        "autograd": (contextlib.nullcontext, "rollout"),
        "no_grad": (torch.no_grad, "rollout"),
        "inference_mode": (contextlib.nullcontext, "rollout_nograd"),
        "prepared+inference": (torch.inference_mode, "prepared"),
        "naive+inference": (torch.inference_mode, "naive"),
    }
    print(f"{'envs':>4} {'B':>5} {'T0':>3} {'mode':>16} {'ms med':>8} {'ms min':>8} "
          f"{'cand-steps/s':>13} {'s/plan':>7}   (rate and s/plan from the min)")
    for envs in args.envs:
        b = envs * args.samples
        for t0 in args.history:
            z_hist = torch.randn(b, t0, cfg.latent_dim, generator=g).to(args.device)
            acts = torch.randn(b, args.horizon, a_in, generator=g).to(args.device)
            past = torch.randn(b, t0 - 1, a_in, generator=g).to(args.device) if t0 > 1 else None
            # The planner's layout: one history per environment, repeated for its samples.
            z_hist = z_hist[:: args.samples].repeat_interleave(args.samples, dim=0)
            past = past[:: args.samples].repeat_interleave(args.samples, dim=0) if past is not None else None
            for name, (ctx, kind) in modes.items():
                def run(ctx=ctx, kind=kind, z_hist=z_hist, acts=acts, past=past):
                    with ctx():
                        if kind == "naive":
                            out = reference_rollout(pred, z_hist, acts, past)
                        elif kind == "prepared":
                            env_past = past[:: args.samples] if past is not None else None
                            out = pred.rollout_from(pred.prepare(z_hist[:: args.samples], env_past), acts)
                        else:
                            out = getattr(pred, kind)(z_hist, acts, past_actions=past)
                    if args.device != "cpu":
                        torch.cuda.synchronize()
                    return out

                med, best = time_it(run, args.reps)
                rate = b * args.horizon / best
                print(
                    f"{envs:>4} {b:>5} {t0:>3} {name:>16} {med * 1e3:>8.1f} {best * 1e3:>8.1f} "
                    f"{rate:>13,.0f} {best * args.iterations:>7.2f}"
                )


if __name__ == "__main__":
    main()
