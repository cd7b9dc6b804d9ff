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


# ---------------------------------------------------------------- landmark / measurement split
def test_split_is_a_deterministic_disjoint_partition_pinned_by_hashes():
    from lensemble.data.probe import index_set_hash, landmark_count, split_probe

    h = probe_hash(_frames())
    s = split_probe(256, 128, seed=3, probe_hash=h)
    lm, ms = s.landmark_idx, s.measurement_idx
    assert lm.size == 128 and ms.size == 128 and s.num_probe == 256
    assert np.array_equal(np.sort(np.concatenate([lm, ms])), np.arange(256))   # a partition
    assert np.all(np.diff(lm) > 0) and np.all(np.diff(ms) > 0)                  # sorted, no repeats
    again = split_probe(256, 128, seed=3, probe_hash=h)
    assert np.array_equal(again.landmark_idx, lm) and again.landmark_hash == s.landmark_hash
    # The seed and the probe both move it; the hashes say so.
    other_seed = split_probe(256, 128, seed=4, probe_hash=h)
    other_probe = split_probe(256, 128, seed=3, probe_hash=probe_hash(_frames(seed=1)))
    assert other_seed.landmark_hash != s.landmark_hash and other_probe.landmark_hash != s.landmark_hash
    assert s.landmark_hash == index_set_hash(lm[::-1])  # a set: order does not matter
    assert s.landmark_hash != s.measurement_hash
    rec = s.record()
    assert rec["num_landmarks"] == 128 and rec["measurement_hash"] == s.measurement_hash
    # Not the first half: a random partition (a 1-in-C(256,128) coincidence otherwise).
    assert not np.array_equal(lm, np.arange(128))
    assert landmark_count(256, 128) == 128 and landmark_count(32, 128) == 16 and landmark_count(32, 16) == 16


def test_split_refuses_to_leave_no_measurement_frames():
    from lensemble.data.probe import landmark_count, split_probe

    with pytest.raises(ProbeError):
        split_probe(16, 16, seed=0, probe_hash="x")
    with pytest.raises(ProbeError):
        split_probe(16, 0, seed=0, probe_hash="x")
    with pytest.raises(ProbeError):
        landmark_count(1, 4)


def test_every_one_byte_corruption_raises_probe_error_naming_the_file(tmp_path):
    """Flip each byte of a probe file in turn: it loads with its pinned hash (a byte numpy never
    reads, e.g. a zip timestamp) or raises ProbeError naming the file; never zlib.error,
    NotImplementedError or any other raw exception."""
    probe = save_probe(tmp_path / "src", _frames(p=4), {"public_values": [[1]]})
    raw = probe.path.read_bytes()
    bad = tmp_path / "bad"
    bad.mkdir()
    target = bad / probe.path.name
    kinds = set()
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0xFF
        target.write_bytes(bytes(flipped))
        try:
            got = load_probe(target, expected_hash=probe.content_hash)
        except ProbeError as exc:
            assert probe.path.name in exc.message, exc.message
            kinds.add("refused")
            continue
        assert got.content_hash == probe.content_hash
        kinds.add("harmless")
    assert "refused" in kinds
