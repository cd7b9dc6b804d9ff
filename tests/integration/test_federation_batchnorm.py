"""BatchNorm statistics under federation (lensemble/federation/bn_stats.py), end to end in process.

Known answers: the committed global's statistics are exactly those its committed weights give on
the public probe (``bn_recalibration=probe``), or the warm start's (``none``); the participants
embed the probe with statistics from the same frames; a LayerNorm run is untouched.
"""

import copy
import json

import pytest
import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.data.store import data_dir, probe_frames
from lensemble.federation import participant as participant_module
from lensemble.federation.bn_stats import PROBE_BATCH_FRAMES, recalibrate_on_probe, recalibrates
from lensemble.federation.inprocess import run_inprocess
from lensemble.model.world_model import world_model_from_state

BN = ["model.projector_norm=batchnorm", "model.input_norm=global"]


def _bn_buffers(tensors: dict) -> dict:
    return {k: v for k, v in tensors.items() if k.endswith(("running_mean", "running_var", "num_batches_tracked"))}


@pytest.fixture(scope="module")
def shared(micro_warm_start):
    base, _, ws_dir = micro_warm_start("fedbn", *BN)
    return base, ws_dir


def _probe(summary: dict, cfg) -> torch.Tensor:
    return probe_frames(str(data_dir(cfg)), summary["probe_hash"])


def test_global_statistics_are_the_probe_statistics_of_the_committed_weights(shared, tmp_path):
    base, ws_dir = shared
    cfg = load_config(base + ["gauge=backstop"])
    summary = run_inprocess(cfg, tmp_path / "run", progress=False)
    final = load_checkpoint(summary["final_checkpoint"])
    warm = load_checkpoint(ws_dir)
    committed = _bn_buffers(final.tensors)
    assert committed, "the BatchNorm model has no running statistics"
    # Known answer: rebuild from the committed weights, re-estimate on the probe, compare.
    model = world_model_from_state(final.architecture, final.tensors)
    assert recalibrate_on_probe(model.encoder, _probe(summary, cfg), cfg) == 1  # 32 frames: one batch
    again = _bn_buffers(model.state_dict())
    for k in committed:
        torch.testing.assert_close(committed[k], again[k], rtol=0, atol=0)
    moved = max(float((committed[k].float() - warm.tensors[k].float()).abs().max()) for k in committed
                if k.endswith("running_mean"))
    assert moved > 1e-4, "the global still carries the warm start's statistics"
    rounds = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r.get("gauge/backstop_skipped") == 0 for r in rounds if "gauge/backstop_skipped" in r)


def test_none_keeps_the_warm_start_statistics(shared, tmp_path):
    base, ws_dir = shared
    cfg = load_config(base + ["federation.bn_recalibration=none"])
    assert not recalibrates(cfg)
    summary = run_inprocess(cfg, tmp_path / "run", progress=False)
    final, warm = load_checkpoint(summary["final_checkpoint"]), load_checkpoint(ws_dir)
    assert final.content_hash != warm.content_hash  # the weights moved ...
    for k, v in _bn_buffers(final.tensors).items():  # ... the statistics did not
        torch.testing.assert_close(v, warm.tensors[k], rtol=0, atol=0)


def test_participants_embed_the_probe_with_probe_statistics(shared, tmp_path, monkeypatch):
    base, _ = shared
    cfg = load_config(base)
    checked = []
    real = participant_module.embed_frames

    def spy(encoder, frames, *a, **k):
        # Known answer: the statistics the probe is embedded with are a fresh estimate on the probe.
        fresh = copy.deepcopy(encoder)
        recalibrate_on_probe(fresh, frames, cfg)
        want, got = _bn_buffers(fresh.state_dict()), _bn_buffers(encoder.state_dict())
        checked.append(all(torch.equal(want[n], got[n]) for n in want))
        return real(encoder, frames, *a, **k)

    monkeypatch.setattr(participant_module, "embed_frames", spy)
    run_inprocess(cfg, tmp_path / "run", progress=False)
    assert len(checked) == cfg.federation.rounds * cfg.data.num_silos and all(checked)


def test_layernorm_and_frozen_encoders_are_left_alone(shared):
    base, _ = shared
    ln = load_config(base[:-1] + ["model.projector_norm=layernorm"])
    frozen = load_config(base + ["model.encoder_frozen=true"])
    assert not recalibrates(ln) and not recalibrates(frozen)
    model = world_model_from_state(load_checkpoint(shared[1]).architecture, load_checkpoint(shared[1]).tensors)
    before = copy.deepcopy(model.state_dict())
    assert recalibrate_on_probe(model.encoder, torch.zeros(8, 3, 32, 32, dtype=torch.uint8), frozen) == 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_probe_batches_never_leave_a_single_frame(shared):
    base, ws_dir = shared
    cfg = load_config(base)
    ck = load_checkpoint(ws_dir)
    model = world_model_from_state(ck.architecture, ck.tensors)
    frames = torch.randint(0, 255, (PROBE_BATCH_FRAMES + 1, 3, 32, 32), dtype=torch.uint8)
    assert recalibrate_on_probe(model.encoder, frames, cfg) == 1  # 257 frames: one batch, not 256 + 1
    frames = torch.randint(0, 255, (PROBE_BATCH_FRAMES + 2, 3, 32, 32), dtype=torch.uint8)
    assert recalibrate_on_probe(model.encoder, frames, cfg) == 2


def test_a_batchnorm_model_federates_through_flower_records(shared, tmp_path):
    """Through Flower's ArrayRecord a 0-d buffer (``num_batches_tracked``) arrives with shape (1,):
    the participant must still difference against the model it loaded, and the run complete."""
    from lensemble.federation.simulation import run_on_local_grid

    base, _ = shared
    cfg = load_config(base)
    summary = run_on_local_grid(cfg, tmp_path / "run", progress=False)
    assert summary["rounds_completed"] == cfg.federation.rounds
    assert all(r["dropped"] == {} for r in summary["rounds"])
