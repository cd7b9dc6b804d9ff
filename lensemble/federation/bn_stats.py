"""BatchNorm statistics under federation: every party re-estimates them on the public probe.

BatchNorm running mean/var are buffers, not parameters, so they are never part of a
pseudo-gradient (:func:`lensemble.federation.state.federated_keys` takes parameters only): no
average, no outer momentum, no DP noise ever touches them. Left alone, the global model would
carry its warm start's statistics for ever while its weights move every round — the staleness that
cost a centrally trained BatchNorm model 20 points of planning (docs/model.md).

With ``federation.bn_recalibration="probe"`` (the default) the coordinator re-estimates the global
encoder's statistics on the public probe after each outer step (after distillation on rung 5)
and commits them in the checkpoint's fixed tensors, and each participant does the same on the same
frames after its inner steps, before it embeds the probe. So every party's statistics are a
function of its weights and of public frames only: embeddings compared for frame drift or fitted
by the backstop differ by weights, not by whose frames set the statistics, and no statistic of
a silo's private frames is ever computed for release (such summaries would sit outside the DP
pipeline). ``"none"`` keeps the warm start's statistics (the earlier behaviour, for comparison).
"""

from __future__ import annotations

import torch

from lensemble.config.schema import LensembleConfig
from lensemble.model.collapse import effective_dim, latent_std
from lensemble.model.encoder import Encoder, embed_frames, recalibrate_batchnorm

#: Frames per recalibration batch: one default training batch's frames (64 clips x 4 frames are
#: encoded in one pass), so the statistics are as noisy as those the encoder was trained with; the
#: default probe (256 frames) is then one batch.
PROBE_BATCH_FRAMES = 256


def recalibrates(cfg: LensembleConfig) -> bool:
    """Whether the parties of this run re-estimate BatchNorm statistics on the probe."""
    return (cfg.model.projector_norm == "batchnorm" and cfg.federation.bn_recalibration == "probe"
            and not cfg.model.encoder_frozen)  # a frozen encoder (Fork A) keeps what it came with


def recalibrate_on_probe(encoder: Encoder, probe: torch.Tensor, cfg: LensembleConfig) -> int:
    """Re-estimate ``encoder``'s BatchNorm statistics on ``probe`` (|P|, 3, H, W) uint8, in its fixed
    order in batches of :data:`PROBE_BATCH_FRAMES` (a last batch of one frame is merged into the
    previous one: BatchNorm needs two). Deterministic: no randomness is drawn. Returns the number
    of batches used; 0 (nothing changed) when :func:`recalibrates` is false for ``cfg``."""
    if not recalibrates(cfg):
        return 0
    n = probe.shape[0]
    bounds = list(range(0, n, PROBE_BATCH_FRAMES)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] < 2:
        bounds.pop(-2)
    return recalibrate_batchnorm(encoder, (probe[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)))


def probe_spread(encoder: Encoder, probe: torch.Tensor, cfg: LensembleConfig) -> tuple[float, float]:
    """(effective dimension, latent std) of ``encoder`` on the probe, measured as the coordinator
    measures each round's global: statistics re-estimated on the probe first (this changes the
    encoder's BatchNorm buffers), then eval-mode embeddings."""
    recalibrate_on_probe(encoder, probe, cfg)
    z = embed_frames(encoder, probe)
    return effective_dim(z), latent_std(z)


__all__ = ["PROBE_BATCH_FRAMES", "probe_spread", "recalibrates", "recalibrate_on_probe"]
