"""The pooled objective end to end (lensemble/federation/pooling.py, lensemble/training/pooling.py).

Known answers:
- a federation of one participant with η = 1, μ = 0 reproduces centralized training of the same
  steps and batches (the silo objective and, with one party, the pooled one);
- under sigreg_scope / bn_scope = pooled every round starts with a summary ask whose mean reaches
  each participant, and the run differs from the silo objective's;
- the per-silo central control draws a share of every batch per silo and moves the model
  differently from the control with the same batches;
- privacy refuses the pooled objective with a ConfigError naming why;
- under secure aggregation the summary ask runs SecAgg+: the coordinator receives no individual
  summary, only their sum, and the pooled mean it hands the train ask is the mean of the
  participants' own summaries within the quantisation bound; a summary outside the SecAgg+
  coordinate range is refused by its participant, naming the range;
- the train ask after a summary ask sends no global to the participants that kept it (only its
  digest), the full global to any other, and trains the same model as the in-process engine.
"""

import io
import json

import numpy as np
import pytest
import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.data.store import ensure_data
from lensemble.errors import (
    ConfigError,
    FaultToleranceExceeded,
    ResidencyViolation,
    RoundError,
    SecureSumRejected,
)
from lensemble.federation import participant as participant_module
from lensemble.federation.checks import check_federation_config
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.flower import server_app as server_app_module
from lensemble.federation.flower.local_grid import LocalGrid
from lensemble.federation.flower.records import ARRAYS, CONFIG, record_nbytes
from lensemble.federation.flower.secagg import SecureGridAsk
from lensemble.federation.global_cache import DIGEST_KEY, HOLDERS_KEY, global_digest
from lensemble.federation.inprocess import run_inprocess
from lensemble.federation.messages import NodeSpec, Reply
from lensemble.federation.participant import participant_round
from lensemble.federation.pooling import (
    GRADIENT_PHASE,
    MEMBERS,
    MOMENTS_PHASE,
    PREFIX,
    SUMMARY_PHASE,
    secure_settings,
    secure_summary_divisors,
    secure_summary_payload,
    summary_numel,
    summary_template,
)
from lensemble.federation.secure_agg import SecureSum
from lensemble.federation.simulation import run_on_local_grid
from lensemble.federation.state import to_arrays
from lensemble.training.trainer import train_local

BN = ["model.projector_norm=batchnorm", "model.input_norm=global"]
POOLED = ["objective.sigreg_scope=pooled", "objective.bn_scope=pooled", "objective.summary_clips=8"]
# b = 16: q = 2c/2^16 = 2.4e-4 at c = 8, large enough that the quantisation error shows in every mean
SECURE = ["federation.secure_aggregation=true", "federation.secagg_bits=16"]


@pytest.fixture(scope="module")
def shared(micro_warm_start):
    base, _, ws_dir = micro_warm_start("fedpooled", *BN)
    return base, ws_dir


def _federated_weights(summary: dict) -> dict:
    return load_checkpoint(summary["final_checkpoint"]).tensors


def _close(a: dict, b: dict, keys) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in keys)


