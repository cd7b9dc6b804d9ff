"""Train steps per second: the real ``InnerLoop`` against a bare torch loop on the same work.

Both sides train the same world model (two copies of one seeded initialisation, each with its own
AdamW) on the same batches: one ``ClipSampler`` over synthetic uint8 episodes of the configured
shape, sampled with identically seeded generators, and the same per-step SIGReg sketch schedule
``train_local`` uses (:func:`lensemble.model.objective.sketch_for_step`).

* ``InnerLoop`` - built and driven exactly as ``train_local`` drives it: AdamW with linear
  warm-up, gradient clipping, :class:`JEPAObjective`, sampler, ``run(..., log_every=
  train.log_every)`` (so the collapse diagnostics run every ``log_every`` steps and on the last
  step of each call). ``train_local``'s own metrics sink and progress bar are not included.
* ``bare``     - the loop one would write by hand: sample, encode the clip, predictor, MSE +
  SIGReg, backward, AdamW step; no warm-up, no clipping, no metrics, no logging.

Repetitions are interleaved (ABBA order, so a change in machine load hits both sides alike);
each repetition times ``--steps`` consecutive steps of one side. The script prints the median
steps/s of each side, their ratio (goal >= 0.9), and the cost of the extra pieces the loop runs
(timed in isolation, per step and amortised): gradient clipping, the warm-up, the scalar
extraction of the loss terms, the diagnostics (effective dimension + latent std, every
``log_every`` steps), and, for reference, the sampler and the sketch that both sides pay.

    .venv/bin/python benchmarks/bench_train_step.py            # CPU preset (configs/model/cpu.yaml), batch 64
    .venv/bin/python benchmarks/bench_train_step.py --small    # experiment=micro: micro model, batch 16
    .venv/bin/python benchmarks/bench_train_step.py --threads 1 --reps 8 --steps 10

Only ratios measured within one run mean anything; absolute steps/s depend on the machine's load.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from lensemble.config import load_config
from lensemble.data.clips import ClipSampler
from lensemble.model import build_world_model, count_parameters, sigreg, sketch_for_step
from lensemble.model.collapse import effective_dim, latent_std
from lensemble.training.loop import InnerLoop

GOAL = 0.9


def synthetic_episodes(cfg, episodes: int, seed: int) -> list[dict]:
    """``episodes`` random episodes of ``data.steps_per_episode`` steps at the model's resolution."""
    rng = np.random.default_rng(seed)
    t, h = cfg.data.steps_per_episode, cfg.model.img_size
    return [{"obs": rng.integers(0, 256, size=(t + 1, h, h, 3), dtype=np.uint8),
             "actions": rng.standard_normal((t, cfg.model.action_dim)).astype(np.float32),
             "state": rng.standard_normal((t + 1, 4)).astype(np.float32)}
            for _ in range(episodes)]


class Bare:
    """The hand-written reference loop (same model shape, same optimizer hyper-parameters)."""

    def __init__(self, model, cfg, sampler):
        self.model, self.cfg, self.sampler = model, cfg, sampler
        self.opt = torch.optim.AdamW(model.trainable_parameters(), lr=cfg.train.lr,
                                     weight_decay=cfg.train.weight_decay)

    def run(self, n: int, *, sketch_fn, generator: torch.Generator, offset: int) -> None:
        o, bs = self.cfg.objective, self.cfg.train.batch_size
        self.model.train()
        for i in range(n):
            batch = self.sampler.sample(bs, generator)
            z = self.model.encoder.encode_frames(batch.obs)
            pred = self.model.predictor(z[:, :-1], batch.actions)
            loss = (o.lambda_pred * F.mse_loss(pred, z[:, 1:].detach())
                    + o.lambda_sig * sigreg(z, sketch_fn(offset + i), knots=o.sigreg_knots, t_max=o.sigreg_t_max))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()


def warmup_bookkeeping(loop: InnerLoop) -> None:
    """What ``InnerLoop.step`` does besides the bare step: set the warm-up lr, list the
    trainable parameters for the gradient clip."""
    lr = loop.lr_at(loop.steps_done)
    for group in loop.optimizer.param_groups:
        group["lr"] = lr
    loop.model.trainable_parameters()


