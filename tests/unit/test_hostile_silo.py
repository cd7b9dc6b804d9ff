"""A hostile silo inside the bound (issue 47): known answers for the direction screen, the norm
bound's floor, the pooled-objective summary range checks, the config caps and the warm-start check.

Each attack was accepted before issue 47; the integration twin (tests/integration/
test_hostile_silo_federation.py) runs the first and the third through micro federations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lensemble.artifacts.checkpoint import read_header, save_checkpoint
from lensemble.config import load_config
from lensemble.errors import CheckpointIntegrityError, ConfigError, FaultToleranceExceeded
from lensemble.federation.codec import encode_delta
from lensemble.federation.messages import Reply
from lensemble.federation.pooling import close_summaries
from lensemble.federation.robust import (
    DIRECTION_REASON,
    norm_bound,
    screen_directions,
    screen_updates,
    step_bound,
)
from lensemble.federation.summary_checks import SUMMARY_REASON, check_summary
from lensemble.federation.validation import require_quorum
from lensemble.study import warmstarts

N = 40_000


def _honest(rng, c: int, *, shared: float = 0.5, scale: float = 1.5e-3) -> list[np.ndarray]:
    """c updates with a common part: pairwise cosines ≈ shared² / (shared² + 1) (0.2 at 0.5), the
    order of micro's measured 0.01-0.66, and norms ≈ 0.3 like micro's."""
    common = rng.normal(0, 1, N)
    return [scale * (shared * common + rng.normal(0, 1, N)) for _ in range(c)]


def _deltas(vectors) -> dict[str, dict[str, torch.Tensor]]:
    return {f"silo-{i}": {"w": torch.from_numpy(v.astype(np.float32))} for i, v in enumerate(vectors)}


@pytest.fixture(scope="module")
def micro():
    return load_config(["experiment=micro", "data.num_silos=3"])


@pytest.fixture(scope="module")
def zeros():
    return {"w": torch.zeros(N)}


# -- 1. a sign-flipped update inside the norm bound


def test_a_sign_flipped_update_inside_the_bound_is_dropped_by_direction(micro, zeros):
    rng = np.random.default_rng(0)
    honest = _honest(rng, 3)
    deltas = _deltas([honest[0], honest[1], -9.0 * honest[2]])
    kept, dropped, metrics, norms = screen_updates(micro, deltas, [], zeros)
    # inside the norm bound (what let it in before issue 47): 9x the honest norm, the bound 10x
    assert metrics["fed/norm_dropped"] == 0 and 9 * 0.25 < metrics["fed/norm_bound"]
    assert sorted(kept) == ["silo-0", "silo-1"] and list(dropped) == ["silo-2"]
    assert dropped["silo-2"].startswith(DIRECTION_REASON) and "update_max_cancel = 0.5" in dropped["silo-2"]
    assert metrics["fed/direction_dropped"] == 1 and metrics["fed/direction_cancel_max"] < 0.1
    assert sorted(norms) == ["silo-0", "silo-1"]  # the history holds accepted norms only
    # the screen off: what main did
    off = load_config(["experiment=micro", "data.num_silos=3", "federation.update_max_cancel=null"])
    kept, dropped, metrics, _ = screen_updates(off, deltas, [], zeros)
    assert len(kept) == 3 and "fed/direction_dropped" not in metrics


def test_honest_updates_are_kept_by_the_direction_screen(micro, zeros):
    rng = np.random.default_rng(1)
    # weak agreement (pairwise cos ≈ 0.06), none at all (≈ 0, some negative), scaled copies, a zero
    # update, many silos; and micro's round where two honest updates had cosine -0.045
    a, b = _honest(rng, 2, shared=0.0)
    b = b - (a @ b / (a @ a) + 0.045 * np.linalg.norm(b) / np.linalg.norm(a)) * a  # cos(a, b) = -0.045
    for vectors in (_honest(rng, 3, shared=0.25), _honest(rng, 3, shared=0.0), [a, b],
                    [v * s for v, s in zip(_honest(rng, 3), (0.01, 1.0, 3.0))],
                    _honest(rng, 2, shared=0.1) + [np.zeros(N)], _honest(rng, 7, shared=0.3)):
        kept, dropped, _ = screen_directions(_deltas(vectors), max_cancel=0.5)
        assert dropped == {} and len(kept) == len(vectors)


def test_a_flipped_minority_is_dropped_and_the_honest_majority_kept():
    rng = np.random.default_rng(2)
    honest = _honest(rng, 5)
    kept, dropped, _ = screen_directions(_deltas(honest[:3] + [-9 * honest[3], -9 * honest[4]]), max_cancel=0.5)
    assert sorted(dropped) == ["silo-3", "silo-4"] and sorted(kept) == ["silo-0", "silo-1", "silo-2"]


def test_with_two_updates_a_pair_whose_mean_turns_against_one_is_dropped_whole(micro, zeros):
    rng = np.random.default_rng(3)
    a, b = _honest(rng, 2)
    two = load_config(["experiment=micro"])
    kept, dropped, metrics, _ = screen_updates(two, _deltas([a, -9.0 * b]), [], zeros)
    assert kept == {} and sorted(dropped) == ["silo-0", "silo-1"]
    assert "cannot tell which is hostile" in dropped["silo-1"]
    with pytest.raises(FaultToleranceExceeded) as err:  # the quorum decides: nothing commits
        require_quorum(len(kept), 1, round_index=0, failures=dropped)
    assert "bring nodes back" not in err.value.remediation and "update_max_cancel" in err.value.remediation
    # an honest pair that barely agrees (micro measured cos 0.01 with norms 13x apart) is kept
    b = b - (a @ b) / (a @ a) * a + 0.01 * np.linalg.norm(b) / np.linalg.norm(a) * a  # cos(a, b) = 0.01
    kept, dropped, _ = screen_directions(_deltas([a, 13 * b]), max_cancel=0.5)
    assert dropped == {}


def test_the_direction_screen_is_off_under_dp(zeros):
    dp = load_config(["experiment=micro", "data.num_silos=3", "privacy=dp"])
    rng = np.random.default_rng(4)
    honest = _honest(rng, 3)
    _, dropped, metrics, _ = screen_updates(dp, _deltas([honest[0], honest[1], -honest[2]]), [], zeros)
    assert "fed/direction_dropped" not in metrics and dropped == {}


# -- 3. round-0 denial of service with two silos


def test_a_near_zero_update_cannot_get_the_honest_one_dropped(zeros):
    cfg = load_config(["experiment=micro"])
    rng = np.random.default_rng(5)
    honest = _honest(rng, 1)[0]
    deltas = _deltas([honest, honest * 1e-5])  # the issue: 0.2928 against the bound 3.1e-06
    kept, dropped, metrics, _ = screen_updates(cfg, deltas, [], zeros)
    assert dropped == {} and len(kept) == 2
    step = step_bound(cfg, zeros)
    assert metrics["fed/norm_floor"] == pytest.approx(0.5 * step) and metrics["fed/norm_bound"] >= 0.5 * step
    # nor once its tiny norms fill half the history (rounds 1.. of the same attack)
    history = [{"update_norms": {"silo-0": 0.29, "silo-1": 3e-6}}] * 3
    kept, dropped, _, _ = screen_updates(cfg, deltas, history, zeros)
    assert dropped == {}
    # a x1e4 update is still refused (by the step bound, which the floor never exceeds)
    kept, dropped, _, _ = screen_updates(cfg, _deltas([honest, honest * 1e4]), [], zeros)
    assert list(dropped) == ["silo-1"]
    # without the floor: the denial of service main had
    nb = norm_bound({"silo-0": 0.29, "silo-1": 3e-6}, [], step=step, factor=10.0)
    assert nb.bound == pytest.approx(3e-5)


def test_the_floor_is_the_step_bound_under_dp(zeros):
    dp = load_config(["experiment=micro", "privacy=dp"])
    step = step_bound(dp, zeros)
    _, _, metrics, _ = screen_updates(dp, _deltas([np.full(N, 1e-9), np.full(N, 1e-2)]), [], zeros)
    assert metrics["fed/norm_bound"] == pytest.approx(step)


def test_a_quorum_failed_by_the_screens_says_so_in_its_remedy():
    reasons = {"silo-0": "sent an update of norm 0.2928 above the bound 3.1e-06 (10 x the reference norm 3.1e-07)"}
    with pytest.raises(FaultToleranceExceeded) as err:
        require_quorum(1, 2, round_index=0, failures=reasons)
    assert "silo-0" in err.value.remediation and "bring nodes back" not in err.value.remediation
    with pytest.raises(FaultToleranceExceeded) as err:  # a plain timeout keeps the default remedy
        require_quorum(1, 2, round_index=0, failures={"silo-0": "did not reply within 5 s"})
    assert "bring nodes back" in err.value.remediation


# -- 2. poisoned pooled-objective summaries


@pytest.fixture(scope="module")
def pooled():
    return load_config(["experiment=micro", "data.num_silos=3", "model.projector_norm=batchnorm",
                        "objective.sigreg_scope=pooled", "objective.bn_scope=pooled"])


def _summary(cfg, rng) -> dict[str, np.ndarray]:
    """An honest-looking summary: ECF means of real projections, moments of real features."""
    s, k, h = cfg.objective.sigreg_directions, cfg.objective.sigreg_knots, cfg.model.projector_hidden
    p = rng.normal(0, 1, (64, s))
    t = np.linspace(0, cfg.objective.sigreg_t_max, k)
    x = rng.normal(0.5, 0.1, (64, h))
    mean = x.mean(0).astype(np.float32)
    return {"ecf.cos": np.cos(p[:, :, None] * t).mean(0).astype(np.float32),
            "ecf.sin": np.sin(p[:, :, None] * t).mean(0).astype(np.float32),
            "ecf.mean": p.mean(0).astype(np.float32),
            "bn.0.mean": mean, "bn.0.var": x.var(0).astype(np.float32), "bn.0.meansq": np.square(mean)}


POISONS = {
    "x1e4": (lambda a: {k: v * 1e4 for k, v in a.items()}, "bn.0.mean reaches"),
    "negative variance": (lambda a: a | {"bn.0.var": np.full_like(a["bn.0.var"], -1e4)}, "bn.0.var is -1e+04"),
    "ecf cos 100": (lambda a: a | {"ecf.cos": np.full_like(a["ecf.cos"], 100.0)}, "ecf.cos reaches 100"),
    "ecf modulus": (lambda a: a | {"ecf.cos": np.full_like(a["ecf.cos"], 0.9), "ecf.sin": np.full_like(a["ecf.sin"], 0.9)},
                    "modulus"),
    "huge mean": (lambda a: a | {"ecf.mean": np.full_like(a["ecf.mean"], 5e3)}, "ecf.mean reaches 5000"),
    "meansq": (lambda a: a | {"bn.0.meansq": a["bn.0.meansq"] * 1e4}, "square of the mean"),
}


def test_honest_summaries_and_their_subsets_pass(pooled):
    rng = np.random.default_rng(6)
    arrays = _summary(pooled, rng)
    assert check_summary(arrays, pooled) is None
    assert check_summary({k: v for k, v in arrays.items() if k.startswith("bn.")}, pooled) is None  # moments pass
    assert check_summary({k: v for k, v in arrays.items() if k.startswith("ecf.")}, pooled) is None


@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_summary_is_named_and_left_out_of_the_pooled_mean(pooled, poison, caplog):
    rng = np.random.default_rng(7)
    summaries = [_summary(pooled, rng) for _ in range(3)]
    change, words = POISONS[poison]
    summaries[2] = change(summaries[2])
    assert words in check_summary(summaries[2], pooled)
    # the moments pass: only its bn.* fields (the poisons that touch them are still caught)
    bn_only = {k: v for k, v in summaries[2].items() if k.startswith("bn.")}
    if poison in ("negative variance", "meansq", "x1e4"):
        assert check_summary(bn_only, pooled) is not None
    replies = {f"silo-{i}": Reply(0, encode_delta({k: torch.from_numpy(v) for k, v in sorted(a.items())}),
                                  np.zeros((0, pooled.model.latent_dim), np.float32), {})
               for i, a in enumerate(summaries)}
    extras, metrics = close_summaries(pooled, 0, replies, {})
    assert metrics["fed/summary_participants"] == 2 and metrics["fed/summary_dropped"] == 1
    assert extras["pooled.members"].tolist() == [0, 1]
    honest_mean = (summaries[0]["bn.0.var"].astype(np.float64) + summaries[1]["bn.0.var"]) / 2
    np.testing.assert_allclose(extras["pooled.bn.0.var"], honest_mean, rtol=1e-6)
    assert "silo-2" in caplog.text and words in caplog.text
    # with a quorum of all three the round fails, naming the culprit and the field
    three = load_config(["experiment=micro", "data.num_silos=3", "model.projector_norm=batchnorm",
                         "objective.sigreg_scope=pooled", "objective.bn_scope=pooled",
                         "federation.min_participants=3"])
    with pytest.raises(FaultToleranceExceeded) as err:
        close_summaries(three, 0, replies, {})
    assert f"silo-2 {SUMMARY_REASON} ({words}" in str(err.value) or words in str(err.value)
    assert "bring nodes back" not in err.value.remediation


# -- lower: config caps, finite floats, the run name, a kept warm start


@pytest.mark.parametrize("override, field", [
    ("train.batch_size=100000000", "train.batch_size"), ("federation.rounds=10000000", "federation.rounds"),
    ("federation.inner_steps=100000000", "federation.inner_steps"),
    ("data.episodes_per_silo=100000000", "data.episodes_per_silo"), ("eval.episodes=100000000", "eval.episodes"),
    ("model.latent_dim=1000000", "model.latent_dim"), ("train.lr=inf", "train.lr"), ("train.lr=nan", "train.lr"),
    ("federation.outer_lr=inf", "federation.outer_lr"), ("name=../..", "name"), ("name=..", "name"),
    ("name=a/b", "name"),
])
def test_absurd_values_are_config_errors_naming_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config(["experiment=micro", override])
    assert field in err.value.details["fields"] and field in str(err.value)


def test_the_shipped_names_still_validate():
    for name in ("tiny", "micro", "pooled-sweeps", "fork_a", "paper.v2"):
        assert load_config(["experiment=micro", f"name={name}"]).run_dir == f"runs/{name}"


def test_a_kept_warm_start_is_compared_by_its_weights(tmp_path):
    study = tmp_path / "study"
    h = save_checkpoint(tmp_path / "a", {"w": torch.full((4, 3), 1.0)}, kind="warmstart")
    warmstarts.keep(study, "warmstart-s0", tmp_path / "a")
    assert warmstarts.holds(tmp_path / "a", h) and not warmstarts.holds(tmp_path / "a", "0" * 64)
    assert not warmstarts.holds(tmp_path / "missing", h)
    # the scratch copy's weights change under an intact header: no longer "held", and not kept
    weights = next(p for p in (tmp_path / "a").iterdir() if p.name != "header.json")
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF
    weights.write_bytes(bytes(raw))
    assert read_header(tmp_path / "a")["content_hash"] == h and not warmstarts.holds(tmp_path / "a", h)
    with pytest.raises(CheckpointIntegrityError):
        warmstarts.keep(tmp_path / "study2", "warmstart-s0", tmp_path / "a")
    # a damaged kept copy of the same warm start is replaced by a verified one
    kept = warmstarts.kept_path(study, "warmstart-s0")
    save_checkpoint(tmp_path / "b", {"w": torch.full((4, 3), 1.0)}, kind="warmstart")
    kw = next(p for p in kept.iterdir() if p.name != "header.json")
    kw.write_bytes(weights.read_bytes())  # damaged
    assert not warmstarts.holds(kept, h)
    warmstarts.keep(study, "warmstart-s0", tmp_path / "b")
    assert warmstarts.holds(kept, h)


def test_the_new_fields_leave_config_hashes_alone():
    base = load_config(["experiment=micro"])
    dump = base.model_dump(mode="json")["federation"]
    assert not {"update_norm_floor", "update_max_cancel", "summary_max_abs"} & set(dump)
    moved = load_config(["experiment=micro", "federation.update_max_cancel=0.25"])
    assert moved.config_hash() != base.config_hash()
    assert math.isfinite(base.federation.summary_max_abs)
