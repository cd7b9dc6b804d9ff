"""Shared test set-up: one torch thread (2-core machines), no phoning home, tiny configs."""

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def micro_cfg():
    """The composed ``experiment=micro`` config (test-sized model and data)."""
    from lensemble.config import load_config

    return load_config(["experiment=micro"])