def test_one_participant_federation_is_centralized_training(shared, tmp_path):
    base, ws_dir = shared
    # one silo, one round of H steps, η = 1 and μ = 0: the new global is the participant's local model,
    # and the participant trained exactly as train_local does on that silo, batches and sketch alike
    # (The pooled objective of one party is the plain one up to float rounding, which AdamW's first
    # steps turn into ±lr moves of parameters whose gradient is 0 in exact arithmetic, such as the
    # bias before BatchNorm: it is checked on the objective's value and gradient instead,
    # tests/unit/test_pooled_stats.py.)
    fed = base + ["data.num_silos=1", "federation.min_participants=1", "federation.rounds=1",
                              "federation.outer_lr=1.0", "federation.outer_momentum=0.0", "federation.nesterov=false",
                              "gauge=sketch", "federation.bn_recalibration=none", "train.bn_recalibration_batches=0",
                              "train.steps=3", "federation.inner_steps=3"]
    cfg = load_config(fed)
    summary = run_inprocess(cfg, tmp_path / "fed", progress=False)
    got = _federated_weights(summary)

    # the central twin: silo-0 alone, the round-0 sketch, the participant's batch stream
    from lensemble.config.seeds import torch_generator
    from lensemble.model import objective as objective_module
    from lensemble.training import trainer as trainer_module

    sketch = objective_module.sketch_for_round(cfg.root_seed, 0, cfg.model.latent_dim, cfg.objective.sigreg_directions)
    monkey = pytest.MonkeyPatch()
    monkey.setattr(trainer_module, "sketch_for_step", lambda *a, **k: sketch)
    monkey.setattr(trainer_module, "torch_generator",
                   lambda root, *labels: torch_generator(root, "batches", "silo-0", 0)
                   if labels[:1] == ("batches",) else torch_generator(root, *labels))
    try:
        central = train_local(load_config(fed), source="silo-0", run_dir=tmp_path / "central",
                              init_checkpoint=ws_dir, progress=False)
    finally:
        monkey.undo()
    want = load_checkpoint(central.checkpoint_dir).tensors
    params = [k for k in want if "running_" not in k and "num_batches" not in k]
    assert _close(got, want, params) < 1e-5


