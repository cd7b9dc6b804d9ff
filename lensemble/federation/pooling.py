"""The pooled objective under federation: the summary exchange at the start of each round.

With ``objective.sigreg_scope=pooled`` or ``objective.bn_scope=pooled`` a round has two asks:

1. **summary** (round config ``phase=summary``): every participant encodes
   ``objective.summary_clips`` clips of its own data with the round's global model and replies
   with its :class:`~lensemble.model.pooled.SiloSummary` (ECF means on the round's shared sketch,
   BatchNorm input moments) as a flat fp32 payload, nothing else (no probe embeddings). It keeps
   its own summary on its disk for step 2. The coordinator validates the replies like updates
   (shape, finiteness, round), requires the quorum and averages them: the pooled summary.
2. **train**: the extras carry the pooled mean (``pooled.*`` arrays) and the contributing
   partition ids (``pooled.members``); each participant rebuilds the others' part (C·mean − own,
   :func:`~lensemble.model.pooled.others_pooling`) and trains its H inner steps on its live batch
   pooled with it (fixed). So summaries are as stale as H inner steps, never older than the round.

Cost per participant and round: S·(2K + 1) + 3H floats up (17,920 at S = 512, K = 17, plus
1,536 for a 512-wide BatchNorm: ~78 KB) and one forward pass over the summary clips; the global
model is sent once more for the summary ask (``fed/summary_bytes`` counts both ways).
What a summary reveals, and why privacy and secure aggregation refuse it for now:
docs/federation.md, "The pooled objective".
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from lensemble.config.schema import LensembleConfig
from lensemble.config.seeds import torch_generator
from lensemble.federation.codec import encode_delta
from lensemble.federation.messages import Reply
from lensemble.federation.validation import Update, require_quorum, validate_updates
from lensemble.model.objective import BatchStatistics
from lensemble.model.pooled import MOMENT_FIELDS, SiloSummary, others_pooling
from lensemble.training.pooling import pools_anything, pools_batchnorm, pools_sigreg, summarise

SUMMARY_PHASE = "summary"
PREFIX = "pooled."
MEMBERS = PREFIX + "members"


def is_summary_round(round_config: dict) -> bool:
    return round_config.get("phase") == SUMMARY_PHASE


def summary_template(cfg: LensembleConfig) -> dict[str, torch.Tensor]:
    """Zero tensors shaped like one participant's summary under ``cfg`` (names of
    :meth:`SiloSummary.to_arrays`, sorted): the layout replies are validated against."""
    s, k, h = cfg.objective.sigreg_directions, cfg.objective.sigreg_knots, cfg.model.projector_hidden
    out: dict[str, torch.Tensor] = {}
    if pools_sigreg(cfg):
        out |= {"ecf.cos": torch.zeros(s, k), "ecf.sin": torch.zeros(s, k), "ecf.mean": torch.zeros(s)}
    if pools_batchnorm(cfg):  # the encoder's one BatchNorm layer, in the projector
        out |= {f"bn.0.{f}": torch.zeros(h) for f in MOMENT_FIELDS}
    return dict(sorted(out.items()))


def _own_path(state_dir: Path, t: int) -> Path:
    return state_dir / f"summary-{t:05d}.npz"


def summary_round(cfg: LensembleConfig, model, sampler, sketch: torch.Tensor, state_dir: Path,
                  participant_id: str, t: int) -> Reply:
    """Step 1 on one participant: its summary of round t as a Reply (flat fp32 payload, no probe
    embeddings); its own copy stays in ``state_dir`` for the train ask."""
    started = time.perf_counter()
    gen = torch_generator(cfg.root_seed, "summary", participant_id, t)
    summary = summarise(model, sampler.sample(cfg.objective.summary_clips, gen).obs, sketch, cfg)
    arrays = summary.to_arrays()
    np.savez(_own_path(state_dir, t), **arrays)
    for old in sorted(state_dir.glob("summary-*.npz"))[:-2]:
        old.unlink()
    payload = encode_delta({k: torch.from_numpy(arrays[k]) for k in sorted(arrays)})
    metrics = {"fed/summary_clips": cfg.objective.summary_clips, "fed/compute_seconds": time.perf_counter() - started}
    return Reply(t, payload, np.zeros((0, cfg.model.latent_dim), dtype=np.float32), metrics)


def pooled_statistics(cfg: LensembleConfig, extras: dict[str, np.ndarray] | None, state_dir: Path,
                      partition_id: int, t: int) -> BatchStatistics | None:
    """Step 2 on one participant: its :class:`BatchStatistics` for round t's inner steps from the
    pooled mean in ``extras`` and its own summary, or None when nothing is pooled."""
    if not pools_anything(cfg):
        return None
    if not extras or MEMBERS not in extras:
        raise KeyError(f"round {t}: the pooled objective is on but the round carries no pooled summary")
    members = [int(m) for m in np.asarray(extras[MEMBERS]).ravel()]
    mean = SiloSummary.from_arrays({k[len(PREFIX):]: v for k, v in extras.items()
                                    if k.startswith(PREFIX) and k != MEMBERS})
    own = None
    if partition_id in members:
        with np.load(_own_path(state_dir, t)) as f:
            own = SiloSummary.from_arrays({k: f[k] for k in f.files})
    return BatchStatistics(pooling=(others_pooling(mean, own, len(members)),))


def close_summaries(cfg: LensembleConfig, t: int, replies: dict[str, Reply], failures: dict[str, str]
                    ) -> tuple[dict[str, np.ndarray], dict]:
    """Coordinator side of step 1: (extras for the train ask, metrics). Raises
    FaultToleranceExceeded below the quorum (the round is retried like a failed train ask)."""
    template = summary_template(cfg)
    result = validate_updates([Update(pid, r.round_index, r.payload, r.probe_embeddings)
                               for pid, r in sorted(replies.items())],
                              template=template, round_index=t, max_update_mb=cfg.federation.max_update_mb,
                              embedding_shape=(0, cfg.model.latent_dim))
    dropped = dict(failures) | {pid: f"sent an unusable summary ({why})" for pid, why in result.rejected}
    require_quorum(len(result.accepted), cfg.federation.min_participants, round_index=t, failures=dropped)
    members = sorted(result.accepted)
    mean = {k: torch.stack([result.accepted[p][k].double() for p in members]).mean(0).float() for k in template}
    extras = {PREFIX + k: v.numpy() for k, v in mean.items()}
    extras[MEMBERS] = np.asarray([int(p.rsplit("-", 1)[1]) for p in members], dtype=np.int64)
    metrics = {"fed/summary_participants": len(members),
               "fed/summary_floats": int(sum(v.numel() for v in template.values()))}
    return extras, metrics


__all__ = ["MEMBERS", "PREFIX", "SUMMARY_PHASE", "close_summaries", "is_summary_round", "pooled_statistics",
           "summary_round", "summary_template"]
