"""The paper preset on a device: train steps/s, ms per planning call and memory, in one command.

Prepared for the moment a GPU is lent (one command, well under 10 minutes on one GPU); it runs
anywhere with ``--device cpu --tiny`` (tests/unit/test_check_paper_device.py runs that), so it is
known to work before a GPU is ever used. Everything goes through the library's own device paths:
``train.device`` / ``eval.device`` (lensemble/config/schema.py), ``InnerLoop`` (model, optimizer
state and batches on the device for the steps, back on the CPU after),
``eval.mpc.WorldModelOnDevice`` + ``closed_loop.planner_plan_fn`` + ``run_closed_loop`` (the
closed loop ``evaluate`` runs) and ``evaluate`` itself (ladder off).

1. **train** ``--steps`` AdamW steps of the preset's model (``experiment=paper``: ViT-tiny at
   224 px, batch 128 clips x 4 frames) on synthetic uint8 episodes of the preset's shape (the
   throughput does not depend on what the pixels show; collecting 8000 real 224-px episodes would
   take hours), after ``--warmup`` steps. Prints steps/s (synchronised), the loss, and the peak
   device memory.
2. **determinism**: the same ``--repeat-steps`` steps twice from one initialisation and seed on
   the device (bitwise equal or not), and ``--cpu-steps`` steps at batch ``--cpu-batch`` on the
   device against the same on the CPU (max |weight difference|).
3. **plan**: ``--episodes`` closed-loop TwoRoom episodes at the model's resolution, ``--parallel``
   side by side, with the preset's planner (CEM 300 x 30, H = 5), then ``--plan-reps`` warm
   planning calls for ``--parallel`` environments: ms per planning call (median), ms per env
   action, peak device memory.
4. **evaluate** the trained weights (a checkpoint in ``--workdir``) on 2 episodes, ladder off.

    python benchmarks/check_paper_device.py --device cuda            # the paper preset, ~2-5 min on one GPU
    python benchmarks/check_paper_device.py --device cpu --tiny      # experiment=micro sizes, seconds, anywhere
    python benchmarks/check_paper_device.py --device cuda train.precision=fp32 eval.precision=fp32 && \
      python benchmarks/check_paper_device.py --device cuda train.precision=bf16 eval.precision=bf16   # issue 34, item 5

Trailing arguments are Hydra overrides (e.g. ``train.batch_size=64``). Absolute numbers depend on
the machine; on a shared CPU box they swing with the load.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from lensemble.config import load_config
from lensemble.config.seeds import derive, torch_generator
from lensemble.data.clips import ClipSampler
from lensemble.model.objective import sketch_for_step
from lensemble.model.precision import resolve_precision
from lensemble.model.world_model import architecture, build_world_model
from lensemble.training.loop import InnerLoop


def synthetic_episodes(cfg, episodes: int, seed: int) -> list[dict]:
    """``episodes`` random episodes of ``data.steps_per_episode`` steps at the model's resolution."""
    rng = np.random.default_rng(seed)
    t, h = cfg.data.steps_per_episode, cfg.model.img_size
    return [{"obs": rng.integers(0, 256, size=(t + 1, h, h, 3), dtype=np.uint8),
             "actions": rng.uniform(-1, 1, (t, cfg.model.action_dim)).astype(np.float32),
             "state": rng.standard_normal((t + 1, 4)).astype(np.float32)}
            for _ in range(episodes)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gpu_memory(device: str) -> str:
    if not device.startswith("cuda"):
        return "n/a (cpu)"
    mib = 1024 * 1024
    return (f"{torch.cuda.max_memory_allocated() / mib:,.0f} MiB allocated, "
            f"{torch.cuda.max_memory_reserved() / mib:,.0f} MiB reserved")


def reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train_steps(cfg, sampler, n: int, *, seed_label: str, model=None):
    """``n`` InnerLoop steps from the preset's seeded initialisation; returns (model, loop, metrics)."""
    model = model or build_world_model(cfg.model, init_seed=derive(cfg.root_seed, "init"))
    loop = InnerLoop(model, cfg, sampler)
    d, s = cfg.model.latent_dim, cfg.objective.sigreg_directions
    last = loop.run(n, sketch_fn=lambda i: sketch_for_step(cfg.root_seed, i, d, s),
                    generator=torch_generator(cfg.root_seed, "batches", seed_label), log_every=max(n, 1))
    return model, loop, last


def max_weight_diff(a, b) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    return max(float((sa[k].double() - sb[k].double()).abs().max()) if sa[k].numel() else 0.0 for k in sa)


class TimedPlan:
    """A PlanFn wrapper that counts calls and times each one (synchronised)."""

    def __init__(self, fn, device: str):
        self.fn, self.device, self.ms = fn, device, []

    def __call__(self, *args, **kwargs):  # kwargs: the closed loop's per-episode planner streams
        sync(self.device)
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        sync(self.device)
        self.ms.append(1000 * (time.perf_counter() - t0))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="experiment=micro sizes and few steps (CPU smoke test)")
    ap.add_argument("--steps", type=int, default=None, help="timed train steps (default 300; --tiny 6)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed train steps first (default 10; --tiny 1)")
    ap.add_argument("--repeat-steps", type=int, default=None, help="steps of the bitwise repeat (default 20; --tiny 2)")
    ap.add_argument("--cpu-steps", type=int, default=None, help="steps of device vs CPU (default 3; --tiny 2)")
    ap.add_argument("--cpu-batch", type=int, default=2, help="clips per step of device vs CPU")
    ap.add_argument("--episodes", type=int, default=None, help="closed-loop episodes (default 8; --tiny 2)")
    ap.add_argument("--parallel", type=int, default=None, help="episodes side by side (default 8; --tiny 2)")
    ap.add_argument("--plan-reps", type=int, default=None, help="warm planning calls timed (default 10; --tiny 2)")
    ap.add_argument("--data-episodes", type=int, default=16, help="synthetic episodes in the sampler")
    ap.add_argument("--workdir", default=None, help="where the checkpoint goes (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default train.threads)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides")
    args = ap.parse_args()
    tiny = args.tiny
    pick = lambda value, big, small: value if value is not None else (small if tiny else big)  # noqa: E731
    steps, warmup = pick(args.steps, 300, 6), pick(args.warmup, 10, 1)
    repeat_steps, cpu_steps = pick(args.repeat_steps, 20, 2), pick(args.cpu_steps, 3, 2)
    episodes, parallel, plan_reps = pick(args.episodes, 8, 2), pick(args.parallel, 8, 2), pick(args.plan_reps, 10, 2)
    dev = args.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"--device {dev}: torch {torch.__version__} sees no CUDA device")

    t_start = time.perf_counter()
    preset = "micro" if tiny else "paper"
    cfg = load_config([f"experiment={preset}", f"train.device={dev}", f"eval.device={dev}", *args.overrides])
    cpu_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"device": "cpu"})})
    threads = args.threads or cfg.train.threads
    torch.set_num_threads(threads)
    name = torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else "cpu"
    tf32 = (f", TF32 matmul {torch.backends.cuda.matmul.allow_tf32} cudnn {torch.backends.cudnn.allow_tf32}"
            if dev.startswith("cuda") else "")
    n_params = sum(p.numel() for p in build_world_model(cfg.model, init_seed=0).parameters())
    m, t = cfg.model, cfg.train
    print(f"device {dev} ({name}), torch {torch.__version__}{tf32}, {threads} CPU thread(s)")
    ran = {f: resolve_precision(getattr(cfg, f.split(".")[0]).precision, dev, field=f)
           for f in ("train.precision", "eval.precision")}
    print("precision: " + ", ".join(f"{f}={getattr(cfg, f.split('.')[0]).precision} runs {p}"
                                    for f, p in ran.items()), flush=True)
    print(f"preset {preset}: {n_params / 1e6:.2f} M parameters, batch {t.batch_size} clips x {t.clip_len} frames "
          f"at {m.img_size} px, planner {cfg.eval.planner} {cfg.eval.num_samples} x {cfg.eval.iterations} "
          f"H={cfg.eval.horizon}", flush=True)

    # ------------------------------------------------------------------ 1. train
    sampler = ClipSampler.from_config(synthetic_episodes(cfg, args.data_episodes, cfg.root_seed), cfg)
    reset_peak(dev)
    model, loop, _ = train_steps(cfg, sampler, warmup, seed_label="warmup")
    d, s = cfg.model.latent_dim, cfg.objective.sigreg_directions
    sync(dev)
    t0 = time.perf_counter()
    last = loop.run(steps, sketch_fn=lambda i: sketch_for_step(cfg.root_seed, warmup + i, d, s),
                    generator=torch_generator(cfg.root_seed, "batches", "timed"), log_every=max(steps, 1))
    sync(dev)
    seconds = time.perf_counter() - t0
    on_cpu = all(p.device.type == "cpu" for p in model.parameters())
    print(f"train: {steps} steps in {seconds:.1f} s = {steps / seconds:.3f} steps/s "
          f"({steps * t.batch_size * t.clip_len / seconds:,.0f} frames/s), loss {last['loss/total']:.4f}, "
          f"weights back on the cpu: {on_cpu}", flush=True)
    print(f"train memory: peak {gpu_memory(dev)}", flush=True)

    # ------------------------------------------------------------------ 2. determinism
    a, _, _ = train_steps(cfg, sampler, repeat_steps, seed_label="repeat")
    b, _, _ = train_steps(cfg, sampler, repeat_steps, seed_label="repeat")
    diff = max_weight_diff(a, b)
    print(f"train repeat ({repeat_steps} steps twice on {dev}): "
          f"{'bitwise identical' if diff == 0 else f'differs, max |dw| {diff:.3e}'}", flush=True)
    small = lambda c: c.model_copy(update={"train": c.train.model_copy(update={"batch_size": args.cpu_batch})})  # noqa: E731
    on_dev, _, _ = train_steps(small(cfg), sampler, cpu_steps, seed_label="vs-cpu")
    on_host, _, _ = train_steps(small(cpu_cfg), sampler, cpu_steps, seed_label="vs-cpu")
    print(f"train {dev} vs cpu ({cpu_steps} steps, batch {args.cpu_batch}): max |dw| "
          f"{max_weight_diff(on_dev, on_host):.3e}", flush=True)
    del a, b, on_dev, on_host

    # ------------------------------------------------------------------ 3. plan
    from lensemble.envs import make_env
    from lensemble.envs.adapter import env_info
    from lensemble.eval.closed_loop import episode_specs, eval_factor_values, planner_plan_fn, run_closed_loop
    from lensemble.eval.mpc import Planner, WorldModelOnDevice

    ev, env_id = cfg.eval, cfg.env.id
    info, block = env_info(env_id), cfg.model.action_block
    values, _ = eval_factor_values(cfg, env_id, "heldout")
    specs = episode_specs(ev.seed, episodes, values)
    envs = [make_env(env_id, cfg.model.img_size) for _ in range(min(parallel, episodes))]
    torch.set_num_threads(threads)  # after the envs: the adapter pins the process to one thread
    planner = Planner.from_config(ev, action_dim=info.action_dim * block,
                                  action_low=torch.tensor(info.action_low).repeat(block),
                                  action_high=torch.tensor(info.action_high).repeat(block),
                                  seed=derive(ev.seed, "eval", "planner"))
    model.eval()
    reset_peak(dev)
    try:
        with WorldModelOnDevice(model, ev.device):
            timed = TimedPlan(planner_plan_fn(model, planner, ev.receding_horizon), dev)
            res = run_closed_loop(model, envs, specs, ev, plan_fn=timed, eval_seed=ev.seed)
            closed_calls = list(timed.ms)
            # steady state: warm planning calls for len(envs) environments at T0 = 1
            g = torch.Generator().manual_seed(0)
            b_envs = len(envs)
            z = torch.randn(b_envs, 1, cfg.model.latent_dim, generator=g)
            goal = torch.randn(b_envs, cfg.model.latent_dim, generator=g)
            timed.ms.clear()
            for _ in range(2 + plan_reps):
                timed(z, None, goal, None)
            warm = timed.ms[2:]
    finally:
        for env in envs:
            env.close()
    print(f"plan: {len(closed_calls)} planning calls in {len(specs)} closed-loop episodes ({len(envs)} side by "
          f"side), {res.n_successes}/{len(specs)} successes, {res.time_per_action_ms:.1f} ms per env action", flush=True)
    print(f"plan: median {statistics.median(warm):.1f} ms per planning call ({b_envs} envs x {ev.num_samples} "
          f"samples x {ev.iterations} iterations, {plan_reps} warm calls; min {min(warm):.1f}, max {max(warm):.1f})",
          flush=True)
    print(f"plan memory: peak {gpu_memory(dev)}", flush=True)

    # ------------------------------------------------------------------ 4. evaluate (ladder off)
    from lensemble.artifacts.checkpoint import save_checkpoint
    from lensemble.eval.closed_loop import evaluate

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="check-paper-"))
    ckpt = work / "checkpoint"
    save_checkpoint(ckpt, model.state_dict(), kind="world_model", config_hash=cfg.config_hash(),
                    architecture=architecture(cfg.model), extra={"source": "check_paper_device"})
    report = evaluate(ckpt, env_id, cfg=cfg, episodes=2, ladder=False, progress=False, parallel=2)
    print(f"evaluate ({dev}, ladder off): {report.n_successes}/{report.n_episodes} successes, "
          f"{report.time_per_action_ms:.1f} ms per action", flush=True)
    print(f"host memory: peak RSS {rss_mib():,.0f} MiB", flush=True)
    print(f"done in {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