def test_pooled_rounds_exchange_summaries_and_change_training(shared, tmp_path, monkeypatch):
    base, ws_dir = shared
    seen = []
    real = participant_module.pooled_statistics

    def spy(cfg, extras, state_dir, partition_id, t):
        stats = real(cfg, extras, state_dir, partition_id, t)
        if stats is not None:  # the silo objective's run below pools nothing
            seen.append((partition_id, t, sorted(int(m) for m in extras[MEMBERS]), stats.pooling[0].parties))
        return stats

    monkeypatch.setattr(participant_module, "pooled_statistics", spy)
    pooled = run_inprocess(load_config(base + POOLED), tmp_path / "pooled", progress=False)
    assert sorted(seen) == [(p, t, [0, 1], 2) for p in (0, 1) for t in (0, 1)]
    rounds = [json.loads(line) for line in (tmp_path / "pooled" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["fed/summary_participants"] == 2 and r["fed/summary_bytes"] > 0 for r in rounds)
    silo = run_inprocess(load_config(base), tmp_path / "silo", progress=False)
    a, b = _federated_weights(pooled), _federated_weights(silo)
    assert _close(a, b, [k for k in a if k.startswith("encoder.projector")]) > 1e-6


def test_a_rounds_passes_give_each_participant_the_statistics_of_one_process_holding_every_silo(shared, tmp_path,
                                                                                                 monkeypatch):
    # the wiring of the three summary passes (moments, summary, moment gradients) through the real
    # engine: extras, members, the own part kept on disk and subtracted, the gradients' standardisation
    # round trip. What each participant trains round 0 with equals silo_poolings() of the same
    # summary clips in one process (whose exactness against the union batch is
    # tests/unit/test_pooled_exact.py's)
    from lensemble.config.seeds import torch_generator
    from lensemble.data.clips import ClipSampler
    from lensemble.data.collect import load_silo
    from lensemble.data.store import ensure_data as ensure
    from lensemble.model.objective import sketch_for_round
    from lensemble.model.world_model import world_model_from_state
    from lensemble.training.pooling import participant_statistics, silo_poolings

    base, ws_dir = shared
    cfg = load_config(base + POOLED + ["federation.rounds=1", "objective.bn_cross_gradient=true"])
    seen = {}
    real = participant_module.pooled_statistics

    def spy(cfg, extras, state_dir, partition_id, t):
        seen[partition_id] = stats = real(cfg, extras, state_dir, partition_id, t)
        return stats

    monkeypatch.setattr(participant_module, "pooled_statistics", spy)
    run_inprocess(cfg, tmp_path / "run", progress=False)
    folder = str(ensure(cfg, progress=False)[0])
    ck = load_checkpoint(ws_dir)
    model = world_model_from_state(ck.architecture, ck.tensors)
    clips = [ClipSampler([load_silo(folder, i, "train")], cfg.train.clip_len, cfg.model.action_block)
             .sample(cfg.objective.summary_clips, torch_generator(cfg.root_seed, "summary", f"silo-{i}", 0))
             for i in range(2)]
    sketch = sketch_for_round(cfg.root_seed, 0, cfg.model.latent_dim, cfg.objective.sigreg_directions)
    want = [participant_statistics(p) for p in silo_poolings(model, clips, sketch, cfg)]
    assert sorted(seen) == [0, 1]
    for i in range(2):
        got, ref = seen[i].pooling[0], want[i].pooling[0]
        assert seen[i].sigreg_weight == ref.parties == got.parties == 2
        for a, b in [(got.ecf.cos, ref.ecf.cos), (got.ecf.mean, ref.ecf.mean), (got.bn[0].var, ref.bn[0].var),
                     (got.bn_grad[0].mean, ref.bn_grad[0].mean), (got.bn_grad[0].var, ref.bn_grad[0].var)]:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert float(got.bn_grad[0].mean.abs().max()) > 0  # the cross-silo path is there, and not zero


@pytest.mark.parametrize("per_silo", ["both", "sigreg", "batchnorm"])
def test_per_silo_central_control_differs_from_the_control(shared, tmp_path, per_silo):
    base, ws_dir = shared
    common = base + ["train.silo_batches=true", "train.bn_recalibration_batches=0"]
    control = train_local(load_config(common), source="pooled", run_dir=tmp_path / "control",
                          init_checkpoint=ws_dir, progress=False)
    treated = train_local(load_config(common + [f"train.silo_statistics={per_silo}"]), source="pooled",
                          run_dir=tmp_path / per_silo, init_checkpoint=ws_dir, progress=False)
    a = load_checkpoint(control.checkpoint_dir).tensors
    b = load_checkpoint(treated.checkpoint_dir).tensors
    assert _close(a, b, [k for k in a if k.startswith("encoder.vit")]) > 1e-7


def test_per_silo_control_with_the_pooled_remedy_trains(shared, tmp_path):
    base, ws_dir = shared
    cfg = load_config(base + POOLED + ["train.silo_batches=true", "train.silo_statistics=both",
                                       "federation.inner_steps=2"])
    res = train_local(cfg, source="pooled", run_dir=tmp_path / "remedy", init_checkpoint=ws_dir, progress=False)
    assert all(torch.isfinite(v.float()).all() for v in load_checkpoint(res.checkpoint_dir).tensors.values())


def test_silo_statistics_need_silo_batches():
    with pytest.raises(ConfigError, match="silo_batches"):
        load_config(["experiment=micro", "train.silo_statistics=both"])


def test_privacy_refuses_the_pooled_objective():
    with pytest.raises(ConfigError, match="pooled"):
        check_federation_config(load_config(["experiment=micro", *BN, *POOLED, "privacy=dp"]))
    check_federation_config(load_config(["experiment=micro", *BN, "objective.bn_scope=frozen", "privacy=dp"]))


def test_secure_aggregation_takes_the_pooled_objective_with_a_range_that_holds_the_ecf():
    check_federation_config(load_config(["experiment=micro", *BN, *POOLED, "federation.secure_aggregation=true"]))
    with pytest.raises(ConfigError, match=r"secagg_clip_range=0.5 < 1.*\[-1, 1\]"):
        check_federation_config(load_config(["experiment=micro", *BN, *POOLED, "federation.secure_aggregation=true",
                                             "federation.secagg_clip_range=0.5"]))


# ---------------------------------------------------------------------------------------------
# the summary ask under secure aggregation


def _own_summaries(run_dir, t: int) -> list[dict[str, np.ndarray]]:
    out = []
    for p in (0, 1):
        with np.load(run_dir / "nodes" / f"silo-{p}" / f"summary-{t:05d}.npz") as f:
            out.append({k: f[k] for k in f.files})
    return out


def test_a_secure_pooled_federation_pools_only_the_sum_of_the_summaries(shared, tmp_path, monkeypatch):
    base, _ = shared
    # every pass masked: moments, summary and (opted in) the moment gradients
    cfg = load_config(base + POOLED + SECURE + ["objective.bn_cross_gradient=true"])
    closed: dict[int, dict] = {}
    seen: list[tuple[str, object]] = []

    class Spy(Coordinator):
        def close_summaries(self, t, replies, failures, *, wire_bytes=None, secure_sum=None, phase=SUMMARY_PHASE):
            extras = super().close_summaries(t, replies, failures, wire_bytes=wire_bytes, secure_sum=secure_sum,
                                             phase=phase)
            if phase == SUMMARY_PHASE:  # the moments pass (SIGReg and BatchNorm pooled) comes first
                closed[t] = {"replies": replies, "secure_sum": secure_sum, "extras": extras}
            return extras

    def observed(grid, cfg, cancel=None):  # every reply the coordinator receives, at every stage
        return SecureGridAsk(grid, cfg, cancel=cancel, observe=lambda stage, msg: seen.append((stage, msg.content)))

    monkeypatch.setattr(server_app_module, "SecureGridAsk", observed)
    summary = run_on_local_grid(cfg, tmp_path / "run", progress=False, coordinator=Spy)
    assert summary["rounds_completed"] == 2 and sorted(closed) == [0, 1]

    s, divisors = secure_settings(cfg), secure_summary_divisors(cfg)
    wire_forms = []
    for t, got in closed.items():
        # the coordinator held the SecAgg+ sum of both summaries and replies with no payload
        assert got["secure_sum"].contributors == ("silo-0", "silo-1")
        assert got["secure_sum"].total.shape == (summary_numel(cfg),)
        assert sorted(got["replies"]) == ["silo-0", "silo-1"]
        assert all(r.payload == {} and r.probe_embeddings.shape[0] == 0 for r in got["replies"].values())
        assert sorted(int(m) for m in got["extras"][MEMBERS]) == [0, 1]
        # ... and the pooled mean it handed the train ask is the mean of the participants' own
        # summaries (kept on their disks) within the quantisation bound, field by field
        own = _own_summaries(tmp_path / "run", t)
        errors = []
        for key in summary_template(cfg):
            want = (own[0][key].astype(np.float64) + own[1][key].astype(np.float64)) / 2
            got_mean = got["extras"][PREFIX + key].astype(np.float64)
            bound = divisors[key] * s.mean_error_bound() + float(np.spacing(np.float32(np.abs(want).max() + 1)))
            err = float(np.abs(got_mean - want).max())
            assert err <= bound, (t, key, err, bound)
            errors.append(err)
        assert max(errors) > 0  # quantised: not the plaintext mean
        # what each summary pass sent, as it entered SecAgg+ (the kept file also holds the moment gradients)
        wire_forms += [secure_summary_payload({k: o[k] for k in summary_template(cfg, phase)}, cfg, phase)["fp32"]
                       for o in own for phase in (MOMENTS_PHASE, SUMMARY_PHASE, GRADIENT_PHASE)]
    rounds = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["fed/summary_participants"] == 2 and r["fed/secagg_participants"] == 2 for r in rounds)
    assert all(r["fed/summary_secagg_mean_error_bound"] == divisors["bn.0.meansq"] * s.quantum for r in rounds)
    # nothing any node sent at any stage of either ask holds a summary, as sent or as it entered SecAgg+
    assert {stage for stage, _ in seen} == {"setup", "share keys", "collect masked vectors", "unmask"}
    plain = [o[k].astype(np.float32) for t in closed for o in _own_summaries(tmp_path / "run", t) for k in o]
    for stage, content in seen:
        for name, rec in content.array_records.items():  # the public probe's embeddings are the only array
            assert name == "probe" or len(rec) == 0, (stage, name)
        for rec in content.config_records.values():
            for value in rec.values():
                for blob in (b for b in (value if isinstance(value, list) else [value]) if isinstance(b, bytes)):
                    for x in plain:
                        assert x.tobytes() not in blob
                    for x in wire_forms:
                        assert x.tobytes() not in blob and x.astype(np.float64).tobytes() not in blob
    vectors = [np.load(io.BytesIO(c.config_records["secaggplus_configs"]["masked_params"][1]))
               for stage, c in seen if stage == "collect masked vectors"]
    masked = [v.astype(np.float64) for v in vectors if v.size == summary_numel(cfg)]
    assert len(masked) == 2 * 2  # two summaries a round, two rounds: each masked
    # the moments and moment-gradient passes are masked too (each its own size)
    assert sum(v.size == summary_numel(cfg, MOMENTS_PHASE) for v in vectors) == 2 * 2
    assert sum(v.size == summary_numel(cfg, GRADIENT_PHASE) for v in vectors) == 2 * 2
    for vec in masked:  # a masked summary looks uniform: it tells nothing about the summary
        for x in (w for w in wire_forms if w.size == vec.size):
            assert abs(np.corrcoef(vec, x.astype(np.float64))[0, 1]) < 0.5


