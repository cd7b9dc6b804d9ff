"""DMControl Reacher through the whole pipeline on the micro config (issue 35): collection in the
worker processes (MuJoCo drawing headless there too), the probe, training, and evaluation under
both goal protocols with the env's pose-success rule."""

import numpy as np
import pytest

from lensemble.config import load_config
from lensemble.data.shards import list_shards, load_shard
from lensemble.data.store import ensure_data
from lensemble.envs.reacher import QPOS_TOLERANCE
from lensemble.eval.closed_loop import evaluate

REACHER = "swm/ReacherDMControl-v0"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from lensemble.artifacts import save_checkpoint
    from lensemble.model import architecture, build_world_model

    root = tmp_path_factory.mktemp("reacher")
    overrides = ["experiment=micro", "env=reacher", f"data.root={root / 'data'}"]
    cfg = load_config(overrides)
    folder, summary = ensure_data(cfg, progress=False)
    model = build_world_model(cfg.model, init_seed=3)
    save_checkpoint(root / "ckpt", model.state_dict(), kind="world_model",
                    architecture=architecture(cfg.model), config_hash=cfg.config_hash())
    return cfg, root, folder, summary


def test_collection_holds_reacher_episodes_with_disjoint_silo_colours(setup):
    cfg, _, folder, summary = setup
    assert summary["env_id"] == REACHER

    colours = {}
    for silo in ("silo_000", "silo_001"):
        (path,) = list_shards(folder / silo, "train")
        shard = load_shard(path)
        assert shard.obs.shape[1:] == (cfg.data.steps_per_episode + 1, cfg.model.img_size, cfg.model.img_size, 3)
        assert shard.state.shape[-1] == 6 and np.isfinite(shard.state).all()
        # The arm moves: the joint angles change within every episode.
        assert (np.ptp(shard.state[:, :, :2], axis=1) > 0.1).all()
        colours[silo] = {tuple(f["agent.color"]) for f in shard.factors}
    assert not colours["silo_000"] & colours["silo_001"]  # severity 1: the silos' arm colours are disjoint


@pytest.mark.parametrize("source", ["expert", "dataset"])
def test_evaluate_scores_the_pose_rule_under_both_protocols(setup, source):
    cfg, root, _, _ = setup
    cfg_p = load_config(["experiment=micro", "env=reacher", f"data.root={root / 'data'}",
                         f"eval.goal_source={source}"])
    for policy in ("mpc", "random"):
        report = evaluate(root / "ckpt", REACHER, cfg=cfg_p, episodes=2, policy=policy, progress=False,
                          ladder=policy == "mpc" and source == "expert")
        assert report.n_episodes == 2 and report.goal_source == source
        for e in report.episodes:
            assert e.success == (e.final_distance < QPOS_TOLERANCE), e
            assert e.success or e.steps == cfg_p.eval.budget
            assert e.start_distance > 0 and e.cross_wall is None  # no wall in Reacher
        if policy == "mpc" and source == "expert":  # the ladder runs on Reacher's states (probe: fingertip)
            assert report.one_step_error is not None and report.probe_r2 is not None
            assert report.effective_dim is not None


def test_oracle_plans_reacher_on_mujoco_and_beats_random(setup, tmp_path):
    """Reacher's oracle (the same CEM on the env's own MuJoCo model, lensemble.eval.reacher_sim)
    reaches poses 10 expert steps away with a small planner; random actions do not, on the same tasks."""
    _, root, _, _ = setup
    cfg = load_config(["experiment=micro", "env=reacher", f"data.root={root / 'data'}", "eval.num_samples=128",
                       "eval.iterations=10", "eval.topk=16", "eval.budget=25", "eval.goal_offset=10"])
    runs = {p: evaluate(root / "ckpt", REACHER, cfg=cfg, episodes=4, progress=False, policy=p, ladder=False)
            for p in ("oracle", "random")}
    oracle, random = runs["oracle"], runs["random"]
    assert oracle.planner == "oracle-cem" and oracle.n_successes >= 3 > random.n_successes
    assert [e.start_distance for e in oracle.episodes] == [e.start_distance for e in random.episodes]
