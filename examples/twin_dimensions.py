"""The data-parallel twin's effective dimension over its steps, measured as a federation's global is.

The run's watch (lensemble/federation/stability.py) compares the global's effective dimension on
the public probe with the warm start's. How much of a fall is the objective's own at that budget,
not the federation's? This trains the twin of a run's config from its warm start (the federation's
rounds × H steps at C × B clips, as `lensemble run --baselines` does), keeps a checkpoint every H
steps, and prints the effective dimension and latent std of each on the probe after re-estimating
BatchNorm statistics on the probe, exactly as the coordinator measures each round's global.

    .venv/bin/python examples/twin_dimensions.py runs/tiny/warmstart/checkpoints/step-000300 runs/twin-dims
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config.loader import load_config
from lensemble.data.store import ensure_data, probe_frames
from lensemble.federation.bn_stats import probe_spread
from lensemble.model.world_model import world_model_from_state
from lensemble.report.baselines import TWIN, baseline_config


def checkpoint_spread(checkpoint, probe, cfg) -> tuple[float, float]:
    ck = load_checkpoint(checkpoint)
    return probe_spread(world_model_from_state(ck.architecture, ck.tensors).encoder, probe, cfg)


def main(argv: list[str] | None = None) -> list:
    from lensemble.training.trainer import train_local

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("warmstart", help="the run's warm-start checkpoint folder")
    ap.add_argument("out", help="the twin's run folder")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run's config")
    args = ap.parse_args(argv)
    cfg = load_config(args.overrides)
    folder, info = ensure_data(cfg, progress=False)
    probe = probe_frames(str(folder), info["probe"]["content_hash"])
    twin = baseline_config(cfg, TWIN, cfg.federation.rounds)
    twin = twin.model_copy(update={"train": twin.train.model_copy(update={"checkpoint_every": cfg.federation.inner_steps})})
    train_local(twin, source="pooled", run_dir=args.out, init_checkpoint=args.warmstart, progress=False)
    rows = [("warmstart", *checkpoint_spread(args.warmstart, probe, cfg))]
    rows += [(p.name, *checkpoint_spread(p, probe, cfg)) for p in sorted(Path(args.out, "checkpoints").glob("step-*"))]
    for name, dim, std in rows:
        print(f"{name}: effective dimension {dim:.2f}, latent std {std:.3f}")
    (Path(args.out) / "dims.json").write_text(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
