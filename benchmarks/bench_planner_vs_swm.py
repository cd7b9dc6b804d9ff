"""Closed-loop latent MPC: Lensemble's Planner vs stable-worldmodel 0.1.1's CEMSolver, same model.

Every contender drives the same world model through the same episodes (same seeds, factors, goals
and env loop: :func:`lensemble.eval.closed_loop.run_closed_loop`), with equal CEM budgets (samples,
iterations, top-k, horizon, receding horizon, batch of parallel episodes, threads):

* ``lensemble``      — :class:`~lensemble.eval.mpc.Planner` over the predictor: the history is
  ``prepare``d once per plan call and continued for every candidate (``rollout_from``).
* ``swm+reference``  — ``stable_worldmodel.solver.CEMSolver`` calling ``get_cost`` on
  :class:`SwmCost` in the style of swm's reference world models (LeWM): each rollout step re-runs
  the predictor over its whole history window (the predictor's context: W latents for the window
  kind, depth·(W−1)+1 for the banded kind, so the predictions are the model's own) and keeps the
  last output.
* ``lensemble+mean`` (opt-in) — the same planner executing its final elite mean instead of the
  best candidate it evaluated (what swm's solver returns).
* ``lensemble+bf16`` (opt-in) — ``lensemble`` with the same planner noise under ``eval.precision=bf16``
  (:class:`~lensemble.eval.mpc.WorldModelOnDevice`: bf16 autocast, the cost in fp32; fp32 with a
  warning where the CPU has no bf16 matrix units): the issue-34 planner against today's fp32 one
  and against swm's loop (which runs fp32, as swm's reference models do on a CPU) in one run.
* ``swm+rollout``    — the same solver, ``get_cost`` continuing a history ``prepare``d on the
  first call of each solve (``rollout_from``, as ours does): isolates the solver's own overhead
  from the rollout implementation.

``get_cost(info_dict, action_candidates)`` receives every info entry expanded to (B, S, ...) and
candidates (B, S, H, A·b), and returns (B, S) costs. swm passes the same dict on every iteration
of a solve, so the adapter caches the flattened start history, its past actions and the goal
latent in it on the first call. The cost is the planner's: L1 between the last predicted latent and
the goal latent. Differences that remain by design: swm does not clip candidates to the action
bounds (the env clamps), returns the final mean rather than the best candidate seen, and its
warm start is what ``WorldModelPolicy`` passes (nothing when horizon == receding horizon; our
Planner then also starts from the midpoint).

Output: per contender, success k/n (Wilson 95 % interval), ms per env action (control loop
incl. encoding and env steps), seconds per plan call, and the ratio against ``lensemble``;
then a two-proportion test of the success difference.

    python benchmarks/bench_planner_vs_swm.py --episodes 4               # CPU preset, random init
    python benchmarks/bench_planner_vs_swm.py --model micro --episodes 8 # seconds
    python benchmarks/bench_planner_vs_swm.py --checkpoint runs/x/checkpoints/step-000300 --episodes 20
    python benchmarks/bench_planner_vs_swm.py --checkpoint CKPT --episodes 32 --parallel 8 \
        --contenders lensemble lensemble+bf16 swm+reference   # issue 34's planner target, one run
"""

from __future__ import annotations

import argparse
import contextlib
import io

import torch

from lensemble.config import load_config
from lensemble.config.seeds import derive
from lensemble.eval.closed_loop import episode_specs, eval_factor_values, planner_plan_fn, run_closed_loop
from lensemble.eval.mpc import Planner, WorldModelOnDevice
from lensemble.eval.stats import compare_proportions, wilson_interval
from lensemble.model.predictor import reference_rollout


