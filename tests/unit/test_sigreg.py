"""SIGReg: sketch construction, null level, sensitivity to collapse/shrinkage, invariances, grads."""

import pytest
import torch

from lensemble.model.sigreg import make_sketch, sigreg, sigreg_null_mean

D, S = 16, 128


def gen(seed):
    return torch.Generator().manual_seed(seed)


def sketch(seed=0, d=D, s=S):
    return make_sketch(d, s, gen(seed))


def test_make_sketch_unit_columns_and_determinism():
    a = sketch(0)
    assert a.shape == (D, S) and a.dtype == torch.float32
    torch.testing.assert_close(a.norm(dim=0), torch.ones(S))
    assert torch.equal(a, sketch(0))
    assert not torch.equal(a, sketch(1))


def test_null_level_matches_prediction_and_is_batch_size_free():
    null = sigreg_null_mean()
    assert 0.25 < null < 0.32
    a = sketch(0)
    for n in (128, 1024):
        vals = torch.stack([sigreg(torch.randn(n, D, generator=gen(s)), a) for s in range(8)])
        assert abs(float(vals.mean()) - null) < 0.25 * null, (n, vals)


@pytest.mark.parametrize("n", [256, 1024])
def test_large_on_rank_one_and_shrunken_samples(n):
    a = sketch(0)
    null = sigreg_null_mean()
    healthy = float(sigreg(torch.randn(n, D, generator=gen(1)), a))
    # rank one: all latents on one unit direction, with unit-variance coefficients
    v = torch.randn(D, generator=gen(2))
    rank1 = torch.randn(n, 1, generator=gen(3)) * (v / v.norm())
    shrunk = 0.1 * torch.randn(n, D, generator=gen(4))
    for bad in (rank1, shrunk):
        val = float(sigreg(bad, a))
        assert val > 20 * null and val > 20 * healthy
    # departures grow with N (that is the point of the N scaling)
    assert float(sigreg(shrunk, a)) > 0.1 * n * null


def test_not_fooled_by_standardisation_sensitive_cases():
    # scaled-up latents also fail (the test is not scale-free)
    a = sketch(0)
    assert float(sigreg(5.0 * torch.randn(512, D, generator=gen(5)), a)) > 20 * sigreg_null_mean()
    # a constant offset is removed by the centring
    z = torch.randn(512, D, generator=gen(6))
    torch.testing.assert_close(sigreg(z + 3.0, a), sigreg(z, a), rtol=1e-3, atol=1e-4)


def test_invariant_under_joint_rotation():
    q, _ = torch.linalg.qr(torch.randn(D, D, generator=gen(7), dtype=torch.float64))
    q = q.float()
    z = torch.randn(300, D, generator=gen(8))
    a = sketch(0)
    torch.testing.assert_close(sigreg(z @ q, q.T @ a), sigreg(z, a), rtol=1e-5, atol=1e-5)


def test_differentiable_and_accepts_leading_dims():
    z = torch.randn(4, 32, D, generator=gen(9)).mul(0.5).requires_grad_(True)
    val = sigreg(z, sketch(0))
    assert val.ndim == 0
    val.backward()
    assert z.grad.shape == z.shape
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


def test_rejects_mismatched_sketch():
    with pytest.raises(ValueError):
        sigreg(torch.randn(10, D), sketch(0, d=D + 1))


# ---------------------------------------------------------------- the scale of stable-worldmodel
def _swm_forward(z, seed, num_proj):
    """The installed stable_worldmodel 0.1.1 SIGReg on z (N, d), with its random directions drawn
    from the global generator seeded with ``seed``; returns (value, the directions it drew)."""
    pytest.importorskip("stable_worldmodel")
    from stable_worldmodel.wm.loss import SIGReg

    torch.manual_seed(seed)
    value = SIGReg(knots=17, num_proj=num_proj)(z.unsqueeze(0))  # (T=1, B=N, d)
    torch.manual_seed(seed)
    a = torch.randn(z.shape[-1], num_proj)
    return float(value), a / a.norm(p=2, dim=0)


@pytest.mark.parametrize("kind", ["gaussian", "shrunk", "rank1"])
def test_stable_worldmodel_is_twice_this_statistic_on_zero_mean_latents(kind):
    from lensemble.model.sigreg import SWM_SCALE, lambda_sig_on_swm_scale, sigreg_swm

    n = 512
    z = {"gaussian": torch.randn(n, D, generator=gen(20)),
         "shrunk": 0.1 * torch.randn(n, D, generator=gen(21)),
         "rank1": torch.randn(n, 1, generator=gen(22)) * torch.randn(1, D, generator=gen(23)) / 4}[kind]
    z = z - z.mean(0, keepdim=True)  # zero-mean departures: the centring here then changes nothing
    swm, a = _swm_forward(z, seed=5, num_proj=S)
    # The sketch swm drew is the one make_sketch builds from the same seed.
    torch.testing.assert_close(a, make_sketch(D, S, gen(5)))
    ours = float(sigreg(z, a))
    assert SWM_SCALE == 2.0
    assert swm == pytest.approx(SWM_SCALE * ours, rel=1e-4)
    assert float(sigreg_swm(z, a)) == pytest.approx(swm, rel=1e-5)
    # λ restated on swm's scale gives the same loss term.
    assert lambda_sig_on_swm_scale(0.1) * swm == pytest.approx(0.1 * ours, rel=1e-4)


def test_at_the_null_level_stable_worldmodel_also_counts_the_mean_shift_term():
    from lensemble.model.sigreg import lambda_sig_from_swm_scale

    z = torch.randn(2048, D, generator=gen(30))  # not centred: swm sees the sample-mean term
    swm, a = _swm_forward(z, seed=6, num_proj=S)
    ours = float(sigreg(z, a))
    assert 3.0 < swm / ours < 4.5  # ≈ 3.8: 2 from the weights, the rest from no centring
    assert lambda_sig_from_swm_scale(0.09) == pytest.approx(0.18)  # LeWM's published weight
