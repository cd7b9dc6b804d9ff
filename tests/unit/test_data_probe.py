"""Public probe: hash pinning, ProbeError on mismatch or corruption."""

import numpy as np
import pytest
import torch

from lensemble.data import check_probe, load_probe, probe_hash, save_probe
from lensemble.errors import ProbeError


def _frames(seed=0, p=6):
    return np.random.default_rng(seed).integers(0, 256, (p, 3, 8, 8), dtype=np.uint8)


def test_save_load_round_trip(tmp_path):
    probe = save_probe(tmp_path, _frames(), {"public_values": [[1, 2, 3]]})
    assert probe.path.name == f"probe-{probe.content_hash}.npz"
    got = load_probe(probe.path, expected_hash=probe.content_hash)
    assert np.array_equal(got.frames, probe.frames) and got.meta["public_values"] == [[1, 2, 3]]
    assert got.tensor().shape == (6, 3, 8, 8) and got.tensor().dtype == torch.uint8
    assert probe_hash(got.tensor()) == probe.content_hash  # tensors and arrays hash alike


def test_mismatch_raises_probe_error(tmp_path):
    probe = save_probe(tmp_path, _frames(), {})
    other = probe_hash(_frames(seed=1))
    with pytest.raises(ProbeError):
        load_probe(probe.path, expected_hash=other)
    with pytest.raises(ProbeError):
        check_probe(_frames(seed=1), probe.content_hash)
    with pytest.raises(ProbeError):
        probe.verify(other)


def test_tampered_or_missing_probe_raises(tmp_path):
    probe = save_probe(tmp_path, _frames(), {})
    frames = probe.frames.copy()
    frames[0, 0, 0, 0] ^= 1
    with open(probe.path, "wb") as fh:
        np.savez_compressed(fh, frames=frames, meta=np.array("{}"))
    with pytest.raises(ProbeError, match="file name"):
        load_probe(probe.path)
    with pytest.raises(ProbeError, match="cannot read"):
        load_probe(tmp_path / "probe-nothere.npz")
    with pytest.raises(ProbeError):
        probe_hash(np.zeros((2, 8, 8, 3), np.uint8))  # HWC is not the probe layout
