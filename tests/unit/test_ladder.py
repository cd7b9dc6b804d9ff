"""Ladder metrics on synthetic data with known answers."""

import numpy as np
import pytest
import torch

from lensemble.errors import EvaluationError
from lensemble.eval.ladder import (
    LadderSettings,
    copy_last_error,
    fit_episode_batch,
    intervention_error,
    latent_sequences,
    linear_probe_r2,
    one_step_error,
    pixel_pca_probe_r2,
    rollout_composite,
    rollout_errors,
    run_ladder,
)


class LinearDynamics:
    """z_{t+1} = z_t + a_t M + bias: exact for bias 0, a known per-step drift otherwise."""

    def __init__(self, m: torch.Tensor, bias: float = 0.0, history: int = 3):
        self.m, self.bias, self.history = m, bias, history

    def __call__(self, z, a):
        return z + a @ self.m + self.bias

    def rollout(self, z_hist, actions, past_actions=None):
        z, out = z_hist[:, -1], []
        for h in range(actions.shape[1]):
            z = z + actions[:, h] @ self.m + self.bias
            out.append(z)
        return torch.stack(out, 1)


def _episodes(e=5, steps=6, a_dim=4, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(a_dim, d, generator=g)
    a = torch.randn(e, steps, a_dim, generator=g)
    z0 = torch.randn(e, 1, d, generator=g)
    z = torch.cat([z0, z0 + torch.cumsum(a @ m, dim=1)], dim=1)  # (E, L+1, d)
    return z, a, m


def test_perfect_predictor_scores_zero_and_copy_equals_displacement():
    z, a, m = _episodes()
    pred = LinearDynamics(m)
    assert one_step_error(pred, z, a) == pytest.approx(0.0, abs=1e-10)
    assert copy_last_error(z) == pytest.approx(float(((a @ m) ** 2).mean()), rel=1e-6)
    errors, used = rollout_errors(pred, z, a, (1, 10, 20))
    assert all(v == pytest.approx(0.0, abs=1e-8) for v in errors.values())


def test_rollout_error_grows_with_a_known_drift_and_clamps_horizons():
    z, a, m = _episodes(steps=6)
    c = 0.1
    errors, used = rollout_errors(LinearDynamics(m, bias=c), z, a, (1, 10, 20))
    # 6 latent steps: 10 and 20 clamp to 6; after h steps the drift is h·c in every dimension.
    assert used == {1: 1, 10: 6, 20: 6}
    assert sorted(errors) == [1, 6]
    assert errors[1] == pytest.approx(c**2, rel=1e-5)
    assert errors[6] == pytest.approx((6 * c) ** 2, rel=1e-5)
    assert rollout_composite(errors, used) == pytest.approx(0.1 * c**2 + 0.9 * (6 * c) ** 2, rel=1e-5)


def test_rollout_h1_equals_one_step_for_the_real_predictor(micro_cfg):
    from lensemble.model import build_world_model

    model = build_world_model(micro_cfg.model, init_seed=1).eval()
    g = torch.Generator().manual_seed(0)
    d, a_in = micro_cfg.model.latent_dim, micro_cfg.model.action_dim * micro_cfg.model.action_block
    z = torch.randn(3, 7, d, generator=g)
    a = torch.randn(3, 6, a_in, generator=g)
    errors, _ = rollout_errors(model.predictor, z, a, (1,))
    # Teacher-forced windows and rollout history windows are the same computation at h = 1.
    assert errors[1] == pytest.approx(one_step_error(model.predictor, z, a), rel=1e-5)


def test_intervention_error_perfect_blind_and_undefined():
    g = torch.Generator().manual_seed(0)
    ta, tb = torch.randn(10, 8, generator=g), torch.randn(10, 8, generator=g)
    assert intervention_error(ta, tb, ta, tb) == pytest.approx(0.0)
    same = torch.randn(10, 8, generator=g)
    assert intervention_error(same, same, ta, tb) == pytest.approx(1.0)  # action-blind
    # A shared bias in both predictions cancels in the difference.
    assert intervention_error(ta + 3.0, tb + 3.0, ta, tb) == pytest.approx(0.0, abs=1e-12)
    assert intervention_error(ta, tb, same, same) is None


def test_probe_r2_linear_state_is_one_and_noise_is_zero():
    rng = np.random.default_rng(0)
    s_tr, s_te = rng.uniform(0, 224, (2000, 2)), rng.uniform(0, 224, (1000, 2))
    mix = rng.normal(size=(2, 16))
    z_tr = s_tr @ mix + 0.01 * rng.normal(size=(2000, 16))
    z_te = s_te @ mix + 0.01 * rng.normal(size=(1000, 16))
    t = lambda x: torch.from_numpy(x)  # noqa: E731
    r2, per_dim = linear_probe_r2(t(z_tr), t(s_tr), t(z_te), t(s_te))
    assert r2 > 0.999 and len(per_dim) == 2
    noise_r2, _ = linear_probe_r2(t(rng.normal(size=(2000, 16))), t(s_tr), t(rng.normal(size=(1000, 16))), t(s_te))
    assert abs(noise_r2) < 0.05


def test_probe_skips_constant_dimensions():
    rng = np.random.default_rng(1)
    s = np.stack([rng.uniform(size=300), np.full(300, 7.0)], 1)
    z = torch.from_numpy(s[:, :1] * np.ones((1, 4)) + 0.01 * rng.normal(size=(300, 4)))
    r2, per_dim = linear_probe_r2(z[:200], torch.from_numpy(s[:200]), z[200:], torch.from_numpy(s[200:]))
    assert per_dim[1] is None and r2 == pytest.approx(per_dim[0]) and r2 > 0.99


def _dot_frames(xy: np.ndarray, size: int = 8) -> np.ndarray:
    """uint8 (n, size, size, 3) black frames with one white pixel at integer (x, y)."""
    frames = np.zeros((len(xy), size, size, 3), np.uint8)
    frames[np.arange(len(xy)), xy[:, 1], xy[:, 0]] = 255
    return frames


def test_pixel_pca_probe_decodes_a_moving_dot_and_not_unrelated_state():
    # A one-pixel dot on an 8 × 8 grid: x and y are exactly linear in the pixels (Σ_i p_i · x_i), and
    # the 64 positions span at most 63 centred directions, so 64 components keep all of it.
    rng = np.random.default_rng(0)
    xy_tr, xy_te = rng.integers(0, 8, size=(600, 2)), rng.integers(0, 8, size=(300, 2))
    f_tr, f_te = _dot_frames(xy_tr), _dot_frames(xy_te)
    s_tr, s_te = torch.from_numpy(xy_tr.astype(float)), torch.from_numpy(xy_te.astype(float))
    r2, per_dim = pixel_pca_probe_r2(f_tr, s_tr, f_te, s_te, components=64)
    assert r2 > 0.99 and all(r > 0.99 for r in per_dim)
    # Two components cannot hold 64 positions: the baseline must depend on k, not decode by luck.
    low, _ = pixel_pca_probe_r2(f_tr, s_tr, f_te, s_te, components=2)
    assert low < 0.3
    # The same frames carry nothing about a state drawn independently of them.
    unrelated = torch.from_numpy(rng.normal(size=(300, 2)))
    noise, _ = pixel_pca_probe_r2(f_tr, torch.from_numpy(rng.normal(size=(600, 2))), f_te, unrelated)
    assert noise < 0.05


def test_pixel_pca_probe_cannot_decode_positions_absent_from_training():
    # Train frames only ever show the dot in the left half: neither the PCA nor the probe fitted on
    # them has a direction for the right half, so x of test dots there is not decodable (R² < 0):
    # the baseline gets no credit from the frames it is scored on.
    rng = np.random.default_rng(1)
    xy_tr = np.stack([rng.integers(0, 4, 500), rng.integers(0, 8, 500)], 1)
    xy_te = np.stack([rng.integers(4, 8, 200), rng.integers(0, 8, 200)], 1)
    _, per_dim = pixel_pca_probe_r2(_dot_frames(xy_tr), torch.from_numpy(xy_tr.astype(float)),
                                    _dot_frames(xy_te), torch.from_numpy(xy_te.astype(float)))
    assert per_dim[0] < 0.0


def test_pixel_pca_probe_matches_the_exact_svd_and_is_deterministic():
    # Frames = 12 smooth patterns mixed per frame + noise; the state is 2 of the mixing weights.
    rng = np.random.default_rng(2)
    patterns = rng.uniform(0, 1, size=(12, 8 * 8 * 3))
    w_tr, w_te = rng.uniform(0, 1, size=(400, 12)), rng.uniform(0, 1, size=(200, 12))

    def frames(w):
        x = w @ patterns / 12 + rng.normal(0, 0.02, size=(len(w), patterns.shape[1]))
        return (np.clip(x, 0, 1) * 255).round().astype(np.uint8).reshape(-1, 8, 8, 3)

    f_tr, f_te = frames(w_tr), frames(w_te)
    s_tr, s_te = torch.from_numpy(w_tr[:, :2]), torch.from_numpy(w_te[:, :2])
    r2, _ = pixel_pca_probe_r2(f_tr, s_tr, f_te, s_te, components=12)
    x_tr = torch.from_numpy(f_tr.reshape(400, -1)).double() / 255
    x_te = torch.from_numpy(f_te.reshape(200, -1)).double() / 255
    mu = x_tr.mean(0, keepdim=True)
    basis = torch.linalg.svd(x_tr - mu, full_matrices=False)[2][:12].T
    exact, _ = linear_probe_r2((x_tr - mu) @ basis, s_tr, (x_te - mu) @ basis, s_te)
    assert r2 == pytest.approx(exact, abs=1e-4) and r2 > 0.9
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    assert pixel_pca_probe_r2(f_tr, s_tr, f_te, s_te, components=12)[0] == r2  # same seed every call
    assert torch.equal(torch.rand(1), before)  # and the caller's RNG stream is untouched


def test_pixel_pca_probe_rejects_bad_inputs():
    f = np.zeros((4, 8, 8, 3), np.uint8)
    s = torch.zeros(4, 2)
    with pytest.raises(EvaluationError):
        pixel_pca_probe_r2(f, s, np.zeros((4, 4, 4, 3), np.uint8), s)
    with pytest.raises(EvaluationError):
        pixel_pca_probe_r2(f, s, f, s, components=0)
    with pytest.raises(EvaluationError):
        pixel_pca_probe_r2(f[:1], s[:1], f, s)


def test_latent_sequences_take_stride_b_frames_and_concatenate_actions():
    class Mean(torch.nn.Module):
        latent_dim = 1

        def forward(self, x):  # (B, 3, H, W) uint8 -> (B, 1): the frame's constant value
            return x.float().mean((1, 2, 3))[:, None]

    obs = np.zeros((2, 11, 4, 4, 3), np.uint8) + np.arange(11, dtype=np.uint8)[None, :, None, None, None]
    actions = np.arange(2 * 10 * 2, dtype=np.float32).reshape(2, 10, 2)
    z, a = latent_sequences(Mean(), obs, actions, block=5)
    assert z.shape == (2, 3, 1) and a.shape == (2, 2, 10)
    assert z[0, :, 0].tolist() == [0.0, 5.0, 10.0]
    assert a[1, 1].tolist() == actions[1, 5:10].reshape(-1).tolist()


def test_bad_shapes_raise():
    with pytest.raises(EvaluationError):
        copy_last_error(torch.zeros(2, 1, 3))
    with pytest.raises(EvaluationError):
        one_step_error(lambda z, a: z, torch.zeros(2, 4, 3), torch.zeros(2, 4, 2))


class _FrameValue(torch.nn.Module):
    """Encoder of constant frames: (B, 3, H, W) uint8 -> (B, 1), the frame's value."""

    latent_dim = 1

    def forward(self, x):
        return x.float().mean((1, 2, 3))[:, None]


def _constant_frame_batch(actions: np.ndarray, step: float):
    """EpisodeBatch whose frame values follow v_{t+1} = v_t + step * a_t from 128 (4x4 px)."""
    from lensemble.data.shards import EpisodeBatch

    e, t = actions.shape[:2]
    v = 128 + step * np.concatenate([np.zeros((e, 1)), np.cumsum(actions[..., 0], axis=1)], axis=1)
    obs = np.broadcast_to(v[:, :, None, None, None], (e, t + 1, 4, 4, 3)).astype(np.uint8).copy()
    return EpisodeBatch(obs=obs, actions=actions.astype(np.float32), state=v[..., None].astype(np.float32),
                        factors=[{} for _ in range(e)], meta={"env_id": "synthetic"})


def test_training_episode_rung_separates_a_fitted_law_from_the_held_out_one():
    """A model that learnt its training episodes' law (v += 10 a) scores 0 on them and 4x copying on
    held-out episodes that follow v -= 10 a: the rung reads the training split, not the held-out one."""
    from types import SimpleNamespace

    rng = np.random.default_rng(0)
    train = [_constant_frame_batch(rng.integers(0, 2, (n, 6, 1)), +10.0) for n in (3, 4)]
    held = _constant_frame_batch(rng.integers(0, 2, (5, 6, 1)), -10.0)
    model = SimpleNamespace(encoder=_FrameValue(), predictor=LinearDynamics(torch.tensor([[10.0]])),
                            cfg=SimpleNamespace(action_block=1), latent_dim=1, eval=lambda: None)
    r = run_ladder(model, held, train, split="heldout", settings=LadderSettings(pixel_pca_components=0))
    assert r.train_one_step_error == pytest.approx(0.0, abs=1e-9)
    assert r.train_copy_last_error > 0
    assert r.one_step_error == pytest.approx(4 * r.copy_last_error, rel=1e-6)
    skipped = run_ladder(model, held, train, split="heldout",
                         settings=LadderSettings(pixel_pca_components=0, fit_episodes=0))
    assert skipped.train_one_step_error is None and skipped.train_copy_last_error is None


def test_fit_episode_batch_spreads_over_silos_and_caps():
    a = _constant_frame_batch(np.arange(3 * 6).reshape(3, 6, 1) % 2, 1.0)
    b = _constant_frame_batch(np.ones((5, 6, 1)), 2.0)
    obs, actions = fit_episode_batch([a, b], 4)  # evenly over the 8 episodes: a0, a2, b2, b4
    assert obs.shape == (4, 7, 4, 4, 3) and actions.shape == (4, 6, 1)
    for got, want in zip(obs, [a.obs[0], a.obs[2], b.obs[2], b.obs[4]], strict=True):
        np.testing.assert_array_equal(got, want)
    assert fit_episode_batch([a, b], 100)[0].shape[0] == 8
    assert fit_episode_batch([a, b], 0) is None and fit_episode_batch([], 4) is None
