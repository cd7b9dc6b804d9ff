"""The coordinator's norm bound and robust aggregates (lensemble/federation/robust.py), known answers."""

import math

import numpy as np
import pytest
import torch

from lensemble.config import load_config
from lensemble.errors import ConfigError, SecureSumRejected
from lensemble.federation.checks import check_federation_config
from lensemble.federation.robust import (
    adam_step_ceiling,
    lower_median,
    norm_bound,
    recent_norms,
    robust_mean,
    screen_norms,
    secure_update_settings,
    step_bound,
)
from lensemble.federation.secure_agg import check_secure_sum


def test_adam_step_ceiling_holds_and_is_reached():
    # The Cauchy-Schwarz equality case: gradients growing by β2/β1 per step. torch's AdamW (no weight
    # decay, float64) then steps by lr·A in the limit, and never by more, in any step.
    beta1, beta2, lr = 0.9, 0.999, 1e-3
    ceiling = adam_step_ceiling()
    assert ceiling == pytest.approx(7.2703, abs=1e-3)
    p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=lr, betas=(beta1, beta2), eps=0.0, weight_decay=0.0)
    steps = []
    for s in range(2500):
        before = float(p.detach())
        p.grad = torch.tensor([(beta2 / beta1) ** s], dtype=torch.float64)
        opt.step()
        steps.append(abs(float(p.detach()) - before))
    assert max(steps) <= lr * ceiling * (1 + 1e-9)
    # tight: the worst case reaches it, up to the bias correction √(1 - β2^t)/(1 - β1^t) (0.958 here)
    t = len(steps)
    assert steps[-1] == pytest.approx(lr * ceiling * math.sqrt(1 - beta2**t) / (1 - beta1**t), rel=1e-3)


def test_lower_median():
    assert lower_median([]) is None
    assert lower_median([5.0]) == 5.0
    assert lower_median([1.0, 1e4]) == 1.0  # one inflated value of two never sets it
    assert lower_median([3.0, 1.0, 2.0]) == 2.0
    assert lower_median([4.0, 1.0, 3.0, 2.0]) == 2.0


def test_the_bound_refuses_one_inflated_update_in_round_zero_even_with_two_participants():
    for norms in ({"silo-0": 0.3, "silo-1": 3000.0}, {"silo-0": 0.3, "silo-1": 0.31, "silo-2": 3100.0}):
        nb = norm_bound(norms, [], step=4.2, factor=10.0)
        assert nb.bound == pytest.approx(10 * min(norms.values()) if len(norms) == 2 else 3.1)
        assert max(norms.values()) > nb.bound and sorted(norms.values())[-2] <= nb.bound


def test_a_tiny_update_cannot_drag_the_reference_down_once_there_is_history():
    history = [0.30, 0.33, 0.28, 0.31]
    nb = norm_bound({"silo-0": 0.3, "silo-1": 1e-9}, history, step=4.2, factor=10.0)
    assert nb.reference == pytest.approx(0.30) and nb.bound == pytest.approx(3.0)
    # without history (round 0) and without a floor it does: the honest update would be dropped
    # (issue 47's round-0 denial of service); the coordinator passes norm_floor, which no
    # participant can lower (tests/unit/test_hostile_silo.py)
    assert norm_bound({"silo-0": 0.3, "silo-1": 1e-9}, [], step=4.2, factor=10.0).bound == pytest.approx(1e-8)


def test_honest_updates_that_all_grow_pass_and_the_step_bound_caps_everything():
    history = [0.3] * 6
    nb = norm_bound({"silo-0": 5.0, "silo-1": 6.0, "silo-2": 5.5}, history, step=1e3, factor=10.0)
    assert nb.reference == pytest.approx(5.5) and nb.bound == pytest.approx(55.0)  # this round's median wins
    capped = norm_bound({"silo-0": 5.0, "silo-1": 6.0}, history, step=20.0, factor=10.0)
    assert capped.bound == 20.0 and "step bound" in capped.describe()
    assert norm_bound({"a": 0.0, "b": 0.0}, [], step=2.0, factor=10.0).bound == 2.0  # no scale: step bound
    assert norm_bound({"a": 1.0, "b": 50.0}, [], step=1e3, factor=None).bound == 1e3


def test_screen_norms_drops_with_a_reason_and_keeps_the_rest():
    deltas = {f"silo-{i}": {"w": torch.full((100,), v)} for i, v in enumerate((0.03, 0.001, 0.09, 300.0))}
    kept, dropped, nb, norms = screen_norms(deltas, [], step=1e6, factor=10.0)
    assert sorted(kept) == ["silo-0", "silo-1", "silo-2"]  # 0.001 (scaled down) and 3x larger pass
    assert list(dropped) == ["silo-3"] and "norm 3000 above the bound" in dropped["silo-3"]
    assert norms["silo-3"] == pytest.approx(3000.0)


