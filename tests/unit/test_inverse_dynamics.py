"""The inverse-dynamics head and its objective term (lensemble/model/inverse_dynamics.py).

Known answers: the head learns the actions of a linear latent dynamics and cannot learn them when
the actions are shuffled against the transitions; it is invariant under the latent-basis change
the backstop applies (and does change when only the latents are rotated); the term is the MSE the
docstring says and its gradient reaches the encoder; the model without the head is unchanged.
"""

import pytest
import torch
from tiny_model import D, random_orthogonal, tiny_cfg

from lensemble.config import load_config
from lensemble.config.schema import ModelConfig, ObjectiveConfig
from lensemble.errors import ArtifactError, ConfigError
from lensemble.model import JEPAObjective, build_world_model, sketch_for_step
from lensemble.model.predictor import Predictor
from lensemble.model.world_model import architecture, rotate_latent_basis_, world_model_from_state


def clips(b=3, k=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (b, k, 3, 16, 16), generator=g, dtype=torch.uint8)
    return obs, torch.rand(b, k - 1, 4, generator=g) * 2 - 1


def test_defaults_build_no_head_and_leave_the_config_hash_alone():
    assert build_world_model(tiny_cfg(), init_seed=0).predictor.inverse is None
    assert "inverse_head" not in ModelConfig().model_dump(mode="json")
    assert "lambda_inverse" not in ObjectiveConfig().model_dump(mode="json")
    with pytest.raises(ValueError, match="no inverse-dynamics head"):
        build_world_model(tiny_cfg(), init_seed=0).predictor.infer_actions(torch.zeros(2, 3, D))


def test_the_term_needs_the_head():
    with pytest.raises(ConfigError, match="model.inverse_head"):
        load_config(["experiment=micro", "objective.lambda_inverse=1.0"])
    cfg = load_config(["experiment=micro", "objective.lambda_inverse=1.0", "model.inverse_head=16"])
    assert cfg.model.inverse_head == 16 and cfg.objective.lambda_inverse == 1.0


def test_adding_the_head_initialises_every_other_parameter_identically():
    plain = build_world_model(tiny_cfg(), init_seed=3).state_dict()
    with_head = build_world_model(tiny_cfg(inverse_head=8), init_seed=3).state_dict()
    extra = set(with_head) - set(plain)
    assert extra and all(k.startswith("predictor.inverse.") for k in extra)
    for k, v in plain.items():
        torch.testing.assert_close(with_head[k], v, rtol=0, atol=0)


def test_head_is_invariant_under_the_latent_basis_change_and_not_under_a_bare_rotation():
    model = build_world_model(tiny_cfg(inverse_head=8), init_seed=0).eval()
    # Larger weights than the 0.02 init, so the invariance is tested where the head is not ~constant.
    with torch.no_grad():
        for p in model.predictor.parameters():
            p.normal_(0, 0.5)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(5, 3, D, generator=g)  # 5 trajectories of 3 latents: 2 steps each
    before = model.predictor.infer_actions(z)
    assert before.shape == (5, 2, 4)
    q = random_orthogonal(D, seed=4)
    # Adversarial: rotating the latents without the model's reparametrisation must change the output.
    with torch.no_grad():
        assert float((model.predictor.infer_actions(z @ q) - before).abs().max()) > 1e-2
    rotate_latent_basis_(model, q)
    torch.testing.assert_close(model.predictor.infer_actions(z @ q), before, atol=1e-5, rtol=1e-5)


def test_objective_term_is_the_action_mse_and_trains_the_encoder():
    model = build_world_model(tiny_cfg(inverse_head=8), init_seed=0)
    obs, act = clips()
    sk = sketch_for_step(0, 0, D, 32)
    plain = JEPAObjective(ObjectiveConfig(sigreg_directions=32))(model, obs, act, sk)
    terms = JEPAObjective(ObjectiveConfig(sigreg_directions=32, lambda_inverse=0.5))(model, obs, act, sk)
    assert "inverse" not in plain.as_floats() and "inverse" in terms.as_floats()
    with torch.no_grad():
        z = model.encoder.encode_frames(obs)
        want = torch.nn.functional.mse_loss(model.predictor.infer_actions(z), act)
    torch.testing.assert_close(terms.inverse, want)
    torch.testing.assert_close(terms.total, plain.total + 0.5 * terms.inverse)
    model.zero_grad()
    # Only the inverse term's gradient: the encoder's projector must receive some.
    z = model.encoder.encode_frames(obs)
    torch.nn.functional.mse_loss(model.predictor.infer_actions(z), act).backward()
    enc_grad = sum(float(p.grad.abs().sum()) for p in model.encoder.parameters() if p.grad is not None)
    head_grad = sum(float(p.grad.abs().sum()) for p in model.predictor.inverse.parameters())
    assert enc_grad > 0 and head_grad > 0


def _held_out_mse(train, test, steps=400, seed=0):
    """Train a predictor's in_proj + head on ``train`` = (z, z1, a) -> a; return the MSE on ``test``."""
    torch.manual_seed(seed)
    pred = Predictor(tiny_cfg(inverse_head=64))
    opt = torch.optim.Adam([*pred.in_proj.parameters(), *pred.inverse.parameters()], lr=3e-3)
    z, z1, a = train
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(pred.infer_actions(torch.stack([z, z1], dim=-2))[..., 0, :], a).backward()
        opt.step()
    z, z1, a = test
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(pred.infer_actions(torch.stack([z, z1], dim=-2))[..., 0, :], a))


def _transitions(n, m, g):
    z = torch.randn(n, D, generator=g)
    a = torch.rand(n, 4, generator=g) * 2 - 1
    return z, z + a @ m, a


def test_head_learns_linear_dynamics_and_not_shuffled_actions():
    """z_{t+1} = z_t + a_t M (M a fixed 4 x d map): the action is a linear function of the latent
    difference, so the head recovers it on held-out transitions; trained on the same transitions
    with shuffled actions it can only memorise, and held out it is no better than the mean."""
    g = torch.Generator().manual_seed(0)
    m = torch.randn(4, D, generator=g)
    train, test = _transitions(256, m, g), _transitions(256, m, g)
    var = float(test[2].var(dim=0, unbiased=False).mean())  # ≈ 1/3 for U[-1, 1]
    learned = _held_out_mse(train, test)
    z, z1, a = train
    shuffled = _held_out_mse((z, z1, a[torch.randperm(256, generator=g)]), test)
    assert learned < 0.05 * var, (learned, var)
    assert shuffled > 0.9 * var, (shuffled, var)


def test_checkpoint_with_the_head_round_trips_and_is_refused_without_it():
    cfg = tiny_cfg(inverse_head=8)
    model = build_world_model(cfg, init_seed=0)
    again = world_model_from_state(architecture(cfg), model.state_dict())
    for k, v in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[k], v, rtol=0, atol=0)
    with pytest.raises(ArtifactError):
        world_model_from_state(architecture(tiny_cfg()), model.state_dict())