def median_seconds(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="experiment=micro (micro model, batch 16)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per side (default 6, --small 4)")
    ap.add_argument("--steps", type=int, default=None, help="steps per repetition (default 5, --small 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default train.threads)")
    ap.add_argument("--episodes", type=int, default=8, help="synthetic episodes in the sampler")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. train.batch_size=32")
    args = ap.parse_args()

    cfg = load_config((["experiment=micro"] if args.small else []) + list(args.overrides))
    reps = args.reps or (4 if args.small else 6)
    steps = args.steps or (10 if args.small else 5)
    threads = args.threads or cfg.train.threads
    torch.set_num_threads(threads)

    m, tr = cfg.model, cfg.train
    sampler = ClipSampler.from_config(synthetic_episodes(cfg, args.episodes, cfg.root_seed), cfg)
    base = build_world_model(m, init_seed=cfg.root_seed)
    loop = InnerLoop(copy.deepcopy(base), cfg, sampler)
    bare = Bare(copy.deepcopy(base), cfg, sampler)
    d, n_dir = m.latent_dim, cfg.objective.sigreg_directions

    def sketch(i: int) -> torch.Tensor:  # train_local's schedule
        return sketch_for_step(cfg.root_seed, i, d, n_dir, site="pooled")

    print(f"{'micro' if args.small else 'CPU preset'}: {m.img_size}px patch {m.patch_size}, embed "
          f"{m.embed_dim}, depth {m.depth}, d {d}, predictor {m.predictor_width}x{m.predictor_depth}; "
          f"params {count_parameters(base):,}; batch {tr.batch_size} clips x {tr.clip_len} frames, "
          f"SIGReg S={n_dir}, log_every {tr.log_every}; threads {threads}, torch {torch.__version__}",
          flush=True)
    print(f"{reps} interleaved repetitions x {steps} steps per side (+{args.warmup} warm-up steps)", flush=True)

    # Same batches: each side owns a generator seeded alike and draws the same number of batches.
    gen_loop = torch.Generator().manual_seed(cfg.root_seed)
    gen_bare = torch.Generator().manual_seed(cfg.root_seed)
    done = {"loop": 0, "bare": 0}

    def run_loop(n: int) -> None:
        base_i = done["loop"]
        loop.run(n, sketch_fn=lambda i: sketch(base_i + i), generator=gen_loop, log_every=tr.log_every)
        done["loop"] += n

    def run_bare(n: int) -> None:
        bare.run(n, sketch_fn=sketch, generator=gen_bare, offset=done["bare"])
        done["bare"] += n

    run_loop(args.warmup)
    run_bare(args.warmup)
    rates: dict[str, list[float]] = {"loop": [], "bare": []}
    sides = {"loop": run_loop, "bare": run_bare}
    for r in range(reps):
        order = ("loop", "bare") if r % 2 == 0 else ("bare", "loop")
        for name in order:
            t0 = time.perf_counter()
            sides[name](steps)
            rates[name].append(steps / (time.perf_counter() - t0))
    assert done["loop"] == done["bare"], "both sides must see the same number of batches"

    loop_sps, bare_sps = statistics.median(rates["loop"]), statistics.median(rates["bare"])
    step_s = 1.0 / bare_sps

    # The loop's extra pieces, timed in isolation on the loop's model (one real batch).
    n_micro = 20
    model = loop.model
    batch = sampler.sample(tr.batch_size, torch.Generator().manual_seed(1))
    terms = loop.objective(model, batch.obs, batch.actions, sketch(0))
    loop.optimizer.zero_grad(set_to_none=True)
    terms.total.backward()
    z = terms.latents.reshape(-1, terms.latents.shape[-1])
    costs = {
        "grad clip (clip_grad_norm_)": (median_seconds(lambda: torch.nn.utils.clip_grad_norm_(
            model.trainable_parameters(), tr.grad_clip), n_micro), 1),
        "warm-up lr + trainable_parameters()": (median_seconds(lambda: warmup_bookkeeping(loop), n_micro), 1),
        "loss scalars (as_floats)": (median_seconds(terms.as_floats, n_micro), 1),
        "diagnostics (effective_dim + latent_std)": (median_seconds(lambda: (effective_dim(z), latent_std(z)),
                                                                    n_micro), tr.log_every),
        "sampler.sample (both sides)": (median_seconds(lambda: sampler.sample(tr.batch_size, gen_bare), n_micro), 1),
        "sketch_for_step (both sides)": (median_seconds(lambda: sketch(0), n_micro), 1),
    }
    loop.optimizer.zero_grad(set_to_none=True)

    print(f"\n{'side':<10} {'median steps/s':>15} {'min':>8} {'max':>8}  all")
    for name, label in (("loop", "InnerLoop"), ("bare", "bare")):
        v = rates[name]
        print(f"{label:<10} {statistics.median(v):>15.3f} {min(v):>8.3f} {max(v):>8.3f}  "
              + " ".join(f"{x:.2f}" for x in v))
    print(f"\nper-step costs (isolated medians; 'amortised' divides by how often the loop pays it), "
          f"bare step = {step_s * 1e3:.1f} ms:")
    for name, (sec, every) in costs.items():
        print(f"  {name:<42} {sec * 1e3:8.3f} ms per call, every {every:>3} step(s): "
              f"{sec / every * 1e3:8.3f} ms/step = {sec / every / step_s:6.2%} of a bare step")
    diag_sec, diag_every = costs["diagnostics (effective_dim + latent_std)"]
    print(f"diagnostics cost: {diag_sec * 1e3:.3f} ms per evaluation, every {diag_every} steps "
          f"-> {diag_sec / diag_every / step_s:.3%} of a step")
    ratio = loop_sps / bare_sps
    print(f"ratio InnerLoop/bare steps/s: {ratio:.3f} (goal >= {GOAL}) "
          f"{'OK' if ratio >= GOAL else 'BELOW GOAL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
