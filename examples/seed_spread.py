"""Seed-spread pilot (issue 17, before registration): how much does a model's success move between
training seeds, and what power does that leave the registered test?

Reads the ``partition-pilot.json`` of several partition-pilot runs of ONE candidate that differ only
in ``root_seed`` (silos, probe, batch order and warm start) and share the held-out tasks
(``eval.seed`` fixed, checked by ``goal_spec_hash``), e.g.

    nice -n 19 .venv/bin/python examples/partition_pilot.py --factors agent.region --steps 500 \\
        --out runs/seed-pilot-101 root_seed=101
    .venv/bin/python examples/seed_spread.py docs/results/partition-pilot-500 \\
        runs/seed-pilot-101 runs/seed-pilot-102 --factor agent.region --seeds 6 --episodes 50

and prints, per arm (the warm start, central, the mean of the local models), the success rate at
every seed and two estimates of the seed-to-seed SD of its true success (``sd_train`` of the
registry's planning model, :mod:`lensemble.study.power`):

    raw      the SD of the per-seed rates. On shared tasks it holds the model-to-model spread and
             the model × task noise, which the planning model also counts per episode: an upper
             estimate (conservative for power)
    moments  sqrt(max(0, var_seed(rate) - mean_seed(var_task(outcome) / n))): the binomial part of
             that spread removed (method of moments; can be 0 with few seeds)

The power model (:func:`lensemble.study.power.simulate_success`) gives a seed's paired difference
between two arms the spread 2·sd_train², as if the arms' training noise were independent; but a
seed's warm start and data move every arm of it together. So the script also computes sd_train
from the per-seed central − local differences themselves (their spread / √2, raw and moments):
the number that matters for a paired study, and the one to register when it is smaller.

It also prints the per-seed central − local difference (the quantity the study pairs) with its SD,
the mean within-seed episode correlation (phi) between central and each local model, and the MDE
of the registered test (one-sided paired t at α / Holm size, simulated) at the planned seeds and
episodes for both sd_train estimates. With 3 seeds an SD has 2 degrees of freedom: the script also
prints the upper end of its 80 % chi-square interval, so the registry can be sized for a spread
that large.

Descriptive only: nothing here is a test of a claim.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from lensemble.study import power as pw


def load(folder: str, factor: str) -> dict:
    path = Path(folder) / "partition-pilot.json"
    if not path.is_file():
        raise SystemExit(f"no {path}: run examples/partition_pilot.py --out {folder} first")
    result = json.loads(path.read_text())
    cand = result["candidates"].get(factor)
    if cand is None:
        raise SystemExit(f"{path} has no candidate {factor!r} (it has {sorted(result['candidates'])})")
    return {"folder": folder, "settings": result["settings"], **cand}


def arm_outcomes(cand: dict) -> dict[str, np.ndarray]:
    """Per-task outcomes (n,) in [0, 1] of the warm start, central and the local mean."""
    arms = cand["arms"]
    locals_ = [np.asarray(v["success"], float) for k, v in sorted(arms.items()) if k.startswith("local-")]
    return {"warmstart": np.asarray(arms["warmstart"]["success"], float),
            "central": np.asarray(arms["central"]["success"], float),
            "local": np.mean(locals_, axis=0)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="partition-pilot --out folders (or their --export copies)")
    ap.add_argument("--factor", default="agent.region")
    ap.add_argument("--seeds", type=int, default=6, help="planned study seeds (for the MDE)")
    ap.add_argument("--episodes", type=int, default=50, help="planned episodes per model and seed")
    ap.add_argument("--holm", type=int, default=4, help="size of the confirmatory Holm family")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    cands = [load(f, args.factor) for f in args.folders]
    hashes = {c["goal_spec_hash"] for c in cands}
    if len(hashes) != 1:
        raise SystemExit("the pilots were scored on different tasks (goal_spec_hash differs): use one eval.seed")
    seeds = [next((o.split("=", 1)[1] for o in c["settings"]["overrides"] if o.startswith("root_seed=")), "0")
             for c in cands]
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"two pilots share a root_seed ({seeds}): the spread needs distinct seeds")
    outs = [arm_outcomes(c) for c in cands]
    n = len(outs[0]["central"])
    out: dict = {"factor": args.factor, "root_seeds": seeds, "tasks": n, "arms": {}}
    print(f"Seed spread of {args.factor}: root seeds {', '.join(seeds)}, {n} shared tasks")
    for arm in ("warmstart", "central", "local"):
        y = np.stack([o[arm] for o in outs])                       # (seeds, tasks)
        s = pw.seed_spread(y.mean(1), y.var(1, ddof=1) / n)
        out["arms"][arm] = s
        print(f"  {arm:9s} rates {s['rates']}  sd raw {s['sd_raw']:.3f} (80 % upper {s['sd_raw_upper80']:.3f})"
              f"  moments {s['sd_moments']:.3f}")
    d = np.stack([o["central"] - o["local"] for o in outs])           # (seeds, tasks) paired differences
    diff = d.mean(1)
    # What the power model needs is the seed spread of the *difference* (2·sd_train² there): a seed's
    # warm start and data move both arms, so this can be smaller than the per-arm spreads suggest.
    paired = pw.seed_spread(diff, d.var(1, ddof=1) / n)
    out["arms"]["paired"] = {k: (v / math.sqrt(2) if k != "rates" else v) for k, v in paired.items()}
    within = [[pw.episode_phi(np.asarray(c["arms"]["central"]["success"], float), np.asarray(v["success"], float))
               for k, v in c["arms"].items() if k.startswith("local-")] for c in cands]
    rho = float(np.nanmean([p for w in within for p in w]))
    out["central_minus_local"] = {"per_seed": [round(float(d), 4) for d in diff],
                                  "sd": float(np.std(diff, ddof=1)) if len(diff) > 1 else None}
    out["episode_correlation_central_local"] = rho
    print(f"  central − local per seed {out['central_minus_local']['per_seed']}  "
          f"sd {out['central_minus_local']['sd']:.3f}; within-seed phi(central, local) {rho:.3f}")
    base = float(np.mean([o["central"].mean() for o in outs] + [o["local"].mean() for o in outs]))
    a = args.alpha / args.holm
    out["mde"] = {}
    print(f"  sd_train implied by the paired differences (their seed spread / √2): raw "
          f"{out['arms']['paired']['sd_raw']:.3f} (80 % upper {out['arms']['paired']['sd_raw_upper80']:.3f}), "
          f"moments {out['arms']['paired']['sd_moments']:.3f}")
    for label in ("sd_moments", "sd_raw", "sd_raw_upper80"):
        for source in ("paired", "per-arm"):
            arms = ("paired",) if source == "paired" else ("central", "local")
            sd = float(np.nanmax([out["arms"][arm][label] for arm in arms]))
            mde = pw.simulated_success_mde(n_seeds=args.seeds, n_episodes=args.episodes, baseline=round(base, 2),
                                           sd_train=round(sd, 3), episode_correlation=round(max(rho, 0.0), 2),
                                           alpha=a, power=0.8, reps=2000)
            out["mde"][f"{source}:{label}"] = {"sd_train": sd, "mde": mde}
            print(f"  MDE at {args.seeds} seeds × {args.episodes} episodes, α = {args.alpha}/{args.holm}, power 0.8, "
                  f"baseline {base:.2f}, sd_train = {source} {label} {sd:.3f}: "
                  f"{'undefined' if mde is None else format(mde, '.3f')}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
