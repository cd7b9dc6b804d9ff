"""The coordinator's ServerApp: read the run config, build the coordinator, drive its rounds.

The rounds themselves are :func:`lensemble.federation.rounds.drive_rounds`, the same driver the
framework-free engine uses; this app supplies only how to ask the participants
(:class:`~lensemble.federation.flower.transport.GridAsk`, messages over the Flower Grid).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from lensemble.config.loader import load_config
from lensemble.config.schema import LensembleConfig, validate_config
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.flower import merge_run_config
from lensemble.federation.flower.transport import GridAsk
from lensemble.federation.rounds import drive_rounds


def resolve_config(run_config: Mapping[str, Any]) -> LensembleConfig:
    """The run's config: ``config-json`` if given, else the Hydra ``overrides`` string."""
    blob = run_config.get("config-json")
    if blob:
        return validate_config(json.loads(str(blob)))
    return load_config(shlex.split(str(run_config.get("overrides") or "")))


def resolve_run_dir(cfg: LensembleConfig, run_config: Mapping[str, Any]) -> Path:
    """``run-dir`` from the run config, else ``cfg.run_dir``; relative paths are made absolute here."""
    return Path(str(run_config.get("run-dir") or cfg.run_dir)).expanduser().resolve()


def make_server_app(coordinator: Callable[..., Any] = Coordinator, *,
                    run_config: Mapping[str, Any] | None = None,
                    on_finish: Callable[[dict], None] | None = None) -> ServerApp:
    """A ServerApp that runs ``coordinator(cfg, run_dir, progress=...)``'s remaining rounds.

    ``run_config`` is laid over ``context.run_config`` (Flower's deprecated ``run_simulation``
    leaves the latter empty); ``on_finish`` receives the coordinator's summary.
    """
    baked = dict(run_config or {})
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        rc = merge_run_config(context.run_config, baked)
        cfg = resolve_config(rc)
        progress = bool(rc["progress"])
        coord = coordinator(cfg, resolve_run_dir(cfg, rc), progress=progress)
        summary = drive_rounds(coord, GridAsk(grid, cfg), cfg.federation, progress=progress)
        if on_finish is not None:
            on_finish(summary)

    return server


app = make_server_app()

__all__ = ["app", "make_server_app", "resolve_config", "resolve_run_dir"]
