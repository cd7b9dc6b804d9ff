"""Gap recovery ρ in a study cell: claim 3's decision, and the descriptive table of every
federated arm against each centralized reference.

ρ = (S_fed − S_local) / (S_ref − S_local) over a cell's paired seeds (:func:`~lensemble.study.gap.gap_recovery`:
ratio of means, paired seed bootstrap). The reference is the centralized arm (the federation's total
optimizer steps) or the data-parallel twin (its sequential steps at C × the batch); the registry
names claim 3's (``registry.rho_reference``), and the table reports both wherever they ran, because
the two answer different questions: the twin asks what federation loses against the same
sequential compute on pooled data, the centralized arm against the same total compute.
"""

from __future__ import annotations

import math

import numpy as np

from lensemble.errors import EvaluationError
from lensemble.eval.stats import verdict
from lensemble.study.gap import gap_recovery, gap_recovery_replicated
from lensemble.study.replicates import has_replicates, seed_units
from lensemble.study.spec import FEDERATED_ARMS, RHO_REFERENCES


def rho_claim(fed: dict, local: dict, central: dict, *, threshold: float, alpha: float, n_boot: int,
              min_seeds: int = 2) -> dict:
    """ρ of ``fed`` against ``central`` (any reference arm) and ``local``: per-seed values
    ``{seed: {"success": rate, ...}}``; decided against ``threshold`` by :func:`verdict`."""
    seeds = sorted(s for s in set(fed) & set(local) & set(central)
                   if None not in (fed[s].get("success"), local[s].get("success"), central[s].get("success")))
    out = {"seeds": seeds, "n": len(seeds), "threshold": threshold, "rho": None, "rho_ci": None, "defined": False}
    if len(seeds) < max(2, min_seeds):
        out.update(label="inconclusive", reason=f"{len(seeds)} seed(s) with all three arms evaluated; the "
                                                f"registry asks for at least {max(2, min_seeds)}")
        return out
    if has_replicates(fed, local, central):
        # training replicates (issue 44): seeds, then replicates, then tasks (lensemble.study.replicates)
        units, levels = seed_units([fed, local, central], seeds)
        g = gap_recovery_replicated(units, n_boot=n_boot, seed=0, alpha=alpha, levels=levels)
        out.update({"interval_method": g.method,
                    "replicates": {name: {str(s): len(arm[s].get("replicates") or [arm[s]]) for s in seeds}
                                   for name, arm in (("fed", fed), ("local", local), ("reference", central))}})
    else:
        g = gap_recovery([fed[s]["success"] for s in seeds], [local[s]["success"] for s in seeds],
                         [central[s]["success"] for s in seeds], n_boot=n_boot, seed=0, alpha=alpha)
    out.update({"defined": g.defined, "rho": g.rho, "rho_ci": list(g.rho_ci) if g.rho_ci else None,
                "numerator": g.numerator, "numerator_ci": list(g.numerator_ci), "denominator": g.denominator,
                "denominator_ci": list(g.denominator_ci), "n_indeterminate": g.n_indeterminate})
    if not g.defined:
        out.update(label="inconclusive", reason="ρ undefined: " + (g.reason or ""))
        return out
    lo, hi = g.rho_ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        out["rho_ci"] = [lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None]
        out.update(label="inconclusive", reason=f"the ρ interval is unbounded ({lo}, {hi}): some resampled "
                                                "denominators are 0")
        return out
    v = verdict(g.rho, (lo, hi), delta=threshold, direction="increase")
    if v.label == "confirmed" and not lo > 0:
        raise EvaluationError(f"internal: ρ was about to be confirmed with the interval {(lo, hi)}")
    out.update(label=v.label, reason=v.reason)
    return out


def rho_in_cell(cell_vals: dict, anchored: str, *, threshold: float, alpha: float, n_boot: int,
                min_seeds: int = 2, reference: str = "central") -> dict:
    """:func:`rho_claim` of arm ``anchored`` in one cell (arm -> per-seed values), against
    ``reference`` ("central" or "twin") and the local arm; inconclusive when an arm is missing."""
    if reference not in RHO_REFERENCES:
        raise EvaluationError(f"ρ reference {reference!r} is not one of {RHO_REFERENCES}")
    need = (anchored, "local", reference)
    missing = [a for a in need if a not in cell_vals]
    if missing:
        return {"label": "inconclusive", "reason": f"arm(s) {missing} not in this cell", "defined": False,
                "rho": None, "rho_ci": None, "n": 0, "threshold": threshold, "reference": reference}
    out = rho_claim(cell_vals[anchored], cell_vals["local"], cell_vals[reference], threshold=threshold,
                    alpha=alpha, n_boot=n_boot, min_seeds=min_seeds)
    return {**out, "reference": reference}


