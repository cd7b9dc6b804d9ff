"""The public probe: frames every participant may embed and share.

The probe is rendered with *public* factor values (a role in the factor catalog that no silo and
no evaluation split ever uses), so embedding it reveals nothing about any silo's data. It is a
single array ``frames`` uint8 (P, 3, H, W) pinned by ``content_hash``: the hex SHA-256 over a
domain tag and the frames' dtype, shape and bytes. Everyone who uses the probe (participants, the
gauge, the drift report) verifies that hash; a probe that differs from the pinned one raises
:class:`~lensemble.errors.ProbeError`, because comparing embeddings of different probes would
measure the probe, not the models.

On disk: ``probe-<hash>.npz`` with ``frames`` and a JSON ``meta`` (env, factor, the public values,
seeds). Only the frames are hashed: the hash identifies the pixels that get embedded.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lensemble.errors import ProbeError

_DOMAIN = b"lensemble.probe.v1"


@dataclass
class Probe:
    """Public probe frames (P, 3, H, W) uint8, their hash and provenance."""

    frames: np.ndarray
    content_hash: str
    meta: dict = field(default_factory=dict)
    path: Path | None = None

    def __len__(self) -> int:
        return int(self.frames.shape[0])

    def tensor(self):
        """The frames as a torch uint8 tensor (P, 3, H, W), sharing memory."""
        import torch

        return torch.from_numpy(self.frames)

    def verify(self, expected_hash: str) -> None:
        """ProbeError unless this probe's frames hash to ``expected_hash``."""
        check_probe(self.frames, expected_hash)


def probe_hash(frames) -> str:
    """Hex SHA-256 of probe frames (numpy array or torch tensor, (P, 3, H, W) uint8)."""
    if hasattr(frames, "detach"):
        frames = frames.detach().cpu().numpy()
    a = np.ascontiguousarray(frames)
    if a.dtype != np.uint8 or a.ndim != 4 or a.shape[1] != 3:
        raise ProbeError(f"probe frames must be uint8 (P, 3, H, W), got {a.dtype} {a.shape}",
                         remediation="build the probe with lensemble.data.collect_silos")
    if 0 in a.shape:  # an empty probe pins nothing, and every consumer needs frames (issue 33)
        raise ProbeError(f"the public probe holds no frames (shape {a.shape}): drift, the anchor and the backstop "
                         "all measure on its frames", remediation="raise data.probe_frames (>= 1) or rebuild the "
                         "probe from a collection with public episodes (data.public_episodes)")
    h = hashlib.sha256(_DOMAIN)
    h.update(f"\0{a.dtype.str}\0{list(a.shape)}\0".encode())
    h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def check_probe(frames, expected_hash: str) -> None:
    """ProbeError unless ``frames`` hash to ``expected_hash``."""
    got = probe_hash(frames)
    if got != expected_hash:
        raise ProbeError(
            f"public probe hash {got[:12]}… does not match the pinned {expected_hash[:12]}…",
            remediation="use the public probe whose hash the run was trained with (run manifest)",
            expected=expected_hash, got=got,
        )


def frames_from_episodes(obs: np.ndarray, num_frames: int, stride: int) -> np.ndarray:
    """Pick every ``stride``-th frame of each episode, in order, and keep the first ``num_frames``.

    ``obs`` is (E, T+1, H, W, 3) uint8; returns (num_frames, 3, H, W) uint8.
    """
    picked = obs[:, ::stride].reshape(-1, *obs.shape[2:])
    if picked.shape[0] < num_frames:
        raise ValueError(f"only {picked.shape[0]} frames available for a probe of {num_frames}")
    return np.ascontiguousarray(picked[:num_frames].transpose(0, 3, 1, 2))


def save_probe(folder: str | Path, frames: np.ndarray, meta: dict | None = None) -> Probe:
    """Write ``folder/probe-<hash>.npz`` (atomically) and return the pinned :class:`Probe`."""
    digest = probe_hash(frames)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"probe-{digest}.npz"
    tmp = folder / f".{path.name}.tmp"
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, frames=frames, meta=np.array(json.dumps(meta or {}, sort_keys=True)))
    os.replace(tmp, path)
    return Probe(frames=frames, content_hash=digest, meta=dict(meta or {}), path=path)


