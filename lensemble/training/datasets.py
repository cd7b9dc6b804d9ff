"""Which episodes a training run sees, and where collected data lives.

Data are collected once per collection key (environment, resolution, seed and data settings) into
``<data.root>/<key[:12]>/`` and reused by every run with the same key, so the baselines, the
federated rungs and the warm start of one study all see the very same silos and probe.
"""

from __future__ import annotations

import json
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.data.clips import ClipSampler
from lensemble.data.collect import _collection_key, collect_silos, load_public_episodes, load_silo
from lensemble.errors import ConfigError


def data_dir(cfg: LensembleConfig) -> Path:
    """The folder holding this config's collection (it may not exist yet)."""
    return Path(cfg.data.root) / _collection_key(cfg)[:12]


def ensure_data(cfg: LensembleConfig, *, progress: bool = True) -> tuple[Path, dict]:
    """Collect the silos, splits and probe for ``cfg`` unless they already exist; return
    (folder, collection summary)."""
    folder = data_dir(cfg)
    summary = collect_silos(cfg, folder, progress=progress, reuse=True)
    return folder, summary


def silo_ids(summary: dict) -> list[int]:
    return [s["silo"] for s in summary["silos"]]


def training_sampler(cfg: LensembleConfig, source: str, *, progress: bool = True) -> tuple[ClipSampler, dict]:
    """A clip sampler over ``source`` and a JSON-able description of the data it covers.

    ``source``: "pooled" (every silo's train split), "silo-<i>" (one silo) or "public" (the
    public corpus the probe is cut from; the only data a warm start may see).
    """
    folder, summary = ensure_data(cfg, progress=progress)
    if source == "pooled":
        batches = [load_silo(folder, c, "train", summary) for c in silo_ids(summary)]
    elif source == "public":
        batches = [load_public_episodes(folder, summary)]
    elif source.startswith("silo-") and source[5:].isdigit() and int(source[5:]) in silo_ids(summary):
        batches = [load_silo(folder, int(source[5:]), "train", summary)]
    else:
        raise ConfigError(f"unknown training source {source!r}",
                          remediation=f"use 'pooled', 'public' or silo-<i> for i in {silo_ids(summary)}")
    info = {
        "source": source,
        "data_dir": str(folder),
        "shards": [b.content_hash for b in batches],
        "episodes": sum(b.num_episodes for b in batches),
        "probe_hash": summary["probe"]["content_hash"],
    }
    return ClipSampler.from_config(batches, cfg), info


def collection_summary(folder: str | Path) -> dict:
    return json.loads((Path(folder) / "collection.json").read_text())
