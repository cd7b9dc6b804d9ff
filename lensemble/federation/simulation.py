"""Run a federation on one machine: one function per engine, all driving the same rounds.

=================== =================================================================================
engine              what runs
=================== =================================================================================
``ray``             :func:`~lensemble.federation.flower.runtime.run_with_flwr`: the real ServerApp and
                    ClientApp on Flower's simulation runtime (Ray, one actor and one CPU per
                    virtual SuperNode), launched the supported way — ``flwr run`` against a local
                    simulation SuperLink this process starts and stops
``flower-inprocess`` :func:`run_on_local_grid`: the real ServerApp and ClientApp on an in-process
                    :class:`~lensemble.federation.flower.local_grid.LocalGrid` (threads, no Ray)
``inprocess``       :func:`~lensemble.federation.inprocess.run_inprocess`: no Flower at all
=================== =================================================================================

All three give the same final checkpoint hash for the same config (tests check it). The Flower
engines run ``C = data.num_silos`` virtual nodes whose node config holds ``partition-id`` /
``num-partitions``; the resolved config travels to both apps as the run config's ``config-json``.
Flower's Python ``run_simulation`` is deprecated in 1.42 (it prints a banner and leaves
``context.run_config`` empty); no engine here calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.errors import ConfigError
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.flower.client_app import make_client_app
from lensemble.federation.flower.local_grid import serve_on_local_grid
from lensemble.federation.flower.runtime import run_with_flwr
from lensemble.federation.flower.server_app import make_server_app
from lensemble.federation.inprocess import run_inprocess
from lensemble.federation.participant import participant_round


def simulation_run_config(cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True) -> dict:
    """The run configuration both apps receive in a simulation.

    Virtual nodes share this machine's disk, so their local state goes where the in-process engine
    puts it: ``federation.state_dir``, else ``<run_dir>/nodes``.
    """
    run_dir = Path(run_dir).resolve()
    return {"config-json": cfg.model_dump_json(), "run-dir": str(run_dir), "progress": bool(progress),
            "node-state-dir": str(cfg.federation.state_dir or run_dir / "nodes")}


def _apps(cfg, run_dir, progress, coordinator, participant):
    run_config = simulation_run_config(cfg, run_dir, progress=progress)
    Path(run_config["run-dir"]).mkdir(parents=True, exist_ok=True)
    result: dict = {}
    server_app = make_server_app(coordinator, run_config=run_config, on_finish=result.update)
    client_app = make_client_app(participant, run_config=run_config)
    return server_app, client_app, run_config, result


def run_on_local_grid(cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True,
                      coordinator: Callable = Coordinator, participant: Callable = participant_round) -> dict:
    """The Flower apps on an in-process grid (threads, no Ray); returns the coordinator's summary."""
    server_app, client_app, run_config, result = _apps(cfg, run_dir, progress, coordinator, participant)
    serve_on_local_grid(server_app, client_app, cfg.data.num_silos, run_config=run_config)
    return result


ENGINES: dict[str, Callable[..., dict]] = {
    "ray": run_with_flwr,
    "flower-inprocess": run_on_local_grid,
    "inprocess": run_inprocess,
}


def run_federated_simulation(cfg: LensembleConfig, run_dir: str | Path | None = None, *,
                             engine: str = "ray", progress: bool = True) -> dict:
    """Run (or resume) a federated DiLoCo training on one machine; return the run summary.

    ``engine`` is one of :data:`ENGINES` (see the module docstring). ``run_dir`` defaults to
    ``cfg.run_dir``.
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}", remediation="use " + ", ".join(ENGINES))
    return ENGINES[engine](cfg, Path(run_dir or cfg.run_dir), progress=progress)


__all__ = ["ENGINES", "run_federated_simulation", "run_on_local_grid", "simulation_run_config"]
