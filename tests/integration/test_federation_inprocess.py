"""The federated round logic end to end in one process (no Flower): rungs, resume, faults, DP.

Faults come from :mod:`lensemble.federation.faults` (``run_inprocess(fail=...)`` or
``participant=faulty(...)``); each case of issue 15 has its test here or beside it.
"""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.errors import (
    CheckpointIntegrityError,
    ConfigError,
    FaultToleranceExceeded,
    FolderInUse,
    PrivacyBudgetExceeded,
    ProbeError,
)
from lensemble.federation import coordinator as coordinator_module
from lensemble.federation import participant as participant_module
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.faults import faulty
from lensemble.federation.inprocess import run_inprocess
from lensemble.federation.participant import participant_round
from lensemble.federation.privacy import PrivacyLedger
from lensemble.federation.validation import DP_RELEASED_METRICS


@pytest.fixture(scope="module")
def shared(micro_warm_start):
    base, root, _ = micro_warm_start("fed")  # one warm start for every run in this module
    return base, root


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
    for row in rows:
        # Every round measures drift: a degenerate full rotation is flagged and its angle left out,
        # while the rotation share (singular values only) is always there.
        assert row["gauge/drift_degenerate"] in (0, 1) and "gauge/drift_rotation_share" in row
        if row["gauge/drift_degenerate"] == 0:
            assert "gauge/drift_angle_deg" in row
        report = json.loads((tmp_path / rung / "drift" / f"round-{row['round']:04d}.json").read_text())
        assert bool(report["degenerate_pairs"]) == bool(row["gauge/drift_degenerate"])
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
    # case 6: only the class and code of a participant's error reach the coordinator, never its
    # text (which could hold private values): in summary.json and in every state header
    assert summary["rounds"][0]["dropped"]["silo-1"] == "failed: RoundError [round_failed]"
    assert summary["rounds"][1]["dropped"]["silo-0"] == "did not reply within 600 s"
    on_disk = (tmp_path / "f" / "summary.json").read_text()
    state = (tmp_path / "f" / "rounds" / "round-0001" / "state" / "header.json").read_text()
    for text in (on_disk, state):
        assert "injected" not in text and "partition 1" not in text


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


# -- case 1: DP bounds everything a silo releases ---------------------------------------------------


class _Recorder:
    """A participant that keeps every reply it sends (what the coordinator gets to see)."""

    def __init__(self):
        self.replies = []

    def __call__(self, *args):
        reply = participant_round(*args)
        self.replies.append(reply)
        return reply


def test_dp_reply_carries_only_the_noised_delta(shared, tmp_path):
    cfg = _cfg(shared, "privacy=dp", "gauge=backstop", "federation.rounds=1")
    seen = _Recorder()
    summary = run_inprocess(cfg, tmp_path / "dp", progress=False, participant=seen)
    assert len(seen.replies) == 2
    for reply in seen.replies:
        # the probe embeddings, losses, pre-clip norm and backstop fit are withheld
        assert reply.probe_embeddings.shape == (0, cfg.model.latent_dim)
        assert set(reply.metrics) <= DP_RELEASED_METRICS
        assert reply.metrics["dp/releases"] == 1
    last = summary["rounds"][-1]
    assert "loss/pred" not in last and "gauge/pairwise_angle_deg" not in last  # no per-silo drift
    assert last["dp/epsilon"] == pytest.approx(PrivacyLedger(1.0, delta=1e-5).epsilon_for(1))


def test_dp_refuses_the_rung_that_needs_participant_embeddings(shared, tmp_path):
    cfg = _cfg(shared, "privacy=dp", "gauge=distill")
    with pytest.raises(ConfigError, match="gauge.distill"):
        run_inprocess(cfg, tmp_path / "dd", progress=False)
    assert not (tmp_path / "dd" / "rounds").exists()


def test_dp_ledger_records_a_release_before_it_exists(shared, tmp_path, monkeypatch):
    cfg = _cfg(shared, "privacy=dp", "federation.rounds=1")

    def dies_while_releasing(*a, **k):
        raise KeyboardInterrupt("participant killed while noising")

    monkeypatch.setattr(participant_module, "participant_pipeline", dies_while_releasing)
    with pytest.raises(KeyboardInterrupt):
        run_inprocess(cfg, tmp_path / "r", progress=False)
    ledger = json.loads((tmp_path / "r" / "nodes" / "silo-0" / "dp-ledger.json").read_text())
    assert sum(n for _, _, n in ledger["history"]) == 1


