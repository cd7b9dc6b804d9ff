"""The ray engine attached to an existing Ray cluster (docs/federation.md, "On a cluster").

A one-node Ray head of the test's own (``ray start --head --block`` on a free port, its own temp
dir, 2 CPUs) stands in for a cluster. The micro federation runs against it through Flower's
supported path (``flwr run`` on a simulation SuperLink whose environment carries RAY_ADDRESS) and
must give the in-process engine's final model; the virtual clients must have been actors of that
head, not of a private Ray; and the head is stopped by PID with nothing of it left (``ray stop``
would stop every Ray process on the machine, other users' included).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from lensemble.config import load_config
from lensemble.errors import ConfigError
from lensemble.federation.flower.processes import _alive, descendants, processes_mentioning, start_ray_head
from lensemble.federation.flower.runtime import check_placement, federation_config, run_with_flwr
from lensemble.federation.inprocess import run_inprocess


def test_federation_config_string():
    assert federation_config(2) == "num-supernodes=2 client-resources-num-cpus=1"  # the old default, unchanged
    assert federation_config(4, client_gpus=1) == "num-supernodes=4 client-resources-num-cpus=1 client-resources-num-gpus=1"
    assert federation_config(4, client_cpus=2, client_gpus=0.5).endswith("num-cpus=2 client-resources-num-gpus=0.5")


def test_placement_that_cannot_work_is_refused(tmp_path):
    cfg = load_config(["experiment=micro"])  # data.root is relative ("data")
    check_placement(cfg, ray_address=None, client_cpus=1, client_gpus=0)  # a private Ray: fine
    with pytest.raises(ConfigError, match="data.root=data"):
        check_placement(cfg, ray_address="127.0.0.1:1", client_cpus=1, client_gpus=0)
    absolute = load_config(["experiment=micro", f"data.root={tmp_path}/data"])
    with pytest.raises(ConfigError, match="no Ray cluster answers"):
        check_placement(absolute, ray_address="127.0.0.1:1", client_cpus=1, client_gpus=0)
    with pytest.raises(ConfigError, match="whole number"):
        check_placement(cfg, ray_address=None, client_cpus=0.5, client_gpus=0)
    cuda = load_config(["experiment=micro", "train.device=cuda"])
    with pytest.raises(ConfigError, match="--client-gpus"):
        check_placement(cuda, ray_address=None, client_cpus=1, client_gpus=0)
    # where a run executes is not part of its identity
    assert load_config(["experiment=micro"]).config_hash()[:12] == "08f00f3bbeb8"


@pytest.mark.slow
def test_micro_federation_on_an_existing_ray_cluster(tmp_path, monkeypatch):
    work = tmp_path / "cluster"
    monkeypatch.chdir(tmp_path)
    # Ray's Unix socket paths must stay under 107 bytes: a short temp dir of the test's own
    ray_tmp = Path(tempfile.mkdtemp(prefix="lsray-", dir="/tmp"))
    before = set(descendants(os.getpid()))
    head = start_ray_head(work, num_cpus=2, temp_dir=ray_tmp)
    try:
        assert head.alive() and processes_mentioning(str(ray_tmp)), head.log_text()[-2000:]
        cfg = load_config(["experiment=micro", "federation.rounds=1", f"data.root={tmp_path}/data",
                           "run_dir=run"])
        summary = run_with_flwr(cfg, tmp_path / "run", progress=True, ray_address=f"127.0.0.1:{head.port}")
        family = descendants(head.pid)
    finally:
        head.stop()
    try:
        _check(cfg, summary, head, family, ray_tmp, tmp_path, before)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _check(cfg, summary, head, family, ray_tmp, tmp_path, before):
    reference = run_inprocess(cfg, tmp_path / "reference", progress=False)
    assert summary["rounds_completed"] == 1
    assert summary["rounds"][-1]["fed/participants"] == 2
    assert summary["final_hash"] == reference["final_hash"]

    # The simulation was a driver of *this* head, and the virtual clients were its workers.
    logs = next(ray_tmp.glob("session_2*")) / "logs"
    assert list(logs.glob("python-core-driver-*.log")), sorted(p.name for p in logs.iterdir())
    actor_logs = [p for p in logs.glob("worker-*") if "ClientAppActor" in p.read_text(errors="replace")]
    assert actor_logs, sorted(p.name for p in logs.iterdir())
    run_log = (tmp_path / "run" / "flower" / "flwr-run.log").read_text(errors="replace")
    actors = {pid for pid in re.findall(r"ClientAppActor pid=(\d+)", run_log)}
    assert actors <= {re.search(r"-(\d+)\.(?:out|err)$", p.name).group(1) for p in actor_logs}
    placement = (tmp_path / "run" / "flower" / "placement.json").read_text()
    assert f"127.0.0.1:{head.port}" in placement

    # Nothing left: not the head's processes (GCS, raylet, agents, workers), not the SuperLink's.
    assert not [p for p in family if _alive(p)]
    assert processes_mentioning(str(ray_tmp)) == []
    assert set(descendants(os.getpid())) <= before


def test_cli_placement_options_need_the_ray_engine(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from lensemble.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", "--engine", "inprocess", "--client-gpus", "1", "--no-eval",
                                      "experiment=micro"])
    assert result.exit_code == 2
    assert "--engine ray" in result.output
    assert not (tmp_path / "runs").exists()  # refused before anything ran
