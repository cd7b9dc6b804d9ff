"""The round's global model, kept by a participant from the summary ask for the train ask.

With the pooled objective a round asks every participant twice with the same global model (the
summary ask, then the train ask: :mod:`lensemble.federation.pooling`). Sending it twice would make
a pooled round move ~1.5x the bytes of a plain one on the Flower engines, so:

- in the summary ask each participant keeps the global arrays it received in its state folder,
  named by the round and their content digest (:func:`keep_global`);
- the coordinator's train ask then carries the digest and the participants whose summary it
  accepted in the round config (``global-digest``, ``global-cached-by``: :func:`cache_config`),
  and every engine's ask sends those participants an empty global (:func:`holders`); everyone
  else (a node that missed the summary ask, or whose summary was refused) gets the full global;
- a participant sent an empty global loads the kept arrays and verifies their digest
  (:func:`resolve_global`): missing or different, the round fails on that participant with a
  RoundError naming the digest, and the round is retried (summary ask included) as usual.

The digest is SHA-256 over each array's name, dtype, size and bytes in sorted-name order; shapes
are left out because Flower's ArrayRecord turns a 0-d buffer (BatchNorm's step counter) into
shape (1,) without changing a byte.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from lensemble.artifacts.storage import write_bytes_atomic
from lensemble.errors import RoundError

DIGEST_KEY = "global-digest"
HOLDERS_KEY = "global-cached-by"
_GLOB = "global-*.npz"


def global_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """Hex SHA-256 of ``arrays`` (names, dtypes, sizes and bytes in sorted-name order)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(np.asarray(arrays[name]))
        h.update(f"{name}\0{a.dtype.str}\0{a.size}\0".encode())
        h.update(a.reshape(-1).view(np.uint8).data if a.size else b"")
    return h.hexdigest()


def cache_config(digest: str, cached_by: list[str]) -> dict[str, str]:
    """The round-config entries of a train ask whose global ``cached_by`` (participant ids) hold."""
    return {DIGEST_KEY: digest, HOLDERS_KEY: ",".join(sorted(cached_by))}


def holders(round_config: Mapping) -> frozenset[str]:
    """The participant ids an ask sends an empty global (they kept the round's global), or none."""
    if not round_config.get(DIGEST_KEY):
        return frozenset()
    return frozenset(p for p in str(round_config.get(HOLDERS_KEY, "")).split(",") if p)


def _path(state_dir: Path, t: int, digest: str) -> Path:
    return state_dir / f"global-{t:05d}-{digest[:16]}.npz"


def keep_global(state_dir: Path, t: int, arrays: Mapping[str, np.ndarray]) -> str:
    """Keep round t's global arrays in ``state_dir`` (replacing any kept before); return their digest."""
    digest = global_digest(arrays)
    path = _path(state_dir, t, digest)
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
    # a reader sees the whole file or none; a full disk leaves no temporary and is named DiskFull
    write_bytes_atomic(path, buffer.getvalue(), what="kept global")
    for old in state_dir.glob(_GLOB):
        if old != path:
            old.unlink(missing_ok=True)
    return digest


def cached_global(state_dir: Path, t: int, digest: str) -> dict[str, np.ndarray]:
    """Round t's global arrays as kept by :func:`keep_global`, verified against ``digest``.

    RoundError naming the digest when none is kept (the participant missed the summary ask, or
    its state folder was reset) or the kept arrays have another digest.
    """
    path = _path(state_dir, t, digest)
    if not path.exists():
        raise RoundError(f"round {t}: the train ask sent no global model but the digest {digest[:16]}… of the one "
                         f"this participant should have kept from the summary ask, and {state_dir} holds none",
                         remediation="the participant missed the round's summary ask or lost its state folder; "
                                     "the round is retried with a fresh summary ask")
    with np.load(path) as f:
        arrays = {k: np.array(f[k]) for k in f.files}
    got = global_digest(arrays)
    if got != digest:
        raise RoundError(f"round {t}: the global this participant kept has digest {got[:16]}…, the train ask "
                         f"names {digest[:16]}…", remediation="the kept copy is damaged or stale; the round is "
                                                              "retried with a fresh summary ask")
    return arrays


def resolve_global(state_dir: Path, round_config: Mapping, arrays: Mapping[str, np.ndarray]
                   ) -> Mapping[str, np.ndarray]:
    """The round's global arrays: ``arrays`` as received, or — when they are empty and the round
    config names a digest — the ones kept from the summary ask (:func:`cached_global`)."""
    digest = round_config.get(DIGEST_KEY)
    if arrays or not digest:
        return arrays
    return cached_global(Path(state_dir), int(round_config["round"]), str(digest))


__all__ = ["DIGEST_KEY", "HOLDERS_KEY", "cache_config", "cached_global", "global_digest", "holders", "keep_global",
           "resolve_global"]
