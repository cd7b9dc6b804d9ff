"""The public warm start: a world model trained centrally on the public corpus only.

Every participant starts round 0 from it, and its frozen copy f_ref is the only source of anchor
targets. Anchoring to a random initialisation would pin noise, so the warm start is real training
on public factor settings that no silo and no evaluation split uses.
"""

from __future__ import annotations

from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.training.trainer import TrainResult, train_local


def warmstart_config(cfg: LensembleConfig) -> LensembleConfig:
    """The config the warm start trains with: ``train.warmstart_steps`` steps, one final checkpoint,
    and the plain objective whatever the run's batch-statistics options (the pooled objective and
    the per-silo control are about silos; FixBN freezes statistics the warm start must first learn),
    so every arm of a study can share one warm start."""
    objective = cfg.objective.model_copy(update={"sigreg_scope": "silo", "bn_scope": "batch"})
    train = cfg.train.model_copy(update={"steps": cfg.train.warmstart_steps, "checkpoint_every": 0,
                                         "silo_batches": False, "silo_statistics": "none"})
    return cfg.model_copy(update={"train": train, "objective": objective})


def train_warmstart(cfg: LensembleConfig, *, run_dir: str | Path | None = None, progress: bool = True) -> TrainResult:
    """Train for ``cfg.train.warmstart_steps`` steps on the public corpus (:func:`warmstart_config`);
    return the result (its ``checkpoint_hash`` pins the warm start)."""
    ws_cfg = warmstart_config(cfg)
    return train_local(ws_cfg, source="public", run_dir=run_dir or Path(cfg.run_dir) / "warmstart",
                       progress=progress)