def test_a_summary_outside_the_secagg_range_is_refused_naming_the_range(shared, tmp_path):
    base, ws_dir = shared
    cfg = load_config(base + POOLED + SECURE)
    arrays = {k: np.zeros(tuple(v.shape), np.float32) for k, v in summary_template(cfg).items()}
    secure_summary_payload(arrays, cfg)  # zeros fit
    big_mean = dict(arrays, **{"bn.0.mean": np.full(arrays["bn.0.mean"].shape, 9.0, np.float32)})
    with pytest.raises(RoundError, match=r"bn\.0\.mean .*reaches 9, outside the SecAgg\+ coordinate range \[-8, 8\] "
                                         r"\(federation\.secagg_clip_range\)"):
        secure_summary_payload(big_mean, cfg)
    # the squared mean travels over c: it fits exactly when the mean does
    ok = dict(arrays, **{"bn.0.meansq": np.full(arrays["bn.0.meansq"].shape, 63.0, np.float32)})
    assert float(np.abs(secure_summary_payload(ok, cfg)["fp32"]).max()) == pytest.approx(63.0 / 8)
    with pytest.raises(RoundError, match=r"bn\.0\.meansq/8 .*\[-8, 8\]"):
        secure_summary_payload(dict(arrays, **{"bn.0.meansq": np.full(arrays["bn.0.meansq"].shape, 65.0,
                                                                       np.float32)}), cfg)
    with pytest.raises(RoundError, match="not finite"):
        secure_summary_payload(dict(arrays, **{"ecf.mean": np.full(arrays["ecf.mean"].shape, np.nan, np.float32)}),
                               cfg)
    # a real participant at c = 1: its BatchNorm input means (~1.2 on micro) do not fit, and it
    # refuses the round's first summary pass (the moments ask) rather than let SecAgg+ clip them
    tight = load_config(base + POOLED + SECURE + ["federation.secagg_clip_range=1"])
    global_arrays = to_arrays(load_checkpoint(ws_dir).tensors)
    probe_hash = ensure_data(tight, progress=False)[1]["probe"]["content_hash"]
    node = NodeSpec(0, None, str(tmp_path / "nodes"))
    with pytest.raises(RoundError, match=r"outside the SecAgg\+ coordinate range \[-1, 1\]"):
        participant_round(tight, node, global_arrays, {"round": 0, "probe-hash": probe_hash, "phase": MOMENTS_PHASE})


