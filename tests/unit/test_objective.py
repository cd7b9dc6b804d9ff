"""JEPAObjective: loss terms, gradients, stop-gradient, anchor plug-in, Fork A, sketch schedule."""

import math

import pytest
import torch
from tiny_model import D, tiny_cfg

from lensemble.config.schema import ObjectiveConfig
from lensemble.config.seeds import torch_generator
from lensemble.model import (
    JEPAObjective,
    LossTerms,
    build_world_model,
    make_sketch,
    sigreg,
    sketch_for_round,
    sketch_for_step,
)


def clips(b=3, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (b, k, 3, 16, 16), generator=g, dtype=torch.uint8)
    return obs, torch.randn(b, k - 1, 4, generator=g)


def obj_cfg(**kw):
    return ObjectiveConfig(**{"sigreg_directions": 32, **kw})


def test_loss_terms_and_grads_on_all_trainable_params():
    model = build_world_model(tiny_cfg(), init_seed=0)
    obs, act = clips()
    objective = JEPAObjective(obj_cfg())
    terms = objective(model, obs, act, sketch_for_step(0, 0, D, 32))
    assert isinstance(terms, LossTerms)
    floats = terms.as_floats()
    assert set(floats) == {"loss", "pred", "sigreg", "anchor"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in floats.values())
    assert floats["anchor"] == 0.0
    torch.testing.assert_close(terms.total, terms.pred + 0.1 * terms.sigreg)
    assert terms.latents.shape == (3, 4, D) and not terms.latents.requires_grad
    terms.total.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name


def test_sigreg_term_uses_all_latents_of_the_batch():
    model = build_world_model(tiny_cfg(), init_seed=0)
    obs, act = clips()
    a = sketch_for_step(0, 1, D, 32)
    terms = JEPAObjective(obj_cfg())(model, obs, act, a)
    with torch.no_grad():
        z = model.encoder.encode_frames(obs).reshape(-1, D)
    torch.testing.assert_close(terms.sigreg, sigreg(z, a))


def test_stop_gradient_changes_encoder_gradient():
    obs, act = clips()
    grads = []
    for sg in (True, False):
        model = build_world_model(tiny_cfg(), init_seed=1)
        JEPAObjective(obj_cfg(stop_gradient=sg, lambda_sig=0.0))(
            model, obs, act, sketch_for_step(0, 0, D, 32)
        ).total.backward()
        grads.append(model.encoder.frame.weight.grad.clone())
    assert not torch.allclose(grads[0], grads[1])


def test_anchor_plugin_is_weighted_and_skipped_at_zero():
    model = build_world_model(tiny_cfg(), init_seed=0)
    obs, act = clips()
    calls = []

    def anchor(m):
        calls.append(m)
        return m.encoder.frame.weight.square().sum()  # ‖I‖² = D at init

    a = sketch_for_step(0, 0, D, 32)
    terms = JEPAObjective(obj_cfg(), anchor=anchor, lambda_anc=0.5)(model, obs, act, a)
    assert calls == [model]
    assert terms.as_floats()["anchor"] == pytest.approx(D)
    torch.testing.assert_close(terms.total, terms.pred + 0.1 * terms.sigreg + 0.5 * D)
    JEPAObjective(obj_cfg(), anchor=anchor, lambda_anc=0.0)(model, obs, act, a)
    assert len(calls) == 1


def test_fork_a_trains_predictor_only():
    model = build_world_model(tiny_cfg(encoder_frozen=True), init_seed=0)
    obs, act = clips()
    JEPAObjective(obj_cfg())(model, obs, act, sketch_for_step(0, 0, D, 32)).total.backward()
    assert all(p.grad is None for p in model.encoder.parameters())
    for name, p in model.predictor.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_rejects_bad_clip_shapes():
    model = build_world_model(tiny_cfg(), init_seed=0)
    obs, act = clips()
    objective = JEPAObjective(obj_cfg())
    with pytest.raises(ValueError):
        objective(model, obs, act[:, :2], sketch_for_step(0, 0, D, 32))
    with pytest.raises(ValueError):
        objective(model, obs[:, 0], act, sketch_for_step(0, 0, D, 32))


def test_sketch_schedules():
    r = sketch_for_round(7, 3, D, 32)
    assert torch.equal(r, sketch_for_round(7, 3, D, 32))  # every participant gets the same A
    assert torch.equal(r, make_sketch(D, 32, torch_generator(7, "sketch", 3)))
    assert not torch.equal(r, sketch_for_round(7, 4, D, 32))
    assert not torch.equal(r, sketch_for_round(8, 3, D, 32))
    s = sketch_for_step(7, 3, D, 32)
    assert not torch.equal(s, r)  # step and round streams are distinct
    assert not torch.equal(s, sketch_for_step(7, 4, D, 32))
    assert not torch.equal(sketch_for_step(7, 3, D, 32, site="a"), sketch_for_step(7, 3, D, 32, site="b"))
    torch.testing.assert_close(r.norm(dim=0), torch.ones(32))


