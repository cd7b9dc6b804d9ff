"""RunManifest: everything needed to say exactly what a run was (DESIGN.md §8)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from lensemble.config.hashing import json_digest
from lensemble.config.seeds import derive
from lensemble.numerics import numerics_record

_LIBRARIES = ("lensemble", "torch", "torchvision", "timm", "flwr", "numpy", "scipy", "pydantic",
              "opacus", "stable-worldmodel", "safetensors", "hydra-core",
              # what collection depends on: the simulator, rendering and the resize kernel (issue 32:
              # a fresh install once collected other frames than the committed study's)
              "gymnasium", "pygame", "pymunk", "shapely", "pillow", "opencv-python-headless", "imageio")


class RunManifest(BaseModel):
    """What a run was: config, seeds, code version, libraries, hardware and pinned inputs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = 1
    run_kind: str
    config_hash: str
    config: dict
    root_seed: int
    derived_seeds: dict[str, int]
    round_sketch_seeds: list[int] = Field(default_factory=list)
    git_sha: str
    library_versions: dict[str, str]
    hardware: dict[str, str | int]
    probe_hash: str | None = None
    warmstart_hash: str | None = None
    dataset_hashes: dict[str, list[str]] = Field(default_factory=dict)
    dp: dict[str, float | None] = Field(default_factory=dict)
    created_at: str

    def manifest_hash(self) -> str:
        """SHA-256 of the canonical JSON, excluding the creation time."""
        body = self.model_dump(mode="json", exclude={"created_at"})
        return json_digest(body)


def git_sha(start: Path | None = None) -> str:
    """The checkout's commit, with ``+dirty`` when tracked files changed; ``unknown`` outside git."""
    cwd = start or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def hardware() -> dict[str, str | int]:
    import torch

    return {
        "machine": platform.machine(),
        "system": platform.system(),
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        **numerics_record(),  # the CPU and MKL's code path: they decide the rendered frames' last bits
    }


def build_manifest(cfg, run_kind: str, *, rounds: int = 0, probe_hash: str | None = None,
                   warmstart_hash: str | None = None, dataset_hashes: dict | None = None,
                   dp: dict | None = None) -> RunManifest:
    """Assemble a manifest for ``cfg`` (a LensembleConfig)."""
    seeds = {label: derive(cfg.root_seed, label) for label in ("torch", "numpy", "python", "data", "train")}
    return RunManifest(
        run_kind=run_kind,
        config_hash=cfg.config_hash(),
        config=cfg.model_dump(mode="json"),
        root_seed=cfg.root_seed,
        derived_seeds=seeds,
        round_sketch_seeds=[derive(cfg.root_seed, "sketch", t) for t in range(rounds)],
        git_sha=git_sha(),
        library_versions=library_versions(),
        hardware=hardware(),
        probe_hash=probe_hash,
        warmstart_hash=warmstart_hash,
        dataset_hashes=dataset_hashes or {},
        dp=dp or {},
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def write_manifest(manifest: RunManifest, run_dir: str | os.PathLike) -> Path:
    """Write ``manifest.json`` into ``run_dir`` and return its path."""
    path = Path(run_dir) / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest.model_dump(mode="json"), indent=1, sort_keys=True) + "\n")
    return path

