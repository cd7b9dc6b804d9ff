"""Compose a config from the Hydra groups under ``configs/`` and validate it.

``load_config(["gauge=anchor", "federation.rounds=5"])`` gives a frozen ``LensembleConfig``. The
same overrides work on every CLI command, so a run's config is always a list of strings that can be
replayed.

Composition has four layers, later ones winning: the schema's field defaults (registered in
Hydra's ConfigStore as :data:`SCHEMA_NODE`, first in ``configs/config.yaml``'s defaults list), the
group files, an ``experiment=`` preset, the command-line overrides (docs/configuration.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from lensemble.config.schema import LensembleConfig, schema_defaults, validate_config
from lensemble.errors import ConfigError

# The ConfigStore name of the schema-defaults node; configs/config.yaml lists it first.
SCHEMA_NODE = "lensemble_schema"


def config_dir() -> Path:
    """The ``configs/`` folder: $LENSEMBLE_CONFIG_DIR, else the one beside the package source."""
    env = os.environ.get("LENSEMBLE_CONFIG_DIR")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "configs")
    candidates.append(Path.cwd() / "configs")
    for c in candidates:
        if (c / "config.yaml").is_file():
            return c
    raise ConfigError(
        "cannot find the configs/ folder",
        remediation="run from a checkout (pip install -e .) or set LENSEMBLE_CONFIG_DIR",
    )


def register_schema_defaults() -> None:
    """Store the schema's field defaults in Hydra's ConfigStore under :data:`SCHEMA_NODE`.

    Storing again replaces the node, so calling this before every composition is safe and keeps
    the node in step with the schema of the running process.
    """
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NODE, node=schema_defaults())


def compose_dict(overrides: list[str] | None = None, config_name: str = "config") -> dict:
    """Compose the Hydra config into a plain dict (interpolations resolved)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_schema_defaults()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=list(overrides or []))
        return OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"cannot compose config with overrides {overrides}: {exc}",
                          remediation="check the group and option names under configs/") from None


def load_config(overrides: list[str] | None = None, config_name: str = "config") -> LensembleConfig:
    """Compose and validate; raises ConfigError on any bad value or override."""
    return validate_config(compose_dict(overrides, config_name))
