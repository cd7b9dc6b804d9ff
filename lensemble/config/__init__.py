"""Configuration: the pydantic schema, Hydra composition and seed derivation."""

from lensemble.config.loader import compose_dict, config_dir, load_config
from lensemble.config.schema import (
    DataConfig,
    EnvConfig,
    EvalConfig,
    FederationConfig,
    GaugeConfig,
    LensembleConfig,
    ModelConfig,
    ObjectiveConfig,
    PrivacyConfig,
    TrainConfig,
    validate_config,
)
from lensemble.config.seeds import derive, numpy_rng, torch_generator

__all__ = [
    "LensembleConfig", "ModelConfig", "ObjectiveConfig", "TrainConfig", "EnvConfig", "DataConfig",
    "GaugeConfig", "FederationConfig", "PrivacyConfig", "EvalConfig", "validate_config",
    "load_config", "compose_dict", "config_dir", "derive", "numpy_rng", "torch_generator",
]
