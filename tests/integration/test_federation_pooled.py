"""The pooled objective end to end (lensemble/federation/pooling.py, lensemble/training/pooling.py).

Known answers:
- a federation of one participant with η = 1, μ = 0 reproduces centralized training of the same
  steps and batches (the silo objective and, with one party, the pooled one);
- under sigreg_scope / bn_scope = pooled every round starts with a summary ask whose mean reaches
  each participant, and the run differs from the silo objective's;
- the per-silo central control draws a share of every batch per silo and moves the model
  differently from the control with the same batches;
- privacy and secure aggregation refuse the pooled objective with a ConfigError naming why.
"""

import json

import pytest
import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.errors import ConfigError
from lensemble.federation import participant as participant_module
from lensemble.federation.checks import check_federation_config
from lensemble.federation.inprocess import run_inprocess
from lensemble.federation.pooling import MEMBERS
from lensemble.training.trainer import train_local

BN = ["model.projector_norm=batchnorm", "model.input_norm=global"]
POOLED = ["objective.sigreg_scope=pooled", "objective.bn_scope=pooled", "objective.summary_clips=8"]


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


@pytest.mark.parametrize("extra", [["privacy=dp"], ["federation.secure_aggregation=true"]])
def test_privacy_and_secure_aggregation_refuse_the_pooled_objective(extra):
    with pytest.raises(ConfigError, match="pooled"):
        check_federation_config(load_config(["experiment=micro", *BN, *POOLED, *extra]))
    check_federation_config(load_config(["experiment=micro", *BN, "objective.bn_scope=frozen", *extra]))
