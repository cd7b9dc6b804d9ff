"""Collection end to end on a tiny config: layout, shapes, determinism, splits and probe roles."""

import json

import numpy as np
import pytest

from lensemble.config.schema import LensembleConfig
from lensemble.data import (
    ClipSampler,
    collect_episode,
    collect_silos,
    load_probe,
    load_shard,
    load_silo,
    silo_of,
)
from lensemble.envs import make_env


@pytest.fixture(scope="module")
def tiny_cfg():
    return LensembleConfig.model_validate({
        "model": {"img_size": 32, "patch_size": 8},
        "data": {"num_silos": 2, "episodes_per_silo": 2, "steps_per_episode": 12, "heldout_episodes": 1,
                 "probe_frames": 10, "workers": 1, "severity": 1.0},
    })


@pytest.fixture(scope="module")
def collection(tiny_cfg, tmp_path_factory):
    out = tmp_path_factory.mktemp("collect")
    return out, collect_silos(tiny_cfg, out, progress=False)


def test_layout_and_shapes(collection):
    out, summary = collection
    assert summary["frames_per_second"] > 0 and summary["frames"] > 0
    for c, silo in enumerate(summary["silos"]):
        assert silo_of(out / silo["train"]["path"]) == c
        batch = load_silo(out, c, "train")
        assert batch.obs.shape == (2, 13, 32, 32, 3) and batch.obs.dtype == np.uint8
        assert batch.actions.shape == (2, 12, 2) and batch.actions.dtype == np.float32
        assert batch.state.shape == (2, 13, 10) and batch.state.dtype == np.float32
        assert np.all(np.abs(batch.actions) <= 1.0)
        assert batch.meta["silo"] == c and all("agent.color" in f for f in batch.factors)
        assert load_silo(out, c, "heldout").num_episodes == 1
    assert json.loads((out / "collection.json").read_text())["collection_key"] == summary["collection_key"]


def test_splits_and_probe_use_their_own_values(collection):
    out, summary = collection
    silo_values = [{tuple(v) for v in s["values"]} for s in summary["silos"]]
    assert not silo_values[0] & silo_values[1]  # severity 1: disjoint
    transfer = {tuple(v) for v in summary["splits"]["factor"]["values"]}
    public = {tuple(v) for v in summary["probe"]["public_values"]}
    assert not transfer & public
    for seen in silo_values:
        assert not seen & transfer and not seen & public
    shard = load_shard(out / summary["splits"]["factor"]["path"], summary["splits"]["factor"]["hash"])
    assert {tuple(f["agent.color"]) for f in shard.factors} <= transfer
    probe = load_probe(out / summary["probe"]["path"], expected_hash=summary["probe"]["content_hash"])
    assert probe.frames.shape == (10, 3, 32, 32) and probe.frames.dtype == np.uint8
    assert {tuple(v) for v in probe.meta["public_values"]} == public


def test_reuse_and_clip_sampling(tiny_cfg, collection):
    out, summary = collection
    again = collect_silos(tiny_cfg, out, progress=False)
    assert again["cached"] and again["probe"]["content_hash"] == summary["probe"]["content_hash"]
    sampler = ClipSampler([load_silo(out, 0)], clip_len=3, action_block=2)
    assert len(sampler) == 2 * (13 - 4)


def test_episode_is_a_function_of_its_seed():
    env = make_env("swm/TwoRoom-v1", img_size=16)
    a = collect_episode(env, 123, {"agent.color": [0, 0, 230]}, 8, 0.5)
    b = collect_episode(env, 123, {"agent.color": [0, 0, 230]}, 8, 0.5)
    c = collect_episode(env, 124, {"agent.color": [0, 0, 230]}, 8, 0.5)
    for k in ("obs", "actions", "state"):
        assert np.array_equal(a[k], b[k])
    assert not np.array_equal(a["actions"], c["actions"])


def test_goal_pusher_collects_pusht_episodes_that_move_the_block_and_keys_them_apart(tmp_path):
    from lensemble.data.collect import _collection_key as collection_key

    base = {"env": {"id": "swm/PushT-v1"}, "model": {"img_size": 32, "patch_size": 8},
            "federation": {"min_participants": 1},
            "data": {"num_silos": 1, "episodes_per_silo": 1, "steps_per_episode": 12, "heldout_episodes": 0,
                     "probe_frames": 4, "public_episodes": 1, "workers": 1, "partition_factor": "agent.color",
                     "random_action_share": 0.0}}
    scripted = LensembleConfig.model_validate(base)
    pusher = LensembleConfig.model_validate({**base, "data": {**base["data"], "expert": "goal_pusher"}})
    assert "expert" not in scripted.data.model_dump()  # the default stays out of the dump: old keys hold
    assert collection_key(scripted) != collection_key(pusher)
    env = make_env("swm/PushT-v1", img_size=16)
    ep = collect_episode(env, 5, {}, 60, 0.0, "goal_pusher")
    again = collect_episode(env, 5, {}, 60, 0.0, "goal_pusher")
    np.testing.assert_array_equal(ep["actions"], again["actions"])
    moved = np.linalg.norm(ep["state"][-1, 2:4] - ep["state"][0, 2:4]) + abs(ep["state"][-1, 4] - ep["state"][0, 4])
    assert moved > 1.0, "the pusher reached and moved the block within 60 steps"
    summary = collect_silos(pusher, tmp_path, progress=False)
    assert summary["expert"] == "goal_pusher"


def test_goal_pusher_is_refused_outside_pusht():
    with pytest.raises(ValueError, match="goal_pusher pushes PushT"):
        LensembleConfig.model_validate({"data": {"expert": "goal_pusher"}})
    from lensemble.envs.policies import make_expert

    env = make_env("swm/TwoRoom-v1", img_size=16)
    env.reset(0)
    with pytest.raises(Exception, match="goal_pusher pushes PushT"):
        make_expert(env, np.random.default_rng(0), 0.0, "goal_pusher")
