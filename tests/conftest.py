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


@pytest.fixture(scope="module")
def micro_warm_start(tmp_path_factory):
    """Factory ``make(name, *overrides) -> (overrides, root, warm-start folder)``: trains one public
    warm start for ``experiment=micro`` plus ``overrides`` under a fresh folder, and returns the
    overrides with ``data.root`` and ``federation.warmstart`` set, so every run of a module starts
    from it, as a study's runs share theirs."""
    from lensemble.config import load_config
    from lensemble.training.warmstart import train_warmstart

    def make(name: str, *overrides: str):
        root = tmp_path_factory.mktemp(name)
        base = ["experiment=micro", f"data.root={root / 'data'}", *overrides]
        ws = train_warmstart(load_config(base), run_dir=root / "warmstart", progress=False)
        return base + [f"federation.warmstart={ws.checkpoint_dir}"], root, ws.checkpoint_dir

    return make
