"""train_local and the warm start on the micro config: determinism, artifacts, logging."""

import json

import pytest

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.model.world_model import world_model_from_state
from lensemble.observability.metrics import read_metrics
from lensemble.training.trainer import train_local
from lensemble.training.warmstart import train_warmstart


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    return load_config(["experiment=micro", f"data.root={root / 'data'}", f"run_dir={root / 'run'}"])


def test_same_config_same_checkpoint_hash(cfg, tmp_path):
    a = train_local(cfg, run_dir=tmp_path / "a", progress=False)
    b = train_local(cfg, run_dir=tmp_path / "b", progress=False)
    assert a.checkpoint_hash == b.checkpoint_hash
    ck = load_checkpoint(a.checkpoint_dir, expected_hash=a.checkpoint_hash)
    assert ck.header["kind"] == "world_model" and ck.round_index == cfg.train.steps
    world_model_from_state(ck.architecture, ck.tensors)  # rebuildable from its own header
    rows = read_metrics(tmp_path / "a" / "metrics.jsonl")
    assert rows[-1]["step"] == cfg.train.steps
    for key in ("loss/total", "loss/pred", "loss/sigreg", "gauge/effective_dim", "train/latent_std"):
        assert key in rows[-1]
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["config_hash"] == cfg.config_hash() and manifest["git_sha"]


def test_sources_differ_and_unknown_source_is_refused(cfg, tmp_path):
    from lensemble.errors import ConfigError

    pooled = train_local(cfg, run_dir=tmp_path / "p", progress=False)
    silo = train_local(cfg, source="silo-1", run_dir=tmp_path / "s", progress=False)
    assert pooled.checkpoint_hash != silo.checkpoint_hash
    with pytest.raises(ConfigError):
        train_local(cfg, source="silo-9", run_dir=tmp_path / "x", progress=False)


def test_warmstart_trains_on_public_data_only(cfg, tmp_path):
    res = train_warmstart(cfg, run_dir=tmp_path / "w", progress=False)
    ck = load_checkpoint(res.checkpoint_dir)
    assert ck.header["kind"] == "warmstart" and ck.header["extra"]["source"] == "public"
    assert ck.round_index == cfg.train.warmstart_steps
    assert ck.header["extra"]["data"]["source"] == "public"


def test_chained_checkpoints(cfg, tmp_path):
    c2 = cfg.model_copy(update={"train": cfg.train.model_copy(update={"checkpoint_every": 2})})
    res = train_local(c2, run_dir=tmp_path / "c", progress=False)
    first = load_checkpoint(tmp_path / "c" / "checkpoints" / "step-000002")
    last = load_checkpoint(res.checkpoint_dir)
    assert last.header["parent_hash"] == first.content_hash and first.header["parent_hash"] is None
