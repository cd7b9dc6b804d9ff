"""Encoder cost by backbone: forward + backward of one training batch's frames, ratios in one run.

Each arm is one :class:`~lensemble.model.encoder.Encoder` of the CPU preset's encoder settings
(``input_norm=global``, ``projector_norm=batchnorm``, 64 px, d = 64) that encodes ``--frames``
uint8 frames (a batch of 64 clips x 4 latents = 256) and back-propagates a scalar of the latents,
then takes an AdamW step: the encoder's share of a training step.

* ``vit``: the preset's ViT (patch 16, width 128, depth 3), the reference;
* ``cnn``: the residual CNN at its default widths (8, 16, 32), channels-last activations;
* ``cnn-nchw``: the same CNN with its input kept NCHW (what channels-last saves);
* ``cnn-impala``: IMPALA's widths (16, 32, 32) (what the narrower default saves).

Repetitions are interleaved (every arm once per round, the order rotated) so a change in machine
load hits all alike. Prints the median CPU seconds per batch of each arm (process time, one torch
thread) and its ratio to ``vit``.

    .venv/bin/python benchmarks/bench_encoder_backbone.py               # 256 frames, 5 rounds
    .venv/bin/python benchmarks/bench_encoder_backbone.py --frames 128 --rounds 3

Only the ratios mean anything across machines.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lensemble.config.schema import ModelConfig
from lensemble.model.encoder import Encoder

PRESET = dict(input_norm="global", projector_norm="batchnorm")


def _arms() -> dict[str, Encoder]:
    torch.manual_seed(0)
    nchw = Encoder(ModelConfig(backbone="cnn", **PRESET))
    nchw.cnn.channels_last = False
    return {"vit": Encoder(ModelConfig(**PRESET)),
            "cnn": Encoder(ModelConfig(backbone="cnn", **PRESET)),
            "cnn-nchw": nchw,
            "cnn-impala": Encoder(ModelConfig(backbone="cnn", cnn_channels=[16, 32, 32], **PRESET))}


def _time(encoder: Encoder, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    t0 = time.process_time()
    encoder(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=256, help="frames per batch (64 clips x 4 latents)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    arms = _arms()
    opts = {k: torch.optim.AdamW(e.parameters(), lr=1e-4) for k, e in arms.items()}
    x = torch.randint(0, 256, (args.frames, 3, 64, 64), dtype=torch.uint8)
    names = list(arms)
    for k in names:  # warm-up: allocator, oneDNN kernels
        _time(arms[k], opts[k], x)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(args.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            times[k].append(_time(arms[k], opts[k], x))
    ref = statistics.median(times["vit"])
    print(f"{args.frames} frames at 64 px, forward + backward + AdamW, median of {args.rounds} (CPU s, 1 thread)")
    for k in names:
        params = sum(p.numel() for p in arms[k].parameters())
        med = statistics.median(times[k])
        print(f"  {k:11s} {med:7.3f} s   {med / ref:5.2f} x vit   {params / 1e6:.2f} M parameters")


if __name__ == "__main__":
    main()
