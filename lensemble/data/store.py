"""The data store: where a config's collection lives, and collecting it on first use.

Data are collected once per collection key (environment, resolution, seed and data settings) into
``<data.root>/<key[:12]>/`` and reused by every run with the same key, so the baselines, the
federated rungs and the warm start of one study all see the very same silos and probe.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch

from lensemble.config.schema import LensembleConfig
from lensemble.data.collect import _collection_key, collect_silos
from lensemble.data.probe import load_probe


def data_dir(cfg: LensembleConfig) -> Path:
    """The folder holding this config's collection (it may not exist yet)."""
    return Path(cfg.data.root) / _collection_key(cfg)[:12]


def ensure_data(cfg: LensembleConfig, *, progress: bool = True) -> tuple[Path, dict]:
    """Collect the silos, splits and probe for ``cfg`` unless they already exist; return
    (folder, collection summary)."""
    folder = data_dir(cfg)
    summary = collect_silos(cfg, folder, progress=progress, reuse=True)
    return folder, summary


@lru_cache(maxsize=4)
def probe_frames(folder: str, expected_hash: str) -> torch.Tensor:
    """The collection's public probe as uint8 frames (|P|, 3, H, W), verified against its hash.

    Cached per process: a coordinator or a simulation actor reads the same probe every round.
    """
    summary = json.loads((Path(folder) / "collection.json").read_text())
    return load_probe(Path(folder) / summary["probe"]["path"], expected_hash=expected_hash).tensor()
