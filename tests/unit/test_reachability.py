"""The reachability head: it learns distance along the paths the data took (not the straight
line), it follows a change of latent basis, and the planner uses it in place of the L1 energy."""

import pytest
import torch

from lensemble.errors import ConfigError, EvaluationError
from lensemble.eval.mpc import Planner
from lensemble.model.reachability import (
    ReachabilityHead,
    fit_reachability,
    reachability_cost,
    rotate_head_basis_,
)
from tests.unit.tiny_model import random_orthogonal

D = 8


def _u_path(s: torch.Tensor) -> torch.Tensor:
    """Arc length s in [0, 21] -> a point on a U: up x=0 (s 0..10), across y=10 (10..11),
    down x=1 (11..21). (0, 0) and (1, 0) are 1 apart in a straight line, 21 along the U."""
    x = torch.where(s < 10, 0.0, torch.where(s < 11, s - 10, 1.0))
    y = torch.where(s < 10, s, torch.where(s < 11, 10.0, 21 - s))
    return torch.stack([x, y], -1)


def _embed(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """2-d points -> D-d latents in a rotated frame (the gauge the head must not care about)."""
    z = torch.zeros(*p.shape[:-1], D)
    z[..., :2] = p
    return z @ q


def _u_episodes(n: int, steps: int = 120, seed: int = 0) -> list[torch.Tensor]:
    """Random walks along the U (a step of +-0.5 arc length per env step, 80 % onward)."""
    g = torch.Generator().manual_seed(seed)
    q = random_orthogonal(D, seed=3)
    eps = []
    for _ in range(n):
        s = torch.empty(steps + 1)
        s[0] = torch.rand(1, generator=g) * 21
        direction = 1.0 if torch.rand(1, generator=g) < 0.5 else -1.0
        for t in range(steps):
            step = 0.5 * (direction if torch.rand(1, generator=g) < 0.8 else -direction)
            s[t + 1] = (s[t] + step).clamp(0, 21)
            if float(s[t + 1]) in (0.0, 21.0):
                direction = -direction
        eps.append(_embed(_u_path(s), q) + 0.01 * torch.randn(steps + 1, D, generator=g))
    return eps


@pytest.fixture(scope="module")
def u_fit():
    return fit_reachability(_u_episodes(60), action_block=1, max_gap=60, steps=1500, seed=0)


def test_the_head_measures_distance_along_the_data_paths_not_the_straight_line(u_fit):
    """Known answer with the adversarial case a latent distance gets wrong: (0, 0) -> (1, 0) is as close as
    (0, 0) -> (0, 1) in a straight line but 21 arc-length units along the only path; the head
    must rank it far, and order points along one arm by their distance."""
    q = random_orthogonal(D, seed=3)
    start = _embed(torch.tensor([0.0, 0.0]), q)
    near = _embed(torch.tensor([0.0, 1.0]), q)        # 1 along the path
    across = _embed(torch.tensor([1.0, 0.0]), q)      # 21 along the path, 1 in a straight line
    assert float((start - near).norm()) == pytest.approx(float((start - across).norm()), rel=1e-5)
    head = u_fit.head
    with torch.no_grad():
        r_near, r_across = float(head(start, near)), float(head(start, across))
        arm = torch.stack([head(start, _embed(torch.tensor([0.0, y]), q)) for y in (2.0, 4.0, 6.0, 8.0)])
    assert r_across > 3 * r_near, (r_near, r_across)
    assert (arm[1:] > arm[:-1]).all(), arm
    assert u_fit.holdout_spearman > 0.6


def test_a_head_follows_a_change_of_latent_basis(u_fit):
    q = random_orthogonal(D, seed=11)
    head = ReachabilityHead(D)
    head.load_state_dict(u_fit.head.state_dict())
    z, g = torch.randn(5, D), torch.randn(5, D)
    with torch.no_grad():
        before = head(z, g)
        rotate_head_basis_(head, q)
        after = head(z @ q, g @ q)
        unrotated = head(z, g)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unrotated, before, atol=1e-3)  # the rotation did change the weights


def test_fit_is_deterministic_in_its_seed():
    eps = _u_episodes(12, steps=40)
    a, b = (fit_reachability(eps, action_block=5, max_gap=20, steps=30, seed=4) for _ in range(2))
    c = fit_reachability(eps, action_block=5, max_gap=20, steps=30, seed=5)
    z = torch.randn(3, D)
    with torch.no_grad():
        assert torch.equal(a.head(z, z.flip(0)), b.head(z, z.flip(0)))
        assert not torch.equal(a.head(z, z.flip(0)), c.head(z, z.flip(0)))


def test_fit_refuses_too_little_data():
    with pytest.raises(ConfigError, match="at least 2 episodes"):
        fit_reachability([torch.randn(10, D)], action_block=5)
    with pytest.raises(ConfigError, match="max_gap"):
        fit_reachability(_u_episodes(3, steps=10), action_block=5, max_gap=0)


def test_cost_aggregates_final_and_closest_approach(u_fit):
    pred = torch.randn(2, 3, 4, D)
    goal = torch.randn(2, 1, D)
    with torch.no_grad():
        r = u_fit.head(pred, goal.unsqueeze(-2))  # (2, 3, 4)
        torch.testing.assert_close(reachability_cost(u_fit.head, "final")(pred, goal), r[..., -1])
        torch.testing.assert_close(reachability_cost(u_fit.head, "min")(pred, goal), r.min(-1).values)
    with pytest.raises(ConfigError):
        reachability_cost(u_fit.head, "mean")


def test_planner_minimises_the_cost_it_is_given():
    """A cost that rewards a predicted final latent near +0.8 in dimension 0 of the *actions*
    (the rollout returns the cumulative action): the plan goes there, not where L1 to the goal
    would send it (the goal sits at -1)."""
    planner = Planner("cem", horizon=3, num_samples=64, iterations=8, topk=8, action_dim=1, seed=0)

    def rollout(z_rep, actions):
        return torch.cumsum(actions, dim=1).expand(-1, -1, 2)

    def target(pred, goal):
        return (pred[..., -1, 0] - 0.8).abs()

    z0, goal = torch.zeros(2, 2), torch.full((2, 2), -1.0)
    plain = planner.plan(rollout, z0, goal)
    shaped = planner.plan(rollout, z0, goal, cost_fn=target)
    assert plain.actions.sum(1).mean() < -0.5
    assert (shaped.actions.sum(1) - 0.8).abs().max() < 0.1
    with pytest.raises(EvaluationError, match="cost_fn must return"):
        planner.plan(rollout, z0, goal, cost_fn=lambda p, g: p[..., -1, 0].reshape(-1))