def test_the_coordinator_refuses_individual_summaries_and_a_broken_summary_sum(shared, tmp_path):
    base, _ = shared
    cfg = load_config(base + POOLED + SECURE)
    coord = Coordinator(cfg, tmp_path / "run", progress=False)
    n = summary_numel(cfg)
    none = np.zeros((0, cfg.model.latent_dim), np.float32)
    bare = {p: Reply(0, {}, none, {}) for p in ("silo-0", "silo-1")}
    holding = {p: Reply(0, {"fp32": np.zeros(n, np.float32)}, none, {}) for p in ("silo-0", "silo-1")}
    both = ("silo-0", "silo-1")
    try:
        with pytest.raises(ResidencyViolation, match="not a SecAgg\\+ sum"):
            coord.close_summaries(0, holding, {})
        with pytest.raises(ResidencyViolation, match="carry an individual summary"):
            coord.close_summaries(0, holding, {}, secure_sum=SecureSum(np.zeros(n), both))
        with pytest.raises(SecureSumRejected):  # what a failed unmask looks like
            coord.close_summaries(0, bare, {}, secure_sum=SecureSum(np.full(n, 1e6), both))
        with pytest.raises(SecureSumRejected, match="pooled ecf"):  # within C·(c + q), but no mean of cos is 3
            coord.close_summaries(0, bare, {}, secure_sum=SecureSum(np.full(n, 6.0), both))
        with pytest.raises(FaultToleranceExceeded, match="quorum is 2"):
            coord.close_summaries(0, {"silo-0": bare["silo-0"]}, {"silo-1": "did not reply within 5 s"},
                                  secure_sum=SecureSum(np.zeros(n), ("silo-0",)))
        with pytest.raises(SecureSumRejected, match="silo-1 is in the summary sum"):
            coord.close_summaries(0, {"silo-0": bare["silo-0"]}, {}, secure_sum=SecureSum(np.zeros(n), both))
        # a sum inside every coordinate range whose mean holds a negative BatchNorm variance (issue 47):
        # no honest pair of summaries adds up to it, and the sum cannot say whose it is
        total, at = np.full(n, 0.5), 0
        for key, zero in summary_template(cfg).items():
            if key == "bn.0.var":
                total[at:at + zero.numel()] = -1.0
            at += zero.numel()
        with pytest.raises(SecureSumRejected, match=r"out of range \(bn\.0\.var is -0\.5"):
            coord.close_summaries(0, bare, {}, secure_sum=SecureSum(total, both))
        extras = coord.close_summaries(0, bare, {}, secure_sum=SecureSum(np.full(n, 0.5), both))
        assert sorted(extras[MEMBERS].tolist()) == [0, 1]
        assert float(extras[PREFIX + "bn.0.meansq"].max()) == pytest.approx(0.25 * cfg.federation.secagg_clip_range)
        assert float(extras[PREFIX + "ecf.cos"].max()) == pytest.approx(0.25)
    finally:
        coord.finish()


