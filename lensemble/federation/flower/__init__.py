"""Thin Flower adapters: the ServerApp and ClientApp that carry DiLoCo rounds over Flower.

The learning logic is framework-free: :class:`~lensemble.federation.coordinator.Coordinator` and
:func:`~lensemble.federation.participant.participant_round`, driven by
:func:`~lensemble.federation.rounds.drive_rounds`. The apps only move records, read
configuration and call those, so the same apps run

- in-process on :class:`~lensemble.federation.flower.local_grid.LocalGrid` (tests, CI, no Ray),
- on Flower's simulation runtime via ``flwr run`` and a local simulation SuperLink
  (:func:`lensemble.federation.flower.runtime.run_with_flwr`),
- on real SuperLink / SuperNodes via ``flwr run . <federation>`` (docs/deployment.md).

:func:`~lensemble.federation.flower.server_app.make_server_app` takes the coordinator class and
:func:`~lensemble.federation.flower.client_app.make_client_app` the participant function as
objects (tests pass fakes); the module-level ``app`` of each file is built with the real ones.

Run configuration (``context.run_config``; defaults in ``[tool.flwr.app.config]`` of
pyproject.toml, which must match :data:`RUN_CONFIG_DEFAULTS`):

=============== ========================================================================
``overrides``   Hydra overrides, one string, e.g. ``"experiment=micro federation.rounds=5"``
``run-dir``     where the coordinator writes checkpoints and metrics ("" = the config's run_dir)
``progress``    print one line per round on the ServerApp's stderr
``config-json`` a whole resolved config as JSON ("" = compose ``overrides``); wins over it
``node-state-dir`` participants' local state when virtual nodes share the coordinator's disk
=============== ========================================================================

The app factories also take a run configuration to bake in, for launchers whose runtime leaves
``context.run_config`` empty (the in-process grid).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RUN_CONFIG_DEFAULTS: dict[str, Any] = {
    "overrides": "",
    "run-dir": "",
    "progress": True,
    "config-json": "",      # a whole resolved config as JSON; wins over "overrides"
    "node-state-dir": "",   # participants' local state when virtual nodes share this disk
}


def merge_run_config(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Defaults, then each layer in order (later wins); empty or missing layers are skipped."""
    merged = dict(RUN_CONFIG_DEFAULTS)
    for layer in layers:
        merged.update(dict(layer or {}))
    return merged


__all__ = ["RUN_CONFIG_DEFAULTS", "merge_run_config"]