def rho_table(cell_vals: dict, *, threshold: float, alpha: float, n_boot: int, min_seeds: int = 2) -> list[dict]:
    """Descriptive: ρ of every federated arm of the cell against every reference that ran there
    (rows ``{"arm", "reference", **rho_claim}``; their labels decide nothing, claim 3 does)."""
    return [{"arm": arm, **rho_in_cell(cell_vals, arm, threshold=threshold, alpha=alpha, n_boot=n_boot,
                                        min_seeds=min_seeds, reference=ref)}
            for arm in FEDERATED_ARMS if arm in cell_vals
            for ref in RHO_REFERENCES if ref in cell_vals and "local" in cell_vals]


def simulated_rho_outcomes(*, local: float, reference: float, fed: float, n_seeds: int, n_episodes: int,
                           sd_seed: float, sd_train: float, threshold: float, alpha: float = 0.05,
                           n_boot: int = 2000, reps: int = 200, seed: int = 0, replicates: int = 1,
                           sd_replicate: float = 0.0) -> dict:
    """How often claim 3's registered decision (:func:`rho_claim`) confirms, falsifies or stays
    inconclusive when the arms' true success rates are ``local``, ``reference`` and ``fed``.

    Per replicate and seed the three true rates move together by a seed effect ~ N(0, sd_seed)
    (a seed's warm start and data lift every arm) and each by its own training noise ~ N(0,
    sd_train); ``n_episodes`` independent Bernoulli episodes per arm then give the observed rates
    (independent episodes ignore the positive task correlation between arms, which would narrow
    the interval: conservative). Returns the fractions {"confirmed", "falsified", "inconclusive"}
    and the true ρ.

    With ``replicates`` > 1 or a ``sd_replicate`` (the measured between-replicate spread of an
    arm's success within a seed), each arm trains ``replicates`` times per seed, each replicate
    adding its own N(0, sd_replicate) to its true rate, and the decision uses the replicate
    analysis (seeds, then replicates: :mod:`lensemble.study.replicates`); otherwise the one-run
    model above, number for number.
    """
    rng = np.random.default_rng(seed)
    true = np.array([local, reference, fed])
    counts = {"confirmed": 0, "falsified": 0, "inconclusive": 0}
    if replicates != 1 or sd_replicate:
        for _ in range(reps):
            shift = rng.normal(0.0, sd_seed, size=(n_seeds, 1, 1)) + rng.normal(0.0, sd_train, size=(n_seeds, 3, 1))
            p = np.clip(true[None, :, None] + shift + rng.normal(0.0, sd_replicate, size=(n_seeds, 3, replicates)),
                        0.0, 1.0)
            rates = rng.binomial(n_episodes, p) / n_episodes                # (seeds, [local, ref, fed], replicate)
            per = [{s: {"success": float(rates[s, j].mean()),
                        "replicates": [{"success": float(x)} for x in rates[s, j]]} for s in range(n_seeds)}
                   for j in range(3)]
            res = rho_claim(per[2], per[0], per[1], threshold=threshold, alpha=alpha, n_boot=n_boot, min_seeds=2)
            counts[res["label"]] += 1
        return {**{k: v / reps for k, v in counts.items()}, "true_rho": (fed - local) / (reference - local),
                "reps": reps, "replicates": replicates, "sd_replicate": sd_replicate}
    for _ in range(reps):
        shift = rng.normal(0.0, sd_seed, size=(n_seeds, 1)) + rng.normal(0.0, sd_train, size=(n_seeds, 3))
        p = np.clip(true[None, :] + shift, 0.0, 1.0)
        rates = rng.binomial(n_episodes, p) / n_episodes                    # (seeds, [local, ref, fed])
        per = [{s: {"success": float(rates[s, j])} for s in range(n_seeds)} for j in range(3)]
        res = rho_claim(per[2], per[0], per[1], threshold=threshold, alpha=alpha, n_boot=n_boot, min_seeds=2)
        counts[res["label"]] += 1
    return {**{k: v / reps for k, v in counts.items()}, "true_rho": (fed - local) / (reference - local),
            "reps": reps}


__all__ = ["rho_claim", "rho_in_cell", "rho_table", "simulated_rho_outcomes"]