# ---------------------------------------------------------------------------------------------
# the train ask reuses the global the summary ask sent


def _spy_messages(monkeypatch) -> list[dict]:
    """Every instruction the coordinator pushes on the in-process grid: its phase, round, global
    bytes and digest entries."""
    sent: list[dict] = []
    real = LocalGrid.push_messages

    def push(self, messages):
        messages = list(messages)
        for m in messages:
            rc = dict(m.content[CONFIG].items())
            sent.append({"phase": rc.get("phase", "train"), "round": rc["round"], "node": m.metadata.dst_node_id,
                         "global_bytes": record_nbytes(m.content[ARRAYS]), "keys": len(m.content[ARRAYS]),
                         "digest": rc.get(DIGEST_KEY), "cached_by": rc.get(HOLDERS_KEY)})
        return real(self, messages)

    monkeypatch.setattr(LocalGrid, "push_messages", push)
    return sent


def test_the_train_ask_sends_the_digest_not_the_global_again(shared, tmp_path, monkeypatch):
    base, _ = shared
    cfg = load_config(base + POOLED)
    sent = _spy_messages(monkeypatch)
    flower = run_on_local_grid(cfg, tmp_path / "flower", progress=False)
    monkeypatch.undo()
    for t in range(cfg.federation.rounds):
        # SIGReg and BatchNorm pooled: the moments pass first, which carries the global
        moments_msgs = [m for m in sent if m["round"] == t and m["phase"] == MOMENTS_PHASE]
        summary_msgs = [m for m in sent if m["round"] == t and m["phase"] == "summary"]
        train_msgs = [m for m in sent if m["round"] == t and m["phase"] == "train"]
        assert len(moments_msgs) == len(summary_msgs) == len(train_msgs) == 2
        full = moments_msgs[0]["global_bytes"]
        assert full > 0 and all(m["global_bytes"] == full and m["digest"] is None for m in moments_msgs)
        later = summary_msgs + train_msgs
        assert all(m["global_bytes"] == 0 and m["keys"] == 0 for m in later)
        assert all(m["cached_by"] == "silo-0,silo-1" for m in later)
        want = global_digest(to_arrays(load_checkpoint(tmp_path / "flower" / "rounds" / f"round-{t - 1:04d}" / "model")
                                       .tensors) if t else to_arrays(load_checkpoint(cfg.federation.warmstart).tensors))
        assert {m["digest"] for m in later} == {want}
    # fed/comm_bytes counts what moved: the global went down once a round, in the first summary pass
    rounds = [json.loads(line) for line in (tmp_path / "flower" / "metrics.jsonl").read_text().splitlines()]
    for r in rounds:
        assert r["fed/summary_bytes"] > 2 * full
        # the train ask: two updates up (about a global each), the pooled mean and probe embeddings;
        # with the global sent again it would be two globals more
        assert r["fed/comm_bytes"] - r["fed/summary_bytes"] < 3 * full
    # the kept global is the global: the same model as the in-process engine's, where nothing is serialised
    inproc = run_inprocess(cfg, tmp_path / "inprocess", progress=False)
    assert flower["final_hash"] == inproc["final_hash"]


