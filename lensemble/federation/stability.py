"""Does the federation hold together over its rounds? The run's own watch for coming apart.

A federation can come apart while every round commits and the prediction loss falls (collapsed
latents are easy to predict): on main at 362d03d the default run's pooled SIGReg went 6.6 → 12.3 →
14.0 and the global's effective dimension 4.5 → 3.8 → 2.8 while its answer said nothing (issue 43).
:func:`stability_record` reads the committed round metrics and says so, with the numbers:

- **SIGReg grows**: the participants' pooled SIGReg (``loss/sigreg``, their last inner step) ends
  more than :data:`SIGREG_GROWTH` times its first round's, rising in most rounds;
- **effective dimension falls**: the global's effective dimension on the public probe
  (``gauge/global_effective_dim``) drops below :data:`EFFECTIVE_DIM_SHARE` of the warm start's;
- **latent spread collapses**: the global's latent std on the probe (``gauge/global_latent_std``)
  drops below :data:`SPREAD_SHARE` of the warm start's (a hostile or broken update can shrink every
  latent towards one point: issue 47's sign-flipped silo took it from 0.75 to 0.00048).

The coordinator writes the record into ``summary.json`` (``stability``); the answer's first line
carries :func:`stability_sentence` (lensemble/report/run_report.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

#: The pooled SIGReg's last-over-first ratio beyond which it "grows" (rounds are noisy: one
#: round's batch differs from the next's by more than a few per cent, never by a fifth on the
#: stable runs measured, docs/federation.md "Watching a run").
SIGREG_GROWTH = 1.2
#: The share of the warm start's effective dimension below which the global's "falls": the
#: default run's done-when keeps it within 10 % (issue 43).
EFFECTIVE_DIM_SHARE = 0.9
#: The share of the warm start's latent std below which the global's spread "collapses".
SPREAD_SHARE = 0.1


def _series(rounds: Sequence[Mapping], key: str) -> list[float]:
    return [float(r[key]) for r in rounds if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))]


def _arrow(xs: Sequence[float], spec: str = ".2g") -> str:
    return " → ".join(format(x, spec) for x in xs)


def stability_record(rounds: Sequence[Mapping], warmstart_effective_dim: float | None,
                     warmstart_latent_std: float | None) -> dict:
    """``{"holds": bool, "reasons": [str], "sigreg": [...], "effective_dim": [...], "latent_std":
    [...], "warmstart_effective_dim", "warmstart_latent_std", "thresholds": {...}}`` from the
    committed rounds' metrics (one dict per round, in order). ``holds`` is False when any reason
    is given; each reason states its numbers."""
    sig = _series(rounds, "loss/sigreg")
    eff = _series(rounds, "gauge/global_effective_dim")
    std = _series(rounds, "gauge/global_latent_std")
    reasons: list[str] = []
    if len(sig) >= 2 and sig[0] > 0:
        rises = sum(b > a for a, b in zip(sig[:-1], sig[1:], strict=True))
        if sig[-1] > SIGREG_GROWTH * sig[0] and 2 * rises >= len(sig) - 1:
            reasons.append(f"the pooled SIGReg grew {_arrow(sig, '.3g')} ({sig[-1] / sig[0]:.2f}x over the rounds)")
    if eff and warmstart_effective_dim:
        low = min(eff)
        if low < EFFECTIVE_DIM_SHARE * warmstart_effective_dim:
            reasons.append(f"the global's effective dimension fell to {low:.2g} ({_arrow(eff)}) against the warm "
                           f"start's {warmstart_effective_dim:.2g} ({low / warmstart_effective_dim:.0%} of it)")
    if std and warmstart_latent_std:
        low = min(std)
        if low < SPREAD_SHARE * warmstart_latent_std:
            reasons.append(f"the global's latent spread collapsed to std {low:.2g} ({_arrow(std)}) against the warm "
                           f"start's {warmstart_latent_std:.2g}")
    return {"holds": not reasons, "reasons": reasons, "sigreg": sig, "effective_dim": eff, "latent_std": std,
            "warmstart_effective_dim": warmstart_effective_dim, "warmstart_latent_std": warmstart_latent_std,
            "thresholds": {"sigreg_growth": SIGREG_GROWTH, "effective_dim_share": EFFECTIVE_DIM_SHARE,
                           "spread_share": SPREAD_SHARE}}


def stability_sentence(record: Mapping | None) -> str:
    """The record in words: a warning naming every sign when the run came apart, one line of the
    numbers when it held; "" when there is no record (a run from before the watch)."""
    if not record:
        return ""
    if not record["holds"]:
        return "Warning: signs of the federation coming apart over its rounds: " + "; ".join(record["reasons"]) + "."
    parts = []
    if len(record["sigreg"]) >= 2:
        parts.append(f"pooled SIGReg {_arrow(record['sigreg'], '.3g')}")
    if record["effective_dim"]:
        ws = record.get("warmstart_effective_dim")
        parts.append(f"the global's effective dimension {_arrow(record['effective_dim'])}"
                     + (f" (warm start {ws:.2g})" if ws else ""))
    return "The federation held together over its rounds: " + ", ".join(parts) + "." if parts else ""


__all__ = ["EFFECTIVE_DIM_SHARE", "SIGREG_GROWTH", "SPREAD_SHARE", "stability_record", "stability_sentence"]
