"""evaluate() end to end on the micro config: a random checkpoint, TwoRoom, 2 episodes."""

import json

import pytest

from lensemble.cli import cli_evaluate
from lensemble.config import load_config
from lensemble.errors import CheckpointIntegrityError, ConfigError, EvaluationError
from lensemble.eval import closed_loop
from lensemble.eval.closed_loop import eval_factor_values, evaluate
from lensemble.eval.goals import episode_specs, goal_spec_hash
from lensemble.eval.ladder import LadderSettings
from lensemble.eval.reports import EvalReport

ENV = "swm/TwoRoom-v1"
SMALL_LADDER = LadderSettings(intervention_pairs=4, max_probe_frames=256)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from lensemble.artifacts import save_checkpoint
    from lensemble.config import load_config
    from lensemble.model import architecture, build_world_model

    root = tmp_path_factory.mktemp("evaluate")
    overrides = ["experiment=micro", f"data.root={root / 'data'}"]
    cfg = load_config(overrides)
    model = build_world_model(cfg.model, init_seed=3)
    digest = save_checkpoint(root / "ckpt", model.state_dict(), kind="world_model",
                             architecture=architecture(cfg.model), config_hash=cfg.config_hash())
    return cfg, root, digest, overrides


def test_mpc_report_is_complete_and_round_trips(setup):
    cfg, root, digest, _ = setup
    report = evaluate(root / "ckpt", ENV, cfg=cfg, episodes=2, progress=False, ladder_settings=SMALL_LADDER)
    assert report.n_episodes == 2
    _check_success_is_the_envs(report, cfg)
    assert report.planning_samples == cfg.eval.num_samples * cfg.eval.iterations
    assert report.checkpoint_hash == digest and report.config_hash == cfg.config_hash()
    assert report.planner == "cem" and report.time_per_action_ms > 0 and len(report.goal_spec_hash) == 64
    for name in ("one_step_error", "copy_last_error", "train_one_step_error", "train_copy_last_error",
                 "rollout_composite", "intervention_error", "probe_r2", "pixel_pca_r2", "effective_dim", "latent_std"):
        assert getattr(report, name) is not None, name
    assert 1 in report.rollout_error
    assert EvalReport.from_json(report.to_json()) == report
    # Same seeds, same factors: the goal spec is reproducible.
    again = evaluate(root / "ckpt", ENV, cfg=cfg, episodes=2, progress=False, policy="random", ladder=False)
    assert again.goal_spec_hash == report.goal_spec_hash


# TwoRoom's own success test (stable-worldmodel 0.1.1, TwoRoomEnv.step): agent within 16 px of the goal.
TWOROOM_SUCCESS_PX = 16.0


def _check_success_is_the_envs(report, cfg):
    """The reported success must be the env's flag, episode by episode: a success ended within
    16 px of the goal, a failure did not and used the whole budget; the rate is their mean."""
    eps = report.episodes
    assert eps is not None and len(eps) == report.n_episodes
    assert report.success_rate == sum(e.success for e in eps) / len(eps)
    for e in eps:
        assert e.success == (e.final_distance < TWOROOM_SUCCESS_PX), e
        assert e.success or e.steps == cfg.eval.budget, e
        assert 1 <= e.steps <= cfg.eval.budget and e.route_valid in (True, False)
    valid = sum(e.success and e.route_valid for e in eps)
    assert report.n_route_valid_successes == valid and report.route_valid_success_rate == valid / len(eps)


def test_success_tracks_the_task_oracle_beats_random_on_the_same_episodes(setup):
    """A known answer the success check must reproduce: the oracle planner (the same CEM on
    TwoRoom's true dynamics) reaches goals 15 expert steps (55-75 px) away within 25 steps;
    random actions mostly do not, on the very same episodes."""
    from lensemble.config import load_config
    from lensemble.eval.reports import pair_episodes

    _, root, _, overrides = setup
    cfg = load_config(overrides + ["eval.num_samples=64", "eval.iterations=5", "eval.topk=8", "eval.budget=25",
                                   "eval.goal_offset=15"])
    oracle = evaluate(root / "ckpt", ENV, cfg=cfg, episodes=4, progress=False, policy="oracle", ladder=False)
    random = evaluate(root / "ckpt", ENV, cfg=cfg, episodes=4, progress=False, policy="random", ladder=False)
    for r in (oracle, random):
        _check_success_is_the_envs(r, cfg)
    assert oracle.planner == "oracle-cem" and oracle.n_successes >= 3
    assert oracle.n_successes > random.n_successes
    pairs = pair_episodes(oracle, random)   # same goal spec: the episodes pair one to one
    assert len(pairs) == 4 and all(a.start_distance == b.start_distance for a, b in pairs)