def load_probe(path: str | Path, expected_hash: str | None = None) -> Probe:
    """Load and verify a probe file.

    The frames must hash to the hash in the file name and, when given, to ``expected_hash``
    (the one pinned in the run manifest); otherwise ProbeError. Unreadable files also raise
    ProbeError, never a bare numpy error.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            frames = z["frames"]
            meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
    except Exception as exc:
        # A damaged file fails in many ways (zipfile.BadZipFile, zlib.error, numpy's ValueError or
        # NotImplementedError for a garbled .npy header, EOFError, a JSON error): all of them are
        # "this probe file cannot be read", and the error names the file.
        raise ProbeError(f"cannot read public probe {path}: {type(exc).__name__}: {exc}",
                         remediation="restore the probe file or re-create it with "
                                     "lensemble.data.collect_silos") from None
    name = path.name
    named = name.startswith("probe-") and name.endswith(".npz")
    name_hash = name[len("probe-"):-len(".npz")] if named else None
    try:
        got = probe_hash(frames)
    except ProbeError as exc:  # readable, but not probe frames (a garbled dtype or shape)
        raise ProbeError(f"public probe {name}: {exc.message}", remediation=exc.remediation) from None
    for label, want in (("its file name", name_hash), ("the pinned hash", expected_hash)):
        if want is not None and got != want:
            raise ProbeError(
                f"public probe {name}: hash {got[:12]}… does not match {label} ({want[:12]}…)",
                remediation="use the public probe whose hash the run was trained with (run manifest)",
                expected=want, got=got,
            )
    return Probe(frames=frames, content_hash=got, meta=meta, path=path)


# ================================================================================== the split
# The probe is split once, deterministically, into *landmark* frames (everything that trains or
# fits on the probe uses only these: the anchor's targets, the backstop's Procrustes fit, the
# distillation) and *measurement* frames (every drift number is measured on these only), so that
# no drift figure is scored on frames a gauge control was fitted to.
_SPLIT_DOMAIN = b"lensemble.probe-split.v1"


def index_set_hash(indices) -> str:
    """Hex SHA-256 of a set of probe indices (sorted int64), under a domain tag."""
    idx = np.sort(np.asarray(indices, dtype=np.int64).reshape(-1))
    h = hashlib.sha256(_SPLIT_DOMAIN)
    h.update(f"\0{idx.size}\0".encode())
    h.update(idx.astype("<i8").tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class ProbeSplit:
    """The probe's landmark and measurement frames: disjoint, sorted, covering the probe."""

    landmark_idx: np.ndarray
    measurement_idx: np.ndarray
    probe_hash: str
    seed: int

    @property
    def num_probe(self) -> int:
        return int(self.landmark_idx.size + self.measurement_idx.size)

    @property
    def landmark_hash(self) -> str:
        return index_set_hash(self.landmark_idx)

    @property
    def measurement_hash(self) -> str:
        return index_set_hash(self.measurement_idx)

    def record(self) -> dict:
        """JSON-ready provenance: sizes and both index-set hashes (what a report pins)."""
        return {"probe_hash": self.probe_hash, "num_probe": self.num_probe,
                "num_landmarks": int(self.landmark_idx.size), "num_measurement": int(self.measurement_idx.size),
                "landmark_hash": self.landmark_hash, "measurement_hash": self.measurement_hash,
                "seed_labels": ["probe", "split", self.probe_hash]}


def landmark_count(num_probe: int, anchor_landmarks: int) -> int:
    """Size of the landmark part: ``gauge.anchor_landmarks`` frames, at most half of the probe (so
    drift always has at least as many measurement frames as the anchor has landmarks)."""
    if num_probe < 2:
        raise ProbeError(f"a probe of {num_probe} frame(s) cannot be split into landmark and measurement frames",
                         remediation="raise data.probe_frames")
    return max(1, min(int(anchor_landmarks), int(num_probe) // 2))


def split_probe(num_probe: int, num_landmarks: int, *, seed: int, probe_hash: str) -> ProbeSplit:
    """Split ``num_probe`` probe frames into ``num_landmarks`` landmark frames and the rest.

    A uniform random partition drawn from ``derive(seed, "probe", "split", probe_hash)`` (the root
    seed and the probe's content hash), so every participant and the coordinator derive the same
    split without exchanging it, and a different probe gives a different split. Both index sets
    are returned sorted; their hashes (:func:`index_set_hash`) pin them in reports.
    """
    from lensemble.config.seeds import numpy_rng

    num_probe, num_landmarks = int(num_probe), int(num_landmarks)
    if not 1 <= num_landmarks < num_probe:
        raise ProbeError(f"cannot take {num_landmarks} landmark frames from a probe of {num_probe} "
                         "and keep measurement frames", remediation="raise data.probe_frames or lower "
                         "gauge.anchor_landmarks")
    perm = numpy_rng(int(seed), "probe", "split", probe_hash).permutation(num_probe)
    return ProbeSplit(np.sort(perm[:num_landmarks]).astype(np.int64),
                      np.sort(perm[num_landmarks:]).astype(np.int64), probe_hash, int(seed))


def probe_split_for(cfg, probe_hash: str, num_probe: int | None = None) -> ProbeSplit:
    """The split of a run's probe: ``landmark_count(|P|, gauge.anchor_landmarks)`` landmarks, seeded by
    the run's root seed and the probe hash."""
    n = int(cfg.data.probe_frames if num_probe is None else num_probe)
    return split_probe(n, landmark_count(n, cfg.gauge.anchor_landmarks), seed=cfg.root_seed, probe_hash=probe_hash)
