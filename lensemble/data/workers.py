"""Simulator worker processes for data collection: fresh interpreters, MKL pinned, order kept.

Each worker is a fresh interpreter running :func:`main`, started with
:func:`lensemble.numerics.collection_environment` (MKL's ``COMPATIBLE`` code path, which MKL reads
only at its first call in a process: a fork of a parent that has trained already would keep the
parent's path, and the frames would depend on the CPU). Plain subprocesses rather than a
``multiprocessing`` spawn pool, because spawn re-imports the caller's ``__main__``: a user script
without an ``if __name__ == "__main__"`` guard would start collecting again in every worker.

Protocol over the worker's stdin / stdout: length-prefixed pickles. The parent sends a task tuple
(see :func:`lensemble.data.collect.collect_episode`'s callers) or ``None`` to stop; the worker
answers ``("ok", result)`` or ``("error", formatted traceback, exception type name)``. Its first
message is ``("ready", mkl mode)``.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import BinaryIO

from lensemble.errors import CollectionError
from lensemble.numerics import MKL_CBWR_MODE, collection_environment

_HEADER = struct.Struct("<Q")
#: Seconds a worker may take to start (import torch and the simulator) or to answer one task (an
#: episode takes about a second; a busy 2-core machine stretches both, hence the margin).
TIMEOUT_S = 300.0


def _send(stream: BinaryIO, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact(stream: BinaryIO, n: int, timeout_s: float | None) -> bytes:
    """n bytes from an unbuffered pipe, waiting at most ``timeout_s`` for each chunk (None: no limit)."""
    fd, chunks, left = stream.fileno(), [], n
    while left:
        if timeout_s is not None and not select.select([fd], [], [], timeout_s)[0]:
            raise TimeoutError(f"no answer within {timeout_s:.0f} s")
        chunk = os.read(fd, left)
        if not chunk:
            raise EOFError("worker closed its pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(stream: BinaryIO, timeout_s: float | None = None):
    (size,) = _HEADER.unpack(_read_exact(stream, _HEADER.size, timeout_s))
    return pickle.loads(_read_exact(stream, size, timeout_s))


class WorkerPool:
    """``workers`` simulator processes running ``lensemble.data.collect._run_task`` on task tuples.

    :meth:`map` yields results in task order, with at most one task in flight per worker. A
    worker's exception is re-raised here as :class:`CollectionError` with its traceback; a worker
    that dies or whose MKL mode is not ``COMPATIBLE`` is an error too, never a silent fallback.
    """

    def __init__(self, workers: int):
        env = {**os.environ, **collection_environment()}
        # -c, not -m: the package imports this module, and runpy warns when a module it runs is loaded
        cmd = [sys.executable, "-c", "from lensemble.data.workers import main; main()"]
        self.procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, env=env, bufsize=0) for _ in range(max(1, int(workers)))]
        self.mkl_modes: list[str] = []  # what each worker reported at start
        for p in self.procs:
            kind, mode = self._get(p)
            self.mkl_modes.append(mode)
            if kind != "ready" or mode not in (MKL_CBWR_MODE, "no-mkl"):
                self.close(kill=True)
                raise CollectionError(f"a collection worker runs MKL in mode {mode}, not {MKL_CBWR_MODE}: its "
                                      "frames would depend on the CPU (lensemble/numerics.py)")

    def _get(self, proc: subprocess.Popen):
        try:
            return _receive(proc.stdout, TIMEOUT_S)
        except TimeoutError as exc:
            self.close(kill=True)
            raise CollectionError(f"a collection worker (pid {proc.pid}) did not answer: {exc}") from None
        except (EOFError, pickle.UnpicklingError) as exc:
            code = proc.poll()
            raise CollectionError(f"a collection worker (pid {proc.pid}) stopped (exit code {code}): {exc}") from None

    def map(self, tasks: Iterable[tuple]) -> Iterator:
        pending: deque = deque()  # (proc) in task order
        idle = deque(self.procs)
        it = iter(tasks)
        while True:
            while idle:
                task = next(it, None)
                if task is None:
                    break
                proc = idle.popleft()
                _send(proc.stdin, task)
                pending.append(proc)
            if not pending:
                return
            proc = pending.popleft()
            reply = self._get(proc)
            if reply[0] == "error":
                self.close(kill=True)
                raise CollectionError(f"collection worker failed ({reply[2]}):\n{reply[1]}")
            idle.append(proc)
            yield reply[1]

    def close(self, *, kill: bool = False) -> None:
        for p in self.procs:
            if p.poll() is None:
                if kill:
                    p.kill()
                else:
                    try:
                        _send(p.stdin, None)
                    except (BrokenPipeError, OSError):
                        p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for s in (p.stdin, p.stdout):
                if s is not None:
                    s.close()


def serve(run: Callable[[tuple], object], stdin: BinaryIO, stdout: BinaryIO) -> None:
    """The worker loop: answer tasks until ``None`` or EOF."""
    from lensemble.numerics import mkl_mode

    _send(stdout, ("ready", mkl_mode()))
    while True:
        try:
            task = _receive(stdin)
        except EOFError:
            return
        if task is None:
            return
        try:
            _send(stdout, ("ok", run(task)))
        except Exception as exc:  # sent to the parent, which raises it with this traceback
            _send(stdout, ("error", traceback.format_exc(), type(exc).__name__))


def main() -> None:
    # The protocol owns stdout: anything else printed (a library's notice) goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from lensemble.data.collect import _run_task, _worker_setup

    _worker_setup()
    serve(_run_task, sys.stdin.buffer, out)