def test_pusht_oracle_plans_on_the_true_simulator_and_beats_random(setup, tmp_path):
    """PushT's oracle (the same CEM on the env's own pymunk physics, lensemble.eval.pusht_sim) solves
    tasks 10 expert steps away with a small planner; random actions do not, on the same tasks."""
    from lensemble.artifacts import save_checkpoint
    from lensemble.model import architecture, build_world_model

    cfg = load_config(["experiment=micro", f"data.root={tmp_path / 'data'}", "env=pusht", "eval.num_samples=64",
                       "eval.iterations=5", "eval.topk=8", "eval.budget=25", "eval.goal_offset=10"])
    model = build_world_model(cfg.model, init_seed=3)
    save_checkpoint(tmp_path / "ckpt", model.state_dict(), kind="world_model", architecture=architecture(cfg.model),
                    config_hash=cfg.config_hash())
    runs = {p: evaluate(tmp_path / "ckpt", "swm/PushT-v1", cfg=cfg, episodes=4, progress=False, policy=p, ladder=False)
            for p in ("oracle", "random")}
    oracle, random = runs["oracle"], runs["random"]
    assert oracle.planner == "oracle-cem" and oracle.n_successes >= 2 > random.n_successes
    for r in runs.values():
        for e in r.episodes:
            # PushT's flag: agent and block within 20 px of the goal (and the angle within π/9)
            assert not e.success or e.final_distance < 20.0 + 1e-3, e
            assert e.success or e.steps == cfg.eval.budget, e
    assert [e.start_distance for e in oracle.episodes] == [e.start_distance for e in random.episodes]


def test_oracle_needs_an_env_whose_dynamics_it_has(setup, monkeypatch):
    cfg, root, _, _ = setup
    monkeypatch.setattr(closed_loop, "ORACLE_ENVS", (ENV,))
    with pytest.raises(EvaluationError, match="true dynamics"):
        evaluate(root / "ckpt", "swm/PushT-v1", cfg=cfg, episodes=1, progress=False, policy="oracle")


def test_factor_split_reports_transfer_values(setup):
    cfg, root, _, _ = setup
    report = evaluate(root / "ckpt", ENV, cfg=cfg, episodes=2, split="factor", progress=False, ladder=False)
    assert report.held_out_factors and all(f.startswith("agent.color=") for f in report.held_out_factors)
    assert report.transfer_success_rate == report.success_rate


def test_random_policy_via_cli(setup, tmp_path):
    _, root, _, overrides = setup
    out = tmp_path / "report.json"
    report = cli_evaluate(str(root / "ckpt"), ENV, 2, "heldout", "random", str(out),
                          overrides + ["eval.budget=5"])
    assert report.planner == "random" and report.planning_samples == 1
    assert EvalReport.from_json(out.read_text()) == report
    assert json.loads(out.read_text())["n_episodes"] == 2


