"""The coordinator's ServerApp: read the run config, build the coordinator, drive its rounds.

The rounds themselves are :func:`lensemble.federation.rounds.drive_rounds`, the same driver the
framework-free engine uses; this app supplies only how to ask the participants
(:class:`~lensemble.federation.flower.transport.GridAsk`, messages over the Flower Grid, or
:class:`~lensemble.federation.flower.secagg.SecureGridAsk`, Flower's SecAgg+ stages, under
``federation.secure_aggregation``).
"""

from __future__ import annotations

import gc
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from lensemble.config.loader import load_config
from lensemble.config.schema import LensembleConfig, validate_config
from lensemble.federation.coordinator import Coordinator
from lensemble.federation.flower import merge_run_config
from lensemble.federation.flower.secagg import SecureGridAsk
from lensemble.federation.flower.transport import GridAsk
from lensemble.federation.locks import delegated_owner, owner_gone
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
                    on_finish: Callable[[dict], None] | None = None,
                    on_exit: Callable[[], None] | None = None,
                    cancel: threading.Event | None = None) -> ServerApp:
    """A ServerApp that runs ``coordinator(cfg, run_dir, progress=...)``'s remaining rounds.

    ``run_config`` is laid over ``context.run_config`` (Flower's deprecated ``run_simulation``
    leaves the latter empty); ``on_finish`` receives the coordinator's summary; ``on_exit`` runs
    when the app ends, however it ends; ``cancel`` (set by a launcher, e.g. on Ctrl-C) ends the
    rounds at the next wait. When the app ends inside a Ray simulation, actors still running a
    message (hung clients) are killed (:func:`stop_busy_ray_actors`), or Flower's simulation
    runtime would wait for them forever.
    """
    baked = dict(run_config or {})
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        watch_owner()
        try:
            rc = merge_run_config(context.run_config, baked)
            cfg = resolve_config(rc)
            progress = bool(rc["progress"])
            coord = coordinator(cfg, resolve_run_dir(cfg, rc), progress=progress)
            # [secagg] Flower's SecAgg+ stages instead of one plain "train" message per node
            ask = (SecureGridAsk(grid, cfg, cancel=cancel) if cfg.federation.secure_aggregation
                   else GridAsk(grid, cfg, cancel=cancel))
            summary = drive_rounds(coord, ask, cfg.federation, progress=progress)
            if on_finish is not None:
                on_finish(summary)
        finally:
            stop_busy_ray_actors()
            if on_exit is not None:
                on_exit()

    return server


OWNER_POLL_S = 1.0
ORPHAN_EXIT_CODE = 75  # this process's driver is gone (EX_TEMPFAIL: run the command again)


def watch_owner(poll_s: float = OWNER_POLL_S, on_gone: Callable[[str], None] | None = None) -> bool:
    """In a process started by a ``lensemble run`` driver (:func:`~lensemble.federation.locks.delegated_owner`):
    a daemon thread that ends this process within ``poll_s`` once the driver is gone or another
    run holds the folder. Returns whether it started one (not outside such a driver).

    The driver's guardian normally kills the whole tree first; this is the fallback for a tree the
    guardian could not reach, so an orphaned federation stops training (and the coordinator's
    pre-commit check already refuses its writes). ``on_gone`` replaces the exit (tests).
    """
    info = delegated_owner()
    if info is None:
        return False

    def exit_now(why: str) -> None:
        print(f"[lensemble] {why}: this federation (PID {os.getpid()}) stops, nothing more is written",
              file=sys.stderr, flush=True)
        os._exit(ORPHAN_EXIT_CODE)  # no cleanup runs: nothing of an orphan's may reach the run folder

    def loop() -> None:
        while (why := owner_gone(info)) is None:
            time.sleep(poll_s)
        (on_gone or exit_now)(why)

    threading.Thread(target=loop, name="lensemble-owner-watch", daemon=True).start()
    return True


def stop_busy_ray_actors() -> int:
    """In a Ray simulation process: kill the actors still running a message; return how many.

    Flower 1.42's simulation runtime hands each message to an actor of its RayBackend's pool and
    waits for the result on a worker thread; a client that never returns keeps that thread (and
    so the whole ``flwr-simulation`` process, and ``flwr run``) waiting after the ServerApp has
    finished. Killing the busy actors makes those waits fail, the runtime then stops as usual.
    Flower internals (``raybackend.RayBackend``, ``pool._future_to_actor``), confined here; a no-op
    where Ray is not running in this process (in-process grid, SuperLink deployments).
    """
    module = sys.modules.get("flwr.server.superlink.fleet.vce.backend.raybackend")
    ray = sys.modules.get("ray")
    # Ray may still be half-imported by the runtime's other thread (a resumed run with no round
    # left ends before Ray is up): no ``is_initialized`` yet, and no actor to kill either.
    is_initialized = getattr(ray, "is_initialized", None)
    if module is None or not callable(is_initialized) or not is_initialized():
        return 0
    killed = 0
    backends = [o for o in gc.get_objects() if isinstance(o, module.RayBackend)]
    for backend in backends:
        pool = getattr(backend, "pool", None)
        for actor in list(getattr(pool, "_future_to_actor", {}).values()):
            try:
                ray.kill(actor, no_restart=True)
                killed += 1
            except Exception:  # already gone
                pass
    return killed


app = make_server_app()

__all__ = ["app", "make_server_app", "resolve_config", "resolve_run_dir", "stop_busy_ray_actors", "watch_owner"]
