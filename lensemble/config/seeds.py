"""Seed derivation: every random stream is ``derive(root_seed, *labels)``.

A stable cryptographic hash (SHA-256 of a domain tag and the labels) makes the streams identical
across processes, machines and Python versions, and independent of any global RNG state.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

_DOMAIN = b"lensemble.seed.v1"


def derive(root_seed: int, *labels: object) -> int:
    """Derive a 63-bit seed from ``root_seed`` and a path of labels (str or int).

    ``derive(7, "sketch", 3)`` is the sketch seed of round 3 for root seed 7. Labels are joined
    with a NUL separator so ``("ab", "c")`` and ``("a", "bc")`` give different seeds.
    """
    if isinstance(root_seed, bool) or not isinstance(root_seed, (int, np.integer)):
        raise TypeError(f"root_seed must be an int, got {type(root_seed).__name__}")
    h = hashlib.sha256()
    h.update(_DOMAIN)
    h.update(b"\0" + str(int(root_seed)).encode())
    for label in labels:
        h.update(b"\0" + str(label).encode("utf-8"))
    return int.from_bytes(h.digest()[:8], "big") & ((1 << 63) - 1)


def torch_generator(root_seed: int, *labels: object) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``derive(root_seed, *labels)``."""
    g = torch.Generator(device="cpu")
    g.manual_seed(derive(root_seed, *labels))
    return g


def batch_labels(replicate: int) -> tuple:
    """The labels a training replicate adds to the batch stream's seed, after ``"batches"``:
    none for replicate 0 (every stream, and so every run, from before replicates is unchanged),
    ``("replicate", r)`` for r > 0 (``train.replicate``, docs/study.md "Replicates")."""
    if isinstance(replicate, bool) or not isinstance(replicate, (int, np.integer)) or replicate < 0:
        raise TypeError(f"replicate must be a non-negative int, got {replicate!r}")
    return () if replicate == 0 else ("replicate", int(replicate))


def numpy_rng(root_seed: int, *labels: object) -> np.random.Generator:
    """A numpy ``Generator`` seeded with ``derive(root_seed, *labels)``."""
    return np.random.default_rng(derive(root_seed, *labels))
