"""Start and stop Flower's SuperLink and SuperNodes as local processes (the loopback tests).

Each process gets its own ``FLWR_HOME`` (Flower keeps CLI config, installed FABs and state there),
telemetry and update checks off, runtime dependency installation off, and the current venv's
``bin`` on ``PATH`` (Flower spawns ``flwr-serverapp`` / ``flwr-clientapp`` / ``flower-superexec``
by name). Every wait has a deadline. :meth:`FlowerProcess.stop` ends the process it started and
every descendant it had (the SuperLink starts its SuperExec in a new session, so a process-group
signal would miss it), by PID, SIGTERM first and SIGKILL after a grace period.

Also here: TLS material with ``openssl`` (a CA and a server certificate whose SAN names the
address nodes dial), EC node keys with ``ssh-keygen``, the CLI's ``config.toml``, and
:func:`stage_app`, which copies the Flower app (pyproject.toml, lensemble/, configs/) to a clean
folder: ``flwr run`` builds the FAB by walking every file under the app folder, and a ``.venv``
inside the checkout makes that take 15-30 s per run.
"""

from __future__ import annotations

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

LOOPBACK = "127.0.0.1"


def venv_bin() -> Path:
    """The folder holding this interpreter and the ``flower-*`` / ``flwr`` entry points."""
    return Path(sys.executable).parent


def flower_env(home: Path | str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a Flower process whose ``FLWR_HOME`` is ``home``."""
    env = dict(os.environ)
    env.update({
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PATH": f"{venv_bin()}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(dict(extra or {}))
    Path(home).mkdir(parents=True, exist_ok=True)
    return env


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago (the OS picks it; a small race remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name (field 2) may contain spaces; the parent pid follows the closing ")"
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    """All descendants of ``pid``, parents before children."""
    found, frontier = [], [pid]
    while frontier:
        kids = [c for p in frontier for c in _children(p)]
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
           env_extra: Mapping[str, str] | None) -> FlowerProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                                 env=flower_env(home, env_extra), stdin=subprocess.DEVNULL)
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
                    name: str = "superlink") -> FlowerProcess:
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
                  env_extra=env_extra)
    try:
        wait_for_port(proc, LOOPBACK if host == "0.0.0.0" else host, port, ready_timeout_s)
    except Exception:
        proc.stop()
        raise
    return proc


def node_config_arg(node_config: Mapping[str, Any]) -> str:
    """``--node-config`` value: space-separated TOML ``key=value`` (strings double-quoted)."""
    parts = []
    for key, value in node_config.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        if " " in text:
            raise ValueError(f"node-config value for {key!r} may not contain spaces: {value!r}")
        parts.append(f"{key}={text}")
    return " ".join(parts)


def start_supernode(workdir: Path | str, name: str, *, superlink: str, node_config: Mapping[str, Any],
                    port: int | None = None, root_certificates: Path | str | None = None,
                    auth_private_key: Path | str | None = None, max_wait_time_s: float | None = None,
                    env_extra: Mapping[str, str] | None = None,
                    ready_timeout_s: float | None = 60.0) -> FlowerProcess:
    """Start ``flower-supernode`` connecting to ``superlink`` (host:port).

    Insecure unless ``root_certificates`` (the CA that signed the SuperLink's certificate) is
    given. ``port`` is the node's local runtime API (ClientApp processes talk to it). With
    ``ready_timeout_s`` set, waits until that port listens (the node is up; whether the SuperLink
    accepted it shows in its log and in ``flwr supernode list``).
    """
    workdir = Path(workdir)
    port = port or free_port()
    argv = [str(venv_bin() / "flower-supernode"), "--superlink", superlink, "--host", LOOPBACK,
            "--port", str(port), "--node-config", node_config_arg(node_config)]
    argv += ["--insecure"] if root_certificates is None else ["--root-certificates", str(root_certificates)]
    if auth_private_key is not None:
        argv += ["--auth-supernode-private-key", str(auth_private_key)]
    if max_wait_time_s is not None:
        argv += ["--max-wait-time", str(max_wait_time_s)]
    proc = _spawn(name, argv, home=workdir / f"{name}-home", workdir=workdir, port=port,
                  env_extra=env_extra)
    if ready_timeout_s is not None:
        try:
            wait_for_port(proc, LOOPBACK, port, ready_timeout_s)
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


def make_tls_files(folder: Path | str, *, hosts: Sequence[str] = (LOOPBACK, "localhost"),
                   days: int = 365) -> TLSFiles:
    """A self-signed CA and a server certificate it signs, with ``hosts`` as subjectAltNames.

    Requires the ``openssl`` binary. The SAN must name the address the nodes and CLI dial.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = folder / "ca.key", folder / "ca.crt"
    key, csr, crt = folder / "server.key", folder / "server.csr", folder / "server.pem"
    san = ",".join(("IP:" if _is_ip(h) else "DNS:") + h for h in hosts)
    ext = folder / "server.ext"
    ext.write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_crt),
        "-days", str(days), "-subj", "/CN=lensemble-test-ca")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", f"/CN={hosts[0]}")
    ssl("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(crt), "-days", str(days), "-extfile", str(ext))
    return TLSFiles(ca_cert=ca_crt, server_cert=crt, server_key=key)


def _is_ip(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return True
    except OSError:
        return False


def make_node_key(folder: Path | str, name: str) -> tuple[Path, Path]:
    """An EC (P-384) key pair in OpenSSH format for SuperNode authentication: (private, public)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    private = folder / name
    for p in (private, private.with_suffix(".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-C", name,
                    "-f", str(private)], check=True, capture_output=True, timeout=60)
    return private, Path(f"{private}.pub")


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
    "LOOPBACK", "FlowerProcess", "TLSFiles", "venv_bin", "flower_env", "free_port", "port_open",
    "descendants", "wait_for_port", "start_superlink", "start_supernode",
    "node_config_arg", "stop_all", "write_cli_config", "flwr_cli", "make_tls_files",
    "make_node_key", "stage_app",
]
