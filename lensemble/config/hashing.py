"""Content hashes of JSON-able values: the one helper every new hash should use.

``json_digest(obj)`` is the SHA-256 hex digest of ``obj``'s canonical JSON: sorted keys, compact
separators, UTF-8. Hashes that were pinned before this helper existed keep their exact format
through its arguments (``compact=False``: Python's default ``", "`` / ``": "`` separators;
``default=str`` for values JSON cannot encode), so every committed hash stays bit-identical.

Hashes over tensors (checkpoints, episode shards, the probe, the coordinator's aggregate digest)
are format-specific (a domain tag, headers, little-endian bytes) and live next to their formats.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any


def json_digest(obj: Any, *, compact: bool = True, default: Callable[[Any], Any] | None = None) -> str:
    """SHA-256 hex of ``json.dumps(obj, sort_keys=True)`` (compact separators unless told)."""
    separators = (",", ":") if compact else None
    text = json.dumps(obj, sort_keys=True, separators=separators, default=default)
    return hashlib.sha256(text.encode()).hexdigest()


__all__ = ["json_digest"]
