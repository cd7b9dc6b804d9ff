"""Planner on a linear toy latent dynamics z_{t+1} = z_t + a_t (d = A = 2)."""

import pytest
import torch

from lensemble.config.schema import EvalConfig
from lensemble.errors import ConfigError, EvaluationError
from lensemble.eval.mpc import Planner, latent_l1_cost, shift_plan

Z0 = torch.tensor([[0.0, 0.0], [1.0, 1.0], [-0.5, 2.0]])
GOAL = torch.tensor([[1.5, -2.0], [-1.0, 3.0], [0.5, 0.0]])


def linear_rollout(z0, actions):
    """(N, d) or (N, W, d) latents, (N, H, A) actions -> (N, H, d) predicted latents."""
    last = z0[:, -1] if z0.ndim == 3 else z0
    return last[:, None, :] + actions.cumsum(1)


def _planner(family="cem", **kw):
    args = dict(
        horizon=5,
        num_samples=128,
        iterations=12,
        topk=12,
        action_dim=2,
        action_low=-1.0,
        action_high=1.0,
        seed=0,
    )
    args.update(kw)
    return Planner(family, **args)


@pytest.mark.parametrize("family", ["cem", "icem", "mppi"])
def test_reaches_goal_for_every_env(family):
    calls = []

    def rollout(z0, a):
        calls.append((tuple(z0.shape), tuple(a.shape)))
        return linear_rollout(z0, a)

    res = _planner(family).plan(rollout, Z0, GOAL)
    final = Z0 + res.actions.sum(1)
    assert (final - GOAL).abs().sum(1).max() < 0.1
    assert res.actions.shape == (3, 5, 2) and res.cost.shape == (3,)
    assert torch.allclose(res.cost, (final - GOAL).abs().sum(1), atol=1e-5)
    # One batched model call per iteration over all B*S candidates.
    assert calls == [((3 * 128, 2), (3 * 128, 5, 2))] * 12
    assert torch.all(res.cost_history[1:] <= res.cost_history[:-1])
    assert res.evaluations == 12 * 128


@pytest.mark.parametrize("family", ["cem", "icem", "mppi"])
def test_actions_stay_in_bounds(family):
    low, high = torch.tensor([-0.2, 0.0]), torch.tensor([0.3, 0.1])
    seen = []

    def rollout(z0, a):
        seen.append(a)
        return linear_rollout(z0, a)

    far = torch.tensor([[10.0, -10.0]]).expand(3, 2)  # unreachable: the best plan saturates
    res = _planner(family, action_low=low, action_high=high, init_std=3.0).plan(rollout, Z0, far)
    for a in seen + [res.actions, res.mean]:
        assert torch.all(a >= low) and torch.all(a <= high)
    # The optimum pushes x up and y down as far as the box allows: every step at (0.3, 0.0).
    best = (Z0 + 5 * torch.tensor([0.3, 0.0]) - far).abs().sum(1)
    assert torch.all(res.cost >= best - 1e-4) and torch.all(res.cost <= best + 0.25)


@pytest.mark.parametrize("family", ["cem", "icem", "mppi"])
def test_same_seed_same_plan(family):
    a = _planner(family, seed=3).plan(linear_rollout, Z0, GOAL)
    b = _planner(family, seed=3).plan(linear_rollout, Z0, GOAL)
    c = _planner(family, seed=4).plan(linear_rollout, Z0, GOAL)
    assert torch.equal(a.actions, b.actions) and torch.equal(a.cost, b.cost)
    assert not torch.equal(a.actions, c.actions)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    p1 = _planner(family, generator=g1).plan(linear_rollout, Z0, GOAL)
    p2 = _planner(family, generator=g2).plan(linear_rollout, Z0, GOAL)
    assert torch.equal(p1.actions, p2.actions)


def test_reset_restarts_the_stream():
    p = _planner()
    first = p.plan(linear_rollout, Z0, GOAL).actions
    assert not torch.equal(first, p.plan(linear_rollout, Z0, GOAL).actions)
    p.reset()
    assert torch.equal(first, p.plan(linear_rollout, Z0, GOAL).actions)


@pytest.mark.parametrize(
    "kw",
    [
        dict(topk=200),
        dict(family="random-shooting"),
        dict(action_low=1.0, action_high=-1.0),
        dict(action_low=torch.zeros(3)),
        dict(num_samples=1, topk=1),
        dict(init_std=0.0),
        dict(family="icem", icem_keep_elites=20),
        dict(horizon=0),
    ],
)
def test_bad_config(kw):
    family = kw.pop("family", "cem")
    with pytest.raises(ConfigError):
        _planner(family, **kw)


def test_from_eval_config():
    cfg = EvalConfig(planner="icem", horizon=4, receding_horizon=2, num_samples=64, iterations=3, topk=8)
    p = Planner.from_config(cfg, action_dim=2, action_low=-1.0, action_high=1.0)
    assert (p.family, p.horizon, p.num_samples, p.iterations, p.topk) == ("icem", 4, 64, 3, 8)
    assert p.plan(linear_rollout, Z0, GOAL).actions.shape == (3, 4, 2)


