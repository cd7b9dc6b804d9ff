"""Bad inputs get a clear error naming the cause (issue 33, case 5)."""

import numpy as np
import pytest

from lensemble.data.probe import probe_hash, save_probe
from lensemble.errors import ConfigError, ProbeError
from lensemble.eval.closed_loop import MAX_EPISODES, validate_request


@pytest.mark.parametrize("shape", [(0, 3, 8, 8), (4, 3, 0, 8)])
def test_an_empty_probe_is_refused_naming_the_cause(tmp_path, shape):
    with pytest.raises(ProbeError, match="holds no frames"):
        probe_hash(np.zeros(shape, np.uint8))  # was a raw TypeError from memoryview
    with pytest.raises(ProbeError, match="data.probe_frames"):
        save_probe(tmp_path, np.zeros(shape, np.uint8))
    assert not list(tmp_path.iterdir())  # nothing written


def test_an_absurd_number_of_evaluation_episodes_is_refused_before_anything_runs(micro_cfg):
    with pytest.raises(ConfigError, match="1000000000 evaluation episodes is more than 10,000"):
        validate_request("swm/TwoRoom-v1", micro_cfg, episodes=1_000_000_000)
    from lensemble.config import load_config

    with pytest.raises(ConfigError, match="at most 10,000"):
        validate_request("swm/TwoRoom-v1", load_config(["experiment=micro", f"eval.episodes={MAX_EPISODES + 1}"]))
    assert validate_request("swm/TwoRoom-v1", micro_cfg, episodes=MAX_EPISODES).episodes == micro_cfg.eval.episodes


def test_evaluations_with_different_seeds_keep_their_own_report_folders(tmp_path):
    # issue 33, case 6: both wrote evaluations/<ckpt>-mpc-heldout/ and the second overwrote the first
    from lensemble.report.eval_report import eval_report_paths

    run = tmp_path / "run"
    (run / "rounds" / "round-0001" / "model").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    ckpt = run / "rounds" / "round-0001" / "model"
    a, b = (eval_report_paths(ckpt, None, seed=s) for s in (0, 1))
    assert a.json.parent != b.json.parent
    assert a.json.parent == run / "evaluations" / "round-0001-mpc-heldout-seed0"
