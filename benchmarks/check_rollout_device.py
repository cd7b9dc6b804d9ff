"""The predictor's planning rollout on an accelerator: exactness against the reference and speed.

For each attention kind (window, banded) a random CPU-preset predictor (``ModelConfig()``, seeded)
is moved to ``--device``. Checks, on B = envs × samples candidate rows with T0 history latents:

* ``prepare`` + ``rollout_from`` (the planner's path, KV-cached for the banded kind) against the
  reference that re-runs the teacher-forced ``forward`` over the growing window each step, on
  the device (max |Δ| in float32);
* the device result against the same weights on the CPU (max |Δ|);
* median milliseconds of both paths after warm-up (synchronised), and their ratio.

    python benchmarks/check_rollout_device.py --device cuda
    python benchmarks/check_rollout_device.py --device cpu --envs 1 --reps 3   # runs anywhere
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lensemble.config.schema import ModelConfig
from lensemble.model import build_world_model
from lensemble.model.predictor import reference_rollout


def timed(fn, device: str, reps: int) -> float:
    """Median seconds of ``fn`` after two warm-up calls."""
    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--horizon", type=int, default=5)
    ap.add_argument("--history", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # exactness is checked in full float32
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"device {args.device} ({name}), torch {torch.__version__}, {args.samples} samples, H={args.horizon}")
    print(f"{'kind':>7} {'envs':>4} {'B':>6} {'T0':>3} {'|ours-ref|':>11} {'|dev-cpu|':>10} "
          f"{'ours ms':>8} {'ref ms':>8} {'ref/ours':>8}")
    worst = 0.0
    for kind in ("window", "banded"):
        cfg = ModelConfig(predictor_attention=kind)
        cpu_pred = build_world_model(cfg, init_seed=0).predictor.eval()
        pred = build_world_model(cfg, init_seed=0).predictor.to(args.device).eval()
        a_in = cfg.action_dim * cfg.action_block
        for envs in args.envs:
            b = envs * args.samples
            for t0 in args.history:
                g = torch.Generator().manual_seed(envs * 100 + t0)
                z = torch.randn(envs, t0, cfg.latent_dim, generator=g)
                past = torch.randn(envs, t0 - 1, a_in, generator=g) if t0 > 1 else None
                acts = torch.randn(b, args.horizon, a_in, generator=g)
                dz, dp, da = (z.to(args.device), past.to(args.device) if past is not None else None,
                              acts.to(args.device))
                rep_z = dz.repeat_interleave(args.samples, 0)
                rep_p = dp.repeat_interleave(args.samples, 0) if dp is not None else None
                with torch.inference_mode():
                    def ours(pred=pred, dz=dz, dp=dp, da=da):
                        return pred.rollout_from(pred.prepare(dz, dp), da)

                    def ref(pred=pred, rep_z=rep_z, da=da, rep_p=rep_p):
                        return reference_rollout(pred, rep_z, da, rep_p)

                    got, want = ours(), ref()
                    on_cpu = cpu_pred.rollout_from(cpu_pred.prepare(z, past), acts)
                    err_ref = (got - want).abs().max().item()
                    err_cpu = (got.cpu() - on_cpu).abs().max().item()
                    t_ours, t_ref = timed(ours, args.device, args.reps), timed(ref, args.device, args.reps)
                worst = max(worst, err_ref, err_cpu)
                print(f"{kind:>7} {envs:>4} {b:>6} {t0:>3} {err_ref:>11.2e} {err_cpu:>10.2e} "
                      f"{t_ours * 1e3:>8.2f} {t_ref * 1e3:>8.2f} {t_ref / t_ours:>7.2f}x")
    print(f"largest difference {worst:.2e} ({'ok' if worst < 1e-3 else 'TOO LARGE'} at tolerance 1e-3)")
    if worst >= 1e-3:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