class SwmCost:
    """stable-worldmodel ``Costable`` adapter over a Lensemble world model.

    Info keys the plan function provides (before swm expands them to (B, S, ...)):
    ``z`` (B, T0, d) start history, ``past`` (B, T0-1, A·b) actions between those latents
    (T0-1 may be 0), ``goal_z`` (B, d). ``rollout="reference"`` re-runs the window per step
    (swm's LeWM idiom); ``"fast"`` continues a per-environment ``Predictor.prepare`` state.
    """

    def __init__(self, model, rollout: str = "reference"):
        self.model = model
        self.rollout = rollout

    def parameters(self):  # swm reads the dtype from here
        return self.model.parameters()

    def _cache(self, info: dict) -> None:
        # swm hands the same dict to every iteration of one solve: flatten once, reuse 30 times.
        z = info["z"]
        b, s = z.shape[:2]
        info["_z"] = z.reshape(b * s, *z.shape[2:]).contiguous()
        past = info["past"]
        info["_past"] = past.reshape(b * s, *past.shape[2:]).contiguous() if past.shape[2] > 0 else None
        info["_goal"] = info["goal_z"][:, 0].contiguous()  # (B, d): identical across samples
        if self.rollout == "fast":  # the history is identical across samples: prepare it per env
            info["_state"] = self.model.predictor.prepare(
                z[:, 0].contiguous(), past[:, 0].contiguous() if past.shape[2] > 0 else None)

    def get_cost(self, info_dict: dict, action_candidates: torch.Tensor) -> torch.Tensor:
        if "_z" not in info_dict:
            self._cache(info_dict)
        b, s, h, a = action_candidates.shape
        acts = action_candidates.reshape(b * s, h, a).float()
        pred = self.model.predictor
        if self.rollout == "fast":
            z = pred.rollout_from(info_dict["_state"], acts)
        else:
            z = reference_rollout(pred, info_dict["_z"], acts, info_dict["_past"])
        final = z[:, -1].reshape(b, s, -1)
        return (final - info_dict["_goal"][:, None]).abs().sum(-1)


def swm_plan_fn(model, eval_cfg, n_envs: int, rollout: str, seed: int):
    """A closed-loop PlanFn backed by swm's CEMSolver with equal samples / iterations / top-k."""
    from gymnasium.spaces import Box
    from stable_worldmodel.policy import PlanConfig
    from stable_worldmodel.solver import CEMSolver

    block = model.cfg.action_block
    a_dim = model.cfg.action_dim
    solver = CEMSolver(SwmCost(model, rollout), batch_size=n_envs, num_samples=eval_cfg.num_samples,
                       var_scale=1.0, n_steps=eval_cfg.iterations, topk=eval_cfg.topk, seed=seed)
    solver.configure(action_space=Box(-1.0, 1.0, shape=(n_envs, a_dim)), n_envs=n_envs,
                     config=PlanConfig(horizon=eval_cfg.horizon, receding_horizon=eval_cfg.receding_horizon,
                                       action_block=block, warm_start=True))
    keep = eval_cfg.receding_horizon

    def plan(z_hist, past, z_goal, init, streams=None):  # swm's solver draws for the whole batch: streams unused
        b = z_hist.shape[0]
        info = {"z": z_hist, "goal_z": z_goal,
                "past": past if past is not None else torch.zeros(b, 0, a_dim * block)}
        with contextlib.redirect_stdout(io.StringIO()):  # swm prints its solve time every call
            out = solver(info, init_action=init)
        actions = out["actions"]
        rest = actions[:, keep:]
        return actions, (rest if rest.shape[1] > 0 else None)

    return plan


