"""Exclusive folder locks: one process at a time on a run folder or a participant's state folder.

Two runs on one run folder used to corrupt each other silently (one chain on disk, the other
run's final hash nowhere, shared participant state). :func:`lock_folder` takes an exclusive
``fcntl.flock`` on ``<folder>/.lensemble.lock`` and writes the holder's PID and command line into
it; a second process asking for the same folder gets :class:`~lensemble.errors.FolderInUse`
naming both. The kernel drops the lock when the holder exits, however it exits (kill -9
included), so a crashed run never leaves a stale lock behind.

Locks are per process and re-entrant: the same process may lock a folder it already holds (a
resumed run in the same interpreter, threads of one in-process federation); each
:meth:`FolderLock.release` undoes one :func:`lock_folder`, and the flock goes when the last one is
released or the process ends.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import threading
import time
from pathlib import Path

from lensemble.errors import FolderInUse

LOCK_NAME = ".lensemble.lock"

_held: dict[str, list] = {}  # real path of the lock file -> [fd, count]
_guard = threading.Lock()


def _holder_text(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    pid = info.get("pid", "unknown")
    cmd = info.get("cmdline") or "unknown command"
    since = f", since {info['since']}" if info.get("since") else ""
    return f"PID {pid} ({cmd}{since})"


def _cmdline() -> str:
    try:  # the whole command, interpreter included, where Linux tells it
        parts = Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        return " ".join(p.decode(errors="replace") for p in parts)
    except OSError:
        return " ".join([sys.executable, *sys.argv])


class FolderLock:
    """One hold on the exclusive lock of ``folder`` (see :func:`lock_folder`)."""

    def __init__(self, folder: Path, key: str):
        self.folder = folder
        self._key = key
        self._released = False

    def release(self) -> None:
        """Give this hold back; the flock goes with the process's last hold."""
        with _guard:
            if self._released:
                return
            self._released = True
            entry = _held.get(self._key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del _held[self._key]
                os.close(entry[0])  # closing the descriptor drops the flock

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_folder(folder: str | os.PathLike, *, what: str = "folder") -> FolderLock:
    """Take (or re-enter) the exclusive lock on ``folder``, creating the folder if needed.

    Raises :class:`~lensemble.errors.FolderInUse` with the holder's PID and command line when
    another process holds it; never waits. ``what`` names the folder in the message
    ("run folder", "participant state folder").
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    key = str(path.resolve())
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return FolderLock(folder, key)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise FolderInUse(f"{what} {folder} is in use by {_holder_text(path)}",
                              folder=str(folder)) from None
        # Who holds it, for the message a second process gets. Written after the flock is ours.
        info = {"pid": os.getpid(), "cmdline": _cmdline(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        _held[key] = [fd, 1]
        return FolderLock(folder, key)


def held_by_this_process(folder: str | os.PathLike) -> bool:
    """Whether this process holds the lock on ``folder``."""
    key = str((Path(folder) / LOCK_NAME).resolve())
    with _guard:
        return key in _held


__all__ = ["LOCK_NAME", "FolderLock", "lock_folder", "held_by_this_process"]
