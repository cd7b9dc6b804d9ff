"""Content-hashed episode shards (``.npz``).

A shard holds E episodes of T steps (see docs/CONTRACTS.md):

- ``obs``      uint8   (E, T+1, H, W, 3)  rendered frames, RGB, HWC
- ``actions``  float32 (E, T, A)          action taken after frame t
- ``state``    float32 (E, T+1, S)        ground-truth state at frame t
- ``factors``  JSON string: a list of E dicts of factor values (dotted key -> value)
- ``meta``     JSON string: provenance (env id, silo, split, seeds, image size, ...)

Its content hash is SHA-256 over a domain tag and, for each key in the fixed order above, the key
name, the dtype, the shape and the little-endian bytes (the two JSON strings as UTF-8). The file is
named ``<stem>-<hash>.npz``; :func:`load_shard` recomputes the hash and refuses the shard
(:class:`~lensemble.errors.ArtifactError`) if it disagrees with the name or with an expected hash.
So a shard that was edited, truncated or swapped is never trained on silently.

Writing silo data goes through the residency guard: a batch whose ``meta["silo"]`` is set can only
be written inside that silo's marked folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lensemble.data.residency import guard_silo_write
from lensemble.errors import ArtifactError

_DOMAIN = b"lensemble.shard.v1"
SHARD_KEYS = ("obs", "actions", "state", "factors", "meta")
_NAME = re.compile(r"^(?P<stem>.+)-(?P<hash>[0-9a-f]{64})\.npz$")


@dataclass
class EpisodeBatch:
    """E episodes of T steps held in memory (shapes in the module docstring)."""

    obs: np.ndarray
    actions: np.ndarray
    state: np.ndarray
    factors: list[dict]
    meta: dict = field(default_factory=dict)
    content_hash: str | None = None
    path: Path | None = None

    @property
    def num_episodes(self) -> int:
        return int(self.obs.shape[0])

    @property
    def num_steps(self) -> int:
        """T: actions per episode (frames per episode is T + 1)."""
        return int(self.actions.shape[1])

    @property
    def num_frames(self) -> int:
        return int(self.obs.shape[0] * self.obs.shape[1])

    def validate(self) -> None:
        """Check dtypes and shapes against the shard contract; ArtifactError if they disagree."""
        o, a, s = self.obs, self.actions, self.state
        problems = []
        if o.dtype != np.uint8 or o.ndim != 5 or o.shape[-1] != 3:
            problems.append(f"obs must be uint8 (E, T+1, H, W, 3), got {o.dtype} {o.shape}")
        if a.dtype != np.float32 or a.ndim != 3:
            problems.append(f"actions must be float32 (E, T, A), got {a.dtype} {a.shape}")
        if s.dtype != np.float32 or s.ndim != 3:
            problems.append(f"state must be float32 (E, T+1, S), got {s.dtype} {s.shape}")
        if not problems:
            e, t1 = o.shape[:2]
            if a.shape[:2] != (e, t1 - 1) or s.shape[:2] != (e, t1):
                problems.append(f"inconsistent lengths: obs {o.shape}, actions {a.shape}, state {s.shape}")
            if len(self.factors) != e:
                problems.append(f"{len(self.factors)} factor labels for {e} episodes")
        if problems:
            raise ArtifactError("invalid episode batch: " + "; ".join(problems),
                                remediation="build batches with lensemble.data.collect")


def stack_episodes(episodes: list[dict], meta: dict | None = None) -> EpisodeBatch:
    """Stack single episodes (dicts with obs (T+1,H,W,3), actions (T,A), state (T+1,S), factors)."""
    if not episodes:
        raise ArtifactError("cannot build a shard from zero episodes",
                            remediation="collect at least one episode")
    batch = EpisodeBatch(
        obs=np.stack([e["obs"] for e in episodes]).astype(np.uint8, copy=False),
        actions=np.stack([e["actions"] for e in episodes]).astype(np.float32, copy=False),
        state=np.stack([e["state"] for e in episodes]).astype(np.float32, copy=False),
        factors=[dict(e["factors"]) for e in episodes],
        meta=dict(meta or {}),
    )
    batch.validate()
    return batch


def _canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _arrays(batch: EpisodeBatch) -> dict[str, np.ndarray]:
    return {
        "obs": batch.obs,
        "actions": batch.actions,
        "state": batch.state,
        "factors": np.array(_canonical_json(batch.factors)),
        "meta": np.array(_canonical_json(batch.meta)),
    }


def _hash_arrays(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(_DOMAIN)
    for key in SHARD_KEYS:
        a = arrays[key]
        if a.dtype.kind == "U":  # the JSON strings: hash their UTF-8 text, not numpy's UCS-4
            data, dtype, shape = str(a.reshape(())).encode("utf-8"), "json", ()
        else:
            a = np.ascontiguousarray(a)
            if a.dtype.byteorder == ">":
                a = a.astype(a.dtype.newbyteorder("<"))
            data, dtype, shape = memoryview(a).cast("B"), a.dtype.str, a.shape
        h.update(f"\0{key}\0{dtype}\0{list(shape)}\0".encode())
        h.update(data)
    return h.hexdigest()


def shard_hash(batch: EpisodeBatch) -> str:
    """The hex SHA-256 content hash of a batch (see the module docstring)."""
    return _hash_arrays(_arrays(batch))


def shard_name(stem: str, content_hash: str) -> str:
    return f"{stem}-{content_hash}.npz"


def parse_shard_name(path: str | Path) -> tuple[str, str]:
    """(stem, hash) from a shard file name; ArtifactError if the name carries no hash."""
    m = _NAME.match(Path(path).name)
    if not m:
        raise ArtifactError(f"{Path(path).name!r} is not a shard name (<stem>-<sha256>.npz)",
                            remediation="use the files written by lensemble.data.save_shard")
    return m["stem"], m["hash"]


def save_shard(folder: str | Path, batch: EpisodeBatch, stem: str) -> Path:
    """Write ``batch`` to ``folder/<stem>-<hash>.npz`` and return the path.

    Silo data (``batch.meta["silo"]`` set) may only be written inside that silo's folder
    (ResidencyViolation otherwise). The write is atomic: a crash leaves no half-written shard.
    """
    batch.validate()
    folder = Path(folder)
    arrays = _arrays(batch)
    digest = _hash_arrays(arrays)
    path = folder / shard_name(stem, digest)
    if batch.meta.get("silo") is not None:
        guard_silo_write(path, int(batch.meta["silo"]))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{path.name}.tmp"
    with open(tmp, "wb") as fh:
        # Compressed: rendered frames are mostly flat colour and shrink several-fold.
        np.savez_compressed(fh, **arrays)
    os.replace(tmp, path)
    batch.content_hash, batch.path = digest, path
    return path


def load_shard(path: str | Path, expected_hash: str | None = None) -> EpisodeBatch:
    """Load and verify a shard; ArtifactError if it is unreadable or its hash does not match."""
    path = Path(path)
    _, name_hash = parse_shard_name(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in SHARD_KEYS if k not in z.files]
            if missing:
                raise ArtifactError(f"shard {path.name} lacks {missing}",
                                    remediation="re-collect the data with lensemble.data.collect_silos")
            arrays = {k: z[k] for k in SHARD_KEYS}
    except ArtifactError:
        raise
    except Exception as exc:
        # zipfile.BadZipFile, zlib.error, numpy's ValueError / NotImplementedError for a garbled
        # .npy header, EOFError, OSError: every way a damaged file fails names the file.
        raise ArtifactError(f"cannot read shard {path}: {type(exc).__name__}: {exc}",
                            remediation="the file is missing or corrupt; re-collect or restore it") from None
    try:
        digest = _hash_arrays(arrays)
    except Exception as exc:  # readable, but not shard arrays (a garbled dtype or shape)
        raise ArtifactError(f"shard {path.name} holds unreadable arrays: {type(exc).__name__}: {exc}",
                            remediation="the file is corrupt; re-collect or restore it", path=str(path)) from None
    for label, want in (("its file name", name_hash), ("the expected hash", expected_hash)):
        if want is not None and digest != want:
            raise ArtifactError(
                f"shard {path.name}: content hash {digest[:12]}… does not match {label} ({want[:12]}…)",
                remediation="the shard was modified or swapped; restore it from its source or re-collect",
                path=str(path),
            )
    batch = EpisodeBatch(
        obs=arrays["obs"], actions=arrays["actions"], state=arrays["state"],
        factors=json.loads(str(arrays["factors"])), meta=json.loads(str(arrays["meta"])),
        content_hash=digest, path=path,
    )
    try:
        batch.validate()
    except ArtifactError as exc:
        raise ArtifactError(f"shard {path.name}: {exc.message}", remediation=exc.remediation, path=str(path)) from None
    return batch


def list_shards(folder: str | Path, stem: str | None = None) -> list[Path]:
    """Shard files in ``folder`` (optionally only those with ``stem``), sorted by name."""
    out = []
    for p in sorted(Path(folder).glob("*.npz")):
        m = _NAME.match(p.name)
        if m and (stem is None or m["stem"] == stem):
            out.append(p)
    return out