def test_dp_epsilon_after_kill_and_resume_is_the_silos_real_count(shared, tmp_path, monkeypatch):
    """Killed after the participants released round 1: the re-sent round 1 is a 4th release."""
    cfg = _cfg(shared, "privacy=dp", "privacy.target_epsilon=30", "federation.rounds=3")
    real_close = Coordinator.close_round

    def dies_in_round_1(self, t, *a, **k):
        if t == 1:
            raise KeyboardInterrupt("coordinator killed")
        return real_close(self, t, *a, **k)

    monkeypatch.setattr(Coordinator, "close_round", dies_in_round_1)
    with pytest.raises(KeyboardInterrupt):
        run_inprocess(cfg, tmp_path / "k", progress=False)
    monkeypatch.setattr(Coordinator, "close_round", real_close)
    summary = run_inprocess(cfg, tmp_path / "k", progress=False)
    counts = []
    for silo in ("silo-0", "silo-1"):
        hist = json.loads((tmp_path / "k" / "nodes" / silo / "dp-ledger.json").read_text())["history"]
        counts.append(sum(n for _, _, n in hist))
    assert counts == [4, 4]
    real = PrivacyLedger(cfg.privacy.noise_multiplier, delta=cfg.privacy.delta).epsilon_for(max(counts))
    assert summary["rounds"][-1]["dp/epsilon"] == pytest.approx(real, rel=1e-12)
    assert summary["rounds"][-1]["dp/releases_bound"] == 4


# -- case 2: one process per run folder and per participant state folder ----------------------------

_HOLD = """
import sys, time
from lensemble.federation.locks import lock_folder
lock_folder(sys.argv[1], what="test holder")
print("holding", flush=True)
time.sleep(120)
"""


