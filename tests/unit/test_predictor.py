"""Predictor (window and banded attention): shapes, causality, receptive field, rollout ==
step-by-step forward, prepared histories, gauge rotation."""

import pytest
import torch
from tiny_model import D
from tiny_model import tiny_cfg as _shared_tiny_cfg

from lensemble.model import build_world_model, rotate_latent_basis_
from lensemble.model.predictor import reference_rollout

A = 4  # action_dim * action_block


def tiny_cfg(**kw):
    # Two predictor blocks: causality and the last-only path are only exercised with depth > 1.
    return _shared_tiny_cfg(**{"predictor_depth": 2, **kw})


KINDS = ["window", "banded"]


def predictor(seed=0, **kw):
    p = build_world_model(tiny_cfg(**kw), init_seed=seed).predictor
    # Larger weights than the init so the checks are not trivially satisfied by a near-copy map.
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 100)
        for prm in p.parameters():
            prm.add_(0.2 * torch.randn(prm.shape, generator=g))
    return p.eval()


def data(b, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, D, generator=g), torch.randn(b, t, A, generator=g)


def random_orthogonal(d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t", [1, 2, 3, 5])
def test_forward_shapes(t, kind):
    p = predictor(predictor_attention=kind)
    z, a = data(2, t)
    out = p(z, a)
    assert out.shape == (2, t, D)
    assert torch.isfinite(out).all()


def test_forward_rejects_bad_shapes():
    p = predictor()
    z, a = data(2, 3)
    with pytest.raises(ValueError):
        p(z, a[:, :2])
    with pytest.raises(ValueError):
        p(z[..., :5], a)


@pytest.mark.parametrize("kind", KINDS)
def test_causality(kind):
    p = predictor(predictor_attention=kind)
    z, a = data(2, 3)
    base = p(z, a)
    z2, a2 = z.clone(), a.clone()
    z2[:, 2] += 1.0
    a2[:, 1] += 1.0  # the action at t=1 only affects outputs t >= 1
    out = p(z2, a2)
    torch.testing.assert_close(out[:, 0], base[:, 0], rtol=0, atol=0)
    assert not torch.allclose(out[:, 1], base[:, 1])
    assert not torch.allclose(out[:, 2], base[:, 2])
    a3 = a.clone()
    a3[:, 2] += 1.0
    out3 = p(z, a3)
    torch.testing.assert_close(out3[:, :2], base[:, :2], rtol=0, atol=0)


def test_long_sequence_uses_sliding_windows():
    p = predictor()
    w = p.history
    z, a = data(2, 6)
    out = p(z, a)
    torch.testing.assert_close(out[:, :w], p(z[:, :w], a[:, :w]), rtol=1e-5, atol=1e-6)
    for t in range(w, 6):
        win = p(z[:, t - w + 1 : t + 1], a[:, t - w + 1 : t + 1])
        torch.testing.assert_close(out[:, t], win[:, -1], rtol=1e-5, atol=1e-6)


def test_banded_receptive_field_is_depth_times_band():
    """Output t sees exactly the latents t−C+1..t with C = depth·(W−1)+1, whatever their
    absolute positions (rotary embeddings make attention depend on offsets only)."""
    p = predictor(predictor_attention="banded", history=3, predictor_depth=2)
    assert p.context == 5
    z, a = data(2, 9, seed=3)
    base = p(z, a)
    z2, a2 = z.clone(), a.clone()
    z2[:, 2] += 1.0
    a2[:, 2] += 1.0
    out = p(z2, a2)
    torch.testing.assert_close(out[:, :2], base[:, :2], rtol=0, atol=0)   # causal
    assert not torch.allclose(out[:, 6], base[:, 6])                       # 2 + C − 1 = 6 still sees it
    torch.testing.assert_close(out[:, 7:], base[:, 7:], rtol=0, atol=0)   # beyond the band: exact
    # Shift invariance: the last output from the last C latents equals the full sequence's.
    tail = p(z[:, -5:], a[:, -5:])
    torch.testing.assert_close(tail[:, -1], base[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t0", [1, 3, 6])
def test_prepared_history_serves_repeated_rows(kind, t0):
    """prepare() once + rollout_from with R rows per history == rollout on the expanded history."""
    p = predictor(predictor_attention=kind)
    z, acts = data(2, t0, seed=4)
    past = acts[:, : t0 - 1] if t0 > 1 else None
    cand = torch.randn(2 * 5, 4, A, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = p.rollout_from(p.prepare(z, past), cand)
        ref = p.rollout(z.repeat_interleave(5, 0), cand,
                        past_actions=past.repeat_interleave(5, 0) if past is not None else None)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiple"):
        p.rollout_from(p.prepare(z, past), cand[:7])


def test_banded_needs_even_head_width_and_has_no_position_table():
    with pytest.raises(ValueError, match="even head width"):
        tiny_cfg(predictor_attention="banded", predictor_width=30, predictor_heads=2)
    p = predictor(predictor_attention="banded")
    assert not hasattr(p, "pos_embed")
    assert predictor().context == predictor().history


def test_window_default_keeps_earlier_hashes():
    """The attention field is left out of the dump at its default, so configs, checkpoints and
    study runs hashed before it existed keep their hashes; the banded kind is recorded."""
    assert "predictor_attention" not in tiny_cfg().model_dump()
    dumped = tiny_cfg(predictor_attention="banded").model_dump(mode="json")
    assert dumped["predictor_attention"] == "banded"
    assert type(tiny_cfg()).model_validate(dumped).predictor_attention == "banded"


def step_by_step(p, z_hist, past_actions, actions):
    """Reference rollout: call forward on the growing sequence, keep its last output."""
    zs = list(z_hist.unbind(1))
    acts = ([] if past_actions is None else list(past_actions.unbind(1))) + list(actions.unbind(1))
    outs = []
    for _ in range(actions.shape[1]):
        n = len(zs)
        nxt = p(torch.stack(zs, 1), torch.stack(acts[:n], 1))[:, -1]
        outs.append(nxt)
        zs.append(nxt)
    return torch.stack(outs, 1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t0,history", [(1, 3), (2, 3), (4, 3), (7, 3), (1, 1), (2, 1)])
def test_rollout_equals_step_by_step_forward(t0, history, kind):
    p = predictor(history=history, predictor_attention=kind)
    z, acts = data(3, t0 + 5, seed=1)
    z_hist, past, future = z[:, :t0], acts[:, : t0 - 1], acts[:, t0 - 1 : t0 + 4]
    past = past if t0 > 1 else None
    with torch.no_grad():
        ref = step_by_step(p, z_hist, past, future)
        got = p.rollout(z_hist, future, past_actions=past)
    assert got.shape == (3, 5, D)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(p.rollout_nograd(z_hist, future, past_actions=past), got)
    # The benchmarks' reference re-forwards only the last `context` latents: the same function.
    with torch.no_grad():
        torch.testing.assert_close(reference_rollout(p, z_hist, future, past), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_rollout_broadcasts_history_and_requires_past_actions(kind):
    p = predictor(predictor_attention=kind)
    z, acts = data(1, 2)
    cand = torch.randn(7, 4, A, generator=torch.Generator().manual_seed(3))
    out = p.rollout_nograd(z[:, :1], cand)
    ref = p.rollout_nograd(z[:, :1].expand(7, -1, -1), cand)
    assert out.shape == (7, 4, D)
    torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="past_actions"):
        p.rollout(z, cand[:1])


@pytest.mark.parametrize("kind", KINDS)
def test_rollout_is_differentiable(kind):
    p = predictor(predictor_attention=kind)
    z, acts = data(2, 1)
    z.requires_grad_(True)
    out = p.rollout(z, acts.expand(2, 4, A).contiguous())
    out.square().sum().backward()
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


@pytest.mark.parametrize("kind", KINDS)
def test_rotation_reparametrises_predictor_exactly(kind):
    model = build_world_model(tiny_cfg(predictor_attention=kind), init_seed=4)
    model.predictor = predictor(seed=4, predictor_attention=kind)
    p = model.predictor
    z, a = data(3, 5, seed=2)
    q = random_orthogonal(D, seed=5)
    with torch.no_grad():
        before = p(z, a)
        roll_before = p.rollout(z[:, :2], a[:, 1:], past_actions=a[:, :1])
        rotate_latent_basis_(model, q)
        after = p(z @ q, a)
        roll_after = p.rollout(z[:, :2] @ q, a[:, 1:], past_actions=a[:, :1])
    torch.testing.assert_close(after, before @ q, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(roll_after, roll_before @ q, rtol=1e-4, atol=1e-4)


def test_rotation_on_built_model_end_to_end():
    """Rotating the four gauge tensors of a built model rotates encoder and predictor outputs."""
    model = build_world_model(tiny_cfg(), init_seed=6).eval()
    x = torch.randint(0, 256, (2, 4, 3, 16, 16), generator=torch.Generator().manual_seed(0),
                      dtype=torch.uint8)
    a = torch.randn(2, 3, A, generator=torch.Generator().manual_seed(1))
    q = random_orthogonal(D, seed=7)
    with torch.no_grad():
        z, pred = model(x, a)
        rotate_latent_basis_(model, q)
        z_rot, pred_rot = model(x, a)
    torch.testing.assert_close(z_rot, z @ q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pred_rot, pred @ q, rtol=1e-5, atol=1e-5)


def test_rollout_refuses_past_actions_of_another_batch():
    p = predictor()
    z, acts = data(1, 2)
    cand = torch.randn(4, 3, A, generator=torch.Generator().manual_seed(6))
    with pytest.raises(ValueError, match="past_actions batch"):
        p.rollout(z, cand, past_actions=torch.randn(2, 1, A))
    per_row = p.rollout(z, cand, past_actions=acts[:, :1].expand(4, -1, -1))
    torch.testing.assert_close(per_row, p.rollout(z, cand, past_actions=acts[:, :1]))
