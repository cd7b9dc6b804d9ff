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
