"""Frame drift measured directly on checkpoints: ``drift_between_checkpoints``.

Each checkpoint is loaded hash-verified, its encoder embeds the pinned public probe, and
``frame_drift`` compares the frames. The probe must be the one the checkpoints were trained with:
a checkpoint records that probe's hash, and a different probe is refused (ProbeError).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.data.probe import load_probe
from lensemble.errors import ProbeError
from lensemble.gauge.drift import FrameDriftReport, frame_drift
from lensemble.model.encoder import embed_frames
from lensemble.model.world_model import world_model_from_state


def recorded_probe_hash(header: dict) -> str | None:
    """The probe hash a checkpoint was trained with (federated rounds or train_local), if any."""
    extra = header.get("extra", {})
    return extra.get("probe_hash") or extra.get("data", {}).get("probe_hash")


def embed_probe(checkpoint: str | Path, frames: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """(n, d) embeddings of ``frames`` by a hash-verified checkpoint's encoder, and its header."""
    ck = load_checkpoint(checkpoint)
    return embed_frames(world_model_from_state(ck.architecture, ck.tensors).encoder, frames), ck.header


def drift_between_checkpoints(checkpoints: Sequence[str | Path], probe_path: str | Path, *,
                              expected_probe_hash: str | None = None, global_checkpoint: str | Path | None = None,
                              max_pairs: int | None = None, seed: int = 0,
                              singular_floor: float = 1e-6, degenerate: str = "raise") -> FrameDriftReport:
    """FrameDriftReport between ``checkpoints`` (keys: folder name + hash prefix) on the probe.

    ``degenerate``: as :func:`~lensemble.gauge.drift.frame_drift` (``"mask"`` reports a pair whose
    full rotation is not identifiable instead of raising).

    ``expected_probe_hash`` defaults to the hash the checkpoints recorded; every checkpoint that
    recorded one must agree with it, and the probe file must hash to it.
    """
    recorded = {}
    headers = {}
    paths = list(checkpoints) + ([global_checkpoint] if global_checkpoint else [])
    probe = None
    embeddings: dict[str, torch.Tensor] = {}
    for i, path in enumerate(paths):
        if probe is None:
            probe = load_probe(probe_path)
        z, header = embed_probe(path, probe.tensor())
        key = "global" if global_checkpoint and i == len(paths) - 1 else f"{Path(path).name}@{header['content_hash'][:8]}"
        if key in embeddings:
            key = f"{key}#{i}"
        embeddings[key] = z
        headers[key] = header
        if (h := recorded_probe_hash(header)) is not None:
            recorded[key] = h
    expected = expected_probe_hash or next(iter(recorded.values()), None)
    wrong = {k: h[:12] for k, h in recorded.items() if h != expected}
    if wrong:
        raise ProbeError(f"checkpoints were trained with other probes than {str(expected)[:12]}…: {wrong}",
                         remediation="compare checkpoints that share one pinned probe")
    if expected is not None:
        probe.verify(expected)
    return frame_drift(embeddings, probe_hash=probe.content_hash, expected_probe_hash=expected,
                       max_pairs=max_pairs, seed=seed, singular_floor=singular_floor, degenerate=degenerate)