def test_recent_norms_reads_the_last_rounds_of_history():
    history = [{"update_norms": {"silo-0": float(t), "silo-1": float(t) + 0.5}} for t in range(5)] + [{}]
    assert recent_norms(history, 3) == [3.0, 3.5, 4.0, 4.5]


def _deltas(values):
    return {f"silo-{i}": {"w": torch.tensor(v, dtype=torch.float32)} for i, v in enumerate(values)}


def test_robust_means_known_answers():
    d = _deltas([[1.0, -4.0], [2.0, 0.0], [1e6, 2.0]])
    assert robust_mean(d, "median")["w"].tolist() == [2.0, 0.0]
    assert robust_mean(d, "trimmed_mean", 1)["w"].tolist() == [2.0, 0.0]
    assert robust_mean(d, "mean")["w"][0] > 3e5  # what the mean does with the same updates
    even = _deltas([[1.0], [2.0], [4.0], [1e6]])
    assert robust_mean(even, "median")["w"].tolist() == [3.0]  # midpoint of the two middle values
    assert robust_mean(even, "trimmed_mean", 1)["w"].tolist() == [3.0]
    # bitwise independent of arrival order
    rev = dict(reversed(list(d.items())))
    assert torch.equal(robust_mean(rev, "median")["w"], robust_mean(d, "median")["w"])
    with pytest.raises(Exception, match="cannot be trimmed"):
        robust_mean(_deltas([[1.0], [2.0]]), "trimmed_mean", 1)


def test_robust_aggregates_are_refused_under_secure_aggregation_and_trim_needs_silos():
    with pytest.raises(ConfigError, match="only their sum|sees only their sum"):
        check_federation_config(load_config(["experiment=micro", "federation.secure_aggregation=true",
                                             "federation.aggregate=median"]))
    with pytest.raises(ConfigError, match="needs at least 3 silos"):
        check_federation_config(load_config(["experiment=micro", "federation.aggregate=trimmed_mean"]))
    check_federation_config(load_config(["experiment=micro", "data.num_silos=3", "federation.aggregate=trimmed_mean"]))


def test_step_bound_terms(micro_cfg):
    n = 40_000
    params = {"w": np.zeros(n, np.float32)}
    f, tr = micro_cfg.federation, micro_cfg.train
    plain = step_bound(micro_cfg, params)
    assert plain == pytest.approx(f.inner_steps * tr.lr * adam_step_ceiling() * math.sqrt(n))
    dp = load_config(["experiment=micro", "privacy=dp"])
    p = dp.privacy
    assert step_bound(dp, params) == pytest.approx(p.clip_norm * (1 + p.noise_multiplier * (math.sqrt(n) + 7)))
    # the backstop may rotate the frame layer: 2·(‖rotated‖ + the step part)
    bs = load_config(["experiment=micro", "gauge=backstop"])
    frame = {"w": np.zeros(n, np.float32), "encoder.frame.weight": np.eye(64, dtype=np.float32)}
    base = step_bound(bs, frame)
    assert base > 2 * 8.0  # ‖I_64‖_F = 8


def test_the_secure_default_refuses_a_participant_clipped_to_the_range(micro_cfg):
    """Issue 33, case 2, in numbers: two honest updates of the size H AdamW steps make and one ×1e4
    update that skipped its pre-mask check and was clipped to ±c by Flower. The old default B = c·√n
    let the sum through; the run's step bound refuses it, and passes the honest sum."""
    cfg = load_config(["experiment=micro", "data.num_silos=3", "federation.secure_aggregation=true"])
    n = 37_712
    params = {"w": np.zeros(n, np.float32)}
    rng = np.random.default_rng(0)
    honest = [rng.normal(0, 1.5e-3, n) for _ in range(3)]  # micro's measured scale: ‖Δ‖ ≈ 0.3, |Δ_i| < 3e-3
    hostile = np.clip(honest[2] * 1e4, -8.0, 8.0)
    settings = secure_update_settings(cfg, params)
    assert settings.max_norm < settings.clip_range * math.sqrt(n) / 100
    check_secure_sum(sum(honest), 3, n, settings)  # honest: passes
    with pytest.raises(SecureSumRejected, match="above the bound its own check enforces"):
        check_secure_sum(honest[0] + honest[1] + hostile, 3, n, settings)
    old = load_config(["experiment=micro", "data.num_silos=3", "federation.secure_aggregation=true",
                       f"federation.secagg_max_norm={8.0 * math.sqrt(n)}"])
    check_secure_sum(honest[0] + honest[1] + hostile, 3, n, secure_update_settings(old, params))  # what main did
