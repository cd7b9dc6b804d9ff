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
   an error or Ctrl-C.

The ServerApp and ClientApp are the module-level apps of the FAB (``[tool.flwr.app.components]``),
i.e. the real :class:`~lensemble.federation.coordinator.Coordinator` and
:func:`~lensemble.federation.participant.participant_round`. The coordinator writes
``summary.json`` into the run folder; that file (fresh from this run) is the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lensemble.config.loader import config_dir
from lensemble.config.schema import LensembleConfig
from lensemble.errors import ConfigError, RoundError
from lensemble.federation.flower.processes import (
    LOOPBACK,
    flower_env,
    free_port,
    stage_app,
    start_superlink,
    venv_bin,
    write_cli_config,
)

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


def _deadline_s(cfg: LensembleConfig) -> float:
    fed = cfg.federation
    return STARTUP_ALLOWANCE_S + fed.rounds * (1 + fed.round_retries) * (fed.round_timeout_s + 60.0)


def run_with_flwr(cfg: LensembleConfig, run_dir: str | Path, *, progress: bool = True,
                  verbose: bool = False) -> dict:
    """Run (or resume) ``cfg``'s federation through ``flwr run`` on a local simulation SuperLink.

    Returns the coordinator's summary. ``verbose`` also streams Flower's own log lines (INFO,
    DEBUG, warnings); by default only the ServerApp's ``[lensemble]`` lines and errors are shown.
    Raises RoundError (with the end of the log) when the run does not finish.
    """
    run_dir = Path(run_dir).resolve()
    work = run_dir / "flower"
    work.mkdir(parents=True, exist_ok=True)
    summary_path = run_dir / "summary.json"
    started_at = time.time()
    app = stage_app(app_root(), work / "app")
    state_dir = Path(cfg.federation.state_dir or run_dir / "nodes").resolve()
    run_config = write_run_config(work / "run-config.toml", cfg, run_dir, state_dir, progress)
    cli_home = work / "cli-home"
    link = start_superlink(work, port=free_port(), simulation=True, cwd=Path.cwd())
    try:
        write_cli_config(cli_home, {CONNECTION: {"address": f"{LOOPBACK}:{link.port}", "insecure": True}})
        argv = [str(venv_bin() / "flwr"), "run", str(app), CONNECTION, "--stream",
                "--run-config", str(run_config),
                "--federation-config", f"num-supernodes={cfg.data.num_silos} client-resources-num-cpus=1"]
        log_path = work / "flwr-run.log"
        rc = _stream(argv, env=flower_env(cli_home), log_path=log_path, deadline_s=_deadline_s(cfg),
                     show_all=verbose, show=progress)
    finally:
        link.stop()
    fresh = summary_path.exists() and summary_path.stat().st_mtime >= started_at
    if rc != 0 or not fresh:
        tail = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
        superlink_tail = link.log_text()[-2000:]
        raise RoundError(f"the Flower simulation did not finish (flwr run exit code {rc}); "
                         f"log {log_path}:\n{tail}\nSuperLink log:\n{superlink_tail}",
                         remediation="read the ServerApp error above; --engine inprocess runs the same "
                                     "rounds without Flower")
    return json.loads(summary_path.read_text())


def _stream(argv: list[str], *, env: dict, log_path: Path, deadline_s: float, show_all: bool, show: bool) -> int:
    """Run ``argv``; copy its output to ``log_path`` and the chosen lines to stderr; kill at the deadline."""
    end = time.monotonic() + deadline_s
    with open(log_path, "w") as log, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                      env=env, text=True, stdin=subprocess.DEVNULL,
                                                      cwd=os.getcwd(), bufsize=1) as proc:
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


__all__ = ["run_with_flwr", "app_root", "write_run_config"]