def test_temporal_straightening_known_answers():
    from lensemble.model.objective import temporal_straightening

    line = torch.arange(4.0)[None, :, None] * torch.tensor([1.0, 2.0, -1.0])  # (1, 4, 3), constant step
    assert float(temporal_straightening(line)) == pytest.approx(0.0, abs=1e-6)
    speeds = torch.tensor([0.0, 1.0, 4.0, 5.0])[None, :, None] * torch.ones(3)  # same direction, any speed
    assert float(temporal_straightening(speeds)) == pytest.approx(0.0, abs=1e-6)
    back = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])[None]  # the second step reverses the first
    assert float(temporal_straightening(back)) == pytest.approx(2.0)
    turn = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])[None]  # a right angle
    assert float(temporal_straightening(turn)) == pytest.approx(1.0)
    z = torch.randn(5, 4, 6, generator=torch.Generator().manual_seed(1))
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=torch.Generator().manual_seed(2)))
    torch.testing.assert_close(temporal_straightening(z @ q), temporal_straightening(z))  # blind to the gauge
    with pytest.raises(ValueError):
        temporal_straightening(z[:, :2])


def test_straightening_term_is_weighted_logged_and_reaches_the_encoder():
    model = build_world_model(tiny_cfg(), init_seed=0)
    obs, act = clips()
    sk = sketch_for_step(0, 0, D, 32)
    plain = JEPAObjective(obj_cfg())(model, obs, act, sk)
    terms = JEPAObjective(obj_cfg(lambda_straight=0.5))(model, obs, act, sk)
    assert "straight" not in plain.as_floats() and "straight" in terms.as_floats()
    torch.testing.assert_close(terms.total, plain.total + 0.5 * terms.straight)
    model.zero_grad()
    (terms.total - plain.total).backward()  # the straightening term alone
    enc = [p.grad for p in model.encoder.parameters() if p.grad is not None]
    assert enc and any(g.abs().sum() > 0 for g in enc)
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.predictor.parameters())


def test_straightening_needs_three_latents_per_clip():
    from lensemble.config import load_config
    from lensemble.errors import ConfigError

    with pytest.raises(ConfigError):
        load_config(["experiment=micro", "objective.lambda_straight=0.1", "train.clip_len=2"])
    assert load_config(["experiment=micro", "objective.lambda_straight=0.1"]).objective.lambda_straight == 0.1
    assert "lambda_straight" not in load_config(["experiment=micro"]).model_dump(mode="json")["objective"]


def test_rollout_term_is_the_open_loop_error_and_differs_from_teacher_forcing():
    """Known answers: the term is MSE(predictor.rollout(z_0, a), sg(z_{1:})); on a 2-frame clip the
    open loop *is* the one-step prediction (equal terms); on 4 frames it feeds back its own
    predictions, so it differs from the teacher-forced term; it is weighted into the total."""
    from tiny_model import random_orthogonal

    from lensemble.model.world_model import rotate_latent_basis_

    model = build_world_model(tiny_cfg(), init_seed=0)
    sk = sketch_for_step(0, 0, D, 32)
    obs, act = clips(k=4)
    plain = JEPAObjective(obj_cfg())(model, obs, act, sk)
    terms = JEPAObjective(obj_cfg(lambda_rollout=0.5))(model, obs, act, sk)
    assert "rollout" not in plain.as_floats() and "rollout" in terms.as_floats()
    with torch.no_grad():
        z = model.encoder.encode_frames(obs)
        want = torch.nn.functional.mse_loss(model.predictor.rollout(z[:, :1], act), z[:, 1:])
    torch.testing.assert_close(terms.rollout, want)
    torch.testing.assert_close(terms.total, plain.total + 0.5 * terms.rollout)
    assert abs(float(terms.rollout) - float(terms.pred)) > 1e-6
    obs2, act2 = clips(k=2)
    two = JEPAObjective(obj_cfg(lambda_rollout=1.0))(model, obs2, act2, sk)
    torch.testing.assert_close(two.rollout, two.pred)
    # Rotation equivariant like the one-step term: the same loss in a rotated latent basis.
    rotate_latent_basis_(model, random_orthogonal(D, seed=2))
    torch.testing.assert_close(JEPAObjective(obj_cfg(lambda_rollout=0.5))(model, obs, act, sk).rollout,
                               terms.rollout, atol=1e-5, rtol=1e-4)
    assert "lambda_rollout" not in ObjectiveConfig().model_dump(mode="json")
