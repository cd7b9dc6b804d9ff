"""Encoder and WorldModel construction: shapes, identity frame, Fork A, rebuild, gauge rotation."""

import json

import pytest
import torch
from tiny_model import D, frames, random_orthogonal, tiny_cfg

from lensemble.config.schema import ModelConfig
from lensemble.errors import ArtifactError
from lensemble.model import (
    GAUGE_KEYS,
    architecture,
    build_world_model,
    rotate_latent_basis_,
    world_model_from_state,
)


def test_encoder_shapes_and_input_types():
    m = build_world_model(tiny_cfg(), init_seed=0)
    x = frames(4)
    z = m.encoder(x)
    assert z.shape == (4, D) and z.dtype == torch.float32
    # float input in [0, 1] is the same image as uint8 / 255
    torch.testing.assert_close(m.encoder(x.float() / 255), z)
    clips = x.reshape(2, 2, 3, 16, 16)
    zc = m.encoder.encode_frames(clips)
    assert zc.shape == (2, 2, D)
    torch.testing.assert_close(zc.reshape(4, D), z)
    torch.testing.assert_close(m.encode(clips), zc)
    # native-resolution frames are resized to img_size
    assert m.encoder(frames(2, size=32)).shape == (2, D)
    with pytest.raises(ValueError):
        m.encoder(torch.zeros(2, 16, 16, 3, dtype=torch.uint8))  # channels-last is rejected


def test_frame_layer_is_identity_at_init_and_contract_keys_exist():
    m = build_world_model(tiny_cfg(), init_seed=0)
    assert m.encoder.frame.bias is None
    torch.testing.assert_close(m.encoder.frame.weight, torch.eye(D), rtol=0, atol=0)
    state = m.state_dict()
    for key in GAUGE_KEYS + ("predictor.in_proj.bias",):
        assert key in state
    assert state["predictor.in_proj.weight"].shape == (32, D)
    assert state["predictor.out_proj.weight"].shape == (D, 32)
    # normalisation constants are not checkpoint state
    # the input standardisation travels with the checkpoint, as (1, 3, img, img) buffers
    assert state["encoder.pixel_mean"].shape == state["encoder.pixel_std"].shape


def test_init_seed_is_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_world_model(tiny_cfg(), init_seed=5).state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)
    b = build_world_model(tiny_cfg(), init_seed=5).state_dict()
    c = build_world_model(tiny_cfg(), init_seed=6).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["predictor.in_proj.weight"], c["predictor.in_proj.weight"])


def test_fork_a_freezes_encoder_only():
    m = build_world_model(tiny_cfg(encoder_frozen=True), init_seed=0)
    assert all(not p.requires_grad for p in m.encoder.parameters())
    assert all(p.requires_grad for p in m.predictor.parameters())
    ids = {id(p) for p in m.trainable_parameters()}
    assert ids == {id(p) for p in m.predictor.parameters()}
    m2 = build_world_model(tiny_cfg(), init_seed=0)
    assert all(p.requires_grad for p in m2.parameters())


def test_architecture_roundtrip_strict():
    cfg = tiny_cfg()
    m = build_world_model(cfg, init_seed=1)
    arch = json.loads(json.dumps(architecture(cfg)))  # JSON-able
    tensors = {k: v.clone() for k, v in m.state_dict().items()}
    m2 = world_model_from_state(arch, tensors)
    x = frames(3)
    torch.testing.assert_close(m2.encoder(x), m.encoder(x), rtol=0, atol=0)
    # numpy arrays are accepted too
    m3 = world_model_from_state(arch, {k: v.numpy() for k, v in tensors.items()})
    torch.testing.assert_close(m3.encoder(x), m.encoder(x), rtol=0, atol=0)
    missing = dict(tensors)
    missing.pop("encoder.frame.weight")
    with pytest.raises(ArtifactError):
        world_model_from_state(arch, missing)
    with pytest.raises(ArtifactError):
        world_model_from_state(arch, {**tensors, "extra.weight": torch.zeros(1)})
    with pytest.raises(ArtifactError):
        world_model_from_state({"format": "other"}, tensors)


@pytest.mark.parametrize("backbone", [{}, {"backbone": "cnn", "cnn_channels": [4, 8]}], ids=["vit", "cnn"])
def test_rotation_reparametrises_encoder_exactly(backbone):
    m = build_world_model(tiny_cfg(**backbone), init_seed=2)
    x = frames(5)
    with torch.no_grad():
        z = m.encoder(x)
        q = random_orthogonal(D, seed=3)
        rotate_latent_basis_(m, q)
        z_rot = m.encoder(x)
    torch.testing.assert_close(z_rot, z @ q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.encoder.frame.weight, q.T, rtol=1e-6, atol=1e-6)


def test_input_normalization_fits_public_frames():
    import torch

    from lensemble.model.world_model import build_world_model

    cfg = ModelConfig(img_size=16, patch_size=8, embed_dim=32, depth=1, num_heads=2, latent_dim=8,
                      projector_hidden=16, predictor_width=16, predictor_depth=1, predictor_heads=2)
    m = build_world_model(cfg, init_seed=0)
    frames = torch.zeros(10, 3, 16, 16, dtype=torch.uint8)
    frames[:5, :, 3, 4] = 255  # one pixel differs between frames, the rest is constant background
    m.encoder.fit_input_normalization(frames)
    assert torch.allclose(m.encoder.pixel_mean[0, :, 3, 4], torch.full((3,), 0.5))
    assert float(m.encoder.pixel_std[0, 0, 0, 0]) == pytest.approx(0.02)  # floored, not 0
    x = m.encoder.preprocess(frames)
    assert torch.allclose(x[:, :, 0, 0], torch.zeros(10, 3))  # background standardised to 0
    with pytest.raises(ValueError):
        m.encoder.fit_input_normalization(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))
