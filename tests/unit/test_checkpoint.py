import json

import pytest
import torch

from lensemble.artifacts.checkpoint import HEADER, WEIGHTS, load_checkpoint, read_header, save_checkpoint
from lensemble.errors import ArtifactError, CheckpointIntegrityError, SchemaVersionMismatch


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {"encoder.frame.weight": torch.randn(4, 4, generator=g),
            "predictor.out_proj.bias": torch.randn(4, generator=g),
            "counter": torch.arange(3, dtype=torch.int64)}


def test_round_trip_and_hash_is_layout_independent(tmp_path):
    h = save_checkpoint(tmp_path / "a", _tensors(), kind="world_model", round_index=2,
                        parent_hash="p" * 64, config_hash="c" * 64, architecture={"d": 4})
    ck = load_checkpoint(tmp_path / "a")
    assert ck.content_hash == h and ck.round_index == 2 and ck.header["parent_hash"] == "p" * 64
    for k, v in _tensors().items():
        assert torch.equal(ck.tensors[k], v)
    # insertion order of the dict does not matter
    rev = dict(reversed(list(_tensors().items())))
    assert save_checkpoint(tmp_path / "b", rev, kind="world_model", round_index=2, parent_hash="p" * 64,
                           config_hash="c" * 64, architecture={"d": 4}) == h


def test_hash_depends_on_structure_and_values(tmp_path):
    h0 = save_checkpoint(tmp_path / "a", _tensors(), kind="world_model")
    assert save_checkpoint(tmp_path / "b", _tensors(), kind="world_model", round_index=1) != h0
    t = _tensors()
    t["counter"][0] = 9
    assert save_checkpoint(tmp_path / "c", t, kind="world_model") != h0


def _every_byte_flip_is_caught(folder, name, stride):
    path = folder / name
    original = path.read_bytes()
    for i in range(0, len(original), stride):
        bad = bytearray(original)
        bad[i] ^= 0x01
        path.write_bytes(bytes(bad))
        with pytest.raises(ArtifactError):
            load_checkpoint(folder)
    path.write_bytes(original)
    load_checkpoint(folder)


def test_flipped_byte_in_weights_is_refused(tmp_path):
    save_checkpoint(tmp_path / "a", _tensors(), kind="world_model")
    _every_byte_flip_is_caught(tmp_path / "a", WEIGHTS, stride=7)


def test_flipped_byte_in_header_is_refused(tmp_path):
    save_checkpoint(tmp_path / "a", _tensors(), kind="world_model", extra={"note": "x"})
    _every_byte_flip_is_caught(tmp_path / "a", HEADER, stride=3)


def test_tampered_value_with_consistent_layout_is_refused(tmp_path):
    from safetensors.torch import save

    save_checkpoint(tmp_path / "a", _tensors(), kind="world_model")
    t = _tensors()
    t["encoder.frame.weight"][0, 0] += 1.0
    (tmp_path / "a" / WEIGHTS).write_bytes(save(t))
    with pytest.raises(CheckpointIntegrityError):
        load_checkpoint(tmp_path / "a")


def test_schema_too_new_is_refused_before_hashing(tmp_path):
    save_checkpoint(tmp_path / "a", _tensors(), kind="world_model")
    p = tmp_path / "a" / HEADER
    header = json.loads(p.read_text())
    header["schema_version"] = 99
    p.write_text(json.dumps(header, sort_keys=True, separators=(",", ":")) + "\n")
    with pytest.raises(SchemaVersionMismatch):
        load_checkpoint(tmp_path / "a")
    with pytest.raises(SchemaVersionMismatch):
        read_header(tmp_path / "a")


def test_expected_hash_and_missing_folder(tmp_path):
    save_checkpoint(tmp_path / "a", _tensors(), kind="world_model")
    with pytest.raises(CheckpointIntegrityError):
        load_checkpoint(tmp_path / "a", expected_hash="0" * 64)
    with pytest.raises(ArtifactError):
        load_checkpoint(tmp_path / "missing")


def test_overwrite_is_atomic_and_leaves_no_temp(tmp_path):
    save_checkpoint(tmp_path / "a", _tensors(), kind="world_model")
    save_checkpoint(tmp_path / "a", _tensors(), kind="world_model", round_index=3)
    assert load_checkpoint(tmp_path / "a").round_index == 3
    assert [p.name for p in tmp_path.iterdir()] == ["a"]