def test_dataset_goal_protocol_end_to_end(setup, tmp_path):
    """eval=dataset_goal through the CLI: the same tasks under another goal protocol, recorded as
    such, with another goal-spec hash; MPC runs on it unchanged; cross-wall counts add up."""
    cfg, root, _, overrides = setup
    strict = evaluate(root / "ckpt", ENV, cfg=cfg, episodes=3, progress=False, policy="random", ladder=False)
    dataset = cli_evaluate(str(root / "ckpt"), ENV, 3, "heldout", "random", str(tmp_path / "dataset.json"),
                           overrides + ["eval=dataset_goal"], ladder=False)
    assert strict.goal_source == "expert" and dataset.goal_source == "dataset"
    assert dataset.goal_spec_hash != strict.goal_spec_hash
    assert [e.seed for e in dataset.episodes] == [e.seed for e in strict.episodes]   # the same tasks
    assert [e.start_distance for e in dataset.episodes] != [e.start_distance for e in strict.episodes]
    for r in (strict, dataset):
        _check_success_is_the_envs(r, cfg)
        assert r.n_cross_wall_tasks == sum(e.cross_wall for e in r.episodes)
        assert r.n_cross_wall_successes == sum(e.success and e.cross_wall for e in r.episodes)
    md = (tmp_path / "dataset.md").read_text()
    assert "dataset-goal" in md and "across the wall" in md
    dataset_cfg = load_config(overrides + ["eval.goal_source=dataset"])
    mpc = evaluate(root / "ckpt", ENV, cfg=dataset_cfg, episodes=2, progress=False, ladder=False)
    assert mpc.goal_source == "dataset" and mpc.planner == "cem" and mpc.config_hash != cfg.config_hash()
    _check_success_is_the_envs(mpc, dataset_cfg)
    assert mpc.goal_spec_hash == goal_spec_hash(ENV, cfg.eval.goal_offset, cfg.eval.budget,
                                                episode_specs(cfg.eval.seed, 2, eval_factor_values(
                                                    cfg, ENV, "heldout")[0]), "dataset")


def test_tampered_checkpoint_is_refused(setup, tmp_path):
    import shutil

    cfg, root, _, _ = setup
    bad = tmp_path / "bad"
    shutil.copytree(root / "ckpt", bad)
    weights = bad / "weights.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 0x01
    weights.write_bytes(bytes(blob))
    with pytest.raises(CheckpointIntegrityError):
        evaluate(bad, ENV, cfg=cfg, episodes=1, progress=False, ladder=False)


def test_unknown_env_fails_before_anything_is_built(setup, monkeypatch):
    import lensemble.envs.adapter as adapter

    cfg, root, _, _ = setup

    def no_env(*a, **k):
        raise AssertionError("an env was created")

    monkeypatch.setattr(closed_loop, "make_env", no_env)
    monkeypatch.setattr(adapter, "make_env", no_env)
    monkeypatch.setattr(adapter, "EnvAdapter", no_env)
    with pytest.raises(EvaluationError):
        evaluate(root / "ckpt", "swm/NoSuchEnv-v0", cfg=cfg, episodes=1, progress=False)
    # Validation comes before the checkpoint is even opened.
    with pytest.raises(EvaluationError):
        evaluate(root / "does-not-exist", "swm/NoSuchEnv-v0", cfg=cfg, episodes=1, progress=False)


def test_bad_planner_config_is_a_config_error(setup):
    cfg, root, _, _ = setup
    # model_copy skips pydantic validation: evaluate must catch the inconsistency itself.
    bad = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"topk": cfg.eval.num_samples + 1})})
    with pytest.raises(ConfigError):
        evaluate(root / "does-not-exist", ENV, cfg=bad, episodes=1, progress=False)


def test_banded_predictor_evaluates_end_to_end(setup, tmp_path):
    """A banded-attention checkpoint goes through MPC (KV-cached rollouts over a context of
    depth·(W−1)+1 latents) and the whole ladder; its architecture round-trips the attention kind."""
    from lensemble.artifacts import load_checkpoint, save_checkpoint
    from lensemble.config import load_config
    from lensemble.model import architecture, build_world_model

    _, _, _, overrides = setup
    cfg = load_config(overrides + ["model.predictor_attention=banded"])
    model = build_world_model(cfg.model, init_seed=3)
    digest = save_checkpoint(tmp_path / "ckpt", model.state_dict(), kind="world_model",
                             architecture=architecture(cfg.model), config_hash=cfg.config_hash())
    assert load_checkpoint(tmp_path / "ckpt").architecture["model"]["predictor_attention"] == "banded"
    report = evaluate(tmp_path / "ckpt", ENV, cfg=cfg, episodes=1, progress=False, ladder_settings=SMALL_LADDER)
    assert report.checkpoint_hash == digest and report.n_episodes == 1
    assert report.one_step_error is not None and report.rollout_composite is not None
