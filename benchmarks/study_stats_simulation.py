"""Does the study's analysis hold its level, cover, and have the power the registry says? By simulation.

The study decides every comparison with one-sided paired t tests over seeds (docs/study.md, "The
analysis"). This script simulates the planned design (default: the CPU study, 6 seeds × 20
episodes, baseline success 0.25, δ_success = 0.10, δ_drift = 10° with a per-seed SD of 20°) and
prints, for the registered test and for the alternatives it replaced or reports beside:

* level: P(reject H0 "no effect") when the true effect is 0, at α = 0.05 and at the first Holm
  step of the 4-component confirmatory family (α/4), one-sided;
* coverage of the two-sided 95 % intervals of the mean difference;
* falsification level: P("falsified") when the true effect equals δ;
* power at δ and the MDE at the first Holm step, simulated, beside the formula the registry uses.

Success is simulated with binary episodes paired across arms (a Gaussian copula gives two arms'
outcomes on one episode the correlation ρ_episode) and a treatment × seed spread
(sd_train: each seed's true difference is δ + N(0, 2·sd_train²)); drift as normal or heavy-tailed
(t with 3 degrees of freedom) per-seed differences.

    python benchmarks/study_stats_simulation.py                 # 2000 replicates per cell, a few minutes
    python benchmarks/study_stats_simulation.py --reps 500      # quicker, noisier
    python benchmarks/study_stats_simulation.py --out sim.json  # also write the numbers
"""

from __future__ import annotations

import argparse
import json
import math
import time
from itertools import product

import numpy as np
from scipy import stats

from lensemble.eval.stats import bootstrap_ci
from lensemble.study.power import (
    simulate_success,
    simulated_success_mde,
    success_sd,
    t_mde,
    t_power,
    t_reject,
)


