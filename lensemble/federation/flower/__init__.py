"""Thin Flower adapters: the ServerApp and ClientApp that carry DiLoCo rounds over Flower.

The learning logic lives in a *roles module* (by default :mod:`lensemble.federation.roles`) that
exposes ``Coordinator``, ``participant_round``, ``Reply`` and ``NodeSpec`` (docs/CONTRACTS.md,
"Federation roles"). The apps here only move records and read configuration, so the same apps run

- in-process on :class:`~lensemble.federation.flower.local_grid.LocalGrid` (tests, CI, no Ray),
- on Flower's Ray simulation engine (:func:`lensemble.federation.simulation.launch_simulation`),
- on real SuperLink / SuperNodes via ``flwr run . <federation>`` (docs/deployment.md).

Run configuration (``context.run_config``; defaults in ``[tool.flwr.app.config]`` of
pyproject.toml, which must match :data:`RUN_CONFIG_DEFAULTS`):

=============== ========================================================================
``overrides``   Hydra overrides, one string, e.g. ``"experiment=micro federation.rounds=5"``
``run-dir``     where the coordinator writes checkpoints and metrics ("" = the config's run_dir)
``roles``       import path of the roles module
``progress``    print one line per round on the ServerApp's stdout
=============== ========================================================================

Python launchers may also bake ``config-json`` (a whole resolved config; it wins over
``overrides``) and ``node-state-dir`` (participants' local state when virtual nodes share the
coordinator's disk) into the apps. Flower's deprecated ``run_simulation`` leaves ``context.run_config`` empty,
which is why the apps are built by factories that take the run configuration directly.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from lensemble.errors import ConfigError

DEFAULT_ROLES = "lensemble.federation.roles"

RUN_CONFIG_DEFAULTS: dict[str, Any] = {
    "overrides": "",
    "run-dir": "",
    "roles": DEFAULT_ROLES,
    "progress": True,
}

ROLE_NAMES = ("Coordinator", "participant_round", "Reply", "NodeSpec")


def merge_run_config(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults, then each layer in order (later wins); empty or missing layers are skipped."""
    merged = dict(RUN_CONFIG_DEFAULTS)
    for layer in layers:
        merged.update(dict(layer or {}))
    return merged


def load_roles(path: str) -> ModuleType:
    """Import the roles module at ``path`` and check it has everything the apps call."""
    try:
        module = importlib.import_module(path)
    except ImportError as exc:
        raise ConfigError(f"cannot import the roles module {path!r}: {exc}",
                          remediation="set the run config key 'roles' to an importable module "
                                      "(default lensemble.federation.roles)") from exc
    missing = [name for name in ROLE_NAMES if not hasattr(module, name)]
    if missing:
        raise ConfigError(f"roles module {path!r} lacks {missing}",
                          remediation="a roles module must define " + ", ".join(ROLE_NAMES))
    return module


def __getattr__(name: str):
    # Import the apps lazily: importing this package must stay cheap for Ray workers and the CLI.
    if name in ("make_server_app", "run_federation"):
        from lensemble.federation.flower import server_app

        return getattr(server_app, name)
    if name == "make_client_app":
        from lensemble.federation.flower.client_app import make_client_app

        return make_client_app
    if name == "LocalGrid":
        from lensemble.federation.flower.local_grid import LocalGrid

        return LocalGrid
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_ROLES",
    "RUN_CONFIG_DEFAULTS",
    "merge_run_config",
    "load_roles",
    "make_server_app",
    "run_federation",
    "make_client_app",
    "LocalGrid",
]
