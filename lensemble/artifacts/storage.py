"""Writes that fail because of the disk, said as such: a full disk, a read-only folder.

Before this module a full disk during a round reached the coordinator as "silo-1 failed:
RuntimeError" (``torch.save`` wraps ENOSPC in a RuntimeError without its errno), and a read-only
run folder as a raw OSError traceback from the lock file. Here:

* :func:`storage_errors` turns an ``OSError`` whose errno says *where the write went* is the
  problem (ENOSPC, EDQUOT: :class:`~lensemble.errors.DiskFull`; EROFS, EACCES, EPERM:
  :class:`~lensemble.errors.ReadOnlyFolder`) into that error, naming the path and the remedy;
  any other OSError passes unchanged (it is not the disk's fault, or not one we can name).
* :func:`write_bytes_atomic` writes a file through a temporary sibling and a rename, so a full
  disk leaves the old file or none, never a truncated one, and removes the temporary on failure.
* :func:`remove_stale_temps` removes what a killed process left half-written (the temporaries
  of :func:`write_bytes_atomic` and of :func:`~lensemble.artifacts.checkpoint.save_checkpoint`):
  called by whoever holds the folder's lock, when a run (re)starts.

Only the participant's and coordinator's *write* paths are wrapped: EACCES on a read would be
misnamed "read-only".
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lensemble.errors import DiskFull, ReadOnlyFolder, StorageError

FULL = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "disk quota exceeded (No space left for this user)"}
READ_ONLY = {errno.EROFS: "read-only file system", errno.EACCES: "not writable (permission denied, read-only "
                                                                  "for this user)",
             errno.EPERM: "not writable (operation not permitted, read-only for this user)"}
TEMP_SUFFIX = ".tmp"
_MKDTEMP = re.compile(r"\.[\w.-]+\.[a-z0-9_]{8}")  # tempfile.mkdtemp(prefix=".<name>.")


def storage_error(exc: OSError, path: str | os.PathLike, what: str = "write", *,
                  access: bool = True) -> StorageError | None:
    """The :class:`~lensemble.errors.StorageError` ``exc`` means for a write to ``path``, or None.

    The path named is the one the OS names (``exc.filename``) when it names one, else ``path``.
    ``access=False`` leaves EACCES / EPERM alone: for a block that also reads (a read refused
    is not a read-only folder); ENOSPC, EDQUOT and EROFS only ever come from writes.
    """
    where = exc.filename if exc.filename else path
    if exc.errno in FULL:
        return DiskFull(f"{what} to {where} failed: {FULL[exc.errno]} (errno {errno.errorcode[exc.errno]})",
                        path=str(where))
    if exc.errno in READ_ONLY and (access or exc.errno == errno.EROFS):
        return ReadOnlyFolder(f"{what} to {where} failed: it is {READ_ONLY[exc.errno]} "
                              f"(errno {errno.errorcode[exc.errno]})", path=str(where))
    return None


@contextmanager
def storage_errors(path: str | os.PathLike, what: str = "write", *, access: bool = True) -> Iterator[None]:
    """Raise :func:`storage_error` (chained to the OSError) for a disk-caused failure inside.

    Nested uses keep the innermost message (a StorageError is not an OSError).
    """
    try:
        yield
    except OSError as exc:
        mapped = storage_error(exc, path, what, access=access)
        if mapped is None:
            raise
        raise mapped from exc


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, what: str = "write") -> None:
    """Write ``data`` to ``path`` via ``.<name>.<pid>.tmp`` and a rename (old file or new, never
    half of one); the temporary is removed when anything fails; disk causes become StorageErrors."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TEMP_SUFFIX}")
    with storage_errors(path, what):
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())  # ENOSPC may only surface here (delayed allocation)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def remove_stale_temps(folder: str | os.PathLike, *, recursive: bool = False) -> list[Path]:
    """Remove the hidden temporaries a killed or failed write left in ``folder``; return them.

    Matches ``.<name>.<pid>.tmp`` files (:func:`write_bytes_atomic`) and ``.<name>.<8 random>``
    folders (``save_checkpoint``'s ``tempfile.mkdtemp(prefix=".<name>.")``, never renamed into
    place). Only the caller knows no live writer is using them: call it while holding the
    folder's lock (:mod:`lensemble.federation.locks`).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for entry in (folder.rglob(".*") if recursive else folder.glob(".*")):
        name = entry.name
        if name.startswith(".lensemble"):  # the lock file, never a temporary
            continue
        if entry.is_file() and name.endswith(TEMP_SUFFIX):
            if name.endswith(f".{os.getpid()}{TEMP_SUFFIX}"):
                continue  # this process's own write in flight (threads of an in-process federation)
            entry.unlink(missing_ok=True)
            found.append(entry)
        elif entry.is_dir() and not entry.is_symlink() and _MKDTEMP.fullmatch(name):
            shutil.rmtree(entry, ignore_errors=True)
            found.append(entry)
    return found


__all__ = ["storage_error", "storage_errors", "write_bytes_atomic", "remove_stale_temps"]
