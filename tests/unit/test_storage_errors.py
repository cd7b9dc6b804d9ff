"""A full disk and a read-only folder are named as such on every write path (issue 33, item 4):
DiskFull / ReadOnlyFolder naming the path, the cause and the remedy; no temporary or truncated
file left behind; the cause reaches the coordinator's message without the participant's text."""

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from lensemble.artifacts import storage
from lensemble.artifacts.checkpoint import load_checkpoint, save_checkpoint
from lensemble.artifacts.storage import remove_stale_temps, storage_errors, write_bytes_atomic
from lensemble.errors import DiskFull, FaultToleranceExceeded, ReadOnlyFolder, error_label
from lensemble.federation import global_cache
from lensemble.federation.flower.client_app import sanitised
from lensemble.federation.flower.transport import error_reason_label
from lensemble.federation.locks import LOCK_NAME, lock_folder
from lensemble.federation.validation import require_quorum

ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _half_then_full(real_write):
    """A ``Path.write_bytes`` that writes half the bytes, then fails like a full disk."""
    def write_bytes(self, data):
        real_write(self, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return write_bytes


def test_checkpoint_on_a_full_disk_is_diskfull_and_leaves_nothing(tmp_path, monkeypatch):
    folder = tmp_path / "rounds" / "round-0000" / "state"
    monkeypatch.setattr(Path, "write_bytes", _half_then_full(Path.write_bytes))
    with pytest.raises(DiskFull) as info:
        save_checkpoint(folder, {"w": torch.ones(64)}, kind="test")
    text = str(info.value)
    assert "No space left on device" in text and str(folder) in text and "Free space" in text
    assert not folder.exists()
    assert list(folder.parent.iterdir()) == []  # the .state.<random> temporary is gone


def test_atomic_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "inner-after-00001.pt"
    path.write_bytes(b"old state")

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(storage.os, "fsync", fsync)  # ENOSPC surfacing at fsync (delayed allocation)
    with pytest.raises(DiskFull, match="inner-after-00001.pt"):
        write_bytes_atomic(path, b"new state, longer than the old one", what="inner optimizer state")
    assert path.read_bytes() == b"old state"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inner-after-00001.pt"]


def test_kept_global_on_a_full_disk_is_diskfull(tmp_path, monkeypatch):
    real_open = open

    def full_open(file, mode="r", *a, **k):
        fh = real_open(file, mode, *a, **k)
        if "w" in mode:
            fh.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return fh

    monkeypatch.setattr(storage, "open", full_open, raising=False)
    with pytest.raises(DiskFull, match="No space left on device"):
        global_cache.keep_global(tmp_path, 3, {"w": np.ones(4, np.float32)})
    assert list(tmp_path.iterdir()) == []


def test_read_only_lock_file_is_named_when_the_os_says_erofs(tmp_path, monkeypatch):
    # root ignores permission bits (this machine runs tests as root): the OS's answer is forced
    real_open = os.open

    def ro_open(path, flags, *a, **k):
        if str(path).endswith(LOCK_NAME):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", ro_open)
    with pytest.raises(ReadOnlyFolder) as info:
        lock_folder(tmp_path / "run", what="run folder")
    text = str(info.value)
    assert "read-only" in text and str(tmp_path / "run") in text and "writable" in text


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")
def test_read_only_run_folder_is_named(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o555)
    try:
        with pytest.raises(ReadOnlyFolder, match="read-only"):
            lock_folder(run, what="run folder")
    finally:
        run.chmod(0o755)


def test_other_os_errors_pass_unchanged(tmp_path):
    with pytest.raises(FileNotFoundError):
        with storage_errors(tmp_path):
            (tmp_path / "missing" / "x").read_text()
    with pytest.raises(PermissionError):  # a refused read is not a read-only folder
        with storage_errors(tmp_path, access=False):
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "data"))


def test_stale_temporaries_are_removed_and_committed_files_kept(tmp_path):
    rounds = tmp_path / "rounds"
    save_checkpoint(rounds / "round-0000" / "model", {"w": torch.ones(2)}, kind="test")
    stale_dir = rounds / "round-0001" / ".state.k2j3x9_a"
    stale_dir.mkdir(parents=True)
    (stale_dir / "weights.safetensors").write_bytes(b"trunc")
    stale_file = tmp_path / ".inner-after-00001.pt.999999.tmp"
    stale_file.write_bytes(b"trunc")
    own = tmp_path / f".x.{os.getpid()}.tmp"  # this process's write in flight: kept
    own.write_bytes(b"")
    removed = remove_stale_temps(rounds, recursive=True) + remove_stale_temps(tmp_path)
    assert set(removed) == {stale_dir, stale_file}
    assert own.exists()
    load_checkpoint(rounds / "round-0000" / "model")  # committed work untouched


def test_the_cause_crosses_the_silo_boundary_without_the_text():
    exc = DiskFull("writing to /silo/secret-patient-42/inner-after-00001.pt failed: No space left on device")
    label = error_label(exc)
    assert label == "DiskFull [disk_full]: No space left on device at its site"
    # the Flower path: the ClientApp's sanitised error, parsed out of the runtime's reason text
    reason = f"<class 'lensemble.errors.DiskFull'>:<'{sanitised(exc, 1)}'>"
    assert error_reason_label(reason) == label
    assert "secret" not in label
    with pytest.raises(FaultToleranceExceeded) as info:
        require_quorum(1, 2, round_index=0, failures={"silo-1": f"failed: {label} (Flower error 0)"})
    text = str(info.value)
    assert "silo-1 failed: DiskFull [disk_full]: No space left on device" in text
    assert "free space there" in text and "round_timeout_s" not in text


def test_the_ray_driver_names_the_coordinators_disk_error_from_its_log():
    from lensemble.federation.flower.runtime import storage_cause

    line = ("lensemble.errors.DiskFull: [disk_full] writing checkpoint state to /r/rounds/round-0001/state "
            "failed: No space left on device (errno ENOSPC) (fix: Free space on ...)")
    named = storage_cause(f"[lensemble] round 1/2 ...\n{line}\nERROR: Exit Code: 700\n")
    assert isinstance(named, DiskFull) and str(named).startswith("[disk_full] writing checkpoint state to /r/")
    assert named.message.endswith("(errno ENOSPC)")
    # a participant's disk is the quorum's message (it names the site), not the coordinator's
    quorum = ("[fault_tolerance_exceeded] round 0: 1 valid update(s), quorum is 2 (silo-1 failed: "
              "DiskFull [disk_full]: No space left on device at its site)")
    assert storage_cause(quorum) is None
