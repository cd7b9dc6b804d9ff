"""The federated round logic end to end in one process (no Flower): rungs, resume, faults, DP."""

import json

import pytest

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.errors import FaultToleranceExceeded, PrivacyBudgetExceeded
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.inprocess import run_inprocess


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("fed")
    base = ["experiment=micro", f"data.root={root / 'data'}"]
    # One warm start for every run in this module, as a study shares it.
    from lensemble.training.warmstart import train_warmstart

    ws = train_warmstart(load_config(base), run_dir=root / "warmstart", progress=False)
    return base + [f"federation.warmstart={ws.checkpoint_dir}"], root


def _cfg(shared, *extra):
    base, root = shared
    return load_config(base + list(extra))


@pytest.mark.parametrize("rung", ["naive", "backstop", "anchor", "distill"])
def test_rungs_run_and_chain_checkpoints(shared, tmp_path, rung):
    cfg = _cfg(shared, f"gauge={rung}")
    summary = run_inprocess(cfg, tmp_path / rung, progress=False)
    assert summary["rounds_completed"] == cfg.federation.rounds
    r0 = load_checkpoint(tmp_path / rung / "rounds" / "round-0000" / "model")
    r1 = load_checkpoint(tmp_path / rung / "rounds" / "round-0001" / "model")
    assert r0.header["parent_hash"] == summary["warmstart_hash"]
    assert r1.header["parent_hash"] == r0.content_hash and r1.content_hash == summary["final_hash"]
    rows = [json.loads(x) for x in (tmp_path / rung / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    for key in ("fed/participants", "fed/comm_bytes", "fed/round_seconds", "fed/quant_ratio", "dp/epsilon"):
        assert key in rows[-1]
    assert rows[-1]["fed/participants"] == 2
    if rung == "distill":
        # The micro model's frames can be too degenerate for a consensus; then the round says so.
        ran = "gauge/distill_loss_after" in rows[-1]
        assert ran or rows[-1]["gauge/distill_skipped"] == 1
        if ran:
            assert rows[-1]["gauge/distill_loss_after"] <= rows[-1]["gauge/distill_loss_before"]


def test_killed_coordinator_resumes_bitwise(shared, tmp_path, monkeypatch):
    cfg = _cfg(shared, "gauge=backstop", "federation.rounds=3")
    straight = run_inprocess(cfg, tmp_path / "straight", progress=False)

    real_close = Coordinator.close_round

    def dies_in_round_1(self, t, *a, **k):
        if t == 1:  # participants already trained round 1 and saved their inner state
            raise KeyboardInterrupt("coordinator killed")
        return real_close(self, t, *a, **k)

    monkeypatch.setattr(Coordinator, "close_round", dies_in_round_1)
    with pytest.raises(KeyboardInterrupt):
        run_inprocess(cfg, tmp_path / "killed", progress=False)
    monkeypatch.setattr(Coordinator, "close_round", real_close)
    resumed = run_inprocess(cfg, tmp_path / "killed", progress=False)
    assert resumed["final_hash"] == straight["final_hash"]


def test_participant_crash_or_timeout_costs_its_update(shared, tmp_path):
    cfg = _cfg(shared, "federation.min_participants=1")
    summary = run_inprocess(cfg, tmp_path / "f", progress=False, fail={(0, 1): "crash", (1, 0): "timeout"})
    assert [r["fed/participants"] for r in summary["rounds"]] == [1, 1]
    assert "injected crash" in summary["rounds"][0]["dropped"]["silo-1"]
    assert "deadline" in summary["rounds"][1]["dropped"]["silo-0"]


def test_below_quorum_retries_then_stops(shared, tmp_path):
    cfg = _cfg(shared, "federation.min_participants=2", "federation.round_retries=1")
    with pytest.raises(FaultToleranceExceeded):
        run_inprocess(cfg, tmp_path / "q", progress=False, fail={(0, 1): "crash"})
    assert not (tmp_path / "q" / "rounds" / "round-0000").exists()  # nothing committed


def test_dp_budget_stops_before_release(shared, tmp_path):
    cfg = _cfg(shared, "privacy=dp", "privacy.noise_multiplier=2.0", "privacy.target_epsilon=3.0")
    with pytest.raises(PrivacyBudgetExceeded):
        run_inprocess(cfg, tmp_path / "dp", progress=False)
    # the first round fit the budget and was committed with its epsilon
    rows = [json.loads(x) for x in (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["dp/epsilon"] == pytest.approx(2.17, abs=0.01) and len(rows) == 1
    # fixed tensors (input standardisation) are never federated, so DP noise cannot move them
    import torch

    warm = load_checkpoint(cfg.federation.warmstart)
    r0 = load_checkpoint(tmp_path / "dp" / "rounds" / "round-0000" / "model")
    for key in ("encoder.pixel_mean", "encoder.pixel_std"):
        assert torch.equal(r0.tensors[key], warm.tensors[key])
    assert not torch.equal(r0.tensors["encoder.frame.weight"], warm.tensors["encoder.frame.weight"])


def test_int8_quantised_updates(shared, tmp_path):
    cfg = _cfg(shared, "federation.quantize_int8=true")
    summary = run_inprocess(cfg, tmp_path / "q8", progress=False)
    assert summary["rounds"][-1]["fed/quant_ratio"] > 3.9


def test_drift_on_checkpoints_recovers_a_known_rotation(shared, tmp_path):
    import torch

    from lensemble.artifacts.checkpoint import save_checkpoint
    from lensemble.data.store import ensure_data
    from lensemble.errors import CheckpointIntegrityError, ProbeError
    from lensemble.gauge.checkpoint_drift import drift_between_checkpoints
    from lensemble.gauge.drift import geodesic_angle_deg
    from lensemble.model.world_model import architecture, build_world_model, rotate_latent_basis_

    cfg = _cfg(shared)
    folder, summary = ensure_data(cfg, progress=False)
    probe, probe_hash = folder / summary["probe"]["path"], summary["probe"]["content_hash"]
    d = cfg.model.latent_dim
    a = build_world_model(cfg.model, init_seed=3)
    with torch.no_grad():  # spread the frame so the probe embeddings are well conditioned
        a.encoder.frame.weight.copy_(torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(0)))[0])
    q = torch.linalg.matrix_exp(0.2 * (lambda m: m - m.T)(torch.randn(d, d, generator=torch.Generator().manual_seed(1))))
    b = build_world_model(cfg.model, init_seed=3)
    b.load_state_dict(a.state_dict())
    rotate_latent_basis_(b, q)
    ckpts = []
    for name, m in (("a", a), ("b", b)):
        save_checkpoint(tmp_path / name, m.state_dict(), kind="world_model", architecture=architecture(cfg.model),
                        extra={"probe_hash": probe_hash})
        ckpts.append(tmp_path / name)
    floor = cfg.gauge.singular_floor
    r1 = drift_between_checkpoints(ckpts, probe, singular_floor=floor)
    r2 = drift_between_checkpoints(ckpts, probe, singular_floor=floor)
    assert r1.model_dump_json() == r2.model_dump_json()
    (angle,) = r1.pairwise_angle_deg.values()
    assert angle == pytest.approx(float(geodesic_angle_deg(q.double())), rel=1e-3)
    with pytest.raises(ProbeError):
        drift_between_checkpoints(ckpts, probe, expected_probe_hash="0" * 64, singular_floor=floor)
    weights = ckpts[1] / "weights.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-3] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointIntegrityError):
        drift_between_checkpoints(ckpts, probe, singular_floor=floor)


def test_fork_a_federates_the_predictor_only(shared, tmp_path):
    import torch

    cfg = _cfg(shared, "model.encoder_frozen=true")
    summary = run_inprocess(cfg, tmp_path / "fa", progress=False)
    warm = load_checkpoint(cfg.federation.warmstart)
    final = load_checkpoint(summary["final_checkpoint"])
    enc = [k for k in final.tensors if k.startswith("encoder.")]
    pred = [k for k in final.tensors if k.startswith("predictor.")]
    assert all(torch.equal(final.tensors[k], warm.tensors[k]) for k in enc)
    assert any(not torch.equal(final.tensors[k], warm.tensors[k]) for k in pred)
