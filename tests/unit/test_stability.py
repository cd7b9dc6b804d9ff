"""Known-answer tests of the run's watch for coming apart (lensemble/federation/stability.py)."""

from __future__ import annotations

from lensemble.federation.stability import stability_record, stability_sentence


def _rounds(sigreg, eff, std=None, pred=None):
    std = std or [1.0] * len(sigreg)
    pred = pred or [0.5] * len(sigreg)
    return [{"loss/sigreg": s, "gauge/global_effective_dim": e, "gauge/global_latent_std": d, "loss/pred": p}
            for s, e, d, p in zip(sigreg, eff, std, pred, strict=True)]


def test_the_default_run_of_issue_43_is_called_coming_apart_with_its_numbers():
    # main at 362d03d: pooled SIGReg 6.6 -> 12.3 -> 14.0, effective dimension 4.5 -> 3.8 -> 2.8, while
    # the prediction loss fell (collapsed latents are easy to predict): the watch reads neither pred nor success
    rec = stability_record(_rounds([6.6, 12.3, 14.0], [4.5, 3.8, 2.8], pred=[0.9, 0.6, 0.4]), 4.6, 1.0)
    assert not rec["holds"] and len(rec["reasons"]) == 2
    words = stability_sentence(rec)
    assert words.startswith("Warning: signs of the federation coming apart over its rounds")
    assert "6.6 → 12.3 → 14" in words and "2.12x" in words
    assert "fell to 2.8" in words and "4.6" in words and "61%" in words


def test_a_run_that_holds_says_so_and_noise_is_not_growth():
    rec = stability_record(_rounds([6.6, 7.1, 6.9], [4.5, 4.4, 4.6]), 4.6, 1.0)
    assert rec["holds"] and rec["reasons"] == []
    assert stability_sentence(rec).startswith("The federation held together")
    # one high round that comes back is not growth; a rise at the end beyond 1.2x is
    assert stability_record(_rounds([6.0, 9.0, 6.5, 6.2], [4.6] * 4), 4.6, 1.0)["holds"]
    assert not stability_record(_rounds([6.0, 6.5, 7.0, 7.6], [4.6] * 4), 4.6, 1.0)["holds"]


def test_an_effective_dimension_within_ten_percent_holds_and_below_does_not():
    assert stability_record(_rounds([5.0, 5.0], [4.2, 4.15]), 4.6, 1.0)["holds"]  # 90.2 % of 4.6
    assert not stability_record(_rounds([5.0, 5.0], [4.2, 4.1]), 4.6, 1.0)["holds"]  # 89 %


def test_a_collapsed_latent_spread_is_named_even_when_sigreg_and_dimension_look_fine():
    # issue 47: a sign-flipped silo took the global's latent std from 0.75 to 0.00048
    rec = stability_record(_rounds([5.0, 5.0], [4.6, 4.6], std=[0.75, 0.00048]), 4.6, 0.75)
    assert not rec["holds"] and "latent spread collapsed to std 0.00048" in stability_sentence(rec)


def test_no_record_no_sentence_and_missing_metrics_are_not_signs():
    assert stability_sentence(None) == ""
    rec = stability_record([{"round": 0}, {"round": 1}], None, None)
    assert rec["holds"] and stability_sentence(rec) == ""
