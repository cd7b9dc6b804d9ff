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
    assert set(m) == {"gauge/drift_angle_deg", "gauge/procrustes_residual", "gauge/effective_dim"}


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
