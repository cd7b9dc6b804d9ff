"""The residual CNN backbone (model.backbone=cnn): shapes, config, checkpoints, position.

The exact gauge reparametrisation is tested for both backbones in test_encoder.py."""

import json

import pytest
import torch
from tiny_model import D, frames, tiny_cfg

from lensemble.config.schema import ModelConfig
from lensemble.model import architecture, build_world_model, world_model_from_state
from lensemble.model.cnn import ImpalaCNN, grid_size


def _cnn_cfg(**kw):
    return tiny_cfg(backbone="cnn", cnn_channels=[4, 8], **kw)


def test_grid_size_known_answers():
    # MaxPool2d(3, stride 2, padding 1) halves rounding up: 64 -> 32 -> 16 -> 8, 15 -> 8 -> 4
    assert grid_size(64, 3) == 8
    assert grid_size(16, 2) == 4
    assert grid_size(15, 2) == 4
    net = ImpalaCNN(15, (4, 8), out_dim=6)
    assert net(torch.randn(2, 3, 15, 15)).shape == (2, 6)  # the linear layer matches an odd side too


def test_cnn_encoder_shapes_and_state_layout():
    m = build_world_model(_cnn_cfg(), init_seed=0)
    z = m.encoder(frames(4))
    assert z.shape == (4, D) and z.dtype == torch.float32
    state = m.state_dict()
    assert not any(k.startswith("encoder.vit.") for k in state)
    assert any(k.startswith("encoder.cnn.stages.0.conv.") for k in state)
    # no running statistics in the backbone: its only buffers are the encoder's input statistics
    buffers = {k for k, _ in m.encoder.named_buffers()}
    assert not any(k.startswith("cnn.") for k in buffers)
    # the grid is flattened: fc sees c_last * g * g = 8 * 4 * 4 inputs at 16 px with 2 stages
    assert state["encoder.cnn.fc.weight"].shape == (tiny_cfg().embed_dim, 8 * 4 * 4)
    # the ViT default keeps its "vit." prefix (every ViT checkpoint's layout)
    vit_state = build_world_model(tiny_cfg(), init_seed=0).state_dict()
    assert any(k.startswith("encoder.vit.") for k in vit_state)
    assert not any(k.startswith("encoder.cnn.") for k in vit_state)


def test_cnn_config_is_checked_and_omitted_from_the_dump_at_its_defaults():
    # the patch rule is the ViT's: a CNN takes any image side
    ModelConfig(backbone="cnn", img_size=60, patch_size=16)
    with pytest.raises(ValueError):
        ModelConfig(backbone="vit", img_size=60, patch_size=16)
    with pytest.raises(ValueError):
        ModelConfig(backbone="cnn", cnn_channels=[])
    with pytest.raises(ValueError):
        ModelConfig(backbone="cnn", cnn_channels=[8, 0])
    dump = ModelConfig().model_dump(mode="json")
    assert "backbone" not in dump and "cnn_channels" not in dump  # earlier hashes hold
    dump = ModelConfig(backbone="cnn", cnn_channels=[4, 8]).model_dump(mode="json")
    assert dump["backbone"] == "cnn" and dump["cnn_channels"] == [4, 8]


def test_cnn_checkpoint_roundtrip_after_a_step_has_contiguous_tensors():
    cfg = _cnn_cfg()
    m = build_world_model(cfg, init_seed=1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m.encoder(frames(4)).pow(2).mean().backward()
    opt.step()
    tensors = {k: v.clone() for k, v in m.state_dict().items()}
    # channels-last is an activation layout only: the weights stay contiguous for serialisation
    # and for the federation's flat parameter vectors
    assert all(v.is_contiguous() for v in tensors.values())
    arch = json.loads(json.dumps(architecture(cfg)))
    m2 = world_model_from_state(arch, tensors)
    x = frames(3, seed=4)
    torch.testing.assert_close(m2.encoder(x), m.encoder(x), rtol=0, atol=0)


def test_cnn_latents_do_not_depend_on_the_batch():
    m = build_world_model(_cnn_cfg(), init_seed=2).eval()
    x = frames(6, seed=5)
    with torch.no_grad():
        whole = m.encoder(x)
        one_by_one = torch.cat([m.encoder(x[i:i + 1]) for i in range(6)])
    torch.testing.assert_close(one_by_one, whole, rtol=1e-5, atol=1e-5)


def _dot_frames(n, side=16, seed=0):
    """uint8 frames (n, 3, side, side) of a 2x2 white dot on black at a random place, and its
    (row, col) centre scaled to [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, side - 1, (n, 2), generator=g)
    x = torch.zeros(n, 3, side, side, dtype=torch.uint8)
    for i, (r, c) in enumerate(pos.tolist()):
        x[i, :, r:r + 2, c:c + 2] = 255
    return x, (pos.float() + 0.5) / (side - 1)


def _held_out_r2(labels_train, seed=0, steps=300):
    torch.manual_seed(seed)
    net = ImpalaCNN(16, (4, 8), out_dim=32)
    head = torch.nn.Linear(32, 2)
    opt = torch.optim.Adam([*net.parameters(), *head.parameters()], lr=3e-3)
    x, _ = _dot_frames(256, seed=1)
    xin = x.float() / 127.5 - 1.0
    for _ in range(steps):
        loss = (head(net(xin)) - labels_train).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    xt, yt = _dot_frames(128, seed=2)
    with torch.no_grad():
        pred = head(net(xt.float() / 127.5 - 1.0))
    return float(1 - (pred - yt).pow(2).sum() / (yt - yt.mean(0)).pow(2).sum())


def test_cnn_carries_where_a_small_object_sits_and_shuffled_labels_do_not():
    """The reason to flatten the grid: a 2x2 dot's position must be readable from the feature.
    The control trains the same net on the same frames with the labels shuffled; it must not
    generalise (its held-out R² stays near or below 0)."""
    _, y = _dot_frames(256, seed=1)
    r2 = _held_out_r2(y)
    shuffled = y[torch.randperm(256, generator=torch.Generator().manual_seed(9))]
    r2_shuffled = _held_out_r2(shuffled)
    assert r2 > 0.8, r2
    assert r2_shuffled < 0.2, r2_shuffled
