"""evaluate() end to end on the micro config: a random checkpoint, TwoRoom, 2 episodes."""

import json

import pytest

from lensemble.cli import cli_evaluate
from lensemble.errors import CheckpointIntegrityError, ConfigError, EvaluationError
from lensemble.eval import closed_loop
from lensemble.eval.closed_loop import evaluate
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
    assert report.n_episodes == 2 and 0.0 <= report.success_rate <= 1.0
    assert report.planning_samples == cfg.eval.num_samples * cfg.eval.iterations
    assert report.checkpoint_hash == digest and report.config_hash == cfg.config_hash()
    assert report.planner == "cem" and report.time_per_action_ms > 0 and len(report.goal_spec_hash) == 64
    for name in ("one_step_error", "copy_last_error", "rollout_composite", "intervention_error",
                 "probe_r2", "effective_dim", "latent_std"):
        assert getattr(report, name) is not None, name
    assert 1 in report.rollout_error
    assert EvalReport.from_json(report.to_json()) == report
    # Same seeds, same factors: the goal spec is reproducible.
    again = evaluate(root / "ckpt", ENV, cfg=cfg, episodes=2, progress=False, policy="random", ladder=False)
    assert again.goal_spec_hash == report.goal_spec_hash


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