def _t_interval(d: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    n = d.shape[-1]
    half = stats.t.ppf(0.5 + level / 2, n - 1) * d.std(-1, ddof=1) / math.sqrt(n)
    return d.mean(-1) - half, d.mean(-1) + half


def _t_falsified(d: np.ndarray, delta: float, alpha: float) -> np.ndarray:
    """The registered falsification test: reject H0 'mean >= δ' (one-sided t) at alpha."""
    return t_reject(delta - d, alpha)


def _signflip_p(d: np.ndarray) -> np.ndarray:
    n = d.shape[-1]
    signs = np.array(list(product((1.0, -1.0), repeat=n)))
    null = d @ signs.T / n                                   # (reps, 2^n)
    obs = d.mean(-1, keepdims=True)
    return (null >= obs - 1e-12).mean(-1)


def _bca(d: np.ndarray, rng, n_boot: int) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = np.empty(len(d)), np.empty(len(d))
    for i, row in enumerate(d):
        if np.all(row == row[0]):
            lo[i] = hi[i] = row[0]
            continue
        _, ci = bootstrap_ci(row, n_boot=n_boot, seed=rng)
        lo[i], hi[i] = ci.low, ci.high
    return lo, hi


def _hierarchical(ep: np.ndarray, rng, n_boot: int) -> np.ndarray:
    """Two-stage bootstrap replicates (reps, n_boot) of the mean of per-seed means."""
    reps, n, e = ep.shape
    out = np.empty((reps, n_boot))
    for i in range(reps):
        seeds = rng.integers(0, n, size=(n_boot, n))
        eps = rng.integers(0, e, size=(n_boot, n, e))
        out[i] = ep[i][seeds[..., None], eps].mean(-1).mean(-1)
    return out


def _stratified_p(ep: np.ndarray, rng, n_perm: int) -> np.ndarray:
    reps, n, e = ep.shape
    p = np.empty(reps)
    for i in range(reps):
        flips = rng.choice(np.array([1.0, -1.0]), size=(n_perm, n, e))
        null = (flips * ep[i]).mean(-1).mean(-1)
        p[i] = (np.sum(null >= ep[i].mean() - 1e-12) + 1) / (n_perm + 1)
    return p


def success_cells(args, rng) -> list[dict]:
    rows = []
    first = args.alpha / args.components
    for rho, sd_train in product(args.episode_correlation, args.sd_train):
        kw = dict(baseline=args.baseline, sd_train=sd_train, episode_correlation=rho)
        # Level: the true effect is 0.
        ep0 = simulate_success(rng, args.reps, args.seeds, args.episodes, effect=0.0, **kw)
        d0 = ep0.mean(-1)
        hb = _hierarchical(ep0, rng, args.n_boot)
        sf = _signflip_p(d0)
        sp = _stratified_p(ep0, rng, args.n_boot)
        row = {"metric": "success", "episode_correlation": rho, "sd_train": sd_train,
               "level_t@a": float(t_reject(d0, args.alpha).mean()),
               "level_t@a/4": float(t_reject(d0, first).mean()),
               "level_signflip@a": float((sf <= args.alpha).mean()),
               "level_signflip@a/4": float((sf <= first).mean()),
               "level_hierarchical@a": float((np.quantile(hb, args.alpha, axis=-1) > 0).mean()),
               "level_hierarchical@a/4": float((np.quantile(hb, first, axis=-1) > 0).mean()),
               "level_stratified_episodes@a": float((sp <= args.alpha).mean())}
        # Coverage and falsification: the true effect is δ.
        epd = simulate_success(rng, args.reps, args.seeds, args.episodes, effect=args.delta_success, **kw)
        dd = epd.mean(-1)
        lo, hi = _t_interval(dd)
        row["coverage_t"] = float(((lo <= args.delta_success) & (args.delta_success <= hi)).mean())
        blo, bhi = _bca(dd, rng, args.n_boot)
        row["coverage_bca_seeds"] = float(((blo <= args.delta_success) & (args.delta_success <= bhi)).mean())
        hbd = _hierarchical(epd, rng, args.n_boot)
        hlo, hhi = np.quantile(hbd, [0.025, 0.975], axis=-1)
        row["coverage_hierarchical"] = float(((hlo <= args.delta_success) & (args.delta_success <= hhi)).mean())
        row["falsified_t@a (effect = δ)"] = float(_t_falsified(dd, args.delta_success, args.alpha).mean())
        row["falsified_old_rule (BCa upper < δ)"] = float((bhi < args.delta_success).mean())
        # Power at δ at the first Holm step: simulated vs the normal-theory noncentral t.
        row["power_t@a/4 at δ (sim)"] = float(t_reject(dd, first).mean())
        row["power_signflip@a/4 at δ (sim)"] = float((_signflip_p(dd) <= first).mean())
        row["power_t@a/4 at δ (noncentral t)"] = t_power(args.delta_success, success_sd(
            args.baseline, args.episodes, sd_train, rho), args.seeds, first)
        row["mde_t@a/4 (sim)"] = simulated_success_mde(n_seeds=args.seeds, n_episodes=args.episodes,
                                                       alpha=first, power=args.power, reps=args.reps, **kw)
        rows.append(row)
    return rows


def drift_cells(args, rng) -> list[dict]:
    rows = []
    first = args.alpha / args.components
    sd, delta, n = args.sd_drift, args.delta_drift, args.seeds
    for law in ("normal", "t3"):
        def draw(mean, law=law):
            if law == "normal":
                z = rng.standard_normal((args.reps, n))
            else:  # unit-variance t with 3 degrees of freedom: heavy tails
                z = rng.standard_t(3, (args.reps, n)) / math.sqrt(3.0)
            return mean + sd * z

        d0, dd = draw(0.0), draw(delta)
        lo, hi = _t_interval(dd)
        blo, bhi = _bca(dd, rng, args.n_boot)
        mde_formula = t_mde(sd, n, first, args.power)
        dm = draw(mde_formula)
        rows.append({
            "metric": f"drift ({law})", "sd": sd,
            "level_t@a": float(t_reject(d0, args.alpha).mean()),
            "level_t@a/4": float(t_reject(d0, first).mean()),
            "level_signflip@a": float((_signflip_p(d0) <= args.alpha).mean()),
            "coverage_t": float(((lo <= delta) & (delta <= hi)).mean()),
            "coverage_bca_seeds": float(((blo <= delta) & (delta <= bhi)).mean()),
            "falsified_t@a (effect = δ)": float(_t_falsified(dd, delta, args.alpha).mean()),
            "falsified_old_rule (BCa upper < δ)": float((bhi < delta).mean()),
            "mde_t@a/4 (noncentral t)": mde_formula,
            "power_t@a/4 at that MDE (sim)": float(t_reject(dm, first).mean()),
            "power_signflip@a/4 at that MDE (sim)": float((_signflip_p(dm) <= first).mean()),
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap / permutation draws per replicate")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--baseline", type=float, default=0.25)
    ap.add_argument("--sd-train", type=float, nargs="+", default=[0.0, 0.05, 0.10])
    ap.add_argument("--episode-correlation", type=float, nargs="+", default=[0.0, 0.56])
    ap.add_argument("--delta-success", type=float, default=0.10)
    ap.add_argument("--delta-drift", type=float, default=10.0)
    ap.add_argument("--sd-drift", type=float, default=20.0)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--power", type=float, default=0.8)
    ap.add_argument("--components", type=int, default=4, help="size of the confirmatory Holm family")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    rows = success_cells(args, rng) + drift_cells(args, rng)
    se = math.sqrt(args.alpha * (1 - args.alpha) / args.reps)
    print(f"# {args.seeds} seeds × {args.episodes} episodes, {args.reps} replicates per cell "
          f"(a level of {args.alpha} has a Monte-Carlo SE of {se:.3f}; a coverage of 0.95 of "
          f"{math.sqrt(0.95 * 0.05 / args.reps):.3f}); {time.perf_counter() - t0:.0f} s")
    for row in rows:
        head = {k: row[k] for k in ("metric", "episode_correlation", "sd_train", "sd") if k in row}
        print("\n" + ", ".join(f"{k} = {v}" for k, v in head.items()))
        for k, v in row.items():
            if k not in head:
                print(f"  {k:42s} {('%.3f' % v) if isinstance(v, float) else v}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"args": vars(args), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
