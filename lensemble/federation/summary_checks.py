"""Range checks of one participant's pooled-objective summary, on every path (issue 47).

Validation (:mod:`lensemble.federation.validation`) drops a summary of the wrong shape, round or
finiteness. A finite summary can still be one no honest participant computes: a hostile silo's
summaries x 1e4 took the pooled SIGReg to 1.7e9 (clean 1.3) on the plaintext path, and a
BatchNorm variance of −1e4 or an ECF cosine of 100 were pooled without a word. What every honest
summary satisfies, whatever the model and the data (:mod:`lensemble.model.pooled`):

- ``ecf.cos`` / ``ecf.sin``: means of cos(t·p) and sin(t·p), so in [−1, 1], and per (direction,
  knot) cos² + sin² <= 1 (the modulus of a mean of unit complex numbers);
- ``bn.<i>.var``: a (biased) variance, so >= 0;
- ``bn.<i>.meansq``: the square of ``bn.<i>.mean`` (computed as such in float32), so >= 0 and equal
  to mean² up to rounding;
- ``ecf.mean`` (the latents' mean projection on a sketch direction), ``bn.<i>.mean`` and
  ``bn.<i>.var``: finite, and here bounded: within [−M, M], M = ``federation.summary_max_abs``
  (1e3; honest values measured <= 1.8 on ``experiment=micro``: BatchNorm input means 1.8,
  projection means 0.85, variances 0.02). The SecAgg+ path holds the same fields to its tighter
  coordinate range c (``federation.secagg_clip_range``, :func:`~lensemble.federation.pooling.secure_summary_payload`).

:func:`check_summary` takes any subset of these fields (the moments pass carries the ``bn.*`` ones
only) and names the first field that fails, where and by how much. What it cannot see: a summary
inside every range that is still not the participant's (a plausible but false ECF or moment
moves the pooled statistic by at most its range / C); docs/federation.md, "Threat model".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from lensemble.config.schema import LensembleConfig

log = logging.getLogger(__name__)

#: How a summary refused here is described in the round's drop reasons (validation.py's quorum
#: remedy recognises it).
SUMMARY_REASON = "sent an out-of-range summary"
#: Float32 slack: a mean of N values in [-1, 1] can exceed 1 by a few ulps; |φ|² = cos² + sin² by
#: a few more (the knot t = 0 has cos = 1, sin = 0 exactly: |φ|² = 1 is reached).
ECF_TOL = 1e-5
MODULUS_TOL = 1e-4
#: meansq is mean.square() in float32: equal up to rounding; relative.
MEANSQ_RTOL = 1e-4
#: A biased variance is >= 0; float32 accumulation may leave it a few ulps below, relative to E[x²].
VAR_TOL = 1e-6


def _where(a: np.ndarray, mask: np.ndarray) -> str:
    idx = np.unravel_index(int(np.argmax(mask)), a.shape) if a.ndim else ()
    return f" at {tuple(int(i) for i in idx)}" if idx else ""


def _peak(a: np.ndarray) -> float:
    return float(np.max(np.abs(a))) if a.size else 0.0


def check_summary(arrays: Mapping[str, np.ndarray], cfg: LensembleConfig, *, pooled_slack: float | None = None
                  ) -> str | None:
    """None when one participant's summary (field name -> array) is one an honest participant can
    send, else a phrase naming the first field that is not (sorted field order) and why.

    Any subset of the fields ``ecf.cos``, ``ecf.sin``, ``ecf.mean``, ``bn.<i>.mean``, ``bn.<i>.var``,
    ``bn.<i>.meansq``, ``bngrad.<i>.mean``, ``bngrad.<i>.var`` is checked; other fields only for
    finiteness. The bound M is ``cfg.federation.summary_max_abs`` (the moment gradients travel
    standardised: sums of output gradients, bounded like the loss).

    ``pooled_slack``: check a *mean* of summaries (the SecAgg+ path, where the coordinator sees only
    their sum) with every bound widened by this much (the quantisation error of that mean): the same
    ranges hold for a mean, except that a mean of squared means is at least the square of the mean
    (not equal to it).
    """
    cap = float(cfg.federation.summary_max_abs)
    slack = float(pooled_slack or 0.0)
    values = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    for key in sorted(values):
        a = values[key]
        bad = ~np.isfinite(a)
        if bad.any():
            return f"{key} is not finite{_where(a, bad)}"
        field = key.rsplit(".", 1)[-1]
        if key in ("ecf.cos", "ecf.sin"):
            bad = np.abs(a) > 1.0 + ECF_TOL + slack
            if bad.any():
                return (f"{key} reaches {_peak(a):.4g}{_where(a, bad)}; a mean of {key[4:]}(t·p) lies in [-1, 1]")
        elif key.startswith("bn.") and field == "var":
            floor = -VAR_TOL * (1.0 + np.square(values.get(key[:-3] + "mean", np.zeros_like(a)))) - slack
            bad = a < floor
            if bad.any():
                return f"{key} is {float(a[bad].min()):.4g}{_where(a, bad)}; a variance is >= 0"
        elif key.startswith("bn.") and field == "meansq":
            bad = a < -slack
            if bad.any():
                return f"{key} is {float(a[bad].min()):.4g}{_where(a, bad)}; a squared mean is >= 0"
            mean = values.get(key[:-6] + "mean")
            if mean is not None and mean.shape == a.shape and pooled_slack is not None:
                # a mean over parties of μ_k² is at least (mean of μ_k)²
                bad = a < np.square(mean) * (1.0 - MEANSQ_RTOL) - slack * (1.0 + 2.0 * np.abs(mean))
                if bad.any():
                    return (f"{key} is {float(a[bad].min()):.4g}{_where(a, bad)}, below the square of the pooled "
                            f"{key[:-6]}mean: a mean of squares is at least the square of the mean")
            elif mean is not None and mean.shape == a.shape:
                sq = np.square(mean)
                bad = np.abs(a - sq) > MEANSQ_RTOL * np.maximum(a, sq) + 1e-30
                if bad.any():
                    i = np.unravel_index(int(np.argmax(bad)), a.shape)
                    return (f"{key} is {float(a[i]):.4g}{_where(a, bad)} where {key[:-6]}mean² is {float(sq[i]):.4g}; "
                            "it is the square of the mean")
            if _peak(a) > cap * cap + slack:
                return f"{key} reaches {_peak(a):.4g}, beyond M² = {cap * cap:.4g} (federation.summary_max_abs)"
            continue
        if key == "ecf.mean" or (key.startswith("bn.") and field in ("mean", "var")) or key.startswith("bngrad."):
            bad = np.abs(a) > cap + slack
            if bad.any():
                return (f"{key} reaches {_peak(a):.4g}{_where(a, bad)}, beyond M = {cap:g} "
                        "(federation.summary_max_abs)")
    cos, sin = values.get("ecf.cos"), values.get("ecf.sin")
    if cos is not None and sin is not None and cos.shape == sin.shape:
        modulus = np.square(cos) + np.square(sin)
        bad = modulus > 1.0 + MODULUS_TOL + 4.0 * slack
        if bad.any():
            return (f"ecf.cos² + ecf.sin² reaches {float(modulus.max()):.4g}{_where(modulus, bad)}; the modulus of a "
                    "mean of e^(i·t·p) is <= 1")
    return None


def screen_summaries(accepted: Mapping[str, Mapping[str, object]], cfg: LensembleConfig, *,
                     round_index: int | None = None) -> tuple[dict[str, Mapping[str, object]], dict[str, str]]:
    """(kept, dropped id -> reason) of validated summaries (id -> field -> tensor or array), in
    sorted id order; the reason names the participant's field (:func:`check_summary`), and each
    drop is logged as a warning, as validation logs the replies it drops."""
    kept, dropped = {}, {}
    for pid in sorted(accepted):
        arrays = {k: (v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v))
                  for k, v in accepted[pid].items()}
        why = check_summary(arrays, cfg)
        if why is None:
            kept[pid] = accepted[pid]
        else:
            dropped[pid] = f"{SUMMARY_REASON} ({why})"
            log.warning("round %s: dropping summary from %r: %s", round_index, pid, why)
    return kept, dropped


__all__ = ["ECF_TOL", "MEANSQ_RTOL", "MODULUS_TOL", "SUMMARY_REASON", "VAR_TOL", "check_summary", "screen_summaries"]
