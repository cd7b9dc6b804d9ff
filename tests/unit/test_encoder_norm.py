"""Encoder normalisation options: model.input_norm, model.projector_norm, BatchNorm recalibration.

Covers: the config dump and every hash are unchanged at the defaults; what each option builds;
recalibration re-estimates exactly the population statistics and touches nothing else; the gauge
contract (a rotation through the frame layer gives z Q) for every combination; and input
robustness under a change of resize kernel or brightness, relative to a start-goal distance.
"""

import hashlib
import json

import pytest
import torch
import torch.nn.functional as F
from tiny_model import D, frames, random_orthogonal, tiny_cfg
from torch import nn

from lensemble.config.schema import LensembleConfig, ModelConfig, TrainConfig
from lensemble.gauge.backstop import rotate_state_dict
from lensemble.model import architecture, build_world_model, rotate_latent_basis_, world_model_from_state
from lensemble.model.encoder import embed_frames, recalibrate_batchnorm
from lensemble.training.trainer import recalibrate_for_checkpoint

COMBOS = [(i, p) for i in ("pixel", "global") for p in ("layernorm", "batchnorm")]


def dump_sha(section) -> str:
    blob = json.dumps(section.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


# ----------------------------------------------------------------------------------- config
def test_defaults_are_left_out_of_the_dump_so_hashes_are_unchanged():
    # Pinned from the tree before these fields existed (commit 7f14a56 for the sections' dumps,
    # 4e607f7 for the whole config, after federation.mode left it): every config hash, checkpoint
    # header and warm-start hash built from them is unchanged by the new options.
    assert dump_sha(ModelConfig()) == "d849d54529b96ec25d2f61c2e7f3940d2d4893739c7f1e1d79146431a0104efe"
    assert dump_sha(TrainConfig()) == "783bedd48ca4169e134b73149da8d32e0d0478175b216a82e88c1da161372494"
    assert LensembleConfig().config_hash() == "b12728caf2548005ca37fe9642cac0826c2c7940c559e4cd664ba2f6a7bae93f"
    dumped = ModelConfig(input_norm="pixel", projector_norm="layernorm").model_dump()
    assert "input_norm" not in dumped and "projector_norm" not in dumped
    assert "bn_recalibration_batches" not in TrainConfig(bn_recalibration_batches=40).model_dump()


def test_non_default_options_are_dumped_hashed_and_round_trip():
    base = LensembleConfig()
    seen = {base.config_hash()}
    for model in ({"input_norm": "global"}, {"projector_norm": "batchnorm"}):
        cfg = base.model_copy(update={"model": ModelConfig(**model)})
        (key, value), = model.items()
        assert cfg.model.model_dump()[key] == value
        assert ModelConfig.model_validate(cfg.model.model_dump()) == cfg.model
        seen.add(cfg.config_hash())
    cfg = base.model_copy(update={"train": TrainConfig(bn_recalibration_batches=7)})
    assert cfg.train.model_dump()["bn_recalibration_batches"] == 7
    seen.add(cfg.config_hash())
    assert len(seen) == 4
    with pytest.raises(ValueError):
        ModelConfig(input_norm="channel")
    with pytest.raises(ValueError):
        ModelConfig(projector_norm="groupnorm")
    with pytest.raises(ValueError):
        TrainConfig(bn_recalibration_batches=-1)


# ------------------------------------------------------------------------------------ build
def test_global_input_norm_is_a_fixed_map_without_statistics():
    m = build_world_model(tiny_cfg(input_norm="global"), init_seed=0)
    x = frames(3)
    torch.testing.assert_close(m.encoder.preprocess(x), x.float() / 255 * 2 - 1, rtol=0, atol=0)
    state = m.state_dict()
    assert not any("pixel_" in k for k in state)
    assert not m.encoder.fits_input_statistics
    with pytest.raises(ValueError, match="global"):
        m.encoder.fit_input_normalization(x)
    assert build_world_model(tiny_cfg(), init_seed=0).encoder.fits_input_statistics


def test_batchnorm_projector_layout_and_frame_stays_last():
    m = build_world_model(tiny_cfg(projector_norm="batchnorm"), init_seed=0)
    proj = m.encoder.projector
    assert isinstance(proj[1], nn.BatchNorm1d) and isinstance(proj[0], nn.Linear) and isinstance(proj[3], nn.Linear)
    assert m.encoder.batchnorm_layers() == [proj[1]]
    assert m.encoder.frame.bias is None
    torch.testing.assert_close(m.encoder.frame.weight, torch.eye(D), rtol=0, atol=0)
    state = m.state_dict()
    for suffix in ("running_mean", "running_var", "num_batches_tracked"):
        assert f"encoder.projector.1.{suffix}" in state
    assert build_world_model(tiny_cfg(), init_seed=0).encoder.batchnorm_layers() == []


def test_every_variant_starts_from_the_default_weights():
    # The norms consume no randomness, so the four pilot variants start from identical weights.
    ref = build_world_model(tiny_cfg(), init_seed=4).state_dict()
    for inp, proj in COMBOS:
        state = build_world_model(tiny_cfg(input_norm=inp, projector_norm=proj), init_seed=4).state_dict()
        for k, v in state.items():
            if k in ref and ref[k].shape == v.shape and not k.startswith("encoder.projector.1."):
                assert torch.equal(v, ref[k]), k


@pytest.mark.parametrize("inp,proj", COMBOS)
def test_checkpoint_rebuild_keeps_the_options(inp, proj):
    cfg = tiny_cfg(input_norm=inp, projector_norm=proj)
    m = build_world_model(cfg, init_seed=1)
    if proj == "batchnorm":
        recalibrate_batchnorm(m.encoder, [frames(8, seed=s) for s in range(3)])
    arch = json.loads(json.dumps(architecture(cfg)))
    m2 = world_model_from_state(arch, {k: v.clone() for k, v in m.state_dict().items()})
    assert m2.cfg.input_norm == inp and m2.cfg.projector_norm == proj
    x = frames(4, seed=9)
    torch.testing.assert_close(embed_frames(m2.encoder, x), embed_frames(m.encoder, x), rtol=0, atol=0)


# ---------------------------------------------------------------------------- recalibration
def _pre_bn_features(encoder, x):
    with torch.no_grad():
        return encoder.projector[0](encoder.vit(encoder.preprocess(x)))


def test_recalibration_estimates_the_batch_statistics_and_nothing_else():
    m = build_world_model(tiny_cfg(projector_norm="batchnorm"), init_seed=3)
    enc = m.encoder
    bn = enc.projector[1]
    params = {k: v.clone() for k, v in enc.named_parameters()}
    batches = [frames(12, seed=s) for s in range(4)]
    enc.train()
    assert recalibrate_batchnorm(enc, batches) == 4
    # momentum=None: the equal-weight average of the per-batch mean and unbiased variance
    feats = [_pre_bn_features(enc, b) for b in batches]
    torch.testing.assert_close(bn.running_mean, torch.stack([f.mean(0) for f in feats]).mean(0), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bn.running_var, torch.stack([f.var(0) for f in feats]).mean(0), rtol=1e-5, atol=1e-6)
    assert int(bn.num_batches_tracked) == 4
    assert enc.training and bn.momentum == 0.1  # mode and momentum restored
    for k, v in enc.named_parameters():
        assert torch.equal(v, params[k]), k
    # the result depends on the frames, not on what the running statistics were before
    with torch.no_grad():
        bn.running_mean.add_(5.0)
        bn.running_var.mul_(3.0)
    recalibrate_batchnorm(enc, batches)
    torch.testing.assert_close(bn.running_mean, torch.stack([f.mean(0) for f in feats]).mean(0), rtol=1e-5, atol=1e-6)
    # clip batches (B, T, 3, H, W) are flattened like a training batch
    recalibrate_batchnorm(enc, [b.reshape(3, 4, 3, 16, 16) for b in batches])
    torch.testing.assert_close(bn.running_var, torch.stack([f.var(0) for f in feats]).mean(0), rtol=1e-5, atol=1e-6)


def test_recalibrated_eval_latents_match_the_training_forward():
    # What the staleness gotcha broke: after recalibration, eval-mode latents equal the train-mode
    # (batch-statistics) latents on the same frames, up to the n/(n-1) variance correction.
    m = build_world_model(tiny_cfg(projector_norm="batchnorm"), init_seed=5)
    enc = m.encoder
    x = frames(256, seed=1)
    stale = embed_frames(enc, x)  # running stats at their init (0, 1): not the data's
    enc.train()
    with torch.no_grad():
        z_train = enc(x)
    recalibrate_batchnorm(enc, [x])
    z_eval = embed_frames(enc, x)
    err_after = (z_eval - z_train).norm() / z_train.norm()
    err_before = (stale - z_train).norm() / z_train.norm()
    assert err_after < 0.01 < err_before


def test_recalibration_rejects_no_batches_and_is_a_noop_without_batchnorm():
    bn_model = build_world_model(tiny_cfg(projector_norm="batchnorm"), init_seed=0)
    with pytest.raises(ValueError):
        recalibrate_batchnorm(bn_model.encoder, [])
    with pytest.raises(ValueError):
        recalibrate_batchnorm(bn_model.encoder, [frames(1)])
    ln_model = build_world_model(tiny_cfg(), init_seed=0)
    before = {k: v.clone() for k, v in ln_model.state_dict().items()}
    assert recalibrate_batchnorm(ln_model.encoder, [frames(4)]) == 0
    assert all(torch.equal(v, before[k]) for k, v in ln_model.state_dict().items())


class _FakeSampler:
    """Clips of random frames; counts how often it is asked."""

    def __init__(self):
        self.calls = 0

    def sample(self, batch_size, generator):
        self.calls += 1
        obs = torch.randint(0, 256, (batch_size, 2, 3, 16, 16), generator=generator, dtype=torch.uint8)
        return type("Clips", (), {"obs": obs})()


@pytest.mark.parametrize("proj,n,expected", [("batchnorm", 3, 3), ("batchnorm", 0, 0), ("layernorm", 3, 0)])
def test_checkpoint_hook_uses_its_own_generator_and_the_configured_batches(proj, n, expected):
    cfg = LensembleConfig(model=tiny_cfg(projector_norm=proj),
                          train=TrainConfig(batch_size=4, bn_recalibration_batches=n))
    m = build_world_model(cfg.model, init_seed=0)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    sampler = _FakeSampler()
    assert recalibrate_for_checkpoint(m, cfg, sampler, "pooled", 10) == expected
    assert sampler.calls == expected
    after = m.state_dict()
    for k, v in after.items():
        changed = not torch.equal(v, before[k])
        assert changed == (expected > 0 and k.startswith("encoder.projector.1.running")
                           or expected > 0 and k.endswith("num_batches_tracked")), k
    if expected:  # deterministic: the same step gives the same statistics
        m2 = build_world_model(cfg.model, init_seed=0)
        recalibrate_for_checkpoint(m2, cfg, _FakeSampler(), "pooled", 10)
        assert torch.equal(m2.state_dict()["encoder.projector.1.running_mean"], after["encoder.projector.1.running_mean"])


# ------------------------------------------------------------------------------------ gauge
@pytest.mark.parametrize("inp,proj", COMBOS)
def test_rotating_the_frame_layer_gives_z_q_for_every_option(inp, proj):
    m = build_world_model(tiny_cfg(input_norm=inp, projector_norm=proj), init_seed=2)
    if inp == "pixel":
        m.encoder.fit_input_normalization(frames(32, seed=7))
    if proj == "batchnorm":
        recalibrate_batchnorm(m.encoder, [frames(16, seed=s) for s in range(3)])
    x = frames(5)
    q = random_orthogonal(D, seed=3)
    z = embed_frames(m.encoder, x)
    # the backstop's state-dict rotation: BatchNorm buffers sit before the frame and stay put
    rotated = rotate_state_dict(m.state_dict(), q)
    for k, v in m.state_dict().items():
        if "projector.1." in k or "pixel_" in k:
            assert torch.equal(rotated[k], v), k
    m2 = world_model_from_state(architecture(m.cfg), rotated)
    torch.testing.assert_close(embed_frames(m2.encoder, x), z @ q, rtol=1e-5, atol=1e-5)
    rotate_latent_basis_(m, q)  # the in-place helper agrees
    torch.testing.assert_close(embed_frames(m.encoder, x), z @ q, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------- robustness
NATIVE, IMG = 128, 32


def _scene(x: float, y: float) -> torch.Tensor:
    """A TwoRoom-like native frame in [0, 1]: light floor, a dark wall with a door, a red dot."""
    g = torch.arange(NATIVE, dtype=torch.float32)
    yy, xx = torch.meshgrid(g, g, indexing="ij")
    img = torch.full((3, NATIVE, NATIVE), 0.9)
    wall = ((xx - NATIVE / 2).abs() < NATIVE / 40) & ((yy - NATIVE / 2).abs() >= NATIVE / 8)
    img[:, wall] = 0.2
    dot = (xx - x) ** 2 + (yy - y) ** 2 < (NATIVE / 32) ** 2
    img[:, dot] = torch.tensor([0.9, 0.1, 0.1])[:, None]
    return img


def _render(positions, kernel: str) -> torch.Tensor:
    native = torch.stack([_scene(x, y) for x, y in positions.tolist()])
    if kernel == "area":  # what the env adapter (cv2 INTER_AREA) does at an integer factor
        small = F.interpolate(native, size=(IMG, IMG), mode="area")
    else:                 # Encoder.forward's path for native-size frames
        small = F.interpolate(native, size=(IMG, IMG), mode="bilinear", antialias=True, align_corners=False)
    return (small * 255).round().clamp(0, 255).to(torch.uint8)


def _shift_ratio(a, b, c) -> torch.Tensor:
    """Per row ||a - b|| / ||b - c||."""
    return (a - b).flatten(1).norm(dim=1) / (b - c).flatten(1).norm(dim=1)


ROBUST = [pytest.param(i, p, marks=() if i == "global" else pytest.mark.xfail(
    strict=True, reason="per-pixel standardisation blows up a resize or brightness change 5-40x (issue 14)"))
    for i, p in COMBOS]


@pytest.mark.parametrize("inp,proj", ROBUST)
def test_latents_are_robust_to_resize_kernel_and_brightness(inp, proj):
    """Tolerance: a nuisance change of the input (bilinear instead of area resizing, or +4/255
    brightness) may move the latents, relative to the start-goal latent distance, at most 3x
    (kernel) and 2x (brightness) as far as it moves the pixels relative to the start-goal pixel
    distance. On these synthetic frames the kernel change is already half a start-goal change in
    pixel space, so an untrained encoder cannot do much better than 1x. Over 10 random inits with
    each projector norm, the per-pixel standardisation measured 5-21x (kernel) and 10-39x
    (brightness), the global map 0.7-3.0x and 0.5-1.3x. Median over 32 tasks, then over three
    fixed inits.
    The same measurement on real TwoRoom renders and trained models is in the planning pilot."""
    g = torch.Generator().manual_seed(0)
    lo, hi = 12.0, NATIVE - 12.0
    fit = torch.rand(256, 2, generator=g) * (hi - lo) + lo
    starts = torch.rand(32, 2, generator=g) * (hi - lo) + lo
    goals = (starts + torch.randn(32, 2, generator=g) * 40).clamp(lo, hi)
    s_area, s_bil, goal = _render(starts, "area"), _render(starts, "bilinear"), _render(goals, "area")
    s_bright = (s_area.int() + 4).clamp(0, 255).to(torch.uint8)
    px = {name: _shift_ratio(x.float() / 255, s_area.float() / 255, goal.float() / 255)
          for name, x in (("kernel", s_bil), ("brightness", s_bright))}
    amps = {"kernel": [], "brightness": []}
    fit_frames = _render(fit, "area")
    for seed in range(3):
        enc = build_world_model(tiny_cfg(img_size=IMG, input_norm=inp, projector_norm=proj), init_seed=seed).encoder
        if enc.fits_input_statistics:
            enc.fit_input_normalization(fit_frames)
        recalibrate_batchnorm(enc, list(fit_frames.split(64)))
        z_s, z_g = embed_frames(enc, s_area), embed_frames(enc, goal)
        for name, x in (("kernel", s_bil), ("brightness", s_bright)):
            amps[name].append(float((_shift_ratio(embed_frames(enc, x), z_s, z_g) / px[name]).median()))
    kernel, bright = sorted(amps["kernel"])[1], sorted(amps["brightness"])[1]
    assert kernel <= 3.0, f"resize-kernel shift amplified {kernel:.2f}x relative to the start-goal distance"
    assert bright <= 2.0, f"brightness shift amplified {bright:.2f}x relative to the start-goal distance"


class _ClipSampler(_FakeSampler):
    """Clips with actions, as InnerLoop needs them (tiny_cfg: action_dim 2 x block 2 = 4)."""

    def sample(self, batch_size, generator):
        self.calls += 1
        obs = torch.randint(0, 256, (batch_size, 2, 3, 16, 16), generator=generator, dtype=torch.uint8)
        return type("Clips", (), {"obs": obs, "actions": torch.rand(batch_size, 1, 4, generator=generator)})()


@pytest.mark.parametrize("frozen", [False, True])
def test_inner_loop_updates_batchnorm_statistics_only_for_a_trained_encoder(frozen):
    from lensemble.config.schema import ObjectiveConfig
    from lensemble.training.loop import InnerLoop

    cfg = LensembleConfig(model=tiny_cfg(projector_norm="batchnorm", encoder_frozen=frozen),
                          train=TrainConfig(batch_size=4, warmup_steps=0),
                          objective=ObjectiveConfig(sigreg_directions=8))
    m = build_world_model(cfg.model, init_seed=0)
    bn = m.encoder.projector[1]
    mean0 = bn.running_mean.clone()
    loop = InnerLoop(m, cfg, _ClipSampler())
    loop.run(2, sketch_fn=lambda i: torch.nn.functional.normalize(torch.randn(D, 8), dim=0),
             generator=torch.Generator().manual_seed(0))
    assert torch.equal(bn.running_mean, mean0) == frozen
    assert recalibrate_for_checkpoint(m, cfg, _ClipSampler(), "pooled", 2) == (0 if frozen else 40)
