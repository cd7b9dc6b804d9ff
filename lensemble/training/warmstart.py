"""The public warm start: a world model trained centrally on the public corpus only.

Every participant starts round 0 from it, and its frozen copy f_ref is the only source of anchor
targets. Anchoring to a random initialisation would pin noise, so the warm start is real training
on public factor settings that no silo and no evaluation split uses.
"""

from __future__ import annotations

from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.training.trainer import TrainResult, train_local


def train_warmstart(cfg: LensembleConfig, *, run_dir: str | Path | None = None, progress: bool = True) -> TrainResult:
    """Train for ``cfg.train.warmstart_steps`` steps on the public corpus; return the result
    (its ``checkpoint_hash`` pins the warm start)."""
    steps = cfg.train.warmstart_steps
    ws_cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": steps, "checkpoint_every": 0})})
    return train_local(ws_cfg, source="public", run_dir=run_dir or Path(cfg.run_dir) / "warmstart",
                       progress=progress)
