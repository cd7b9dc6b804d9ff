"""DP ledger (opacus RDP) and the participant release pipeline (clip → noise → quantise)."""

import json
import math

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant

from lensemble.config.seeds import numpy_rng
from lensemble.errors import ConfigError, PrivacyBudgetExceeded, RoundError
from lensemble.federation.privacy import PrivacyLedger, ReleaseTally
from lensemble.federation.pseudograd import clip, flatten, l2_norm
from lensemble.federation.release import participant_pipeline, secure_standard_normal


def _delta(scale: float = 5.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(6, 4, generator=g) * scale, "b": torch.randn(4, generator=g) * scale}


# -- ledger ---------------------------------------------------------------------------------------


def test_epsilon_grows_and_matches_opacus():
    ledger = PrivacyLedger(noise_multiplier=1.0, sample_rate=1.0, delta=1e-5)
    ref = RDPAccountant()
    assert ledger.epsilon() == 0.0
    eps = []
    for _ in range(4):
        predicted = ledger.epsilon_after(1)
        ledger.step()
        ref.step(noise_multiplier=1.0, sample_rate=1.0)
        assert ledger.epsilon() == pytest.approx(ref.get_epsilon(delta=1e-5), rel=1e-12)
        assert ledger.epsilon() == pytest.approx(predicted, rel=1e-12)
        eps.append(ledger.epsilon())
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))
    assert ledger.releases == 4
    assert ledger.epsilon_after(3) > ledger.epsilon()


def test_budget_exceeded_is_raised_before_the_release_that_would_exceed_it():
    ledger = PrivacyLedger(noise_multiplier=1.0, delta=1e-5, target_epsilon=7.5)
    released = 0
    with pytest.raises(PrivacyBudgetExceeded) as info:
        while True:
            ledger.check_release()
            released += 1  # the update would go out here
            ledger.step()
    # σ=1, q=1: ε≈4.7 after 1 release, ≈7.1 after 2, ≈9.0 after 3
    assert released == 2 and ledger.releases == 2
    assert ledger.epsilon() <= 7.5 < info.value.details["epsilon"]


def test_zero_noise_has_no_finite_guarantee():
    ledger = PrivacyLedger(noise_multiplier=0.0, target_epsilon=8.0)
    assert ledger.epsilon_after(1) == math.inf
    with pytest.raises(PrivacyBudgetExceeded):
        ledger.check_release()


def test_ledger_state_roundtrips_through_json():
    a = PrivacyLedger(noise_multiplier=1.3, delta=1e-5)
    for _ in range(3):
        a.step()
    b = PrivacyLedger(noise_multiplier=1.3, delta=1e-5)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.epsilon() == a.epsilon() and b.releases == 3
    a.step()
    b.step()
    assert b.epsilon() == a.epsilon()
    assert len(b._accountant.history) == 1  # steps keep merging after a reload
    with pytest.raises(ConfigError):
        PrivacyLedger(noise_multiplier=0.5).load_state_dict(a.state_dict())


# -- release pipeline -----------------------------------------------------------------------------


def test_clip_bounds_the_norm_and_leaves_small_updates_alone():
    big = _delta(5.0)
    clipped, before = clip(big, 1.0)
    assert before == pytest.approx(l2_norm(big)) and before > 1.0
    assert l2_norm(clipped) <= 1.0
    small = _delta(1e-3)
    same, _ = clip(small, 1.0)
    for k in small:
        assert torch.equal(same[k], small[k])


def test_noise_is_not_reproducible_and_clip_bound_holds():
    d = _delta(5.0)
    r1 = participant_pipeline(d, clip_norm=1.0, noise_multiplier=1.0)
    r2 = participant_pipeline(d, clip_norm=1.0, noise_multiplier=1.0)
    assert r1.norm_before_clip > 1.0
    assert r1.norm_after_clip <= 1.0 and r2.norm_after_clip <= 1.0
    assert r1.noise_std == 1.0
    assert not torch.equal(r1.delta["w"], r2.delta["w"])
    # and not the stream the run seed would give: replaying with a seed-derived generator differs
    r3 = participant_pipeline(d, clip_norm=1.0, noise_multiplier=1.0, rng=numpy_rng(0, "dp"))
    r4 = participant_pipeline(d, clip_norm=1.0, noise_multiplier=1.0, rng=numpy_rng(0, "dp"))
    assert torch.equal(r3.delta["w"], r4.delta["w"])
    assert not torch.equal(r1.delta["w"], r3.delta["w"])


