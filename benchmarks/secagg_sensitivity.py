"""How far a whole secure run ends from the plaintext run, against a control of the same size.

SecAgg+ quantisation moves round 1's global by at most the one-step bound e1 = η(1+μ)·q
(docs/federation.md, "Secure aggregation"); every later round trains from a global that already
differs, so the inner steps amplify it and no a-priori whole-run bound exists. This script
measures whether the secure run's end-to-end difference is what *any* perturbation of size e1
becomes: it runs, from one warm start, (1) the plaintext federation, (2) the plaintext federation
from the warm start perturbed once by ±e1 on every federated coordinate (random signs, seeded),
and (3) the secure federation, then prints per round the max |Δθ| of (3) and (2) against (1).
A ratio (3)/(2) near or below 1 says the masking costs no more than one bound-sized perturbation.

    .venv/bin/python benchmarks/secagg_sensitivity.py               # experiment=micro, flower-inprocess
    .venv/bin/python benchmarks/secagg_sensitivity.py --config default --rounds 2
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from lensemble.artifacts.checkpoint import load_checkpoint, save_checkpoint
from lensemble.config import load_config
from lensemble.federation.secure_agg import SecAggSettings, outer_error_bound
from lensemble.federation.simulation import run_on_local_grid
from lensemble.federation.state import federated_keys
from lensemble.training.warmstart import train_warmstart


def max_gap(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=("micro", "default"), default="micro")
    ap.add_argument("--rounds", type=int, default=None, help="federation.rounds (default: the config's)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the control's random signs")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = (["experiment=micro"] if args.config == "micro" else []) + [f"data.root={root / 'data'}"]
        if args.rounds:
            base.append(f"federation.rounds={args.rounds}")
        ws = train_warmstart(load_config(base), run_dir=root / "warmstart", progress=False)
        cfg = load_config(base + [f"federation.warmstart={ws.checkpoint_dir}", "federation.secure_aggregation=true"])
        f = cfg.federation
        e1 = outer_error_bound(SecAggSettings.from_config(f).mean_error_bound(), 1, lr=f.outer_lr,
                               momentum=f.outer_momentum, nesterov=f.nesterov)
        warm = load_checkpoint(ws.checkpoint_dir)
        keys = federated_keys(cfg)
        gen = np.random.default_rng(args.seed)
        shaken = {k: (v + e1 * torch.from_numpy(gen.choice([-1.0, 1.0], size=tuple(v.shape))).to(v.dtype)
                      if k in keys else v) for k, v in sorted(warm.tensors.items())}
        save_checkpoint(root / "warm-shaken", shaken, kind="world_model", architecture=warm.architecture)

        runs = {}
        for name, extra in (("plain", [f"federation.warmstart={ws.checkpoint_dir}"]),
                            ("control", [f"federation.warmstart={root / 'warm-shaken'}"]),
                            ("secure", [f"federation.warmstart={ws.checkpoint_dir}", "federation.secure_aggregation=true"])):
            run_on_local_grid(load_config(base + extra), root / name, progress=False)
            runs[name] = sorted((root / name / "rounds").glob("round-*"))
        print(f"{args.config}: one-step bound e1 = {e1:.3g}; max |Δθ| against the plaintext run")
        # The secure run's first deviation appears after round 1's outer step, the control's before
        # round 1's inner steps: secure after round k+1 and control after round k have both been
        # through k rounds of inner training since their deviation (the "aligned" ratio).
        print("round | secure | control (±e1 once at the start) | secure / control | aligned: secure(k+1) / control(k)")
        gaps = []
        for k, folder in enumerate(runs["plain"]):
            p = load_checkpoint(folder / "model").tensors
            s = load_checkpoint(runs["secure"][k] / "model").tensors
            c = load_checkpoint(runs["control"][k] / "model").tensors
            gaps.append((max_gap(s, p), max_gap(c, p)))
        for k, (gs, gc) in enumerate(gaps):
            aligned = f"{gaps[k + 1][0] / gc:.3g}" if k + 1 < len(gaps) else "–"
            print(f"{k + 1} | {gs:.3g} | {gc:.3g} | {gs / gc:.3g} | {aligned}")


if __name__ == "__main__":
    main()
