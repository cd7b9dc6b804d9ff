"""Flower's supported simulation path: ``flwr run`` against a local simulation SuperLink.

Flower 1.42 deprecates the Python ``run_simulation`` call and points to ``flwr run``. This engine
does what ``flwr run`` does for a local simulation federation, with processes it owns:

1. stage the app (pyproject.toml, lensemble/, configs/) into ``<run_dir>/flower/app`` so the FAB
   build does not walk a ``.venv`` inside the checkout;
2. start ``flower-superlink --simulation`` on a free loopback port (its own FLWR_HOME, runtime
   dependency installation off), in the caller's working directory so relative paths in the
   config (``data.root``) resolve as they do for the CLI;
3. ``flwr run <app> sim --stream`` with the run configuration in a TOML file (the resolved config
   as ``config-json``, the run folder, the participants' state folder) and the federation
   configuration ``num-supernodes=C client-resources-num-cpus=1`` (one Ray actor per virtual
   SuperNode; Ray's default of two CPUs would run clients one after another on 2 cores);
4. stream the ServerApp's ``[lensemble]`` lines to stderr, and stop the SuperLink and every
   process it started (SuperExec, the simulation runtime, Ray) by PID when the run ends — also on
   an error, Ctrl-C or SIGTERM.

**When the driver is SIGKILLed** (issue 33) none of that can run. This process holds the run
folder's lock for the whole run and hands the processes it starts a delegated hold
(:func:`~lensemble.federation.locks.delegate_env`), which the coordinator verifies before every
commit: an orphan cannot commit a round. The SuperLink and the ``flwr run`` CLI die with this
process (``PR_SET_PDEATHSIG``), and a guardian process
(:mod:`~lensemble.federation.flower.guardian`) SIGKILLs the rest of the tree (SuperExec,
``flwr-simulation``, Ray) within a second; the ServerApp also exits on its own once this process is
gone (:func:`~lensemble.federation.flower.server_app.watch_owner`). Running the command again
resumes from the last committed round.

**On a cluster** (``ray_address``): Flower's simulation runtime calls ``ray.init()`` with no
address and its federation config has no address key, so the address travels the way Ray reads
it, as ``RAY_ADDRESS`` in the SuperLink's environment, inherited by SuperExec and the
``flwr-simulation`` process (verified: the virtual clients run as actors of the existing cluster,
tests/integration/test_ray_cluster.py). Without ``ray_address`` the variable is removed, so a
stray ``RAY_ADDRESS`` never moves a run onto a shared cluster. ``client_cpus`` / ``client_gpus``
are each virtual SuperNode's Ray resources (Flower 1.42 passes CPUs (an integer) and GPUs (a
fraction is allowed), not memory). Placement is not part of the config: where a run executes
does not change its config hash, manifest or checkpoints; it is recorded in
``<run_dir>/flower/placement.json``. Actors run in the working directory of the ``ray start``
that started their host's raylet, on whichever host Ray picks, and a silo's rounds may land on
different hosts: so ``data.root`` and ``federation.state_dir`` must be absolute, and, across
hosts, on storage every host mounts at the same path (with the run folder, which holds the
participants' state by default) — see docs/federation.md, "On a cluster".

The ServerApp and ClientApp are the module-level apps of the FAB (``[tool.flwr.app.components]``),
i.e. the real :class:`~lensemble.federation.coordinator.Coordinator` and
:func:`~lensemble.federation.participant.participant_round`. The coordinator writes
``summary.json`` into the run folder; that file (fresh from this run) is the result.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from lensemble.artifacts.storage import storage_errors
from lensemble.config.loader import config_dir
from lensemble.config.schema import LensembleConfig
from lensemble.errors import ConfigError, DiskFull, LensembleError, ReadOnlyFolder, RoundError
from lensemble.federation.flower.guardian import start_guardian
from lensemble.federation.flower.processes import (
    LOOPBACK,
    die_with_parent,
    flower_env,
    free_port,
    port_open,
    stage_app,
    start_superlink,
    venv_bin,
    write_cli_config,
)
from lensemble.federation.locks import delegate_env, lock_folder

CONNECTION = "lensemble-sim"
# Beyond the rounds' own deadlines: SuperLink start, FAB build, Ray start, warm start, collection.
STARTUP_ALLOWANCE_S = 1800.0


def app_root() -> Path:
    """The checkout that holds pyproject.toml, lensemble/ and configs/ (the Flower app)."""
    root = config_dir().parent
    if not (root / "pyproject.toml").is_file() or not (root / "lensemble").is_dir():
        raise ConfigError(f"no Flower app (pyproject.toml and lensemble/) beside {config_dir()}",
                          remediation="run from a source checkout (pip install -e .), or use --engine inprocess")
    return root


def _toml_str(text: str) -> str:
    # A TOML basic string: JSON's string escapes (\" \\ \n \uXXXX) are valid TOML escapes.
    return json.dumps(text)


def write_run_config(path: Path, cfg: LensembleConfig, run_dir: Path, state_dir: Path, progress: bool) -> Path:
    """The ``--run-config`` TOML file: every key exists in ``[tool.flwr.app.config]``."""
    lines = [f"config-json = {_toml_str(cfg.model_dump_json())}",
             f"run-dir = {_toml_str(str(run_dir))}",
             f"node-state-dir = {_toml_str(str(state_dir))}",
             f"progress = {'true' if progress else 'false'}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _number(x: float) -> str:
    # TOML-typed value for --federation-config: 1 stays "1" (an int), 0.5 is "0.5"
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def federation_config(num_supernodes: int, *, client_cpus: int = 1, client_gpus: float = 0.0) -> str:
    """The ``--federation-config`` string: C virtual SuperNodes, each a Ray actor holding
    ``client_cpus`` CPUs and ``client_gpus`` GPUs (the GPU key is left out at 0: Ray's default)."""
    out = f"num-supernodes={int(num_supernodes)} client-resources-num-cpus={int(client_cpus)}"
    if client_gpus:
        out += f" client-resources-num-gpus={_number(client_gpus)}"
    return out


def check_placement(cfg: LensembleConfig, *, ray_address: str | None, client_cpus: int,
                    client_gpus: float) -> None:
    """ConfigError for a placement that cannot work, before anything starts."""
    if isinstance(client_cpus, bool) or int(client_cpus) != client_cpus or client_cpus < 1:
        raise ConfigError(f"client CPUs must be a whole number >= 1, got {client_cpus!r}",
                          remediation="Flower's client-resources-num-cpus is an integer: pass --client-cpus 1, 2, ...")
    if isinstance(client_gpus, bool) or not float(client_gpus) >= 0:
        raise ConfigError(f"client GPUs must be >= 0, got {client_gpus!r}",
                          remediation="pass --client-gpus 1 (one GPU per participant) or a fraction such as 0.5")
    if cfg.train.device != "cpu" and not client_gpus:
        raise ConfigError(f"train.device={cfg.train.device} on the ray engine needs GPUs per virtual client",
                          remediation="pass --client-gpus 1 (Ray hides every GPU from an actor that reserves "
                                      "none), or train.device=cpu")
    if ray_address is None:
        return
    relative = [f"{name}={value}" for name, value in (("data.root", cfg.data.root),
                                                      ("federation.state_dir", cfg.federation.state_dir))
                if value is not None and not Path(value).is_absolute()]
    if relative:
        raise ConfigError(
            f"on a Ray cluster {' and '.join(relative)} would resolve in each worker's own working "
            "directory (where its host's `ray start` ran), not here",
            remediation="give an absolute path, on storage every host mounts at the same path "
                        "(docs/federation.md, 'On a cluster')")
    host, sep, port = ray_address.rpartition(":")
    if sep and port.isdigit() and "://" not in ray_address and not port_open(host or LOOPBACK, int(port)):
        raise ConfigError(f"no Ray cluster answers at {ray_address}",
                          remediation="start the head first (`ray start --head --port ...`, docs/federation.md "
                                      "'On a cluster'), or leave out --ray-address for a private Ray")


def _deadline_s(cfg: LensembleConfig) -> float:
    fed = cfg.federation
    return STARTUP_ALLOWANCE_S + fed.rounds * (1 + fed.round_retries) * (fed.round_timeout_s + 60.0)


def run_with_flwr(cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True,
                  verbose: bool = False, ray_address: str | None = None, client_cpus: int = 1,
                  client_gpus: float = 0.0) -> dict:
    """Run (or resume) ``cfg``'s federation through ``flwr run`` on a local simulation SuperLink.

    Returns the coordinator's summary. ``verbose`` also streams Flower's own log lines (INFO,
    DEBUG, warnings); by default only the ServerApp's ``[lensemble]`` lines and errors are shown.
    ``ray_address`` (``host:port`` of a running cluster's GCS, or ``auto``) runs the virtual
    clients on that cluster instead of a private Ray; ``client_cpus`` / ``client_gpus`` are each
    virtual client's Ray resources. None of the three is part of the config (see the module
    docstring). Raises ConfigError for a placement that cannot work, RoundError (with the end of
    the log) when the run does not finish.
    """
    check_placement(cfg, ray_address=ray_address, client_cpus=client_cpus, client_gpus=client_gpus)
    run_dir = Path(run_dir).resolve()
    # Held for the whole run; the coordinator gets a delegated hold tied to this process's life.
    # A read-only or full run folder is refused here, by name (ReadOnlyFolder / DiskFull).
    hold = lock_folder(run_dir, what="run folder")
    try:
        return _run_locked(cfg, run_dir, hold, progress=progress, verbose=verbose, ray_address=ray_address,
                           client_cpus=client_cpus, client_gpus=client_gpus)
    finally:
        hold.release()


def _run_locked(cfg: LensembleConfig, run_dir: Path, hold, *, progress: bool, verbose: bool,
                ray_address: str | None, client_cpus: int, client_gpus: float) -> dict:
    work = run_dir / "flower"
    summary_path = run_dir / "summary.json"
    started_at = time.time()
    fed_config = federation_config(cfg.data.num_silos, client_cpus=client_cpus, client_gpus=client_gpus)
    with storage_errors(work, "staging the Flower app", access=False):
        work.mkdir(parents=True, exist_ok=True)
        app = stage_app(app_root(), work / "app")
        state_dir = Path(cfg.federation.state_dir or run_dir / "nodes").resolve()
        run_config = write_run_config(work / "run-config.toml", cfg, run_dir, state_dir, progress)
        (work / "placement.json").write_text(json.dumps(
            {"ray_address": ray_address, "federation_config": fed_config, "cwd": os.getcwd()}, indent=1) + "\n")
    cli_home = work / "cli-home"
    guardian = start_guardian(work / "guardian.log")  # reaps the tree if this process is SIGKILLed
    link = None
    previous = _stop_on_sigterm()
    try:
        # Ray reads its cluster address from RAY_ADDRESS; SuperExec and flwr-simulation inherit it,
        # and the delegated run-folder hold (locks.DELEGATE_ENV) with it.
        link = start_superlink(work, port=free_port(), simulation=True, cwd=Path.cwd(),
                               env_extra={"RAY_ADDRESS": ray_address, **delegate_env(run_dir)})
        guardian.watch(link.pid)
        write_cli_config(cli_home, {CONNECTION: {"address": f"{LOOPBACK}:{link.port}", "insecure": True}})
        argv = [str(venv_bin() / "flwr"), "run", str(app), CONNECTION, "--stream",
                "--run-config", str(run_config), "--federation-config", fed_config]
        log_path = work / "flwr-run.log"
        rc = _stream(argv, env=flower_env(cli_home), log_path=log_path, deadline_s=_deadline_s(cfg),
                     show_all=verbose, show=progress, on_start=guardian.watch)
    finally:
        if link is not None:
            link.stop()
        guardian.done()  # everything is stopped: the guardian leaves without killing
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    fresh = summary_path.exists() and summary_path.stat().st_mtime >= started_at
    if rc != 0 or not fresh:
        tail = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
        superlink_tail = link.log_text()[-2000:]
        named = storage_cause(tail)
        if named is not None:  # the coordinator's disk: said first, with its remedy, not as a log tail
            raise named
        raise RoundError(f"the Flower simulation did not finish (flwr run exit code {rc}); "
                         f"log {log_path}:\n{tail}\nSuperLink log:\n{superlink_tail}",
                         remediation="read the ServerApp error above; --engine inprocess runs the same "
                                     "rounds without Flower")
    return json.loads(summary_path.read_text())


_CAUSE = re.compile(r"\[(disk_full|read_only)\] (.+?)(?: \(fix: .*)?$")


def storage_cause(log_tail: str) -> LensembleError | None:
    """The coordinator's DiskFull / ReadOnlyFolder as the ServerApp logged it, or None."""
    for line in reversed(log_tail.splitlines()):
        found = _CAUSE.search(line.strip())
        if found:
            cls = DiskFull if found.group(1) == DiskFull.code else ReadOnlyFolder
            return cls(found.group(2))
    return None


def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


def _stop_on_sigterm():
    """Turn SIGTERM into SystemExit while the run lasts, so ``finally`` stops the SuperLink tree
    (Ctrl-C already raises KeyboardInterrupt); returns the handler to restore, or None off the
    main thread (only it may set handlers). SIGKILL cannot be caught: the tree then outlives us."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_exit)


def _stream(argv: list[str], *, env: dict, log_path: Path, deadline_s: float, show_all: bool, show: bool,
            on_start: Callable[[int], None] | None = None) -> int:
    """Run ``argv``; copy its output to ``log_path`` and the chosen lines to stderr; kill at the deadline.

    The process dies with this one (``PR_SET_PDEATHSIG``); ``on_start(pid)`` is told its PID."""
    end = time.monotonic() + deadline_s
    with open(log_path, "w") as log, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                      env=env, text=True, stdin=subprocess.DEVNULL,
                                                      cwd=os.getcwd(), bufsize=1,
                                                      preexec_fn=die_with_parent()) as proc:
        if on_start is not None:
            on_start(proc.pid)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if show and (show_all or _worth_showing(line)):
                    sys.stderr.write(line)
                    sys.stderr.flush()
                if time.monotonic() > end:
                    proc.kill()
                    return -9
            return proc.wait(timeout=max(1.0, end - time.monotonic()))
        except BaseException:
            proc.kill()  # Ctrl-C or an error here: the CLI process goes; the caller stops the SuperLink
            raise


def _worth_showing(line: str) -> bool:
    """The ServerApp's own lines, progress, and anything that looks like an error."""
    text = line.strip()
    return ("[lensemble]" in text or "Traceback" in text or "Error" in text or text.startswith("File ")
            or "ERROR" in text)


__all__ = ["run_with_flwr", "app_root", "write_run_config", "federation_config", "check_placement"]
