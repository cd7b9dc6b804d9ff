"""Orthogonal Procrustes: known answers, optimality, degeneracy."""

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
import torch

from lensemble.errors import DegenerateProcrustes, GaugeError
from lensemble.gauge import geodesic_angle_deg, procrustes_align


def _orthogonal(d, seed, reflect=False):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if reflect == (torch.linalg.slogdet(q).sign > 0):
        q[:, 0] = -q[:, 0]
    return q


def _cloud(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(
        1.0, 0.3, d, dtype=torch.float64
    )


@pytest.mark.parametrize("reflect", [False, True])
def test_recovers_known_rotation(reflect):
    src = _cloud(64, 8, 0)
    q_true = _orthogonal(8, 1, reflect=reflect)
    q, residual = procrustes_align(src, src @ q_true)
    assert q.dtype == torch.float64 and q.shape == (8, 8)
    torch.testing.assert_close(q, q_true, atol=1e-5, rtol=1e-4)
    assert residual == pytest.approx(0.0, abs=1e-5)
    torch.testing.assert_close(geodesic_angle_deg(q), geodesic_angle_deg(q_true), atol=1e-5, rtol=1e-4)
    assert bool(torch.linalg.slogdet(q).sign < 0) == reflect


def test_unrotated_pair_is_identity():
    src = _cloud(40, 6, 2)
    q, residual = procrustes_align(src, src.clone())
    torch.testing.assert_close(q, torch.eye(6, dtype=torch.float64), atol=1e-10, rtol=0)
    assert residual < 1e-10
    assert float(geodesic_angle_deg(q)) < 1e-5


def test_float32_input_returns_float64_q_and_relative_residual():
    src = _cloud(30, 4, 3)
    tgt = src @ _orthogonal(4, 4) + 0.1 * _cloud(30, 4, 5)
    q32, r32 = procrustes_align(src.float(), tgt.float())
    q64, r64 = procrustes_align(src, tgt)
    assert q32.dtype == torch.float64
    torch.testing.assert_close(q32, q64, atol=1e-5, rtol=0)
    expected = float(torch.linalg.matrix_norm(src @ q64 - tgt) / torch.linalg.matrix_norm(tgt))
    assert r64 == pytest.approx(expected, rel=1e-12)
    # Scale-free: multiplying both sets by a constant leaves Q and the relative residual alone.
    q_s, r_s = procrustes_align(1e-6 * src, 1e-6 * tgt)
    torch.testing.assert_close(q_s, q64, atol=1e-10, rtol=0)
    assert r_s == pytest.approx(r64, rel=1e-9)


def test_closed_form_matches_numerical_optimisation_over_rotations():
    d = 3
    src = _cloud(20, d, 6)
    tgt = src @ _orthogonal(d, 7) + 0.2 * _cloud(20, d, 8)
    q, _ = procrustes_align(src, tgt)
    assert float(torch.linalg.slogdet(q).sign) > 0  # the optimum lies in SO(3) for this data
    s, t = src.numpy(), tgt.numpy()
    iu = np.triu_indices(d, 1)

    def rot(x):
        k = np.zeros((d, d))
        k[iu] = x
        return scipy.linalg.expm(k - k.T)

    def objective(x):
        return float(np.sum((s @ rot(x) - t) ** 2))

    best = min(
        (
            scipy.optimize.minimize(objective, x0, method="BFGS", options={"gtol": 1e-10})
            for x0 in (np.zeros(3), np.array([1.0, -1.0, 0.5]), np.array([-2.0, 0.3, 1.0]))
        ),
        key=lambda r: r.fun,
    )
    closed = float(torch.sum((src @ q - tgt) ** 2))
    assert closed <= best.fun + 1e-9
    assert closed == pytest.approx(best.fun, rel=1e-7)
    np.testing.assert_allclose(rot(best.x), q.numpy(), atol=1e-4)


def test_rank_deficient_raises_with_details():
    src = _cloud(50, 6, 9)
    src[:, 2] = 0.0  # one latent dimension collapsed
    with pytest.raises(DegenerateProcrustes) as info:
        procrustes_align(src, src @ _orthogonal(6, 10))
    err = info.value
    assert err.details["singular_floor"] == 1e-6
    assert err.details["sigma_min"] == pytest.approx(0.0, abs=1e-10)
    assert err.details["condition_number"] > 1e6
    assert err.condition_number == err.details["condition_number"]
    assert err.code == "procrustes_degenerate"


def test_fewer_frames_than_dims_is_degenerate():
    src = _cloud(5, 8, 11)
    with pytest.raises(DegenerateProcrustes):
        procrustes_align(src, src)


def test_floor_is_relative():
    src = _cloud(50, 4, 12)
    src[:, 3] *= 1e-2  # sigma ratio ~1e-5 in the cross product: fine at 1e-6, not at 1e-3
    procrustes_align(src, src, singular_floor=1e-6)
    with pytest.raises(DegenerateProcrustes):
        procrustes_align(src, src, singular_floor=1e-3)


def test_bad_inputs():
    src = _cloud(10, 3, 13)
    with pytest.raises(GaugeError):
        procrustes_align(src, src[:, :2])
    bad = src.clone()
    bad[0, 0] = math.nan
    with pytest.raises(GaugeError):
        procrustes_align(bad, src)
    with pytest.raises(GaugeError):
        procrustes_align(src[0], src[0])
