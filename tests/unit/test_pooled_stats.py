"""Known-answer tests of the pooled objective's statistics (lensemble/model/pooled.py).

The adversarial case for a batch statistic is a one-room batch: two silos whose latents sit in
different places. Each silo's own (centred) SIGReg finds its batch Gaussian; only the pooled
statistic sees the two rooms.
"""

from __future__ import annotations

import torch
from torch import nn

from lensemble.model.pooled import (
    Moments,
    PoolableBatchNorm1d,
    Pooling,
    SiloSummary,
    ecf_summary,
    fixed_batchnorm,
    others_pooling,
    pooled_batchnorm,
    pooled_moments,
    pooled_sigreg,
    sum_summaries,
)
from lensemble.model.sigreg import _knot_weights, make_sketch, sigreg


def _sketch(d=8, s=32, seed=0):
    return make_sketch(d, s, torch.Generator().manual_seed(seed))


def _rooms(n=200, d=8, offset=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    shift = torch.zeros(d)
    shift[0] = offset
    return torch.randn(n, d, generator=g) + shift, torch.randn(n, d, generator=g) - shift


def test_identity_per_silo_is_pooled_plus_between_silo_penalty():
    # Σ_k w_k |φ̂_k − φ|² = |φ̂_pool − φ|² + Σ_k w_k |φ̂_k − φ̂_pool|², per direction and knot,
    # on two skewed silos of unequal size (weights = their shares of the examples)
    a, b = _rooms(n=150)
    b = b[:90] * 0.5
    sk = _sketch()
    t, phi, _ = _knot_weights(17, 3.0, "cpu")
    sa, sb = ecf_summary(a, sk), ecf_summary(b, sk)
    wa, wb = 150 / 240, 90 / 240
    pool = ecf_summary(torch.cat([a, b]), sk)
    torch.testing.assert_close(pool.cos, wa * sa.cos + wb * sb.cos, atol=1e-5, rtol=0)

    def sq(re, im, re0, im0):
        return (re - re0).square() + (im - im0).square()

    left = wa * sq(sa.cos, sa.sin, phi, 0) + wb * sq(sb.cos, sb.sin, phi, 0)
    right = (sq(pool.cos, pool.sin, phi, 0) + wa * sq(sa.cos, sa.sin, pool.cos, pool.sin)
             + wb * sq(sb.cos, sb.sin, pool.cos, pool.sin))
    torch.testing.assert_close(left, right, atol=1e-5, rtol=0)
    assert float((wa * sq(sa.cos, sa.sin, pool.cos, pool.sin)).sum()) > 0.1  # the penalty is not 0 here


def test_pooled_sigreg_equals_sigreg_of_the_pooled_batch_value_and_gradient():
    a, b = _rooms()
    sk = _sketch()
    za = a.clone().requires_grad_(True)
    pooled = pooled_sigreg(za, sk, Pooling(parties=2, ecf=ecf_summary(b, sk)))
    (ga,) = torch.autograd.grad(pooled, za)
    zc = torch.cat([a, b]).requires_grad_(True)
    ref = sigreg(zc, sk)
    (gc,) = torch.autograd.grad(ref, zc)
    torch.testing.assert_close(pooled, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ga, gc[: len(a)], rtol=1e-4, atol=1e-6)


def test_one_party_pooled_sigreg_is_sigreg():
    a, _ = _rooms()
    sk = _sketch()
    assert float(pooled_sigreg(a, sk, None)) == float(sigreg(a, sk))  # nothing pooled: the silo statistic
    nobody = ecf_summary(a, sk)
    nobody = type(nobody)(nobody.cos * 0, nobody.sin * 0, nobody.mean * 0)  # no other party
    torch.testing.assert_close(pooled_sigreg(a, sk, Pooling(parties=1, ecf=nobody)), sigreg(a, sk), rtol=1e-5, atol=1e-5)


def test_one_room_batches_fool_the_silo_statistic_not_the_pooled_one():
    a, b = _rooms(offset=3.0)
    sk = _sketch()
    per_silo = float(sigreg(a, sk) + sigreg(b, sk)) / 2
    pooled = float(pooled_sigreg(a, sk, Pooling(parties=2, ecf=ecf_summary(b, sk))))
    assert per_silo < 1.0  # each room is a centred Gaussian: near the null level (~0.29)
    assert pooled > 20 * per_silo  # the two rooms together are far from N(0, I)


def test_others_pooling_subtracts_own_contribution():
    a, b = _rooms(n=64)
    c = _rooms(n=64, seed=1)[0]
    sk = _sketch()
    own = [SiloSummary(ecf_summary(x, sk), None) for x in (a, b, c)]
    mean = sum_summaries(own).scaled(1 / 3)
    p = others_pooling(mean, own[0], 3)
    assert p.parties == 3
    torch.testing.assert_close(p.ecf.cos, own[1].ecf.cos + own[2].ecf.cos, atol=1e-5, rtol=0)
    late = others_pooling(mean, None, 3)  # a party that was not in the pool joins it
    assert late.parties == 4
    torch.testing.assert_close(late.ecf.mean, own[0].ecf.mean + own[1].ecf.mean + own[2].ecf.mean, atol=1e-5, rtol=0)


def test_summary_arrays_round_trip():
    a, _ = _rooms(n=32)
    s = SiloSummary(ecf_summary(a, _sketch()), [Moments(torch.ones(5), torch.full((5,), 2.0), torch.ones(5))])
    back = SiloSummary.from_arrays(s.to_arrays())
    torch.testing.assert_close(back.ecf.sin, s.ecf.sin)
    torch.testing.assert_close(back.bn[0].var, s.bn[0].var)
    assert SiloSummary.from_arrays({}).ecf is None and SiloSummary.from_arrays({}).bn is None


def test_poolable_batchnorm_is_batchnorm_and_pools_like_the_concatenated_batch():
    torch.manual_seed(0)
    plain, pool = nn.BatchNorm1d(6), PoolableBatchNorm1d(6)
    assert list(plain.state_dict()) == list(pool.state_dict())  # checkpoints and hashes unchanged
    with torch.no_grad():
        pool.weight.uniform_(0.5, 2.0)
        pool.bias.uniform_(-1, 1)
    plain.load_state_dict(pool.state_dict())
    a, b = torch.randn(40, 6) + 2.0, torch.randn(40, 6) * 3 - 1.0
    torch.testing.assert_close(pool(a), plain(a))  # outside the pooled block: exactly BatchNorm1d
    others = Moments.of(b)
    xa = a.clone().requires_grad_(True)
    with pooled_batchnorm(nn.Sequential(pool), Pooling(parties=2, bn=[others])):
        ya = pool(xa)
    xc = torch.cat([a, b]).requires_grad_(True)
    plain.train()
    yc = plain(xc)
    torch.testing.assert_close(ya, yc[:40], rtol=1e-4, atol=1e-5)
    # the running statistics follow the pooled moments, as plain BatchNorm's follow the union batch's
    torch.testing.assert_close(pool.running_mean, plain.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pool.running_var, plain.running_var, rtol=1e-5, atol=1e-6)
    # a loss on the live party's outputs: its gradient is the union batch's, through the pooled
    # moments too (x_a enters them with weight 1/80 in both), not merely finite
    (ga,) = torch.autograd.grad(ya.square().sum(), xa)
    (gc,) = torch.autograd.grad(yc[:40].square().sum(), xc)
    torch.testing.assert_close(ga, gc[:40], rtol=1e-4, atol=1e-5)
    assert pool.pooled_with is None  # the block leaves the layer as it found it


def test_fixed_batchnorm_normalises_with_the_given_moments_in_any_mode():
    pool = PoolableBatchNorm1d(5)
    with torch.no_grad():
        pool.weight.uniform_(0.5, 2.0)
        pool.bias.uniform_(-1, 1)
    x = torch.randn(30, 5) * 2 + 1
    mean, var = torch.full((5,), 0.5), torch.full((5,), 4.0)
    before = pool.running_mean.clone()
    for mode in (True, False):
        pool.train(mode)
        with fixed_batchnorm(nn.Sequential(pool), [(mean, var)]):
            y = pool(x)
        torch.testing.assert_close(y, (x - 0.5) / torch.sqrt(torch.tensor(4.0) + pool.eps) * pool.weight + pool.bias)
    torch.testing.assert_close(pool.running_mean, before)  # a summary leaves the running statistics alone
    assert pool.fixed is None


def test_pooled_moments_are_the_union_batch_moments():
    a, b, c = torch.randn(40, 6) + 2.0, torch.randn(40, 6) * 3 - 1.0, torch.randn(40, 6) * 0.2
    mean = sum_summaries([SiloSummary(None, [Moments.of(x)]) for x in (a, b, c)]).scaled(1 / 3).bn
    [(m, v)] = pooled_moments(mean)
    u = torch.cat([a, b, c])
    torch.testing.assert_close(m, u.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, u.var(0, unbiased=False), rtol=1e-4, atol=1e-5)


def test_one_party_pooled_objective_is_the_plain_objective_value_and_gradient():
    # the whole objective (BatchNorm projector, SIGReg) with a pool of one party: no other silo
    from tiny_model import D, frames, tiny_cfg

    from lensemble.config.schema import ObjectiveConfig
    from lensemble.model.objective import BatchStatistics, JEPAObjective
    from lensemble.model.pooled import recording_moments
    from lensemble.model.world_model import build_world_model

    model = build_world_model(tiny_cfg(projector_norm="batchnorm"), init_seed=0)
    obs = frames(8 * 3).reshape(8, 3, 3, 16, 16)
    actions = torch.randn(8, 2, 4, generator=torch.Generator().manual_seed(1))
    sk = _sketch(d=D, s=16)
    objective = JEPAObjective(ObjectiveConfig(sigreg_directions=16))
    with recording_moments(model.encoder) as rec:
        model.encoder.encode_frames(obs)
    zero = type(rec[0][0])(*(torch.zeros_like(v) for v in (rec[0][0].mean, rec[0][0].var, rec[0][0].meansq)))
    ecf = ecf_summary(torch.zeros(2, D), sk)
    nobody = Pooling(parties=1, ecf=type(ecf)(ecf.cos * 0, ecf.sin * 0, ecf.mean * 0), bn=[zero])

    def loss_and_grads(stats):
        model.zero_grad()
        model.train()
        terms = objective(model, obs, actions, sk, stats) if stats else objective(model, obs, actions, sk)
        terms.total.backward()
        return terms.total.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, g_plain = loss_and_grads(None)
    pooled, g_pooled = loss_and_grads(BatchStatistics(pooling=(nobody,)))
    torch.testing.assert_close(pooled, plain, rtol=1e-5, atol=1e-6)
    for name, g in g_plain.items():
        torch.testing.assert_close(g_pooled[name], g, rtol=1e-3, atol=1e-6, msg=name)