def _holder(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def _first_run(cfg, run_dir, ready) -> None:
    # a forked child (torch already imported): a real Coordinator holds the run folder
    Coordinator(cfg, run_dir, progress=False)
    ready.set()
    time.sleep(120)


def test_second_run_on_a_run_folder_is_refused_with_the_holders_pid(shared, tmp_path):
    """A second run on the folder of a live first one is refused, naming its PID and command."""
    import multiprocessing

    cfg = _cfg(shared)
    run_dir = tmp_path / "busy"
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    first = ctx.Process(target=_first_run, args=(cfg, run_dir, ready), daemon=True)
    first.start()
    try:
        assert ready.wait(120), "the first run did not start"
        before = sorted(p.name for p in run_dir.iterdir())
        with pytest.raises(FolderInUse) as info:
            run_inprocess(cfg, run_dir, progress=False)
        assert f"PID {first.pid} (" in info.value.message and "pytest" in info.value.message
        assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing written by the second
    finally:
        first.kill()
        first.join()
    run_inprocess(cfg, run_dir, progress=False)  # the kernel dropped the lock with its holder


def test_participant_state_folder_is_locked_and_owned(shared, tmp_path):
    state = tmp_path / "state"
    cfg = _cfg(shared, "federation.min_participants=1", "federation.rounds=1",
               f"federation.state_dir={state}", "federation.round_retries=0")
    holder = _holder(state / "silo-1")
    try:
        summary = run_inprocess(cfg, tmp_path / "a", progress=False)
    finally:
        holder.kill()
        holder.wait()
    assert summary["rounds"][0]["dropped"] == {"silo-1": "failed: FolderInUse [folder_in_use]"}
    # the state folders now belong to run "a": another run pointed at them is refused
    with pytest.raises(FaultToleranceExceeded, match="FolderInUse"):
        run_inprocess(_cfg(shared, "federation.rounds=1", f"federation.state_dir={state}",
                           "federation.round_retries=0"), tmp_path / "b", progress=False)


# -- case 3: a hung participant costs one deadline, never a hang ------------------------------------


def test_hung_participant_costs_one_deadline_in_process(shared, tmp_path):
    """`--engine inprocess` honours federation.round_timeout_s: a participant that never returns
    costs round 0 one deadline and is not asked again while it runs."""
    cfg = _cfg(shared, "federation.min_participants=1", "federation.rounds=3", "federation.round_timeout_s=6")
    hung = faulty(participant_round, {(0, 1): "hang"}, hang_s=90)
    start = time.monotonic()
    summary = run_inprocess(cfg, tmp_path / "h", progress=False, participant=hung)
    elapsed = time.monotonic() - start
    dropped = [r["dropped"] for r in summary["rounds"]]
    assert dropped[0] == {"silo-1": "did not reply within 6 s"}
    for d in dropped[1:]:  # never asked again while its first call runs
        assert d["silo-1"].startswith("is still busy with round 0")
    assert [r["fed/participants"] for r in summary["rounds"]] == [1, 1, 1]
    assert elapsed < 6 + 30, elapsed  # one deadline plus three healthy rounds, not the 90 s hang


# -- case 4: bad probe embeddings cost that reply only ----------------------------------------------


@pytest.mark.parametrize("fault", ["nan-embeddings", "wrong-shape-embeddings", "nan-delta", "wrong-round"])
def test_a_bad_reply_drops_only_that_participant(shared, tmp_path, fault):
    cfg = _cfg(shared, "federation.min_participants=1", "federation.rounds=1", "gauge=backstop")
    summary = run_inprocess(cfg, tmp_path / fault, progress=False, fail={(0, 1): fault})
    (row,) = summary["rounds"]
    assert row["fed/participants"] == 1 and list(row["dropped"]) == ["silo-1"]
    why = row["dropped"]["silo-1"]
    assert why.startswith("sent an unusable reply")
    expect = {"nan-embeddings": "non-finite", "wrong-shape-embeddings": "shape", "nan-delta": "non-finite",
              "wrong-round": "wrong round"}[fault]
    assert expect in why


# -- case 5: resume verifies what it finds ----------------------------------------------------------


def _killed_at(cfg, run_dir, monkeypatch, t_kill):
    real_close = Coordinator.close_round

    def dies(self, t, *a, **k):
        if t == t_kill:
            raise KeyboardInterrupt("coordinator killed")
        return real_close(self, t, *a, **k)

    monkeypatch.setattr(Coordinator, "close_round", dies)
    with pytest.raises(KeyboardInterrupt):
        run_inprocess(cfg, run_dir, progress=False)
    monkeypatch.setattr(Coordinator, "close_round", real_close)


def test_resume_refuses_a_remade_probe_and_keeps_the_manifest(shared, tmp_path, monkeypatch):
    cfg = _cfg(shared)
    run_dir = tmp_path / "p"
    _killed_at(cfg, run_dir, monkeypatch, 1)
    manifest = (run_dir / "manifest.json").read_bytes()
    real_ensure, real_frames = coordinator_module.ensure_data, coordinator_module.probe_frames
    from lensemble.data.probe import probe_hash

    def remade(cfg, progress=True):
        folder, summary = real_ensure(cfg, progress=progress)
        frames = real_frames(str(folder), summary["probe"]["content_hash"]).clone()
        frames[0, 0, 0, 0] ^= 1
        remade.frames = frames
        return folder, {**summary, "probe": {**summary["probe"], "content_hash": probe_hash(frames)}}

    monkeypatch.setattr(coordinator_module, "ensure_data", remade)
    monkeypatch.setattr(coordinator_module, "probe_frames", lambda folder, h: remade.frames)
    with pytest.raises(ProbeError, match="round-0000 was measured on probe"):
        run_inprocess(cfg, run_dir, progress=False)
    assert (run_dir / "manifest.json").read_bytes() == manifest


def test_resume_refuses_a_stale_coordinator_state(shared, tmp_path, monkeypatch):
    cfg = _cfg(shared, "gauge=backstop", "federation.rounds=3")
    run_dir = tmp_path / "s"
    _killed_at(cfg, run_dir, monkeypatch, 2)
    rounds = run_dir / "rounds"
    shutil.rmtree(rounds / "round-0001" / "state")
    shutil.copytree(rounds / "round-0000" / "state", rounds / "round-0001" / "state")
    with pytest.raises(CheckpointIntegrityError, match="coordinator state of round 0"):
        run_inprocess(cfg, run_dir, progress=False)
    shutil.rmtree(rounds / "round-0000")  # a gap in the chain
    with pytest.raises(CheckpointIntegrityError, match="chain is broken"):
        run_inprocess(cfg, run_dir, progress=False)


def test_resume_reuses_the_warm_start_and_checks_its_hash(shared, tmp_path, monkeypatch):
    base, _ = shared
    cfg = load_config([o for o in base if not o.startswith("federation.warmstart")])
    run_dir = tmp_path / "w"
    _killed_at(cfg, run_dir, monkeypatch, 1)  # trains the warm start inside the run folder

    def no_retraining(*a, **k):
        raise AssertionError("the warm start was trained again on resume")

    monkeypatch.setattr(coordinator_module, "train_warmstart", no_retraining)
    summary = run_inprocess(cfg, run_dir, progress=False)
    assert summary["rounds_completed"] == cfg.federation.rounds
    # a warm start that is not the one the rounds chain to (re-made in the run folder, internally
    # consistent) is refused, not trained on
    from lensemble.artifacts.checkpoint import save_checkpoint

    ws_dir = run_dir / "warmstart" / "checkpoints" / f"step-{cfg.train.warmstart_steps:06d}"
    ws = load_checkpoint(ws_dir)
    tensors = dict(ws.tensors)
    name = sorted(k for k, v in tensors.items() if v.is_floating_point())[0]
    tensors[name] = tensors[name] + 1e-3
    h = ws.header
    new_hash = save_checkpoint(ws_dir, tensors, kind=h["kind"], round_index=h["round_index"],
                               parent_hash=h["parent_hash"], config_hash=h["config_hash"],
                               architecture=h["architecture"], extra=h["extra"])
    result = json.loads((run_dir / "warmstart" / "result.json").read_text())
    (run_dir / "warmstart" / "result.json").write_text(json.dumps({**result, "checkpoint_hash": new_hash}))
    with pytest.raises(ConfigError, match="chains to warm start"):
        run_inprocess(cfg, run_dir, progress=False)
