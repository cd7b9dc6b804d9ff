"""Drift magnitudes and frame_drift: known rotations, determinism, sampling, errors."""

import math

import pytest
import torch

from lensemble.errors import ConfigError, DegenerateProcrustes, GaugeError, ProbeError
from lensemble.gauge import (
    FrameDriftReport,
    drift_magnitudes,
    frame_drift,
    frobenius_drift,
    geodesic_angle_deg,
    principal_angles,
)


def _plane_rotation(d, planes):
    """Block rotation: angle (degrees) in each plane (i, j)."""
    q = torch.eye(d, dtype=torch.float64)
    for (i, j), deg in planes.items():
        t = math.radians(deg)
        q[i, i] = q[j, j] = math.cos(t)
        q[i, j], q[j, i] = -math.sin(t), math.sin(t)
    return q


def _orthogonal(d, seed):
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _cloud(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(
        1.0, 0.4, d, dtype=torch.float64
    )


def test_planar_rotation_reads_its_angle():
    for deg in (0.5, 37.0, 120.0, 179.0):
        q = _plane_rotation(6, {(0, 1): deg})
        fro, ang, refl = drift_magnitudes(q)
        assert float(ang) == pytest.approx(deg, abs=1e-5, rel=1e-4)
        assert float(fro) == pytest.approx(2 * math.sqrt(2) * math.sin(math.radians(deg) / 2), abs=1e-12)
        assert not bool(refl)


def test_multi_plane_rotation_is_geodesic_norm_and_basis_free():
    angles = {(0, 1): 20.0, (2, 3): 50.0, (4, 5): 100.0}
    q = _plane_rotation(7, angles)
    expected = math.sqrt(sum(a * a for a in angles.values()))
    expected_fro = math.sqrt(sum(8 * math.sin(math.radians(a) / 2) ** 2 for a in angles.values()))
    p = _orthogonal(7, 0)
    for m in (q, p @ q @ p.T):  # conjugation changes the planes, not the magnitudes
        assert float(geodesic_angle_deg(m)) == pytest.approx(expected, abs=1e-5, rel=1e-4)
        assert float(frobenius_drift(m)) == pytest.approx(expected_fro, abs=1e-10)
    theta = torch.rad2deg(principal_angles(q))
    torch.testing.assert_close(
        theta, torch.tensor([0.0, 20, 20, 50, 50, 100, 100], dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_angles_match_eigenvalue_phases_and_do_not_saturate():
    q = _orthogonal(64, 1)
    phases = torch.linalg.eigvals(q).angle().abs().sort().values
    torch.testing.assert_close(principal_angles(q), phases, atol=1e-10, rtol=0)
    ang = float(geodesic_angle_deg(q))
    assert ang == pytest.approx(math.degrees(math.sqrt(0.5 * float((phases**2).sum()))), rel=1e-9)
    assert ang > 180.0  # the trace formula would be pinned at 180 here
    # Small drift: angle ≈ ||Q - I||_F / sqrt(2) in radians.
    small = _plane_rotation(64, {(0, 1): 0.3, (5, 9): 0.2})
    assert math.radians(float(geodesic_angle_deg(small))) == pytest.approx(
        float(frobenius_drift(small)) / math.sqrt(2), rel=1e-4
    )


def test_reflection_is_flagged():
    q = torch.diag(torch.tensor([-1.0, 1.0, 1.0, 1.0], dtype=torch.float64))
    fro, ang, refl = drift_magnitudes(q)
    assert bool(refl)
    assert float(fro) == pytest.approx(2.0)
    assert float(ang) == pytest.approx(180.0 / math.sqrt(2), rel=1e-9)
    # Batched reflection flags agree with per-matrix signs.
    batch = torch.stack([_orthogonal(5, s) for s in range(6)])
    batch[::2, :, 0] *= -1
    signs = [float(torch.linalg.slogdet(m).sign) for m in batch]
    assert drift_magnitudes(batch)[2].tolist() == [s < 0 for s in signs]


def _sites(n=48, d=6):
    base = _cloud(n, d, 2)
    rots = {
        "s1": _plane_rotation(d, {(0, 1): 30.0}),
        "s2": _plane_rotation(d, {(2, 3): 40.0}),
        "s0": torch.eye(d, dtype=torch.float64),
    }
    emb = {k: (base @ r).float() for k, r in rots.items()}
    emb["global"] = base.float()
    return emb, rots


def test_frame_drift_known_rotations():
    emb, rots = _sites()
    rep = frame_drift(emb, round_index=3, probe_hash="abc")
    assert rep.participants == ["s0", "s1", "s2"]
    assert list(rep.pairwise_angle_deg) == ["s0|s1", "s0|s2", "s1|s2"]
    assert rep.pairwise_angle_deg["s0|s1"] == pytest.approx(30.0, abs=1e-3)
    assert rep.pairwise_angle_deg["s1|s2"] == pytest.approx(50.0, abs=1e-3)  # sqrt(30² + 40²)
    assert rep.pairwise_residual["s0|s2"] == pytest.approx(float(frobenius_drift(rots["s2"])), abs=1e-5)
    assert rep.drift_from_global["s1"].angle_deg == pytest.approx(30.0, abs=1e-3)
    assert rep.drift_from_global["s0"].angle_deg == pytest.approx(0.0, abs=1e-3)
    assert all(v < 1e-3 for v in rep.pairwise_fit_residual.values())
    assert rep.reflected_pairs == []
    assert set(rep.effective_dim) == {"s0", "s1", "s2", "global"}
    assert rep.mean_pairwise_angle_deg == pytest.approx((30 + 40 + 50) / 3, abs=1e-3)
    assert rep.round_index == 3 and rep.probe_hash == "abc" and rep.latent_dim == 6 and rep.num_probe == 48
    m = rep.summary_metrics()
    assert m["gauge/drift_angle_deg"] == pytest.approx(rep.mean_global_angle_deg)
    assert set(m) == {"gauge/drift_angle_deg", "gauge/procrustes_residual", "gauge/effective_dim",
                      "gauge/drift_rel_residual_before", "gauge/drift_rel_residual_after",
                      "gauge/drift_rotation_share", "gauge/drift_subspace_angle_deg"}
    assert set(rep.pairwise_metrics()) == {"gauge/pairwise_angle_deg", "gauge/pairwise_residual",
                                           "gauge/pairwise_rel_residual_before", "gauge/pairwise_rel_residual_after",
                                           "gauge/pairwise_rotation_share", "gauge/pairwise_subspace_angle_deg"}
    # An exact rotation: a rotation explains all of the disagreement.
    assert rep.drift_from_global["s1"].rotation_share == pytest.approx(1.0, abs=1e-6)
    assert rep.drift_from_global["s0"].relative_residual_before == pytest.approx(0.0, abs=1e-6)


def test_frame_drift_matches_single_pair_procrustes():
    from lensemble.gauge import procrustes_align

    emb = {f"p{i}": _cloud(40, 5, 10 + i) @ _orthogonal(5, 20 + i) for i in range(4)}
    rep = frame_drift(emb)
    for a, b in [("p0", "p1"), ("p1", "p3")]:
        q, fit = procrustes_align(emb[a], emb[b])
        fro, ang, _ = drift_magnitudes(q)
        key = f"{a}|{b}"
        assert rep.pairwise_residual[key] == pytest.approx(float(fro), abs=1e-9)
        assert rep.pairwise_angle_deg[key] == pytest.approx(float(ang), abs=1e-8)
        assert rep.pairwise_fit_residual[key] == pytest.approx(fit, abs=1e-6)


def test_frame_drift_is_bitwise_deterministic_and_round_trips():
    emb = {f"site{i}": _cloud(30, 5, i) @ _orthogonal(5, 100 + i) for i in range(5)}
    emb["global"] = _cloud(30, 5, 0)
    a = frame_drift(emb, round_index=1, probe_hash="h", expected_probe_hash="h")
    reordered = {k: emb[k].clone() for k in reversed(list(emb))}
    b = frame_drift(reordered, round_index=1, probe_hash="h", expected_probe_hash="h")
    assert a.model_dump_json() == b.model_dump_json()
    again = FrameDriftReport.model_validate_json(a.model_dump_json())
    assert again == a
    assert again.model_dump_json() == a.model_dump_json()


def test_frame_drift_workers_do_not_change_the_report():
    # 40 participants -> 780 pairs in 40+ chunks of <= 32, plus two global chunks: enough chunks
    # that two workers really interleave. The report must not depend on how many ran at once,
    # nor on the caller's torch thread count (restored afterwards).
    emb = {f"s{i:02d}": _cloud(24, 6, i) @ _orthogonal(6, 200 + i) for i in range(40)}
    emb["global"] = _cloud(24, 6, 0)
    before = torch.get_num_threads()
    serial = frame_drift(emb, workers=1).model_dump_json()
    assert frame_drift(emb, workers=2).model_dump_json() == serial
    assert frame_drift(emb, workers=3).model_dump_json() == serial
    assert torch.get_num_threads() == before
    # The first failing chunk in pair order is the one reported, as in a serial loop.
    bad = dict(emb)
    for key in ("s05", "s30"):
        bad[key] = bad[key].clone()
        bad[key][:, 2] = 0.0
    with pytest.raises(DegenerateProcrustes) as info:
        frame_drift(bad, workers=2)
    assert info.value.details["pair"] == "s00|s05"
    with pytest.raises(ConfigError):
        frame_drift(emb, workers=0)


def test_probe_hash_mismatch_is_fail_closed():
    emb, _ = _sites()
    with pytest.raises(ProbeError) as info:
        frame_drift(emb, probe_hash="aaa", expected_probe_hash="bbb")
    assert info.value.fail_closed
    with pytest.raises(ProbeError):
        frame_drift(emb, probe_hash=None, expected_probe_hash="bbb")


def test_pair_sampling_is_seeded_and_recorded():
    emb = {f"c{i:02d}": _cloud(24, 4, i) @ _orthogonal(4, 50 + i) for i in range(7)}  # 21 pairs
    full = frame_drift(emb)
    s1 = frame_drift(emb, max_pairs=5, seed=11)
    s2 = frame_drift(emb, max_pairs=5, seed=11)
    s3 = frame_drift(emb, max_pairs=5, seed=12)
    assert s1.model_dump_json() == s2.model_dump_json()
    assert s1.sampling.model_dump() == {
        "max_pairs": 5,
        "seed": 11,
        "sampled": True,
        "total_pairs": 21,
        "evaluated_pairs": 5,
    }
    assert list(s1.pairwise_angle_deg) == sorted(s1.pairwise_angle_deg)
    assert set(s1.pairwise_angle_deg) != set(s3.pairwise_angle_deg)
    for k, v in s1.pairwise_angle_deg.items():
        assert v == pytest.approx(full.pairwise_angle_deg[k], abs=1e-9)
    assert full.sampling.sampled is False and full.sampling.evaluated_pairs == 21
    with pytest.raises(ConfigError):
        frame_drift(emb, max_pairs=0)


def test_degenerate_pair_and_bad_ids():
    emb = {"a": _cloud(30, 4, 0), "b": _cloud(30, 4, 1)}
    emb["b"][:, 1] = 0.0
    with pytest.raises(DegenerateProcrustes) as info:
        frame_drift(emb)
    assert info.value.details["pair"] == "a|b"
    with pytest.raises(GaugeError):
        frame_drift({"a|x": _cloud(10, 2, 0), "b": _cloud(10, 2, 1)})
    with pytest.raises(GaugeError):
        frame_drift({"a": _cloud(10, 2, 0), "b": _cloud(11, 2, 1)})


def test_single_participant_with_global():
    rep = frame_drift({"only": _cloud(20, 3, 0), "global": _cloud(20, 3, 0)})
    assert rep.pairwise_angle_deg == {} and rep.mean_pairwise_angle_deg is None
    assert rep.drift_from_global["only"].angle_deg == pytest.approx(0.0, abs=1e-5)


# --- fast path of frame_drift (eigh polar factor, cosine angles) against the SVD path ---------

from lensemble.gauge import drift as drift_module  # noqa: E402
from lensemble.gauge.procrustes import polar_factors  # noqa: E402


def _spd(d, kappa, seed):
    """Symmetric positive definite matrix with condition number kappa (log-spaced spectrum)."""
    w = _orthogonal(d, seed)
    s = torch.logspace(0.0, -math.log10(kappa), d, dtype=torch.float64)
    return w @ torch.diag(s) @ w.T


def _rotation_with_planes(d, radians, seed, reflect=False):
    """P B Pᵀ: block rotation by the given angles (radians) in planes (0,1), (2,3), ..., plus a
    reflected last axis when asked, in a random basis P."""
    q = torch.eye(d, dtype=torch.float64)
    for k, t in enumerate(radians):
        i, j = 2 * k, 2 * k + 1
        q[i, i] = q[j, j] = math.cos(t)
        q[i, j], q[j, i] = -math.sin(t), math.sin(t)
    if reflect:
        q[-1, -1] = -1.0
    p = _orthogonal(d, seed)
    return p @ q @ p.T


def _count_calls(monkeypatch, name):
    """Record the batch sizes passed to drift_module.<name> (the SVD fallbacks)."""
    calls = []
    original = getattr(drift_module, name)

    def spy(x, *args, **kwargs):
        calls.append(int(x.shape[0]))
        return original(x, *args, **kwargs)

    monkeypatch.setattr(drift_module, name, spy)
    return calls


def _assert_same_magnitudes(q, q_ref=None, angle_atol=1e-9):
    """The fast magnitudes of q equal the SVD path's (of q_ref when given). The reference calls
    the imported functions directly, so that a spy on drift_module sees only the fast path."""
    ref = q if q_ref is None else q_ref
    fro0, ang0 = frobenius_drift(ref), geodesic_angle_deg(ref)
    refl0 = torch.linalg.slogdet(ref).sign < 0
    fro1, ang1, refl1 = drift_module._fast_drift_magnitudes(q.clone())
    torch.testing.assert_close(fro1, fro0, atol=1e-11, rtol=0)
    torch.testing.assert_close(ang1, ang0, atol=angle_atol, rtol=0)
    assert refl1.tolist() == refl0.tolist()


def test_fast_polar_factors_match_svd_on_well_conditioned_pairs(monkeypatch):
    calls = _count_calls(monkeypatch, "polar_factors")
    d = 48
    ms = []
    for b in range(8):
        q = _orthogonal(d, 300 + b)
        if b % 2:
            q[:, 0] = -q[:, 0]  # half of them reflections
        ms.append(q @ _spd(d, [3.0, 30.0, 99.0, 1e3][b % 4], 400 + b) * 10.0 ** (b - 4))
    m = torch.stack(ms)
    q0, s0 = polar_factors(m)
    q1, s1 = drift_module._fast_polar_factors(m, 1e-6, [str(b) for b in range(8)])
    assert calls == []  # no SVD fallback
    torch.testing.assert_close(q1, q0, atol=1e-11, rtol=0)
    torch.testing.assert_close(s1 / s0[:, :1], s0 / s0[:, :1], atol=1e-13, rtol=0)
    _assert_same_magnitudes(q1, q0)


def test_fast_angles_match_svd_path_on_random_rotations_and_reflections(monkeypatch):
    calls = _count_calls(monkeypatch, "geodesic_angle_deg")
    batch = torch.stack([_orthogonal(64, 500 + s) for s in range(8)])
    batch[::2, :, 0] *= -1
    _assert_same_magnitudes(batch)
    assert calls == []
    refl = drift_module._fast_drift_magnitudes(batch)[2]
    assert refl.tolist() == [bool(torch.linalg.slogdet(m).sign < 0) for m in batch]


def test_fast_angles_small_rotations(monkeypatch):
    calls = _count_calls(monkeypatch, "geodesic_angle_deg")
    d = 32
    batch = torch.stack(
        [
            _rotation_with_planes(d, [1e-4], 600),
            _rotation_with_planes(d, [1e-4, 2e-4, 3e-4], 601),
            _rotation_with_planes(d, [1e-7], 602),
            _rotation_with_planes(d, [1e-4], 603, reflect=True),
            torch.eye(d, dtype=torch.float64),
        ]
    )
    _assert_same_magnitudes(batch, angle_atol=1e-10)
    assert calls == []
    ang = drift_module._fast_drift_magnitudes(batch)[1]
    assert float(ang[0]) == pytest.approx(math.degrees(1e-4), rel=1e-9)
    assert float(ang[1]) == pytest.approx(math.degrees(math.sqrt(14e-8)), rel=1e-9)
    assert float(ang[4]) < 1e-9


def test_fast_angles_near_pi_and_reflections(monkeypatch):
    calls = _count_calls(monkeypatch, "geodesic_angle_deg")
    d = 12
    fast = torch.stack(
        [
            _rotation_with_planes(d, [math.pi - 1e-2], 700),
            _rotation_with_planes(d, [math.pi - 1e-2, 1.0, 2.0], 701),
            _rotation_with_planes(d, [], 702, reflect=True),
            _rotation_with_planes(d, [math.pi - 1e-2, 0.3], 703, reflect=True),
            torch.diag(torch.tensor([-1.0] + [1.0] * (d - 1), dtype=torch.float64)),
        ]
    )
    _assert_same_magnitudes(fast)
    assert calls == []  # all read from cosines
    ang = drift_module._fast_drift_magnitudes(fast)[1]
    assert float(ang[0]) == pytest.approx(math.degrees(math.pi - 1e-2), abs=1e-10)
    assert float(ang[2]) == pytest.approx(180.0 / math.sqrt(2), abs=1e-10)
    # A plane within ~1e-3 of π (beyond the pure reflection's -1) goes to the SVD path.
    slow = torch.stack(
        [
            _rotation_with_planes(d, [math.pi - 1e-5], 710),
            _rotation_with_planes(d, [math.pi], 711),
            _rotation_with_planes(d, [math.pi, 0.5], 712, reflect=True),
        ]
    )
    _assert_same_magnitudes(torch.cat([fast, slow]))
    assert calls == [3]
    ang = drift_module._fast_drift_magnitudes(slow)[1]
    assert float(ang[0]) == pytest.approx(math.degrees(math.pi - 1e-5), abs=1e-10)
    assert float(ang[1]) == pytest.approx(180.0, abs=1e-10)


def test_fast_angles_one_dimension():
    q = torch.tensor([[[1.0]], [[-1.0]]], dtype=torch.float64)
    _assert_same_magnitudes(q)


def test_ill_conditioned_pair_takes_the_svd_path(monkeypatch):
    calls = _count_calls(monkeypatch, "polar_factors")
    d = 40
    well = _orthogonal(d, 800) @ _spd(d, 20.0, 801)
    ill = _orthogonal(d, 802) @ _spd(d, 1e5, 803)  # sigma_min / sigma_max = 1e-5 < 1e-4
    mid = _orthogonal(d, 804) @ _spd(d, 5e3, 805)  # refined by one Newton-Schulz step
    m = torch.stack([well, ill, mid])
    q1, s1 = drift_module._fast_polar_factors(m, 1e-6, ["w", "i", "m"])
    assert calls == [1]
    q_ill, s_ill = polar_factors(ill.unsqueeze(0))
    torch.testing.assert_close(q1[1], q_ill[0], atol=1e-15, rtol=0)
    torch.testing.assert_close(s1[1], s_ill[0], atol=1e-15, rtol=0)
    q0, _ = polar_factors(m)
    torch.testing.assert_close(q1, q0, atol=1e-10, rtol=0)
    _assert_same_magnitudes(q1, q0)
    # A larger singular floor moves the cut-off with it (10 x floor): 'm' (2e-4) goes to the SVD.
    calls.clear()
    q2, _ = drift_module._fast_polar_factors(m[[0, 2]], 5e-5, ["w", "m"])
    assert calls == [1]
    torch.testing.assert_close(q2[1], polar_factors(mid.unsqueeze(0))[0][0], atol=1e-15, rtol=0)


def test_degenerate_pair_is_reported_as_by_the_svd_path():
    d = 6
    m = torch.stack(
        [
            _orthogonal(d, 900) @ _spd(d, 10.0, 901),
            _orthogonal(d, 902) @ torch.diag(torch.tensor([1.0, 1, 1, 1, 1, 1e-8], dtype=torch.float64)),
            _orthogonal(d, 903) @ torch.diag(torch.tensor([1.0, 1, 1, 1, 1, 1e-9], dtype=torch.float64)),
            torch.zeros(d, d, dtype=torch.float64),
        ]
    )
    labels = ["a|b", "a|c", "a|d", "a|e"]
    with pytest.raises(DegenerateProcrustes) as ref:
        polar_factors(m, singular_floor=1e-6, labels=labels)
    with pytest.raises(DegenerateProcrustes) as got:
        drift_module._fast_polar_factors(m, 1e-6, labels)
    assert got.value.details == ref.value.details
    assert got.value.details["pair"] == "a|c"
    with pytest.raises(DegenerateProcrustes) as zero:
        drift_module._fast_polar_factors(m[3:], 1e-6, labels[3:])
    assert zero.value.details["pair"] == "a|e"
    with pytest.raises(GaugeError):
        frame_drift({"a": _cloud(30, 4, 0), "b": _cloud(30, 4, 1)}, singular_floor=0.0)


def test_frame_drift_matches_per_pair_svd_reference(monkeypatch):
    from lensemble.gauge import procrustes_align

    d, n = 24, 96
    base = _cloud(n, d, 40)
    emb = {}
    for i in range(6):
        q = _orthogonal(d, 41 + i)
        if i % 3 == 0:
            q[:, 0] = -q[:, 0]
        emb[f"p{i}"] = base @ q + 0.02 * _cloud(n, d, 60 + i)
    emb["p6"] = emb["p0"] @ _rotation_with_planes(d, [1e-4], 70)  # small drift from p0
    emb["p7"] = emb["p1"] @ _rotation_with_planes(d, [math.pi], 71)  # half-turn from p1
    # sigma_min / sigma_max ~ 1e-3 against the others: the Newton-Schulz band.
    emb["p8"] = emb["p2"] * torch.logspace(0, -1.5, d, dtype=torch.float64)
    emb["p9"] = _cloud(n, d, 72) * torch.logspace(0, -2.5, d, dtype=torch.float64)  # ~1e-5: SVD
    emb["global"] = base
    polar_calls = _count_calls(monkeypatch, "polar_factors")
    angle_calls = _count_calls(monkeypatch, "geodesic_angle_deg")
    rep = frame_drift(emb)
    monkeypatch.undo()
    assert 0 < sum(polar_calls) < len(rep.pairwise_angle_deg) // 2
    assert 0 < sum(angle_calls) < len(rep.pairwise_angle_deg) // 2
    ratios = [
        float(s[-1] / s[0]) for s in (torch.linalg.svdvals(emb[k].T @ emb["p8"]) for k in ("p0", "p3", "p5"))
    ]
    assert all(1e-4 < r < 1e-2 for r in ratios)
    for key in rep.pairwise_angle_deg:
        a, b = key.split("|")
        q, fit = procrustes_align(emb[a], emb[b])
        fro, ang, refl = drift_magnitudes(q)
        assert rep.pairwise_residual[key] == pytest.approx(float(fro), abs=1e-9)
        assert rep.pairwise_angle_deg[key] == pytest.approx(float(ang), abs=1e-9)
        assert rep.pairwise_fit_residual[key] == pytest.approx(fit, abs=1e-6)
        assert (key in rep.reflected_pairs) == bool(refl)
    for k, v in rep.drift_from_global.items():
        q, fit = procrustes_align(emb[k], emb["global"])
        fro, ang, refl = drift_magnitudes(q)
        assert v.residual == pytest.approx(float(fro), abs=1e-9)
        assert v.angle_deg == pytest.approx(float(ang), abs=1e-9)
        assert v.reflection == bool(refl)
    assert rep.pairwise_angle_deg["p0|p6"] == pytest.approx(math.degrees(1e-4), abs=1e-9)
    again = frame_drift({k: v.clone() for k, v in reversed(list(emb.items()))})
    assert again.model_dump_json() == rep.model_dump_json()


# ---------------------------------------------------------------- variance-weighted misalignment
def _strong_weak(n=512, d=64, strong=12, weak_energy=0.004, seed=0):
    """Two frames identical in ``strong`` directions, independent noise in the other d - strong,
    which hold ``weak_energy`` of the total."""
    g = torch.Generator().manual_seed(seed)
    core = torch.randn(n, strong, generator=g, dtype=torch.float64)
    scale = math.sqrt(weak_energy / (1 - weak_energy) * strong / (d - strong))
    wx = scale * torch.randn(n, d - strong, generator=g, dtype=torch.float64)
    wy = scale * torch.randn(n, d - strong, generator=g, dtype=torch.float64)
    return torch.cat([core, wx], 1), torch.cat([core, wy], 1)


def test_identical_strong_directions_random_weak_ones_read_near_zero_weighted():
    from lensemble.gauge.drift import misalignment

    x, y = _strong_weak()
    m = misalignment(x, y)
    # The unweighted magnitudes are dominated by the 52 weak directions: a large "rotation".
    assert m.residual > 5.0 and m.angle_deg > 300.0
    # The weighted ones are not: the strong 12 directions agree, and they hold >= 95 % of the energy.
    assert m.subspace_rank <= 12
    assert m.subspace_angle_deg < 1.0 and m.subspace_tilt_deg < 5.0  # vs 530° unweighted
    assert m.relative_residual_before < 0.1 and m.fit_residual <= m.relative_residual_before
    # The known answer of the relative residual: ||X - Y||² = 2 × weak energy of one frame.
    expected = float(torch.linalg.matrix_norm(x - y) / torch.linalg.matrix_norm(y))
    assert m.relative_residual_before == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(math.sqrt(2 * 0.004), rel=0.15)


def test_a_rotation_within_the_strong_subspace_reads_its_angle_weighted():
    from lensemble.gauge.drift import misalignment

    x, y = _strong_weak(seed=1, weak_energy=0.001)
    r = _plane_rotation(64, {(0, 1): 40.0})
    m = misalignment(y @ r, y)  # the target's strong plane (0, 1) turned by 40°
    assert m.angle_deg == pytest.approx(40.0, abs=0.1)
    assert m.subspace_angle_deg == pytest.approx(40.0, abs=0.1)  # all of it inside S
    assert m.subspace_tilt_deg < 0.5                             # S maps onto itself
    assert m.fit_residual < 1e-6 and m.rotation_share == pytest.approx(1.0, abs=1e-9)
    # ||X - Y||_F / ||Y||_F for a plane turned by θ: 2 sin(θ/2) × the plane's share of the norm.
    share = float((y[:, :2] ** 2).sum() / (y**2).sum())
    assert m.relative_residual_before == pytest.approx(2 * math.sin(math.radians(20)) * math.sqrt(share), rel=1e-6)


def test_a_rotation_out_of_the_strong_subspace_is_tilt_not_within_angle():
    from lensemble.gauge.drift import misalignment

    x, y = _strong_weak(seed=2, weak_energy=0.001)
    r = _plane_rotation(64, {(0, 40): 30.0})  # strong axis 0 turned towards weak axis 40
    m = misalignment(y @ r, y)
    assert m.angle_deg == pytest.approx(30.0, abs=0.1)
    assert m.subspace_tilt_deg == pytest.approx(30.0, abs=0.5)
    assert m.subspace_angle_deg < 0.5


def test_weighted_fields_are_recorded_per_pair_and_summarised():
    emb, _ = _sites()
    rep = frame_drift(emb, probe_subset={"role": "measurement", "hash": "h"})
    assert rep.probe_subset == {"role": "measurement", "hash": "h"} and rep.subspace_variance == 0.95
    for table in (rep.pairwise_relative_residual_before, rep.pairwise_rotation_share,
                  rep.pairwise_subspace_angle_deg, rep.pairwise_subspace_tilt_deg, rep.pairwise_subspace_rank):
        assert list(table) == list(rep.pairwise_angle_deg)
    assert rep.mean_pairwise_fit_residual == pytest.approx(
        sum(rep.pairwise_fit_residual.values()) / 3)
    assert FrameDriftReport.model_validate_json(rep.model_dump_json()) == rep
    with pytest.raises(ConfigError):
        frame_drift(emb, variance=0.0)


# ------------------------------------------------ degenerate pairs: degenerate="mask" (identification)
def _dead_weak(n=256, d=64, strong=8, weak_scale=1e-9, seed=0):
    """A frame whose d - strong weak directions are ~1e-9 of the strong ones (a latent with dead
    directions, as trained SIGReg encoders have): every cross-covariance with another such frame
    has sigma_min / sigma_max ~ 1e-18, far below the 1e-10 floor. Returns (frame, fresh weak noise)."""
    g = torch.Generator().manual_seed(seed)
    core = torch.randn(n, strong, generator=g, dtype=torch.float64) * torch.linspace(1.2, 1.0, strong,
                                                                                  dtype=torch.float64)
    weak = lambda: weak_scale * torch.randn(n, d - strong, generator=g, dtype=torch.float64)  # noqa: E731
    return torch.cat([core, weak()], 1), weak


def test_mask_mode_measures_the_identified_subspace_of_a_degenerate_pair():
    y, weak = _dead_weak()
    x = y @ _plane_rotation(64, {(0, 1): 25.0})
    x = torch.cat([x[:, :8], weak()], 1)  # its own dead directions: the full rotation is arbitrary there
    emb = {"site": x, "global": y}
    with pytest.raises(DegenerateProcrustes):
        frame_drift(emb, singular_floor=1e-10)
    rep = frame_drift(emb, singular_floor=1e-10, degenerate="mask")
    v = rep.drift_from_global["site"]
    assert rep.degenerate_pairs == ["site|global"]
    assert v.angle_deg is None and v.residual is None and rep.mean_global_angle_deg is None
    # The strong plane's 25° is identified, whatever Q does on the 56 dead directions.
    assert v.subspace_angle_deg == pytest.approx(25.0, abs=1e-6) and v.subspace_tilt_deg < 1e-4  # acos near 1: ~1e-5°
    assert v.fit_residual < 1e-6 and v.rotation_share == pytest.approx(1.0, abs=1e-9)
    metrics = rep.summary_metrics()
    assert "gauge/drift_angle_deg" not in metrics  # unmeasured stays unmeasured, never a number
    assert metrics["gauge/drift_subspace_angle_deg"] == pytest.approx(25.0, abs=1e-6)
    assert FrameDriftReport.model_validate_json(rep.model_dump_json()) == rep


def test_mask_mode_refuses_a_subspace_angle_the_null_space_can_reach():
    # Adversarial: the source lacks one of the target's strong directions altogether, so the
    # arbitrary part of Q lands inside the target's principal subspace: no subspace number.
    y, weak = _dead_weak(seed=3)
    x = y.clone()
    x[:, 0] = 0.0
    # At the default floor (1e-6) the lost direction is below it (sigma ~4e-10 relative, from the
    # 1e-9 weak noise); at 1e-10 it would count as identified, which is what a floor means.
    rep = frame_drift({"site": x, "global": y}, degenerate="mask")
    v = rep.drift_from_global["site"]
    assert rep.degenerate_pairs == ["site|global"]
    assert v.subspace_angle_deg is None and v.subspace_tilt_deg is None and v.angle_deg is None
    assert v.relative_residual_before > 0.1  # the singular-value numbers stay measured
    assert "gauge/drift_subspace_angle_deg" not in rep.summary_metrics()


def test_mask_mode_leaves_identifiable_pairs_bit_for_bit_and_means_none_if_any_unmeasured():
    emb, _ = _sites()
    assert frame_drift(emb, degenerate="mask").model_dump_json() == frame_drift(emb).model_dump_json()
    y, weak = _dead_weak(n=48, d=6, strong=3, seed=5)
    healthy = {k: v for k, v in emb.items()}
    mixed = {**healthy, "z_dead": y}
    rep = frame_drift(mixed, degenerate="mask")
    ref = frame_drift(healthy)
    assert rep.degenerate_pairs and all("z_dead" in p for p in rep.degenerate_pairs)
    for pair, angle in ref.pairwise_angle_deg.items():
        assert rep.pairwise_angle_deg[pair] == angle  # same bits as without the dead site
    assert rep.mean_pairwise_angle_deg is None and rep.max_pairwise_angle_deg is None
    with pytest.raises(ConfigError):
        frame_drift(emb, degenerate="ignore")
