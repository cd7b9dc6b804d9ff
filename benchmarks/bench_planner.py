"""Planner-only micro-benchmark: lensemble ``Planner`` vs stable-worldmodel 0.1.1 solvers.

Both planners optimise the *same* cost on the *same* stand-in world model: a tiny residual MLP
predictor z_{t+1} = z_t + MLP([z_t, a_t]) with the lensemble L1 energy between the final predicted
latent and a goal latent (``lensemble.eval.mpc.latent_l1_cost``). The model exposes both interfaces:

* ``rollout(z0 (N, d), actions (N, H, A)) -> (N, H, d)`` — what ``Planner.plan`` calls;
* ``get_cost(info_dict, candidates (B, S, H, A)) -> (B, S)`` — what the swm solvers call, with
  ``info_dict['z0']``/``info_dict['goal']`` expanded by the solver to (B, S, d).

Budgets are equal: samples, iterations, elites, horizon, initial std (swm's ``var_scale`` is used
as a std) and B parallel environments in one batch. The model clips actions to the box inside the
rollout, so swm's unclipped candidates are scored exactly as lensemble's clipped ones; returned
plans are clipped (as an environment would) and re-scored with the same cost. swm returns its
final sampling mean, lensemble the cheapest sequence it evaluated: the re-scored cost compares what
each planner would execute.

Output: median ms per plan for each, the ratio swm / lensemble (> 1: lensemble is faster), and the
mean final cost over environments and repeats.

    python benchmarks/bench_planner.py --envs 4 --repeats 5
    python benchmarks/bench_planner.py --families cem icem mppi --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time

import torch
from torch import nn

from lensemble.eval.mpc import Planner, latent_l1_cost


class StandInWorldModel(nn.Module):
    """Tiny residual MLP latent dynamics with both planner interfaces (see module docstring)."""

    def __init__(self, latent_dim: int, action_dim: int, hidden: int, low: float, high: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(latent_dim + action_dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, latent_dim),
        )
        self.low, self.high = low, high

    @torch.no_grad()
    def rollout(self, z0: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """(N, d), (N, H, A) -> (N, H, d) predicted latents z_1..z_H."""
        actions = actions.clamp(self.low, self.high)
        z, out = z0, []
        for t in range(actions.shape[1]):
            z = z + self.net(torch.cat([z, actions[:, t]], dim=-1))
            out.append(z)
        return torch.stack(out, dim=1)

    @torch.no_grad()
    def get_cost(self, info_dict: dict, action_candidates: torch.Tensor) -> torch.Tensor:
        """swm ``Costable``: (B, S, H, A) candidates -> (B, S) L1 energy to the goal."""
        b, s, h, a = action_candidates.shape
        z0 = info_dict["z0"].reshape(b * s, -1)
        goal = info_dict["goal"].reshape(b * s, -1)
        pred = self.rollout(z0, action_candidates.reshape(b * s, h, a))
        return latent_l1_cost(pred, goal).reshape(b, s)


def _swm_solver(family, model, args, device, seed):
    from stable_worldmodel import solver as swm_solver

    common = dict(
        batch_size=args.envs,
        num_samples=args.samples,
        var_scale=args.init_std,
        n_steps=args.iterations,
        topk=args.topk,
        device=device,
        seed=seed,
    )
    if family == "cem":
        return swm_solver.CEMSolver(model, **common)
    if family == "icem":
        return swm_solver.ICEMSolver(model, noise_beta=args.beta, alpha=0.1, n_elite_keep=5, **common)
    return swm_solver.MPPISolver(model, temperature=args.temperature, **common)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(family: str, args, device: torch.device) -> dict:
    from gymnasium.spaces import Box
    from stable_worldmodel.policy import PlanConfig

    torch.manual_seed(args.seed)
    model = StandInWorldModel(args.latent_dim, args.action_dim, args.hidden, -1.0, 1.0).to(device)
    model.eval()
    b, h, a = args.envs, args.horizon, args.action_dim
    gen = torch.Generator().manual_seed(args.seed + 1)
    z0 = torch.randn(b, args.latent_dim, generator=gen).to(device)
    # Reachable goals: the latent at the end of a random in-box action sequence.
    goal = model.rollout(z0, (torch.rand(b, h, a, generator=gen) * 2 - 1).to(device))[:, -1]

    ours = Planner(
        family,
        h,
        args.samples,
        args.iterations,
        args.topk,
        a,
        -1.0,
        1.0,
        seed=args.seed,
        init_std=args.init_std,
        mppi_temperature=args.temperature,
        icem_colored_noise_beta=args.beta,
    )
    theirs = _swm_solver(family, model, args, device, args.seed)
    theirs.configure(
        action_space=Box(-1.0, 1.0, shape=(b, a)), n_envs=b, config=PlanConfig(horizon=h, receding_horizon=h)
    )
    info = {"z0": z0, "goal": goal}

    def plan_ours():
        return ours.plan(model.rollout, z0, goal).actions

    def plan_theirs():
        with contextlib.redirect_stdout(io.StringIO()):  # swm 0.1.1 prints every solve
            return theirs(info)["actions"].to(device)

    def score(actions):
        return latent_l1_cost(model.rollout(z0, actions.clamp(-1.0, 1.0)), goal)

    fns = {"lensemble": plan_ours, "swm": plan_theirs}
    times = {name: [] for name in fns}
    costs = {name: [] for name in fns}
    for _ in range(args.warmup):
        for fn in fns.values():
            fn()
    # Interleave the two (alternating who goes first) so load drift on a shared machine hits both.
    for r in range(args.repeats):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            _sync(device)
            t0 = time.perf_counter()
            actions = fns[name]()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
            costs[name].append(score(actions).mean().item())
    return {n: (1000 * statistics.median(times[n]), statistics.mean(costs[n])) for n in fns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=["cem"], choices=["cem", "icem", "mppi"])
    ap.add_argument("--envs", type=int, default=4, help="B parallel environments")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--topk", type=int, default=30)
    ap.add_argument("--horizon", type=int, default=5)
    ap.add_argument("--init-std", type=float, default=1.0)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--beta", type=float, default=2.0, help="iCEM colored-noise exponent")
    ap.add_argument("--latent-dim", type=int, default=32)
    ap.add_argument("--action-dim", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    print(
        f"device={device} threads={args.threads} envs={args.envs} samples={args.samples} "
        f"iterations={args.iterations} topk={args.topk} horizon={args.horizon} "
        f"d={args.latent_dim} A={args.action_dim}"
    )
    print(
        f"{'family':<6} {'lensemble ms/plan':>18} {'swm ms/plan':>12} {'swm/lens':>9} "
        f"{'lens cost':>10} {'swm cost':>10}"
    )
    for family in args.families:
        res = run(family, args, device)
        (t_ours, c_ours), (t_swm, c_swm) = res["lensemble"], res["swm"]
        print(
            f"{family:<6} {t_ours:>18.1f} {t_swm:>12.1f} {t_swm / t_ours:>9.2f} "
            f"{c_ours:>10.4f} {c_swm:>10.4f}"
        )


if __name__ == "__main__":
    main()
