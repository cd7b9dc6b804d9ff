"""Run a federation on one machine with the Flower apps.

:func:`launch_simulation` runs the real ServerApp and ClientApp
(:mod:`lensemble.federation.flower`) with ``C = cfg.data.num_silos`` virtual SuperNodes whose node
config holds ``partition-id`` / ``num-partitions``, either

- ``engine="ray"``: Flower's simulation engine on Ray, one CPU per virtual client (Ray's default
  of two would run clients one after another on a 2-core machine), or
- ``engine="inprocess"``: :class:`~lensemble.federation.flower.local_grid.LocalGrid`, threads in
  this process, no Ray (seconds to start; tests and CI).

The resolved config travels to both apps as ``config-json`` baked into the app factories, because
Flower's Python ``run_simulation`` gives the apps an empty ``context.run_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from lensemble.config.schema import LensembleConfig
from lensemble.errors import ConfigError

Engine = Literal["ray", "inprocess"]


def simulation_run_config(cfg: LensembleConfig, run_dir: str | Path, *, roles: str | None = None,
                          progress: bool = True) -> dict:
    """The run configuration both apps receive in a simulation.

    Virtual nodes share this machine's disk, so their local state goes where the in-process engine
    puts it: ``federation.state_dir``, else ``<run_dir>/nodes``.
    """
    from lensemble.federation.flower import DEFAULT_ROLES

    run_dir = Path(run_dir).resolve()
    return {"config-json": cfg.model_dump_json(), "run-dir": str(run_dir),
            "roles": roles or DEFAULT_ROLES, "progress": bool(progress),
            "node-state-dir": str(cfg.federation.state_dir or run_dir / "nodes")}


def launch_simulation(cfg: LensembleConfig, run_dir: str | Path, *, engine: Engine = "ray",
                      progress: bool = True, roles: str | None = None) -> dict:
    """Run ``cfg.federation.rounds`` DiLoCo rounds with ``cfg.data.num_silos`` virtual nodes.

    Returns the coordinator's summary (``Coordinator.finish()``). ``roles`` names the module with
    Coordinator / participant_round / Reply / NodeSpec (default ``lensemble.federation.roles``).
    Errors raised by the coordinator (e.g. FaultToleranceExceeded) propagate.
    """
    from lensemble.federation.flower.client_app import make_client_app
    from lensemble.federation.flower.server_app import make_server_app

    run_config = simulation_run_config(cfg, run_dir, roles=roles, progress=progress)
    Path(run_config["run-dir"]).mkdir(parents=True, exist_ok=True)
    result: dict = {}
    server_app = make_server_app(run_config, on_finish=result.update)
    client_app = make_client_app(run_config)
    num_nodes = cfg.data.num_silos

    if engine == "inprocess":
        from lensemble.federation.flower.local_grid import run_inprocess

        run_inprocess(server_app, client_app, num_nodes, run_config=run_config)
    elif engine == "ray":
        from flwr.simulation import run_simulation

        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=num_nodes,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                            "init_args": {"logging_level": "error", "log_to_driver": True}},
        )
    else:
        raise ConfigError(f"unknown simulation engine {engine!r}", remediation="use 'ray' or 'inprocess'")
    return result


__all__ = ["launch_simulation", "simulation_run_config"]


def run_federated_simulation(cfg: LensembleConfig, run_dir: str | Path | None = None, *,
                             engine: str = "ray", progress: bool = True) -> dict:
    """Run (or resume) a federated DiLoCo training on one machine; return the run summary.

    ``engine``: "ray" (Flower's simulation engine, one CPU per virtual client), "flower-inprocess"
    (the real Flower apps on an in-process grid, no Ray) or "inprocess" (no Flower at all). All
    three drive the same participant and coordinator code and give the same final checkpoint hash.
    ``run_dir`` defaults to ``cfg.run_dir``.
    """
    run_dir = Path(run_dir or cfg.run_dir)
    if engine == "inprocess":
        from lensemble.federation.inprocess import run_inprocess

        return run_inprocess(cfg, run_dir, progress=progress)
    if engine == "flower-inprocess":
        return launch_simulation(cfg, run_dir, engine="inprocess", progress=progress)
    if engine == "ray":
        return launch_simulation(cfg, run_dir, engine="ray", progress=progress)
    raise ConfigError(f"unknown engine {engine!r}", remediation="use ray, flower-inprocess or inprocess")
