import pytest

from lensemble.config import LensembleConfig, load_config, validate_config
from lensemble.errors import ConfigError


def test_default_config_composes_and_validates():
    cfg = load_config()
    assert isinstance(cfg, LensembleConfig)
    assert cfg.env.id == "swm/TwoRoom-v1" and cfg.model.img_size == 64 and cfg.gauge.rung == "naive"
    assert len(cfg.config_hash()) == 64


def test_overrides_and_rung_groups():
    cfg = load_config(["gauge=anchor", "federation.rounds=5"])
    assert cfg.gauge.anchor == "A" and cfg.gauge.backstop and cfg.gauge.shared_sketch
    assert cfg.federation.rounds == 5
    assert cfg.config_hash() != load_config().config_hash()


@pytest.mark.parametrize("rung", ["naive", "sketch", "backstop", "anchor", "distill"])
def test_every_rung_composes(rung):
    assert load_config([f"gauge={rung}"]).gauge.rung == rung


def test_micro_experiment(micro_cfg):
    assert micro_cfg.name == "micro" and micro_cfg.model.latent_dim == 16


@pytest.mark.parametrize("override,field", [
    ("federation.outer_lr=-1", "federation.outer_lr"),
    ("data.severity=1.5", "data.severity"),
    ("model.patch_size=7", "model"),
    ("eval.topk=1000", "eval"),
])
def test_bad_value_names_the_field(override, field):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert field in str(info.value)
    assert info.value.remediation


def test_unknown_field_and_unknown_group_are_refused():
    with pytest.raises(ConfigError) as info:
        validate_config({"model": {"latent_dims": 3}})
    assert "model.latent_dims" in str(info.value)
    with pytest.raises(ConfigError):
        load_config(["gauge=nonexistent"])


def test_anchor_needs_k_at_least_d():
    with pytest.raises(ConfigError) as info:
        load_config(["gauge=anchor", "gauge.anchor_landmarks=8"])
    assert "anchor_landmarks" in str(info.value)


def test_baseline_experiments_compose():
    fork_a = load_config(["experiment=fork_a"])
    assert fork_a.model.encoder_frozen and fork_a.gauge.rung == "naive" and fork_a.federation.mode == "fork_a"
    naive = load_config(["experiment=naive_fedavg"])
    assert naive.gauge.rung == "naive" and not naive.gauge.shared_sketch and not naive.model.encoder_frozen
