"""Backstop: rotating the weights is an exact reparametrisation; align-then-re-difference."""

import pytest
import torch
from torch import nn

from lensemble.errors import GaugeError
from lensemble.gauge import align_and_redifference, rotate_state_dict


def _orthogonal(d, seed):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


class _Encoder(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, d))
        self.frame = nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.frame(self.body(x))


class _Predictor(nn.Module):
    def __init__(self, d, width=12):
        super().__init__()
        self.in_proj = nn.Linear(d, width)
        self.act = nn.Linear(2, width)
        self.mid = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
        self.out_proj = nn.Linear(width, d)

    def forward(self, z, a):
        return z + self.out_proj(self.mid(self.in_proj(z) + self.act(a)))


class _StandIn(nn.Module):
    """Same key names and the same z-path as lensemble.model's world model."""

    def __init__(self, d):
        super().__init__()
        self.encoder = _Encoder(d)
        self.predictor = _Predictor(d)


def _check_equivariance(model, rotated, q, x, z_hist, a, atol):
    q32 = q.to(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(rotated.encoder(x), model.encoder(x) @ q32, atol=atol, rtol=1e-4)
        torch.testing.assert_close(
            rotated.predictor(z_hist @ q32, a), model.predictor(z_hist, a) @ q32, atol=atol, rtol=1e-4
        )


def test_stand_in_model_outputs_rotate_exactly():
    torch.manual_seed(0)
    d = 6
    model = _StandIn(d)
    with torch.no_grad():
        model.encoder.frame.weight.copy_(torch.randn(d, d))
    q = _orthogonal(d, 1)
    sd = model.state_dict()
    rotated_sd = rotate_state_dict(sd, q)
    assert list(rotated_sd) == list(sd)
    rotated = _StandIn(d)
    rotated.load_state_dict(rotated_sd)
    _check_equivariance(
        model, rotated, q, torch.randn(7, 5), torch.randn(7, 3, d), torch.randn(7, 3, 2), 1e-5
    )
    rotated_keys = {
        "encoder.frame.weight",
        "predictor.in_proj.weight",
        "predictor.out_proj.weight",
        "predictor.out_proj.bias",
    }
    for k, v in sd.items():
        if k in rotated_keys:
            assert rotated_sd[k].dtype == v.dtype and not torch.equal(rotated_sd[k], v)
        else:
            assert rotated_sd[k] is v  # untouched: the same tensor, byte-identical


def test_real_world_model_outputs_rotate_exactly():
    model_mod = pytest.importorskip("lensemble.model")
    from lensemble.config.schema import ModelConfig

    cfg = ModelConfig(
        img_size=16,
        patch_size=8,
        embed_dim=32,
        depth=1,
        num_heads=2,
        latent_dim=8,
        projector_hidden=16,
        predictor_width=16,
        predictor_depth=1,
        predictor_heads=2,
        history=3,
        action_dim=2,
        action_block=1,
        action_embed_dim=8,
    )
    model = model_mod.build_world_model(cfg, init_seed=0).eval()
    with torch.no_grad():  # a non-identity frame, as after training
        model.encoder.frame.weight.add_(0.1 * torch.randn(8, 8, generator=torch.Generator().manual_seed(1)))
    q = _orthogonal(8, 2)
    sd = model.state_dict()
    rotated = model_mod.build_world_model(cfg, init_seed=5).eval()
    rotated.load_state_dict(rotate_state_dict(sd, q))
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8, generator=g)
    z_hist = torch.randn(4, 3, 8, generator=g)
    a = torch.randn(4, 3, 2, generator=g)
    _check_equivariance(model, rotated, q, x, z_hist, a, 1e-4)
    # Agrees with the model package's own in-place rotation.
    other = model_mod.build_world_model(cfg, init_seed=0)
    other.load_state_dict(sd)
    model_mod.rotate_latent_basis_(other, q)
    for k, v in other.state_dict().items():
        torch.testing.assert_close(v, rotated.state_dict()[k], atol=1e-6, rtol=0)


