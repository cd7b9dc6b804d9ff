"""Data: collection into content-hashed shards, silo partitioning, splits, residency, clips, probe."""

from lensemble.data.clips import Clips, ClipSampler
from lensemble.data.collect import collect_episode, collect_silos, load_silo, silo_folder
from lensemble.data.partition import SiloPlan, partition_silos, plan_from_config
from lensemble.data.probe import Probe, check_probe, load_probe, probe_hash, save_probe
from lensemble.data.residency import (
    MARKER,
    guard_export,
    guard_silo_write,
    mark_silo_folder,
    silo_of,
)
from lensemble.data.shards import (
    EpisodeBatch,
    list_shards,
    load_shard,
    save_shard,
    shard_hash,
    stack_episodes,
)

__all__ = [
    "Clips",
    "ClipSampler",
    "collect_episode",
    "collect_silos",
    "load_silo",
    "silo_folder",
    "SiloPlan",
    "partition_silos",
    "plan_from_config",
    "Probe",
    "check_probe",
    "load_probe",
    "probe_hash",
    "save_probe",
    "MARKER",
    "guard_export",
    "guard_silo_write",
    "mark_silo_folder",
    "silo_of",
    "EpisodeBatch",
    "list_shards",
    "load_shard",
    "save_shard",
    "shard_hash",
    "stack_episodes",
]
