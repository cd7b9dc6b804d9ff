"""A full disk and a read-only run folder in a real federation (issue 33, item 4).

Before: a participant's full disk reached the coordinator as "silo-1 failed: RuntimeError" with
the quorum's remedy (bring nodes back, raise round_timeout_s), "No space" nowhere; a read-only run
folder gave a raw OSError traceback; a truncated inner state and a ``.state.<random>`` folder were
left behind. The disk is made "full" by writers that write part of the bytes, then raise ENOSPC.
"""

import errno
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lensemble.artifacts import storage
from lensemble.cli import app
from lensemble.config import load_config
from lensemble.errors import DiskFull, FaultToleranceExceeded
from lensemble.federation.inprocess import run_inprocess
from lensemble.federation.locks import LOCK_NAME


@pytest.fixture(scope="module")
def shared(micro_warm_start):
    base, root, _ = micro_warm_start("disk")  # one warm start for every run in this module
    return base


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_participants_full_disk_is_named_at_the_coordinator(shared, tmp_path, monkeypatch):
    cfg = load_config(shared + ["federation.rounds=1", "federation.round_retries=0"])
    real_open = open

    def silo_1_disk_full(file, mode="r", *a, **k):
        fh = real_open(file, mode, *a, **k)
        if "w" in mode and f"{os.sep}silo-1{os.sep}" in str(file):
            fh.write(b"\0" * 100)  # part of the inner state reached the disk
            fh.close()
            raise _enospc()
        return fh

    monkeypatch.setattr(storage, "open", silo_1_disk_full, raising=False)
    with pytest.raises(FaultToleranceExceeded) as info:
        run_inprocess(cfg, tmp_path / "run", progress=False)
    text = str(info.value)
    assert "silo-1 failed: DiskFull [disk_full]: No space left on device at its site" in text
    assert "free space there" in text and "round_timeout_s" not in text
    state = tmp_path / "run" / "nodes" / "silo-1"
    assert not list(state.glob("inner-after-*")), "a truncated inner state was left behind"
    assert not list(state.glob(".*.tmp"))

    monkeypatch.setattr(storage, "open", real_open, raising=False)  # space freed: the same command resumes
    assert run_inprocess(cfg, tmp_path / "run", progress=False)["rounds_completed"] == 1


def test_a_full_disk_at_commit_stops_the_run_by_name_and_the_rerun_resumes(shared, tmp_path, monkeypatch):
    cfg = load_config(shared + ["federation.rounds=2"])
    run = tmp_path / "run"
    real_write = Path.write_bytes

    def full_at_round_1_state(self, data):
        if self.parent.name.startswith(".state.") and self.parent.parent.name == "round-0001":
            real_write(self, data[: len(data) // 2])
            raise _enospc()
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_at_round_1_state)
    with pytest.raises(DiskFull) as info:
        run_inprocess(cfg, run, progress=False)
    text = str(info.value)
    r1 = run / "rounds" / "round-0001"
    assert "No space left on device" in text and str(r1 / "state") in text and "Free space" in text
    assert not [p.name for p in r1.iterdir() if p.name.startswith(".")], "a .state.<random> folder was left"
    assert not (r1 / "state").exists()  # round 1 is not committed

    monkeypatch.setattr(Path, "write_bytes", real_write)
    (r1 / ".state.k2j3x9_a").mkdir()  # what a writer killed mid-commit leaves: cleaned on the next start
    summary = run_inprocess(cfg, run, progress=False)
    assert summary["rounds_completed"] == 2 and not (r1 / ".state.k2j3x9_a").exists()


def test_a_read_only_run_folder_is_refused_by_name_without_a_traceback(tmp_path, monkeypatch):
    # The default engine (ray) takes the run folder's lock before it starts anything. Root (these
    # tests' user here) ignores permission bits, so the OS's EROFS is forced on the lock file.
    real_open = os.open

    def read_only(path, flags, *a, **k):
        if str(path).endswith(LOCK_NAME):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", read_only)
    res = CliRunner().invoke(app, ["run", "--no-eval", "experiment=micro", f"run_dir={tmp_path / 'run'}",
                                   f"data.root={tmp_path / 'data'}"])
    assert res.exit_code == 2, res.output
    flat = " ".join(res.output.split())
    assert "[read_only]" in flat and "read-only file system" in flat and "writable" in flat
    assert "Traceback" not in res.output and not isinstance(res.exception, OSError)