def test_align_and_redifference():
    torch.manual_seed(4)
    d = 6
    global_model = _StandIn(d)
    local_model = _StandIn(d)
    local_model.load_state_dict(global_model.state_dict())
    r = _orthogonal(d, 5)
    with torch.no_grad():  # local training drifted the frame by r and nudged everything else
        for p in local_model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
        local_model.encoder.frame.weight.copy_((r.T.float() @ local_model.encoder.frame.weight))
    probe = torch.randn(64, 5)
    with torch.no_grad():
        ref = global_model.encoder(probe)
        local = local_model.encoder(probe)
    lsd, gsd = local_model.state_dict(), global_model.state_dict()
    delta, q, residual = align_and_redifference(lsd, gsd, local, ref)
    assert q.dtype == torch.float64 and residual < 0.02
    torch.testing.assert_close(q, r.T, atol=0.02, rtol=0)  # undoes the drift
    assert set(delta) == set(lsd)
    aligned = rotate_state_dict(lsd, q)
    for k in lsd:
        torch.testing.assert_close(delta[k], aligned[k] - gsd[k], atol=0, rtol=0)
        if k not in {
            "encoder.frame.weight",
            "predictor.in_proj.weight",
            "predictor.out_proj.weight",
            "predictor.out_proj.bias",
        }:
            assert torch.equal(delta[k], lsd[k] - gsd[k])
    # global + delta reproduces the aligned local model, whose embeddings sit in the reference frame.
    rebuilt = _StandIn(d)
    rebuilt.load_state_dict({k: gsd[k] + delta[k] for k in gsd})
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.encoder(probe), local @ q.float(), atol=1e-5, rtol=1e-4)


def test_backstop_errors():
    sd = _StandIn(4).state_dict()
    with pytest.raises(GaugeError):
        rotate_state_dict({k: v for k, v in sd.items() if k != "predictor.in_proj.weight"}, _orthogonal(4, 0))
    with pytest.raises(GaugeError):
        rotate_state_dict(sd, 2.0 * _orthogonal(4, 0))
    with pytest.raises(GaugeError):
        rotate_state_dict(sd, _orthogonal(5, 0))
    other = dict(sd)
    other.pop("predictor.act.bias")
    with pytest.raises(GaugeError):
        align_and_redifference(sd, other, torch.randn(10, 4), torch.randn(10, 4))


def test_backstop_fits_on_landmarks_and_reports_what_it_removed_and_left():
    from lensemble.gauge import backstop_metrics

    d = 6
    g = torch.Generator().manual_seed(11)
    ref = torch.randn(40, d, generator=g, dtype=torch.float64) * torch.linspace(1.0, 0.5, d, dtype=torch.float64)
    q_true = _orthogonal(d, 3)
    local = ref @ q_true.T                       # the local frame: the reference turned by Q_trueᵀ
    lm, ms = torch.arange(0, 40, 2), torch.arange(1, 40, 2)
    # Corrupt the measurement rows of the local embeddings: a fit on the landmarks must not see them.
    noisy = local.clone()
    noisy[ms] += 5.0 * torch.randn(len(ms), d, generator=g, dtype=torch.float64)
    sd = {"encoder.frame.weight": torch.eye(d), "predictor.in_proj.weight": torch.randn(4, d),
          "predictor.out_proj.weight": torch.randn(d, 4), "predictor.out_proj.bias": torch.randn(d)}
    _, q, fit = align_and_redifference(sd, sd, noisy, ref, fit_idx=lm)
    torch.testing.assert_close(q, q_true, atol=1e-10, rtol=0)   # recovered from the clean landmarks
    assert fit < 1e-10
    _, q_all, fit_all = align_and_redifference(sd, sd, noisy, ref)
    assert fit_all > 0.1                                         # all rows: the corruption leaks in
    from lensemble.gauge import drift_magnitudes

    m = backstop_metrics(local, ref, q, fit, measurement_idx=ms)
    frob, angle, _ = drift_magnitudes(q_true)
    assert m["gauge/backstop_angle_deg"] == pytest.approx(float(angle), rel=1e-9)     # what it removed
    assert m["gauge/backstop_residual"] == pytest.approx(float(frob), rel=1e-9)
    assert m["gauge/backstop_aligned_angle_deg"] == pytest.approx(0.0, abs=1e-5)      # what it left
    assert m["gauge/backstop_aligned_rel_residual"] == pytest.approx(0.0, abs=1e-6)
    assert m["gauge/backstop_unaligned_rel_residual"] > 0.1
    assert all(isinstance(v, float) for v in m.values())
