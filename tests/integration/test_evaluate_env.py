"""A checkpoint is evaluated on its own environment unless the caller asks otherwise (issue 15)."""

import pytest
from typer.testing import CliRunner

from lensemble.artifacts.checkpoint import load_checkpoint, save_checkpoint
from lensemble.artifacts.manifest import build_manifest, write_manifest
from lensemble.config import load_config
from lensemble.errors import EvaluationError
from lensemble.eval import closed_loop
from lensemble.eval.closed_loop import checkpoint_env, evaluate
from lensemble.model.world_model import architecture, build_world_model


class _Reached(Exception):
    """Raised where evaluation would start creating environments."""


@pytest.fixture
def tworoom_checkpoint(tmp_path):
    cfg = load_config(["experiment=micro"])
    run = tmp_path / "run"
    write_manifest(build_manifest(cfg, "train:pooled"), run)
    model = build_world_model(cfg.model, init_seed=0)
    folder = run / "checkpoints" / "step-000001"
    save_checkpoint(folder, model.state_dict(), kind="world_model", config_hash=cfg.config_hash(),
                    architecture=architecture(cfg.model))
    return cfg, folder


def test_other_environment_is_refused_unless_asked_for(tworoom_checkpoint, monkeypatch):
    cfg, folder = tworoom_checkpoint
    assert checkpoint_env(load_checkpoint(folder)) == "swm/TwoRoom-v1"
    with pytest.raises(EvaluationError, match="trained on swm/TwoRoom-v1, not swm/PushT-v1"):
        evaluate(folder, "swm/PushT-v1", cfg=cfg, episodes=1, ladder=False, progress=False)

    def reached(*a, **k):
        raise _Reached

    monkeypatch.setattr(closed_loop, "env_info", reached)
    with pytest.raises(_Reached):  # asked for: the check lets it through
        evaluate(folder, "swm/PushT-v1", cfg=cfg, episodes=1, ladder=False, progress=False, allow_other_env=True)
    with pytest.raises(_Reached):  # its own environment: no question
        evaluate(folder, "swm/TwoRoom-v1", cfg=cfg, episodes=1, ladder=False, progress=False)


def test_cli_refuses_and_names_the_flag(tworoom_checkpoint):
    from lensemble.cli import app

    _, folder = tworoom_checkpoint
    res = CliRunner().invoke(app, ["evaluate", str(folder), "--env", "swm/PushT-v1", "--episodes", "1",
                                   "--no-ladder", "experiment=micro"])
    assert res.exit_code == 2
    assert "--allow-other-env" in " ".join(res.output.split())


def test_a_manifest_of_another_run_does_not_count(tmp_path):
    cfg = load_config(["experiment=micro"])
    write_manifest(build_manifest(cfg, "train:pooled"), tmp_path)  # a parent folder's, other config
    folder = tmp_path / "x" / "ckpt"
    other = load_config(["experiment=micro", "root_seed=5"])
    save_checkpoint(folder, build_world_model(cfg.model, init_seed=0).state_dict(), kind="world_model",
                    config_hash=other.config_hash(), architecture=architecture(cfg.model))
    assert checkpoint_env(load_checkpoint(folder)) is None
