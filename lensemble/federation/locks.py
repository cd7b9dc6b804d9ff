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

**Delegated holds** (the ``ray`` engine). The driver (``lensemble run``) holds the run folder's
lock and starts the processes that do the work (SuperLink, SuperExec, ``flwr-simulation``, in
which the coordinator runs). It passes them :data:`DELEGATE_ENV` (:func:`delegate_env`): the
folder, its PID and its start time. A process started that way never takes the flock itself:
:func:`lock_folder` gives it a delegated hold, refused with
:class:`~lensemble.errors.RunOwnerGone` unless the driver is alive and still named in the lock
file, and :meth:`FolderLock.verify` (called before every commit) refuses again once the driver is
gone or another process took the folder. So a federation orphaned by a SIGKILLed driver cannot
commit a round into the folder, whatever else survives (docs/federation.md, "Fault handling").
A full disk or a read-only folder on the lock file is :class:`~lensemble.errors.DiskFull` /
:class:`~lensemble.errors.ReadOnlyFolder` naming the folder.
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

from lensemble.artifacts.storage import storage_errors
from lensemble.errors import FolderInUse, RunOwnerGone

LOCK_NAME = ".lensemble.lock"
DELEGATE_ENV = "LENSEMBLE_RUN_LOCK"  # JSON {"lock", "pid", "start"}: the lock file and the driver holding it

_held: dict[str, list] = {}  # real path of the lock file -> [fd, count]
_guard = threading.Lock()


def _holder_text(path: Path) -> str:
    info = _read_info(path)
    pid = info.get("pid", "unknown")
    cmd = info.get("cmdline") or "unknown command"
    since = f", since {info['since']}" if info.get("since") else ""
    return f"PID {pid} ({cmd}{since})"


def start_time(pid: int) -> int | None:
    """``pid``'s start time in clock ticks since boot (Linux /proc), None where unknown or gone.

    With the PID it names one process for good: a PID reused by a later process differs here.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])  # field 22: starttime


def process_alive(pid: int, start: int | None) -> bool:
    """Whether the process ``pid`` that started at ``start`` still runs (not a zombie)."""
    now = start_time(pid)
    if now is not None:
        return start is None or now == start
    if Path("/proc/self/stat").exists():  # Linux: no stat entry means gone (or a zombie)
        return False
    try:  # elsewhere: the PID alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_info(path: Path) -> dict:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _cmdline() -> str:
    try:  # the whole command, interpreter included, where Linux tells it
        parts = Path("/proc/self/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        return " ".join(p.decode(errors="replace") for p in parts)
    except OSError:
        return " ".join([sys.executable, *sys.argv])


class FolderLock:
    """One hold on the exclusive lock of ``folder`` (see :func:`lock_folder`); ``delegate`` is the
    holder's info for a delegated hold (this process works for the driver holding the flock)."""

    def __init__(self, folder: Path, key: str, delegate: dict | None = None, what: str = "folder"):
        self.folder = folder
        self._key = key
        self._released = False
        self.delegate = delegate
        self._what = what

    @property
    def delegated(self) -> bool:
        return self.delegate is not None

    def verify(self) -> None:
        """Raise :class:`~lensemble.errors.RunOwnerGone` unless this hold still entitles a write.

        An own flock does (the kernel keeps it while this process lives). A delegated hold does
        while the driver it names is alive (same PID, same start time) and the lock file still
        names it: after a SIGKILL of the driver, or once a new run took the folder, it does not.
        Called before every commit; costs two small reads.
        """
        if self.delegate is not None:
            _check_delegate(self.folder, self.delegate, self._what)

    def release(self) -> None:
        """Give this hold back; the flock goes with the process's last hold."""
        with _guard:
            if self._released:
                return
            self._released = True
            if self.delegate is not None:
                return  # the driver's flock is the driver's to release
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
    with storage_errors(folder, f"locking the {what}"):  # a read-only or full disk, said so
        folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    key = str(path.resolve())
    with _guard:
        if key in _held:
            _held[key][1] += 1
            return FolderLock(folder, key)
        delegate = _delegate_for(key)
        if delegate is not None:  # started by the driver that holds this folder: never flock it
            _check_delegate(folder, delegate, what)
            return FolderLock(folder, key, delegate=delegate, what=what)
        with storage_errors(folder, f"locking the {what}"):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise FolderInUse(f"{what} {folder} is in use by {_holder_text(path)}",
                              folder=str(folder)) from None
        # Who holds it, for the message a second process gets and for delegated holds' checks
        # (the start time tells this process from a later one given the same PID). Written after
        # the flock is ours.
        info = {"pid": os.getpid(), "start": start_time(os.getpid()), "cmdline": _cmdline(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            with storage_errors(folder, f"locking the {what}"):
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        _held[key] = [fd, 1]
        return FolderLock(folder, key)


def delegate_env(folder: str | os.PathLike) -> dict[str, str]:
    """``{DELEGATE_ENV: ...}`` for the processes this one starts to work in ``folder``, which it
    must hold (:func:`lock_folder`): they get delegated holds tied to this process's life."""
    path = Path(folder) / LOCK_NAME
    key = str(path.resolve())
    with _guard:
        if key not in _held:
            raise RuntimeError(f"delegate_env: this process does not hold {folder}")
    return {DELEGATE_ENV: json.dumps({"lock": key, "pid": os.getpid(), "start": start_time(os.getpid())})}


def delegated_owner() -> dict | None:
    """The driver this process was started for (:data:`DELEGATE_ENV`), or None."""
    raw = os.environ.get(DELEGATE_ENV)
    if not raw:
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        return None
    return info if isinstance(info, dict) and isinstance(info.get("pid"), int) else None


def _delegate_for(key: str) -> dict | None:
    info = delegated_owner()
    return info if info is not None and info.get("lock") == key else None


def owner_gone(info: dict) -> str | None:
    """Why the driver ``info`` names no longer owns its folder, or None while it does."""
    pid, start = info["pid"], info.get("start")
    if not process_alive(pid, start):
        return f"the process that started this run (PID {pid}) is gone"
    holder = _read_info(Path(info["lock"]))
    if holder.get("pid") != pid or holder.get("start") != start:
        return f"the lock file now names {_holder_text(Path(info['lock']))}, not the driver PID {pid}"
    return None


def _check_delegate(folder: Path, info: dict, what: str) -> None:
    why = owner_gone(info)
    if why is not None:
        raise RunOwnerGone(f"{what} {folder}: {why}; this process (PID {os.getpid()}) will not write there",
                           folder=str(folder))


def held_by_this_process(folder: str | os.PathLike) -> bool:
    """Whether this process holds the lock on ``folder``."""
    key = str((Path(folder) / LOCK_NAME).resolve())
    with _guard:
        return key in _held


__all__ = ["LOCK_NAME", "DELEGATE_ENV", "FolderLock", "lock_folder", "held_by_this_process", "delegate_env",
           "delegated_owner", "owner_gone", "process_alive", "start_time"]
