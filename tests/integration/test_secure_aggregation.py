"""Secure aggregation (Flower SecAgg+) under the DiLoCo outer step.

- Protocol level, on the in-process grid with Flower's real ``secaggplus_mod`` and
  ``SecAggPlusWorkflow`` and a participant whose updates are known: the secure sum equals the
  plaintext sum within C·q, the outer step on it matches the plaintext step within its bound,
  dropouts after sharing keys above and below the threshold, and nothing the server receives holds
  an individual update.
- The real stack on ``experiment=micro`` (flower-inprocess engine): a secure run against the
  plaintext run, the coordinator refusing individual updates and a broken sum, the in-process
  engine refusing the option.
- One secure run through a real SuperLink with two SuperNodes on loopback (slow).
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from pathlib import Path

import flower_processes as sl
import numpy as np
import pytest
import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.errors import ConfigError, ResidencyViolation, SecureAggregationAborted, SecureSumRejected
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.flower.client_app import make_client_app
from lensemble.federation.flower.local_grid import LocalGrid
from lensemble.federation.flower.secagg import STAGES, SecureGridAsk
from lensemble.federation.flower.transport import GridAsk
from lensemble.federation.inprocess import run_inprocess
from lensemble.federation.messages import NodeSpec, Reply
from lensemble.federation.outer import OuterOptimizer
from lensemble.federation.secure_agg import SecAggSettings, SecureSum, outer_error_bound
from lensemble.federation.simulation import run_on_local_grid

ROOT = Path(__file__).resolve().parents[2]
N = 200  # coordinates of the test "model": enough for a leak to show as correlation
# c = 1, b = 16: q = 3.1e-5, large enough that the quantisation error is visible in every sum; B = c·√N:
# the known updates are uniform draws, not AdamW steps, so the run's step bound (the default B) does not hold them
SECURE = ["federation.secure_aggregation=true", "federation.secagg_clip_range=1", "federation.secagg_bits=16",
          f"federation.secagg_max_norm={N ** 0.5}"]


def known_delta(partition: int, t: int) -> np.ndarray:
    """The update participant ``partition`` releases in round ``t``: uniform in [-0.9, 0.9]."""
    return np.random.default_rng([partition, t]).uniform(-0.9, 0.9, N).astype(np.float32)


def known_participant(cfg, node: NodeSpec, global_arrays, round_config, extras=None) -> Reply:
    t = int(round_config["round"])
    if node.partition_id in json.loads(round_config.get("drop", "[]")):
        raise RuntimeError("this site drops out after sharing its keys")
    if node.partition_id in json.loads(round_config.get("hang", "[]")):
        time.sleep(6.0)  # past the deadline: its masked vector never arrives
    return Reply(t, {"fp32": known_delta(node.partition_id, t)}, np.full((4, 2), 1.0, np.float32),
                 {"loss/pred": 0.5})


def _ask(num_nodes: int, overrides: list[str], *, drop=(), hang=(), observe=None, t: int = 0,
         deadline_s: float = 30.0):
    cfg = load_config(["experiment=micro", f"data.num_silos={num_nodes}", *SECURE, *overrides])
    app = make_client_app(known_participant, run_config={"node-state-dir": tempfile.mkdtemp(prefix="secagg-nodes-")},
                          federated=lambda _cfg: frozenset({"w"}))
    round_config = {"round": t, "config-json": cfg.model_dump_json(), "drop": json.dumps(list(drop)),
                    "hang": json.dumps(list(hang))}
    with LocalGrid(app, num_nodes) as grid:
        answers = SecureGridAsk(grid, cfg, observe=observe)(t, round_config, {"w": np.zeros(N, np.float32)}, {},
                                                            deadline_s)
    return cfg, answers


def _plain_sum(partitions, t: int = 0) -> np.ndarray:
    return np.sum([known_delta(p, t).astype(np.float64) for p in partitions], axis=0)


def test_secure_sum_equals_the_plaintext_sum_within_the_bound():
    cfg, answers = _ask(3, [])
    s = SecAggSettings.from_config(cfg.federation)
    secure = answers.secure_sum
    assert secure.contributors == ("silo-0", "silo-1", "silo-2") and answers.failures == {}
    error = np.abs(secure.total - _plain_sum(range(3)))
    assert 0 < error.max() <= s.sum_error_bound(3)  # stochastic rounding: some error, never above C·q
    assert dict(secure.stages) == {stage: 3 for stage in STAGES}
    assert {r.metrics["loss/pred"] for r in answers.replies.values()} == {0.5}


def test_the_outer_step_on_the_secure_sum_matches_the_plaintext_step_within_its_bound():
    cfg, answers = _ask(3, [])
    f, s = cfg.federation, SecAggSettings.from_config(cfg.federation)
    rng = np.random.default_rng(3)
    start = {"w": torch.from_numpy(rng.normal(size=N).astype(np.float32))}
    warm = {"w": torch.from_numpy(rng.normal(scale=0.1, size=N).astype(np.float32))}  # a velocity to carry
    plain_mean = {"w": torch.from_numpy((_plain_sum(range(3)) / 3).astype(np.float32))}
    secure_mean = {"w": torch.from_numpy((answers.secure_sum.total / 3).astype(np.float32))}
    after = {}
    for name, mean in (("plain", plain_mean), ("secure", secure_mean)):
        opt = OuterOptimizer(start, lr=f.outer_lr, momentum=f.outer_momentum, nesterov=f.nesterov)
        opt.commit(warm, expected=opt.preview(warm))
        opt.commit(mean, expected=opt.preview(mean))
        after[name] = opt.params["w"].double().numpy()
    # the means are each rounded to fp32 (one ulp between them at most), the new parameters too
    mean_bound = s.mean_error_bound() + float(np.spacing(np.float32(plain_mean["w"].abs().max())))
    bound = outer_error_bound(mean_bound, 1, lr=f.outer_lr, momentum=f.outer_momentum, nesterov=f.nesterov)
    bound += float(np.spacing(np.float32(np.abs(after["plain"]).max())))
    gap = np.abs(after["secure"] - after["plain"]).max()
    assert 0 < gap <= bound


def test_the_server_never_receives_an_individual_update():
    seen: list[tuple[str, object]] = []
    _, answers = _ask(3, [], observe=lambda stage, msg: seen.append((stage, msg.content)))
    assert {stage for stage, _ in seen} == set(STAGES) and len(seen) == 4 * 3
    plain = [known_delta(p, 0) for p in range(3)]
    masked = []
    for stage, content in seen:
        for name, rec in content.array_records.items():  # only the public probe is an array
            assert name == "probe" or len(rec) == 0, (stage, name)
        for rec in content.config_records.values():
            for value in rec.values():
                blobs = value if isinstance(value, list) else [value]
                for blob in (b for b in blobs if isinstance(b, bytes)):
                    for d in plain:
                        assert d.tobytes() not in blob and d.astype(np.float64).tobytes() not in blob
        if stage == "collect masked vectors":
            vec = np.load(io.BytesIO(content.config_records["secaggplus_configs"]["masked_params"][1]))
            masked.append(vec.astype(np.float64))
    assert len(masked) == 3
    for vec in masked:  # a masked vector looks uniform: it tells nothing about any update
        for d in plain:
            assert abs(np.corrcoef(vec, d)[0, 1]) < 0.5
    assert all(r.payload == {} for r in answers.replies.values())


@pytest.mark.parametrize("threshold, completes", [(2, True), (3, False)])
def test_a_dropout_after_sharing_keys(threshold, completes):
    """Three sites, one fails in the round after it has shared its keys: with t = 2 the two others
    still make a sum (the dropout's pairwise masks are rebuilt from their shares), with t = 3 the
    round fails closed."""
    overrides = [f"federation.secagg_threshold={threshold}", "federation.min_participants=2"]
    if not completes:
        with pytest.raises(SecureAggregationAborted, match=r"stage 'collect masked vectors'.*threshold is 3"):
            _ask(3, overrides, drop=[2])
        return
    cfg, answers = _ask(3, overrides, drop=[2])
    s = SecAggSettings.from_config(cfg.federation)
    assert answers.secure_sum.contributors == ("silo-0", "silo-1")
    assert np.abs(answers.secure_sum.total - _plain_sum([0, 1])).max() <= s.sum_error_bound(2)
    (why,) = answers.failures.values()
    assert "dropped out at stage 'collect masked vectors'" in why and "ParticipantFailed" in why


def test_a_site_that_hangs_after_sharing_keys_costs_one_deadline():
    start = time.monotonic()
    cfg, answers = _ask(3, [], hang=[1], deadline_s=2.0)
    assert answers.secure_sum.contributors == ("silo-0", "silo-2")
    assert np.abs(answers.secure_sum.total - _plain_sum([0, 2])).max() <= \
        SecAggSettings.from_config(cfg.federation).sum_error_bound(2)
    (why,) = answers.failures.values()
    assert "did not reply within 2 s" in why
    assert time.monotonic() - start < 30


def test_a_hung_site_is_not_asked_again_while_it_is_busy():
    """Round 0: site 1 hangs past the 2 s deadline. Round 1, at once: it is still busy, so it is not
    asked (no stage waits on it) and the round goes ahead with the others."""
    cfg = load_config(["experiment=micro", "data.num_silos=3", *SECURE])
    app = make_client_app(known_participant, run_config={"node-state-dir": tempfile.mkdtemp(prefix="secagg-")},
                          federated=lambda _cfg: frozenset({"w"}))
    with LocalGrid(app, 3) as grid:
        ask = SecureGridAsk(grid, cfg)
        rc = {"config-json": cfg.model_dump_json(), "hang": json.dumps([1])}
        first = ask(0, {**rc, "round": 0}, {"w": np.zeros(N, np.float32)}, {}, 2.0)
        start = time.monotonic()
        second = ask(1, {**rc, "round": 1, "hang": "[]"}, {"w": np.zeros(N, np.float32)}, {}, 2.0)
        took = time.monotonic() - start
    assert first.secure_sum.contributors == second.secure_sum.contributors == ("silo-0", "silo-2")
    assert second.asked == 2 and took < 2.0
    assert any("still busy with round 0" in why for why in second.failures.values()), second.failures


def test_two_sites_one_dropout_is_below_any_threshold():
    with pytest.raises(SecureAggregationAborted, match="threshold is 2"):
        _ask(2, [], drop=[1])


def test_a_secure_participant_refuses_a_plain_ask():
    cfg = load_config(["experiment=micro", *SECURE])
    app = make_client_app(known_participant, run_config={"node-state-dir": tempfile.mkdtemp(prefix="secagg-nodes-")},
                          federated=lambda _cfg: frozenset({"w"}))
    with LocalGrid(app, 2) as grid, pytest.raises(ResidencyViolation, match="fail-closed"):
        GridAsk(grid, cfg)(0, {"round": 0, "config-json": cfg.model_dump_json()}, {"w": np.zeros(N, np.float32)},
                           {}, 30.0)


# ---------------------------------------------------------------------------------------------
# the real stack on experiment=micro


@pytest.fixture(scope="module")
def shared(micro_warm_start):
    base, root, _ = micro_warm_start("secagg")
    return base, root


def test_a_secure_micro_run_tracks_the_plaintext_run(shared, tmp_path):
    base, _ = shared
    plain_cfg = load_config(base)
    secure_cfg = load_config(base + ["federation.secure_aggregation=true"])
    plain = run_on_local_grid(plain_cfg, tmp_path / "plain", progress=False)
    secure = run_on_local_grid(secure_cfg, tmp_path / "secure", progress=False)
    assert secure["rounds_completed"] == plain["rounds_completed"] == plain_cfg.federation.rounds
    for r in secure["rounds"]:
        assert r["fed/secagg_participants"] == 2 and r["dropped"] == {}
        assert "gauge/drift_angle_deg" in r  # the public-probe embeddings still arrive for frame drift
    # Round 1 starts from the same global with the same updates: within the one-step bound.
    f = secure_cfg.federation
    q = SecAggSettings.from_config(f).mean_error_bound()
    a = load_checkpoint(tmp_path / "plain" / "rounds" / "round-0000" / "model").tensors
    b = load_checkpoint(tmp_path / "secure" / "rounds" / "round-0000" / "model").tensors
    gap = max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())
    peak = max(float(a[k].abs().max()) for k in a if a[k].is_floating_point())
    # + one fp32 ulp of the mean (~1e-3) and of the largest weight: both runs round independently
    bound = outer_error_bound(q + float(np.spacing(np.float32(1e-2))), 1, lr=f.outer_lr,
                              momentum=f.outer_momentum, nesterov=f.nesterov) + float(np.spacing(np.float32(peak)))
    assert 0 < gap <= bound


def test_secure_aggregation_under_dp_keeps_the_noise_and_the_withholding_participant_side(shared, tmp_path):
    base, _ = shared
    cfg = load_config(base + ["privacy=dp", "federation.secure_aggregation=true"])
    summary = run_on_local_grid(cfg, tmp_path / "run", progress=False)
    assert summary["rounds_completed"] == 2
    for r in summary["rounds"]:
        assert r["fed/secagg_participants"] == 2 and r["dp/epsilon"] > 0
        assert "gauge/drift_angle_deg" not in r  # no participant embeddings under DP
    # a noised update (σ·C = 1 per coordinate) is far larger than a plain one: the sum carries the noise
    assert summary["rounds"][0]["fed/secagg_sum_max_abs"] > 1.0


def test_the_coordinator_refuses_individual_updates_and_a_broken_sum(shared, tmp_path):
    base, _ = shared
    cfg = load_config(base + ["federation.secure_aggregation=true"])
    coord = Coordinator(cfg, tmp_path / "run", progress=False)
    n = sum(v.numel() for v in coord.outer.params.values())
    emb = np.zeros((len(coord.probe), cfg.model.latent_dim), np.float32)
    replies = {p: Reply(0, {"fp32": np.zeros(n, np.float32)}, emb, {}) for p in ("silo-0", "silo-1")}
    with pytest.raises(ResidencyViolation, match="individual updates"):
        coord.close_round(0, replies, {})
    bare = {p: Reply(0, {}, emb, {}) for p in ("silo-0", "silo-1")}
    with pytest.raises(ResidencyViolation, match="carry an individual update"):
        coord.close_round(0, replies, {}, secure_sum=SecureSum(np.zeros(n), ("silo-0", "silo-1")))
    broken = SecureSum(np.full(n, 1e6), ("silo-0", "silo-1"))  # what a failed unmask looks like
    with pytest.raises(SecureSumRejected):
        coord.close_round(0, bare, {}, secure_sum=broken)
    assert coord.next_round == 0 and not (tmp_path / "run" / "rounds").exists()  # nothing committed
    coord.close_round(0, bare, {}, secure_sum=SecureSum(np.zeros(n), ("silo-0", "silo-1")))
    assert coord.next_round == 1
    coord.finish()


def test_the_in_process_engine_refuses_secure_aggregation(shared, tmp_path):
    base, _ = shared
    with pytest.raises(ConfigError, match="flower-inprocess") as err:
        run_inprocess(load_config(base + ["federation.secure_aggregation=true"]), tmp_path / "run")
    assert "ray" in str(err.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_secure_run_through_a_superlink_with_two_supernodes(shared, tmp_path):
    base, root = shared
    app = sl.stage_app(ROOT, tmp_path / "lensemble")
    run_dir = tmp_path / "run"
    procs: list[sl.FlowerProcess] = []
    try:
        _, cli_home = sl.start_loopback_federation(tmp_path, procs)
        overrides = " ".join(base + ["federation.secure_aggregation=true", "federation.round_timeout_s=240"])
        res = sl.flwr_cli(["run", ".", "loopback", "--stream", "--run-config",
                           f"overrides='{overrides}' run-dir='{run_dir}'"],
                          home=cli_home, cwd=app, timeout_s=540)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out
        assert "round 2/2: 2/2 replies" in out and "SecAgg+ sum of 2" in out, out
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["rounds_completed"] == 2
        assert all(r["fed/secagg_participants"] == 2 and r["dropped"] == {} for r in summary["rounds"])
    finally:
        sl.stop_all(reversed(procs))
    assert not any(p.alive() for p in procs)