def test_a_participant_that_missed_the_summary_ask_gets_the_full_global(shared, tmp_path, monkeypatch):
    base, _ = shared
    cfg = load_config(base + POOLED + ["federation.min_participants=1"])

    def participant(cfg, node, global_arrays, round_config, extras=None):
        if node.partition_id == 1 and round_config.get("phase") == "summary" and int(round_config["round"]) == 0:
            raise RuntimeError("this site misses round 0's summary ask")
        return participant_round(cfg, node, global_arrays, round_config, extras)

    sent = _spy_messages(monkeypatch)
    summary = run_on_local_grid(cfg, tmp_path / "run", progress=False, participant=participant)
    assert summary["rounds_completed"] == 2
    first = summary["rounds"][0]
    assert first["fed/summary_participants"] == 1 and first["fed/participants"] == 2 and first["dropped"] == {}
    train0 = sorted((m["global_bytes"] > 0, m["cached_by"]) for m in sent if m["round"] == 0 and m["phase"] == "train")
    assert train0 == [(False, "silo-0"), (True, "silo-0")]  # silo-1 was sent the full global, silo-0 none
    train1 = [m for m in sent if m["round"] == 1 and m["phase"] == "train"]
    assert all(m["global_bytes"] == 0 and m["cached_by"] == "silo-0,silo-1" for m in train1)


def test_a_participant_that_lost_the_kept_global_refuses_the_round_naming_the_digest(shared, tmp_path):
    base, _ = shared
    cfg = load_config(base + POOLED + ["federation.min_participants=1", "federation.rounds=1"])

    def participant(cfg, node, global_arrays, round_config, extras=None):
        reply = participant_round(cfg, node, global_arrays, round_config, extras)
        if node.partition_id == 0 and round_config.get("phase") == "summary":
            for kept in (tmp_path / "run" / "nodes" / "silo-0").glob("global-*.npz"):
                kept.unlink()  # its state folder was reset between the two asks
        return reply

    summary = run_inprocess(cfg, tmp_path / "run", progress=False, participant=participant)
    r = summary["rounds"][0]
    assert r["fed/summary_participants"] == 2 and r["fed/participants"] == 1
    assert r["dropped"] == {"silo-0": "failed: RoundError [round_failed]"}
    node = NodeSpec(0, None, str(tmp_path / "run" / "nodes"))
    with pytest.raises(RoundError, match=r"round 0: the train ask sent no global model but the digest 0123456789abcdef"):
        participant_round(cfg, node, {}, {"round": 0, DIGEST_KEY: "0123456789abcdef" * 4})
