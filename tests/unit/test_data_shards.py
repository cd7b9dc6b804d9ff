"""Episode shards: round trip, content hash in the name, tamper detection; residency guard."""

import json

import numpy as np
import pytest

from lensemble.data import (
    EpisodeBatch,
    guard_export,
    guard_silo_write,
    load_shard,
    mark_silo_folder,
    save_shard,
    shard_hash,
    silo_of,
)
from lensemble.errors import ArtifactError, ResidencyViolation


def _batch(silo=None, e=2, t=5, seed=0):
    rng = np.random.default_rng(seed)
    return EpisodeBatch(
        obs=rng.integers(0, 256, (e, t + 1, 8, 8, 3), dtype=np.uint8),
        actions=rng.uniform(-1, 1, (e, t, 2)).astype(np.float32),
        state=rng.normal(size=(e, t + 1, 4)).astype(np.float32),
        factors=[{"agent.color": [i, 0, 0]} for i in range(e)],
        meta={"silo": silo, "split": "train"},
    )


def test_round_trip_and_name_carries_hash(tmp_path):
    b = _batch()
    path = save_shard(tmp_path / "eval", b, "transfer")
    assert path.name == f"transfer-{shard_hash(b)}.npz"
    got = load_shard(path, expected_hash=b.content_hash)
    for k in ("obs", "actions", "state"):
        a, c = getattr(b, k), getattr(got, k)
        assert a.dtype == c.dtype and np.array_equal(a, c)
    assert got.factors == b.factors and got.meta == b.meta


def test_hash_depends_on_content_and_labels():
    a, b = _batch(), _batch()
    assert shard_hash(a) == shard_hash(b)
    b.factors[0]["agent.color"] = [9, 9, 9]
    assert shard_hash(a) != shard_hash(b)
    c = _batch()
    c.state = c.state.astype(np.float64).astype(np.float32)  # same values, same dtype: same hash
    assert shard_hash(a) == shard_hash(c)


def test_tampered_shard_is_refused(tmp_path):
    path = save_shard(tmp_path, _batch(), "train")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["obs"][0, 0, 0, 0, 0] ^= 1  # flip one bit of one pixel
    with open(path, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    with pytest.raises(ArtifactError, match="does not match"):
        load_shard(path)


def test_wrong_expected_hash_and_corrupt_file(tmp_path):
    path = save_shard(tmp_path, _batch(), "train")
    with pytest.raises(ArtifactError):
        load_shard(path, expected_hash="0" * 64)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ArtifactError, match="cannot read"):
        load_shard(path)


def test_residency_marker_and_guard(tmp_path):
    silo0, silo1 = tmp_path / "silo_000", tmp_path / "silo_001"
    mark_silo_folder(silo0, 0)
    mark_silo_folder(silo1, 1)
    marker = json.loads((silo0 / "RESIDENCY.json").read_text())
    assert marker["silo"] == 0 and marker["exportable"] is False
    assert silo_of(silo0 / "sub" / "x.npz") == 0 and silo_of(tmp_path / "x.npz") is None
    guard_silo_write(silo0 / "train.npz", 0)  # its own folder: fine
    with pytest.raises(ResidencyViolation):
        guard_silo_write(tmp_path / "exported.npz", 0)
    with pytest.raises(ResidencyViolation):
        guard_silo_write(silo1 / "train.npz", 0)
    with pytest.raises(ResidencyViolation):
        mark_silo_folder(silo0, 1)
    with pytest.raises(ResidencyViolation):
        guard_export(silo0 / "train.npz")
    guard_export(tmp_path / "report.json")


def test_writer_refuses_silo_data_outside_its_folder(tmp_path):
    mark_silo_folder(tmp_path / "silo_000", 0)
    with pytest.raises(ResidencyViolation):
        save_shard(tmp_path / "public", _batch(silo=0), "train")
    with pytest.raises(ResidencyViolation):
        save_shard(tmp_path / "silo_001_unmarked", _batch(silo=1), "train")
    assert not list(tmp_path.rglob("*.npz"))  # nothing was written
    save_shard(tmp_path / "silo_000", _batch(silo=0), "train")


def test_symlink_does_not_smuggle_data_out(tmp_path):
    mark_silo_folder(tmp_path / "silo_000", 0)
    (tmp_path / "outside").mkdir()
    (tmp_path / "silo_000" / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(ResidencyViolation):
        guard_silo_write(tmp_path / "silo_000" / "link" / "train.npz", 0)


def test_every_one_byte_corruption_raises_artifact_error_naming_the_file(tmp_path):
    """Flip each byte of a (small) shard in turn: it loads with its hash or raises ArtifactError
    naming the file; never a raw zlib / numpy / json exception."""
    path = save_shard(tmp_path / "src", _batch(e=1, t=2), "train")
    raw = path.read_bytes()
    target = tmp_path / path.name
    refused = 0
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0xFF
        target.write_bytes(bytes(flipped))
        try:
            got = load_shard(target)
        except ArtifactError as exc:
            assert path.name in exc.message, exc.message
            refused += 1
            continue
        assert got.content_hash == shard_hash(got)
    assert refused > 0
