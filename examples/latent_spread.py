"""Eval-mode latent spread of a checkpoint on every silo's frames and on the public probe.

The anchored rung of the `pooled-sweeps` study ended with eval latent std up to 174 on silo frames
against ~1 on the probe (issue 43): BatchNorm statistics re-estimated on the probe do not fit the
silos' frames when training normalised them otherwise. This prints, per silo, the latent std and
effective dimension of 1,024 evenly spaced training frames, and the probe's, all in eval mode (the
checkpoint's own running statistics, as planning uses them).

    .venv/bin/python examples/latent_spread.py runs/tiny/rounds/round-0002/model
    .venv/bin/python examples/latent_spread.py CKPT data.num_silos=4 data.shared_homes=true
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config.loader import load_config
from lensemble.data.clips import ClipSampler
from lensemble.data.collect import load_silo
from lensemble.data.store import ensure_data, probe_frames
from lensemble.model.collapse import effective_dim, latent_std
from lensemble.model.encoder import embed_frames
from lensemble.model.world_model import world_model_from_state

FRAMES = 1024  # per silo, evenly spaced over its training episodes


def spread(encoder, frames: torch.Tensor) -> dict:
    z = embed_frames(encoder, frames)
    return {"latent_std": latent_std(z), "effective_dim": effective_dim(z), "frames": int(frames.shape[0])}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint", help="a world-model checkpoint folder")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides naming the run's data (as for lensemble run)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = load_config(args.overrides)
    folder, info = ensure_data(cfg, progress=False)
    ck = load_checkpoint(args.checkpoint)
    encoder = world_model_from_state(ck.architecture, ck.tensors).encoder
    out = {"probe": spread(encoder, probe_frames(str(folder), info["probe"]["content_hash"]))}
    for i in range(cfg.data.num_silos):
        # episode shards hold frames channel-last (E, T, H, W, 3), as ClipSampler reads them
        frames = ClipSampler([load_silo(str(folder), i, "train")], cfg.train.clip_len, cfg.model.action_block).frames
        idx = torch.linspace(0, frames.shape[0] - 1, min(FRAMES, frames.shape[0])).long()
        out[f"silo-{i}"] = spread(encoder, frames[idx])
    print(json.dumps({k: {m: round(v, 4) if isinstance(v, float) else v for m, v in d.items()} for k, d in out.items()}))
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
