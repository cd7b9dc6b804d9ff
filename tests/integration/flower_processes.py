"""SuperNodes, TLS material and node keys for the loopback tests, on top of the library's
process helpers (:mod:`lensemble.federation.flower.processes`: SuperLink, CLI, staging, teardown).

TLS material comes from ``openssl`` (a CA and a server certificate whose SAN names the address
nodes dial), EC node keys from ``ssh-keygen``. Every process started is stopped by PID.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lensemble.federation.flower.processes import (  # noqa: F401  (re-exported for the tests)
    LOOPBACK,
    FlowerProcess,
    TLSFiles,
    _spawn,
    descendants,
    flower_env,
    flwr_cli,
    free_port,
    port_open,
    stage_app,
    start_superlink,
    stop_all,
    venv_bin,
    wait_for_port,
    write_cli_config,
)


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


def start_loopback_federation(workdir: Path | str, procs: list[FlowerProcess], *, sites: int = 2,
                              env_extra: Mapping[str, str] | None = None) -> tuple[str, Path]:
    """An insecure SuperLink and ``sites`` SuperNodes (``site0``.., partition i of ``sites``, each
    with its own state folder) on loopback, every process appended to ``procs`` as it starts so the
    caller's ``finally: stop_all(reversed(procs))`` stops whatever did start. Waits until every node's
    runtime port listens. Returns (the SuperLink's address, a CLI home whose ``loopback``
    connection dials it)."""
    workdir = Path(workdir)
    link = start_superlink(workdir, env_extra=env_extra)
    procs.append(link)
    address = f"{LOOPBACK}:{link.port}"
    nodes = []
    for i in range(sites):
        nodes.append(start_supernode(workdir, f"site{i}", superlink=address,
                                     node_config={"partition-id": i, "num-partitions": sites,
                                                  "state-dir": str(workdir / f"state{i}")},
                                     env_extra=env_extra, ready_timeout_s=None))
        procs.append(nodes[-1])
    for node in nodes:
        wait_for_port(node, LOOPBACK, node.port, 60)
    cli_home = workdir / "cli-home"
    write_cli_config(cli_home, {"loopback": {"address": address, "insecure": True}})
    return address, cli_home


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