def test_warm_start_and_shift():
    exact = ((GOAL - Z0) / 5).unsqueeze(1).expand(3, 5, 2)
    res = _planner(iterations=1).plan(linear_rollout, Z0, GOAL, init_mean=exact)
    assert res.cost.max() < 1e-5  # the initial mean is always evaluated
    plan = torch.arange(12.0).reshape(1, 6, 2)
    shifted = shift_plan(plan, 2, fill=torch.tensor([-1.0, -2.0]))
    assert torch.equal(shifted[0, :4], plan[0, 2:])
    assert torch.equal(shifted[0, 4:], torch.tensor([[-1.0, -2.0], [-1.0, -2.0]]))
    with pytest.raises(ConfigError):
        shift_plan(plan, 7)
    p = _planner(action_low=torch.tensor([0.0, -1.0]), action_high=torch.tensor([1.0, 1.0]))
    nxt = p.next_init(res, 2)
    assert torch.equal(nxt[:, :3], res.mean[:, 2:]) and torch.allclose(nxt[:, 3:], torch.tensor([0.5, 0.0]))
    assert _planner(warm_start=False).next_init(res, 2) is None
    short = _planner(iterations=1).plan(linear_rollout, Z0, GOAL, init_mean=exact[:, :2])
    assert short.mean.shape == (3, 5, 2)


def test_latent_history_and_cost_over_horizon():
    hist = torch.stack([Z0 - 1.0, Z0], dim=1)  # (B, W=2, d)
    res = _planner().plan(linear_rollout, hist, GOAL)
    assert (Z0 + res.actions.sum(1) - GOAL).abs().sum(1).max() < 0.1
    pred = torch.tensor([[[1.0, 0.0], [2.0, 0.0]]])
    goal = torch.tensor([[2.0, 1.0]])
    assert latent_l1_cost(pred, goal).item() == pytest.approx(1.0)
    assert latent_l1_cost(pred, goal, over_horizon=True).item() == pytest.approx(3.0)
    over = _planner(cost_over_horizon=True).plan(linear_rollout, Z0, GOAL)
    assert over.cost.shape == (3,)


def test_bad_model_output_is_an_error():
    with pytest.raises(EvaluationError):
        _planner().plan(lambda z, a: linear_rollout(z, a)[:, :-1], Z0, GOAL)
    with pytest.raises(EvaluationError):
        _planner().plan(lambda z, a: linear_rollout(z, a) * float("nan"), Z0, GOAL)
    with pytest.raises(EvaluationError):
        _planner().plan(linear_rollout, Z0, GOAL[:2])


def test_colored_noise_has_unit_variance():
    for beta, white in ((0.0, True), (2.0, False)):
        p = _planner("icem", horizon=6, num_samples=2000, icem_colored_noise_beta=beta)
        x = p._noise(2, torch.device("cpu")).permute(0, 1, 3, 2).reshape(-1, 6)
        cov = torch.cov(x.T)
        assert torch.allclose(cov.diag(), torch.ones(6), atol=0.06)
        lag1 = cov.diagonal(1).mean()
        assert (abs(lag1) < 0.05) if white else (lag1 > 0.2)


@pytest.mark.parametrize("kind", ["window", "banded"])
def test_plan_fn_prepares_the_history_once_and_plans_as_the_plain_rollout(kind):
    """planner_plan_fn digests the history once per call (Predictor.prepare) and continues it for
    every candidate; the plans equal those of a planner calling Predictor.rollout on the repeated
    history and past actions each iteration."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_model import D, tiny_cfg

    from lensemble.eval.closed_loop import planner_plan_fn
    from lensemble.model import build_world_model

    model = build_world_model(tiny_cfg(predictor_attention=kind, predictor_depth=2), init_seed=1).eval()
    a_in = model.predictor.action_in
    g = torch.Generator().manual_seed(0)
    z_hist, past, goal = torch.randn(2, 3, D, generator=g), torch.randn(2, 2, a_in, generator=g), torch.randn(2, D, generator=g)
    kw = dict(horizon=4, num_samples=24, iterations=4, topk=6, action_dim=a_in)
    prepared = planner_plan_fn(model, _planner(**kw), receding_horizon=2)
    actions, nxt = prepared(z_hist, past, goal, None)

    plain = _planner(**kw)
    past_rep = past.repeat_interleave(24, dim=0)
    ref = plain.plan(lambda z, a: model.predictor.rollout(z, a, past_actions=past_rep), z_hist, goal)
    torch.testing.assert_close(actions, ref.actions, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nxt, plain.next_init(ref, 2), rtol=1e-5, atol=1e-5)


def test_plan_fn_can_execute_the_final_mean():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_model import D, tiny_cfg

    from lensemble.eval.closed_loop import planner_plan_fn
    from lensemble.model import build_world_model

    model = build_world_model(tiny_cfg(), init_seed=2).eval()
    a_in = model.predictor.action_in
    g = torch.Generator().manual_seed(1)
    z_hist, goal = torch.randn(2, 1, D, generator=g), torch.randn(2, D, generator=g)
    kw = dict(horizon=3, num_samples=16, iterations=3, topk=4, action_dim=a_in)
    best, _ = planner_plan_fn(model, _planner(**kw), 1)(z_hist, None, goal, None)
    mean, _ = planner_plan_fn(model, _planner(**kw), 1, execute="mean")(z_hist, None, goal, None)
    ref = _planner(**kw).plan(lambda z, a: model.predictor.rollout(z, a), z_hist, goal)
    torch.testing.assert_close(best, ref.actions, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, ref.mean, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(best, mean)
    with pytest.raises(ConfigError):
        planner_plan_fn(model, _planner(**kw), 1, execute="median")
