"""Artifacts: hash-verified checkpoints and run manifests."""

from lensemble.artifacts.checkpoint import Checkpoint, load_checkpoint, read_header, save_checkpoint
from lensemble.artifacts.manifest import RunManifest, write_manifest

__all__ = ["Checkpoint", "load_checkpoint", "read_header", "save_checkpoint", "RunManifest", "write_manifest"]