class _Counted:
    """Counts plan calls (each plans every active episode of a batch at once)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):  # kwargs: the closed loop's per-episode planner streams
        self.calls += 1
        return self.fn(*args, **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--parallel", type=int, default=4, help="episodes planned together (batch B)")
    ap.add_argument("--model", choices=["cpu", "micro"], default="cpu", help="random-init preset")
    ap.add_argument("--attention", choices=["window", "banded"], default="window",
                    help="predictor attention of the random-init preset (a checkpoint brings its own)")
    ap.add_argument("--checkpoint", default=None, help="use a trained checkpoint instead")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--topk", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--contenders", nargs="+", default=["lensemble", "swm+reference", "swm+rollout"])
    ap.add_argument("--env", default="swm/TwoRoom-v1")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. eval.budget=50")
    args = ap.parse_args()

    from lensemble.envs import make_env

    cfg = load_config([f"model={args.model}", f"model.predictor_attention={args.attention}", "eval=protocol", f"eval.num_samples={args.samples}",
                       f"eval.iterations={args.iterations}", f"eval.topk={args.topk}", *args.overrides])
    if args.checkpoint:
        from lensemble.artifacts import load_checkpoint
        from lensemble.model import world_model_from_state

        ckpt = load_checkpoint(args.checkpoint)
        model = world_model_from_state(ckpt.architecture, ckpt.tensors).eval()
        label = f"checkpoint {ckpt.content_hash[:12]}"
    else:
        from lensemble.model import build_world_model

        model = build_world_model(cfg.model, init_seed=0).eval()
        label = f"random-init {args.model} preset"
    ev = cfg.eval
    values, _ = eval_factor_values(cfg, args.env, "heldout")
    specs = episode_specs(ev.seed, args.episodes, values)
    envs = [make_env(args.env, model.cfg.img_size) for _ in range(min(args.parallel, args.episodes))]
    torch.set_num_threads(args.threads)  # after the envs: the adapter pins the process to 1 thread
    block = model.cfg.action_block
    print(f"{args.env}, {label}: d={model.cfg.latent_dim}, W={model.cfg.history}, "
          f"{model.cfg.predictor_attention} attention (context {model.predictor.context}), block={block}; "
          f"CEM {ev.num_samples} x {ev.iterations} top-{ev.topk}, H={ev.horizon}, receding {ev.receding_horizon}, "
          f"goal +{ev.goal_offset}, budget {ev.budget}; {args.episodes} episodes, {len(envs)} in parallel, "
          f"{args.threads} thread(s), torch {torch.__version__}")

    results = {}
    for name in args.contenders:
        seed = derive(ev.seed, "bench", name)
        precision = "bf16" if name == "lensemble+bf16" else "fp32"
        if name in ("lensemble", "lensemble+mean", "lensemble+bf16"):
            seed = derive(ev.seed, "bench", "lensemble")  # same noise: only what is executed (mean) or the precision differs
            planner = Planner.from_config(ev, action_dim=model.cfg.action_dim * block, action_low=-1.0,
                                          action_high=1.0, seed=seed)
            plan_fn = planner_plan_fn(model, planner, ev.receding_horizon,
                                      execute="mean" if name.endswith("mean") else "best")
        elif name in ("swm+reference", "swm+rollout"):
            plan_fn = swm_plan_fn(model, ev, len(envs), "reference" if name.endswith("reference") else "fast",
                                  seed % (2**31))
        else:
            raise SystemExit(f"unknown contender {name}")
        counted = _Counted(plan_fn)
        with WorldModelOnDevice(model, "cpu", precision):  # fp32: nothing at all
            res = run_closed_loop(model, envs, specs, ev, plan_fn=counted, eval_seed=ev.seed)
        results[name] = (res, counted.calls)

    base = results.get("lensemble")
    print(f"\n{'contender':<15} {'success':>9} {'95% CI':>15} {'ms/action':>10} {'s/plan call':>12} "
          f"{'speedup':>8} {'final dist':>10}")
    for name, (res, n_calls) in results.items():
        ci = wilson_interval(res.n_successes, len(res.episodes))
        speed = res.time_per_action_ms / base[0].time_per_action_ms if base else float("nan")
        final = sum(e.final_distance for e in res.episodes) / len(res.episodes)
        print(f"{name:<15} {res.n_successes:>4}/{len(res.episodes):<4} [{ci.low:5.1%}, {ci.high:5.1%}] "
              f"{res.time_per_action_ms:>10.1f} {res.plan_seconds / max(n_calls, 1):>12.2f} "
              f"{speed:>7.2f}x {final:>10.1f}")
    print("(speedup = that contender's ms/action over lensemble's: > 1 means lensemble is faster)")
    if "lensemble+bf16" in results and "swm+reference" in results:
        fast, ref = results["lensemble+bf16"][0], results["swm+reference"][0]
        print(f"ratio swm+reference / lensemble+bf16 ms per action: "
              f"{ref.time_per_action_ms / fast.time_per_action_ms:.2f}x")
    if base:
        for name, (res, _) in results.items():
            if name == "lensemble":
                continue
            cmp = compare_proportions(base[0].n_successes, len(base[0].episodes), res.n_successes,
                                      len(res.episodes))
            print(f"success lensemble - {name}: {cmp.difference:+.1%} "
                  f"[{cmp.ci.low:+.1%}, {cmp.ci.high:+.1%}], p = {cmp.p_value:.2f}")
    for env in envs:
        env.close()


if __name__ == "__main__":
    main()
