"""A guardian that ends the ray engine's process tree when the driver is SIGKILLed.

The driver (``lensemble run``, :func:`~lensemble.federation.flower.runtime.run_with_flwr`) stops
the SuperLink and every descendant by PID when it ends, on an error, Ctrl-C and SIGTERM. A SIGKILL
runs none of that: before this module twelve processes lived on (SuperLink, SuperExec,
``flwr-simulation``, Ray's GCS, raylet and agents, the ClientApp actors), kept training and
committed rounds into the run folder (issue 33). ``PR_SET_PDEATHSIG`` reaches only the driver's
direct children (the SuperLink, the ``flwr run`` CLI); SuperExec runs in a session of its own and
the rest descend from it. So the driver also starts this guardian:

* ``python -m lensemble.federation.flower.guardian`` with a pipe on stdin whose write end only the
  driver holds. The driver writes ``watch <pid>`` for each process it starts and ``done`` when it
  has stopped them itself. A dead driver's pipe reads EOF, whatever killed it.
* Every :data:`POLL_S` the guardian records the watched processes' descendants with their start
  times (a process that lost its parent is re-parented to init, out of reach of a later tree
  walk; the record keeps it; the start time tells it from a later process given the same PID).
* On EOF without ``done``: every recorded process still alive is stopped (SIGSTOP, so none can
  start another), the stopped processes' new children are found and stopped too until none
  appears, then all get SIGKILL. Ray's workers descend from its raylet, so they go with it.

The guardian runs in its own session (Ctrl-C on the terminal reaches the driver, which cleans up
and says ``done``) and ignores SIGINT; it exits as soon as its job is done. What the guardian does
not stop cannot write either: the coordinator verifies its delegated run-folder lock before every
commit (:mod:`lensemble.federation.locks`).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from lensemble.federation.locks import start_time

POLL_S = 0.5  # how stale the record of the tree may be when the driver dies
STOP_ROUNDS = 20  # freeze passes; each finds the children started since the last one


class Guardian:
    """The driver's handle: ``watch(pid)`` each process it starts, ``done()`` after stopping them."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

    def _send(self, line: str) -> None:
        try:
            assert self.popen.stdin is not None
            self.popen.stdin.write(f"{line}\n".encode())
            self.popen.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the guardian is gone: nothing to tell it (the stop in the driver still runs)

    def watch(self, pid: int) -> None:
        self._send(f"watch {int(pid)}")

    def done(self, timeout_s: float = 10.0) -> None:
        """The driver has stopped what it started: the guardian exits without killing anything."""
        self._send("done")
        try:
            if self.popen.stdin is not None:
                self.popen.stdin.close()
            self.popen.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            self.popen.kill()
            self.popen.wait(timeout=timeout_s)


def start_guardian(log_path: Path) -> Guardian:
    """Start the guardian for this process (see the module docstring)."""
    log = open(log_path, "ab")  # noqa: SIM115 - the guardian's own output, kept open by it
    try:
        popen = subprocess.Popen([sys.executable, "-m", "lensemble.federation.flower.guardian", str(os.getpid())],
                                 stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True)
    finally:
        log.close()
    return Guardian(popen)


def process_table() -> dict[int, int]:
    """pid -> parent pid of every process, in one pass over /proc (a walk per watched process
    would read every entry once per tree level, twice a second)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and ")"
        if len(fields) > 1:
            table[int(entry.name)] = int(fields[1])
    return table


def tree(roots, table: dict[int, int]) -> set[int]:
    """``roots`` and all their descendants in ``table`` (pid -> parent pid)."""
    children: dict[int, list[int]] = {}
    for pid, parent in table.items():
        children.setdefault(parent, []).append(pid)
    found, frontier = set(), [r for r in roots if r in table]
    while frontier:
        pid = frontier.pop()
        if pid not in found:
            found.add(pid)
            frontier.extend(children.get(pid, ()))
    return found


def _alive_as(pid: int, start: int | None) -> bool:
    return start is not None and start_time(pid) == start


def reap(family: dict[int, int | None]) -> list[int]:
    """Stop, then SIGKILL, every process of ``family`` (pid -> start time) still alive as itself
    and every descendant it has; return the PIDs killed."""
    frozen: dict[int, int | None] = {}
    todo = {pid: start for pid, start in family.items() if _alive_as(pid, start)}
    for _ in range(STOP_ROUNDS):
        if not todo:
            break
        for pid in todo:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        frozen.update(todo)
        todo = {pid: start_time(pid) for pid in tree(frozen, process_table()) if pid not in frozen}
    frozen.update(todo)
    killed = []
    for pid, start in frozen.items():
        if _alive_as(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed


def guard(driver: int, stream=None) -> int:
    """The guardian's loop: read ``watch`` / ``done`` lines, keep the record, reap on EOF."""
    fd = (stream or sys.stdin.buffer).fileno()
    watched: dict[int, int | None] = {}
    family: dict[int, int | None] = {}
    buffer = b""
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:  # the driver is gone (or closed the pipe without "done")
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                word, _, arg = line.decode(errors="replace").strip().partition(" ")
                if word == "done":
                    return 0
                if word == "watch" and arg.isdigit():
                    watched[int(arg)] = start_time(int(arg))
        live = [pid for pid, start in watched.items() if _alive_as(pid, start)]
        if live:
            for pid in tree(live, process_table()):
                family.setdefault(pid, start_time(pid))
    killed = reap(family)
    print(f"[lensemble] guardian: the driver (PID {driver}) ended without stopping its federation; "
          f"killed {len(killed)} process(es): {sorted(killed)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the driver's to handle
    return guard(int(args[0]) if args else os.getppid())


if __name__ == "__main__":
    sys.exit(main())
