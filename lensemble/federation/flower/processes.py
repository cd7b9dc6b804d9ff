"""Flower processes started by Lensemble itself: a local SuperLink, the ``flwr`` CLI, teardown.

The Flower simulation engine that ``flwr run`` drives (:mod:`lensemble.federation.flower.runtime`)
needs a SuperLink process and the CLI; the loopback tests add SuperNodes, TLS material and node
keys on top (tests/integration/flower_processes.py).

Each process gets its own ``FLWR_HOME`` (Flower keeps CLI config, installed FABs and state there),
telemetry and update checks off, runtime dependency installation off, and the current venv's
``bin`` on ``PATH`` (Flower spawns ``flwr-serverapp`` / ``flwr-simulation`` /
``flower-superexec`` by name). Every wait has a deadline. :meth:`FlowerProcess.stop` ends the
process it started and every descendant it had (the SuperLink starts its SuperExec in a new
session, so a process-group signal would miss it; Ray's raylet and workers descend from the
simulation process), by PID, SIGTERM first and SIGKILL after a grace period. A SIGKILL of the
process that started them cannot run that code: every process started here also dies with its
parent (Linux ``PR_SET_PDEATHSIG``, :func:`die_with_parent`), and the ray engine adds a guardian
that reaps the rest of the tree (:mod:`lensemble.federation.flower.guardian`).

:func:`stage_app` copies the Flower app (pyproject.toml, lensemble/, configs/) to a clean folder:
``flwr run`` builds the FAB by walking every file under the app folder, and a ``.venv`` inside the
checkout makes that take 15-30 s per run.

:func:`start_ray_head` starts a one-node Ray cluster of its own (``ray start --head --block``, every
port picked free) for the cluster test and drills; :func:`processes_mentioning` finds what is left
of it by its temp dir.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lensemble.federation.flower.guardian import process_table

LOOPBACK = "127.0.0.1"


def venv_bin() -> Path:
    """The folder holding this interpreter and the ``flower-*`` / ``flwr`` entry points."""
    return Path(sys.executable).parent


def flower_env(home: Path | str, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """Environment for a Flower process whose ``FLWR_HOME`` is ``home``; an ``extra`` value of
    None removes that variable (e.g. ``RAY_ADDRESS`` for a private Ray)."""
    env = dict(os.environ)
    env.update({
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PATH": f"{venv_bin()}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    })
    for key, value in dict(extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    Path(home).mkdir(parents=True, exist_ok=True)
    return env


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago (the OS picks it; a small race remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct TCP ports that were free a moment ago (all held open while picking)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl():
    # Loaded here, in the parent: dlopen between fork and exec (in preexec_fn) can deadlock.
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def die_with_parent(sig: int = signal.SIGKILL):
    """A ``preexec_fn`` that makes the child get ``sig`` when the thread that started it ends
    (the process, for a caller that waits on its child in the same thread, as here); None off
    Linux. Checks the parent did not die between fork and prctl (the signal would never come)."""
    if _PRCTL is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # orphaned already: the death signal was missed
            os.kill(os.getpid(), int(sig))

    return preexec


def descendants(pid: int) -> list[int]:
    """All descendants of ``pid``, parents before children (one pass over /proc)."""
    children: dict[int, list[int]] = {}
    for child, parent in process_table().items():
        children.setdefault(parent, []).append(child)
    found, frontier = [], [pid]
    while frontier:
        kids = [c for p in frontier for c in children.get(p, ())]
        found.extend(kids)
        frontier = kids
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class FlowerProcess:
    """A Flower process this module started: its Popen, FLWR_HOME, log file and main port."""

    name: str
    popen: subprocess.Popen
    home: Path
    log_path: Path
    port: int
    argv: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code, or None if it is still running after ``timeout_s``."""
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM this process and its descendants, SIGKILL what is left after ``grace_s``."""
        family = descendants(self.pid) if self.alive() else []
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
        code = self.wait_exit(grace_s)
        if code is None:
            self.popen.kill()
            code = self.wait_exit(5.0)
        leftover = [p for p in family if _alive(p)]
        _signal(leftover, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(p) for p in leftover):
            time.sleep(0.1)
        _signal([p for p in leftover if _alive(p)], signal.SIGKILL)
        return code


def _spawn(name: str, argv: Sequence[str], *, home: Path, workdir: Path, port: int,
           env_extra: Mapping[str, str] | None, cwd: Path | None = None) -> FlowerProcess:
    """Start ``argv`` with its log in ``workdir``; it runs in ``cwd`` (default ``workdir``).

    The process dies with the thread that started it (:func:`die_with_parent`): a SIGKILLed
    driver or test run leaves no SuperLink listening (issue 33). Start it from the thread that
    also stops it (every caller here does)."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=cwd or workdir,
                                 env=flower_env(home, env_extra), stdin=subprocess.DEVNULL,
                                 preexec_fn=die_with_parent())
    return FlowerProcess(name=name, popen=popen, home=home, log_path=log_path, port=port, argv=list(argv))


