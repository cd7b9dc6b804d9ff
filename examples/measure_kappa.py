"""κ on the real model: how far one silo's round moves the other silos' latents (issue 43).

From a checkpoint (a warm start, or a committed round's global model), every silo of the config's
collection trains one round's H inner steps under the pooled objective as a participant would, and
:func:`lensemble.training.response.cross_response` scores every update on every silo's summary clips
(the participants' own summary draw of round ``--round``). Prints the κ matrix, the overshoot
1 + κ̄(C − 1) it predicts, and the pooled SIGReg at the start, as each silo expected it after its own
update, and after the plain average of the updates; ``--out`` writes them as JSON.

    .venv/bin/python examples/measure_kappa.py runs/tiny/warmstart/checkpoints/step-000300
    .venv/bin/python examples/measure_kappa.py CKPT data.num_silos=4 --out kappa-c4.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config.loader import load_config
from lensemble.config.seeds import torch_generator
from lensemble.data.clips import ClipSampler
from lensemble.data.collect import load_silo
from lensemble.data.store import ensure_data
from lensemble.model.objective import sketch_for_round
from lensemble.model.world_model import world_model_from_state
from lensemble.training.response import cross_response


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="the round's global model (a checkpoint folder)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run's config (as for lensemble run)")
    ap.add_argument("--round", type=int, default=0, help="the round whose sketch and summary draw are used")
    ap.add_argument("--inner-steps", type=int, default=None, help="H (default federation.inner_steps)")
    ap.add_argument("--out", default=None, help="write the report here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config(args.overrides)
    folder = str(ensure_data(cfg, progress=False)[0])
    ck = load_checkpoint(args.checkpoint)
    model = world_model_from_state(ck.architecture, ck.tensors)
    samplers = [ClipSampler([load_silo(folder, i, "train")], cfg.train.clip_len, cfg.model.action_block)
                for i in range(cfg.data.num_silos)]
    clips = [s.sample(cfg.objective.summary_clips, torch_generator(cfg.root_seed, "summary", f"silo-{i}", args.round))
             for i, s in enumerate(samplers)]
    sketch = sketch_for_round(cfg.root_seed, args.round, cfg.model.latent_dim, cfg.objective.sigreg_directions)
    report = cross_response(cfg, model, clips, samplers, sketch, inner_steps=args.inner_steps).as_dict()
    report["checkpoint"] = str(args.checkpoint)
    report["overrides"] = list(args.overrides)
    c = report["parties"]
    print(f"C = {c}, H = {report['inner_steps']}: κ̄ = {report['kappa_mean']:.3f}, overshoot 1 + κ̄(C − 1) = "
          f"{report['overshoot']:.2f}")
    for i, row in enumerate(report["kappa"]):
        print(f"  silo-{i}'s update moves " + ", ".join(f"silo-{k} {x:.2f}" for k, x in enumerate(row) if k != i))
    print(f"pooled SIGReg: start {report['sigreg_start']:.3g}; each silo expected "
          + ", ".join(f"{x:.3g}" for x in report["expected"]) + f"; the plain average gives {report['averaged']:.3g}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