def test_pipeline_order_and_quantised_output():
    d = _delta(5.0)
    r = participant_pipeline(d, clip_norm=2.0, noise_multiplier=0.0, quantize=True)
    assert set(r.payload) == {"q", "scale"} and r.nbytes == 28 + 4
    # quantisation comes after clipping: the decoded update is within the int8 bound of ‖Δ‖ ≤ C
    assert l2_norm(r.delta) <= 2.0 + math.sqrt(28) * 2.0 / 254
    plain = participant_pipeline(d)
    assert set(plain.payload) == {"fp32"}
    for k in d:
        assert torch.equal(plain.delta[k], d[k])


def test_pipeline_refuses_non_finite_and_noise_without_clip():
    bad = _delta()
    bad["b"][0] = float("inf")
    with pytest.raises(RoundError):
        participant_pipeline(bad, clip_norm=1.0)
    with pytest.raises(ValueError):
        participant_pipeline(_delta(), noise_multiplier=1.0)


def test_secure_noise_is_float64_standard_normal_from_the_os():
    a, b = secure_standard_normal(200_001), secure_standard_normal(200_001)
    assert a.dtype == np.float64 and a.shape == (200_001,)
    assert not np.array_equal(a, b)  # never replayable
    assert abs(a.mean()) < 0.01 and abs(a.std() - 1.0) < 0.01
    # tails of a Gaussian, not of a uniform: ~0.27 % beyond 3σ
    assert 0.002 < float(np.mean(np.abs(a) > 3.0)) < 0.0035
    # the draws carry the low bits a float32 draw lacks
    assert np.any(a.astype(np.float32).astype(np.float64) != a)


def test_noise_is_added_in_float64_then_rounded_once():
    d = _delta(5.0)
    std = 0.7 * 1.0
    seen = {}

    def noise(n):
        seen["z"] = numpy_rng(3, "noise").standard_normal(n)
        return seen["z"]

    rel = participant_pipeline(d, clip_norm=1.0, noise_multiplier=0.7, rng=noise)
    clipped, _ = clip({k: v.float() for k, v in d.items()}, 1.0)
    flat, _ = flatten(clipped)
    expected = (flat.double().numpy() + seen["z"] * std).astype(np.float32)
    got, _ = flatten(rel.delta)
    np.testing.assert_array_equal(got.numpy(), expected)
    assert rel.noise_std == pytest.approx(std)


# -- the coordinator's tally ------------------------------------------------------------------------


def test_tally_bounds_every_silo_and_survives_a_restart(tmp_path):
    path = tmp_path / "privacy.json"
    tally = ReleaseTally(path, num_silos=2)
    assert tally.bound() == 0
    tally.before_ask()                       # round 0 asked
    assert tally.bound() == 1                # nobody answered yet: each may have released once
    tally.record("silo-0", 1)
    tally.record("silo-1", 1)
    assert tally.bound() == 1
    tally.before_ask()                       # round 1 asked, the coordinator dies before any reply
    again = ReleaseTally(path, num_silos=2)  # a restarted coordinator reads the file
    assert again.bound() == 2
    again.before_ask()                       # round 1 asked again: silo-1 really released 3 times
    again.record("silo-1", 3)
    assert again.bound() == 3                # silo-0's bound 1 + 2 unanswered asks = 3 as well
    again.record("silo-0", 2)                # silo-0 answered only the re-sent ask
    assert again.bound() == 3                # the largest real count
    assert json.loads(path.read_text())["asks"] == 3


def test_epsilon_for_a_count_matches_the_history():
    ledger = PrivacyLedger(noise_multiplier=1.0, delta=1e-5)
    for n in range(1, 4):
        ledger.step()
        assert ledger.epsilon_for(n) == pytest.approx(ledger.epsilon(), rel=1e-12)
    assert ledger.epsilon_for(0) == 0.0


def test_dp_four_rounds_fits_four_releases_and_not_five():
    """configs/privacy/dp_four_rounds.yaml: its name is its contract at its own δ and target."""
    from lensemble.config import load_config

    cfg = load_config(["privacy=dp_four_rounds"]).privacy
    ledger = PrivacyLedger.from_config(cfg)
    assert ledger.epsilon_for(4) <= cfg.target_epsilon < ledger.epsilon_for(5)
    # The plain preset (σ = 1) allows two releases at the same target, which is why this one exists.
    plain = PrivacyLedger.from_config(load_config(["privacy=dp"]).privacy)
    assert plain.epsilon_for(2) <= cfg.target_epsilon < plain.epsilon_for(3)