def wait_for_port(proc: FlowerProcess, host: str, port: int, deadline_s: float) -> None:
    """Block until ``host:port`` accepts connections; raise if ``proc`` dies or time runs out."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with code {proc.popen.returncode} before "
                               f"listening on {host}:{port}:\n{proc.log_text()[-3000:]}")
        if port_open(host, port):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{proc.name} did not listen on {host}:{port} within {deadline_s:g} s:\n"
                       f"{proc.log_text()[-3000:]}")


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the CA certificate (given to nodes and the CLI) and the server's cert and key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def start_superlink(workdir: Path | str, *, port: int | None = None, host: str = LOOPBACK,
                    tls: TLSFiles | None = None, enable_supernode_auth: bool = False,
                    database: Path | str | None = None, simulation: bool = False,
                    env_extra: Mapping[str, str] | None = None, ready_timeout_s: float = 60.0,
                    name: str = "superlink", cwd: Path | str | None = None) -> FlowerProcess:
    """Start ``flower-superlink`` (Fleet, Control and Runtime APIs on one port) and wait for it.

    Insecure unless ``tls`` is given. ``database`` None keeps state in memory. The FLWR_HOME is
    ``<workdir>/<name>-home``.
    """
    workdir = Path(workdir)
    port = port or free_port(host if host != "0.0.0.0" else LOOPBACK)
    argv = [str(venv_bin() / "flower-superlink"), "--host", host, "--port", str(port),
            "--disable-runtime-dependency-installation"]
    if tls is None:
        argv.append("--insecure")
    else:
        argv += ["--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.server_cert),
                 "--ssl-keyfile", str(tls.server_key)]
    if enable_supernode_auth:
        argv.append("--enable-supernode-auth")
    if database is not None:
        argv += ["--database", str(database)]
    if simulation:
        argv.append("--simulation")
    proc = _spawn(name, argv, home=workdir / f"{name}-home", workdir=workdir, port=port,
                  env_extra=env_extra, cwd=Path(cwd) if cwd else None)
    try:
        wait_for_port(proc, LOOPBACK if host == "0.0.0.0" else host, port, ready_timeout_s)
    except Exception:
        proc.stop()
        raise
    return proc


def stop_all(procs: Iterable[FlowerProcess | None], grace_s: float = 10.0) -> None:
    """Stop every process given (nodes first is the caller's choice of order), ignoring Nones."""
    for proc in procs:
        if proc is not None:
            proc.stop(grace_s)


def write_cli_config(home: Path | str, connections: Mapping[str, Mapping[str, Any]],
                     default: str | None = None) -> Path:
    """Write ``$FLWR_HOME/config.toml`` for the ``flwr`` CLI.

    ``connections``: name -> {"address": "host:port", and "insecure": True or
    "root-certificates": "/path/ca.crt"}.
    """
    lines = ["[superlink]", f'default = "{default or next(iter(connections))}"', ""]
    for conn, values in connections.items():
        lines.append(f"[superlink.{conn}]")
        for key, value in values.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            else:
                lines.append(f'{key} = "{value}"')
        lines.append("")
    path = Path(home) / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def flwr_cli(args: Sequence[str], *, home: Path | str, cwd: Path | str | None = None,
             timeout_s: float = 120.0, env_extra: Mapping[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    """Run ``flwr ARGS`` with ``FLWR_HOME=home``; output captured, never raises on exit code."""
    return subprocess.run([str(venv_bin() / "flwr"), *args], cwd=cwd, env=flower_env(home, env_extra),
                          capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


# ------------------------------------------------------------------ a Ray head of our own (tests, drills)
def start_ray_head(workdir: Path | str, *, num_cpus: int = 2, num_gpus: int = 0, port: int | None = None,
                   temp_dir: Path | str | None = None, object_store_mb: int = 256,
                   ready_timeout_s: float = 180.0, name: str = "ray-head") -> FlowerProcess:
    """Start ``ray start --head --block`` (a one-node Ray cluster) and wait until it is up.

    ``--block`` keeps the ``ray start`` process in the foreground with GCS, raylet and the agents
    as its descendants, so :meth:`FlowerProcess.stop` ends the whole head by PID (``ray stop``
    would stop every Ray process on the machine, other users' included). Every port it opens
    (GCS, node and object manager, agents, client server, dashboard, metrics) is picked free,
    so it does not collide with another Ray on the machine. Connect with
    ``RAY_ADDRESS=127.0.0.1:<port>`` (Ray advertises the host's own address and listens on all
    interfaces; 127.0.0.1 reaches it from this host). ``temp_dir`` (Ray's sessions, sockets and
    logs) must be short (Unix socket paths are limited to 107 bytes); default
    ``<workdir>/ray``. The returned process's ``port`` is the GCS port.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    temp = Path(temp_dir or workdir / "ray")
    temp.mkdir(parents=True, exist_ok=True)
    flags = ("--node-manager-port", "--object-manager-port", "--ray-client-server-port", "--dashboard-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
             "--metrics-export-port")
    ports = free_ports(len(flags) + 1)
    port = port or ports[-1]
    argv = [str(venv_bin() / "ray"), "start", "--head", "--block", "--port", str(port),
            "--node-ip-address", LOOPBACK, "--num-cpus", str(int(num_cpus)), "--num-gpus", str(int(num_gpus)),
            "--disable-usage-stats", "--include-dashboard", "false", "--temp-dir", str(temp),
            "--object-store-memory", str(int(object_store_mb) * 1024 * 1024)]
    for flag, free in zip(flags, ports[:-1], strict=True):
        argv += [flag, str(free)]
    proc = _spawn(name, argv, home=workdir / f"{name}-home", workdir=workdir, port=port,
                  env_extra={"RAY_ADDRESS": None, "RAY_USAGE_STATS_ENABLED": "0"}, cwd=workdir)
    end = time.monotonic() + ready_timeout_s
    try:
        while "Ray runtime started" not in proc.log_text():
            if not proc.alive():
                raise RuntimeError(f"ray start exited with code {proc.popen.returncode}:\n{proc.log_text()[-3000:]}")
            if time.monotonic() > end:
                raise TimeoutError(f"the Ray head did not start within {ready_timeout_s:g} s:\n"
                                   f"{proc.log_text()[-3000:]}")
            time.sleep(0.5)
        wait_for_port(proc, LOOPBACK, port, max(1.0, end - time.monotonic()))
    except BaseException:
        proc.stop()
        raise
    return proc


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text`` (e.g. a Ray head's temp dir:
    its GCS, raylet, agents and log monitor carry it; workers rename themselves ``ray::...``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def stage_app(src_root: Path | str, dest: Path | str) -> Path:
    """Copy the Flower app (pyproject.toml, .gitignore, lensemble/, configs/) to ``dest``.

    ``flwr run <dest>`` then builds the same FAB as from the checkout, without walking a
    ``.venv``, ``data/`` or ``runs/`` that lives inside it.
    """
    src, dest = Path(src_root), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", ".gitignore"):
        if (src / name).exists():
            shutil.copy2(src / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("lensemble", "configs"):
        shutil.copytree(src / name, dest / name, ignore=ignore, dirs_exist_ok=True)
    return dest


__all__ = [
    "LOOPBACK", "FlowerProcess", "TLSFiles", "venv_bin", "flower_env", "free_port", "free_ports", "port_open",
    "descendants", "die_with_parent", "wait_for_port", "start_superlink", "stop_all", "write_cli_config", "flwr_cli",
    "stage_app", "start_ray_head", "processes_mentioning",
]
