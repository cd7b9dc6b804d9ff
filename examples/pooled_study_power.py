"""Planning the pooled-objective study (issue 32) from the pooled-objective pilot's seed spread.

Reads ``docs/results/pooled-pilot/pilot.json`` (examples/pooled_objective_pilot.py: the room study's
setting, seeds 0-2, 50 shared tasks per seed) and maps its arms onto the study's:

    central     central-control (400 steps, each batch half per silo: the pilot has no 400-step arm on
                randomly mixed batches; same steps, same data)
    twin        central-twin (200 steps at batch 128)
    local       the mean of local-0 and local-1 on each task
    naive_silo  fed-silo          naive   fed-pooled          anchor  fed-pooled-anchor

and prints what the registry's planning block needs, with the MDEs and the simulated power of
claim 3 that those numbers give at the planned seeds and tasks:

* the baseline success (mean over the arms), the within-seed task correlation (phi) of the paired
  arms, and ``sd_train`` from each registered success comparison's per-seed paired differences
  (their seed spread / √2; raw, moments and the raw SD's 80 % chi-square upper end: 3 seeds give
  2 degrees of freedom) — :mod:`lensemble.study.power`'s model;
* the MDE of the registered one-sided paired t test for success at the first Holm step;
* claim 3 (ρ of the anchored rung against the twin ≥ 0.5): how often the registered decision
  (:func:`lensemble.study.rho.rho_claim`, paired seed bootstrap) confirms, falsifies or stays
  inconclusive when the true rates are the pilot's, at ρ = 0.75, at the threshold itself (about
  half confirm there by design: the registered rule confirms when the interval excludes 0 and the
  estimate reaches the threshold, lensemble.eval.stats.verdict) and at 0 (the room study's finding). The seed
  effect (a seed's warm start lifts every arm) and the arms' own training noise are estimated by a
  two-way decomposition of the (seed × arm) success rates, binomial noise removed.

Descriptive planning only; nothing here decides a claim.

    .venv/bin/python examples/pooled_study_power.py --seeds 8 --episodes 50 --holm 4
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

from lensemble.study import power as pw
from lensemble.study.rho import simulated_rho_outcomes

ARM_OF = {"central": "central-control", "twin": "central-twin", "naive_silo": "fed-silo", "naive": "fed-pooled",
          "anchor": "fed-pooled-anchor"}
#: the registered success comparisons of the study (treatment, control)
PAIRS = [("naive", "central"), ("naive", "naive_silo"), ("anchor", "naive")]


def outcomes(pilot: dict) -> dict[str, dict[int, np.ndarray]]:
    """study arm -> seed -> (tasks,) outcomes in [0, 1], for the seeds that ran every mapped arm."""
    ev = pilot["evaluations"]
    out: dict[str, dict[int, np.ndarray]] = {a: {} for a in [*ARM_OF, "local"]}
    for s, arms in ev.items():
        if not all(a in arms for a in (*ARM_OF.values(), "local-0", "local-1")):
            continue
        for a, name in ARM_OF.items():
            out[a][int(s)] = np.asarray(arms[name]["success"], float)
        out["local"][int(s)] = (np.asarray(arms["local-0"]["success"], float)
                                + np.asarray(arms["local-1"]["success"], float)) / 2
    return out


def two_way(rates: np.ndarray, within: np.ndarray) -> tuple[float, float]:
    """(sd_seed, sd_train) of a (seeds, arms) success table: the seed effect's SD and each arm's own
    training noise, by the additive two-way decomposition, the binomial variance ``within``
    (seeds, arms) removed from the residual; both at their 80 % chi-square upper end."""
    k, a = rates.shape
    resid = rates - rates.mean(1, keepdims=True) - rates.mean(0, keepdims=True) + rates.mean()
    df_r = (k - 1) * (a - 1)
    var_r = float((resid ** 2).sum() / df_r)
    var_train = max(var_r - float(within.mean()), 0.0)
    var_seed = max(float(np.var(rates.mean(1), ddof=1)) - var_r / a, 0.0)
    up_r = df_r / stats.chi2.ppf(0.2, df_r)
    up_s = (k - 1) / stats.chi2.ppf(0.2, k - 1)
    return math.sqrt(var_seed * up_s), math.sqrt(var_train * up_r)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pilot", default="docs/results/pooled-pilot/pilot.json")
    ap.add_argument("--seeds", type=int, default=8, help="planned study seeds")
    ap.add_argument("--episodes", type=int, default=50, help="planned episodes per model and seed")
    ap.add_argument("--holm", type=int, default=4, help="size of the confirmatory Holm family")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--threshold", type=float, default=0.5, help="claim 3's ρ threshold")
    ap.add_argument("--reps", type=int, default=200, help="simulated studies per ρ scenario")
    ap.add_argument("--anchor-arm", default=ARM_OF["anchor"],
                    help="the pilot arm that stands for the study's anchored rung (say so when it is not fed-pooled-anchor)")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    ARM_OF["anchor"] = args.anchor_arm
    o = outcomes(json.loads(Path(args.pilot).read_text()))
    seeds = sorted(o["twin"])
    if len(seeds) < 2:
        raise SystemExit(f"{args.pilot}: fewer than 2 seeds ran every arm {sorted(ARM_OF.values())} + local-0/1")
    n = len(o["twin"][seeds[0]])
    res: dict = {"pilot": args.pilot, "seeds": seeds, "tasks": n, "arm_map": ARM_OF, "arms": {}, "pairs": {}}
    print(f"Pooled-objective study planning from {args.pilot}: seeds {seeds}, {n} shared tasks each")
    for arm, per in o.items():
        y = np.stack([per[s] for s in seeds])
        res["arms"][arm] = pw.seed_spread(y.mean(1), y.var(1, ddof=1) / n)
        print(f"  {arm:10s} rates {res['arms'][arm]['rates']}  sd raw {res['arms'][arm]['sd_raw']:.3f}")
    base = float(np.mean([o[a][s].mean() for a in o for s in seeds]))
    a = args.alpha / args.holm
    for t, c in PAIRS:
        d = np.stack([o[t][s] - o[c][s] for s in seeds])
        sp = pw.seed_spread(d.mean(1), d.var(1, ddof=1) / n)
        phi = float(np.nanmean([pw.episode_phi(o[t][s], o[c][s]) for s in seeds]))
        row = {"per_seed": sp["rates"], "phi": phi,
               **{k: sp[k] / math.sqrt(2) for k in ("sd_raw", "sd_moments", "sd_raw_upper80")}}
        row["mde"] = {k: pw.simulated_success_mde(n_seeds=args.seeds, n_episodes=args.episodes, baseline=round(base, 2),
                                                  sd_train=round(row[k], 3), episode_correlation=round(max(phi, 0.0), 2),
                                                  alpha=a, power=0.8, reps=2000)
                      for k in ("sd_moments", "sd_raw", "sd_raw_upper80")}
        res["pairs"][f"{t}-{c}"] = row
        print(f"  {t} − {c}: per seed {row['per_seed']}, phi {phi:.2f}, sd_train raw {row['sd_raw']:.3f} "
              f"(80 % upper {row['sd_raw_upper80']:.3f}), moments {row['sd_moments']:.3f}; MDE at {args.seeds} × "
              f"{args.episodes}, α {args.alpha}/{args.holm}: " + ", ".join(
                  f"{k} {'–' if v is None else format(v, '.3f')}" for k, v in row["mde"].items()))
    trio = ("local", "twin", "anchor")
    rates = np.stack([[o[x][s].mean() for x in trio] for s in seeds])
    within = np.stack([[o[x][s].var(ddof=1) / n for x in trio] for s in seeds])
    sd_seed, sd_train = two_way(rates, within)
    loc, ref, fed = rates.mean(0)
    res["rho_model"] = {"local": loc, "twin": ref, "anchor": fed, "sd_seed_upper80": sd_seed,
                        "sd_train_upper80": sd_train}
    print(f"  claim 3 model: local {loc:.3f}, twin {ref:.3f}, anchor {fed:.3f}; seed effect SD {sd_seed:.3f}, "
          f"training noise SD {sd_train:.3f} (80 % upper ends)")
    res["rho_power"] = {}
    for label, f in (("pilot", fed), ("rho=0.75", loc + 0.75 * (ref - loc)), ("rho=threshold", loc + args.threshold * (ref - loc)),
                     ("rho=0", loc)):
        out = simulated_rho_outcomes(local=loc, reference=ref, fed=f, n_seeds=args.seeds, n_episodes=args.episodes,
                                     sd_seed=sd_seed, sd_train=sd_train, threshold=args.threshold, alpha=args.alpha,
                                     reps=args.reps)
        res["rho_power"][label] = out
        print(f"  C3 at {args.seeds} seeds × {args.episodes}, true ρ {out['true_rho']:.2f} ({label}): confirmed "
              f"{out['confirmed']:.0%}, falsified {out['falsified']:.0%}, inconclusive {out['inconclusive']:.0%}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
