"""Which episodes a training run sees: pooled silos, one silo, or the public corpus."""

from __future__ import annotations

from lensemble.config.schema import LensembleConfig
from lensemble.data.clips import ClipSampler
from lensemble.data.collect import load_public_episodes, load_silo
from lensemble.data.store import ensure_data
from lensemble.errors import ConfigError
from lensemble.training.pooling import ShareSampler


def silo_ids(summary: dict) -> list[int]:
    return [s["silo"] for s in summary["silos"]]


def training_sampler(cfg: LensembleConfig, source: str, *, progress: bool = True) -> tuple[ClipSampler | ShareSampler, dict]:
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
    if cfg.train.silo_batches:
        if source != "pooled":
            raise ConfigError(f"train.silo_batches draws a share of every batch from each silo; source {source!r} "
                              "is not the pooled silos", remediation="train.silo_batches=false for this source")
        # the per-silo central control: one sampler per silo, a share of each batch from each
        return ShareSampler([ClipSampler.from_config([b], cfg) for b in batches]), info
    return ClipSampler.from_config(batches, cfg), info
