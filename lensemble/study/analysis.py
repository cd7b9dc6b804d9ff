"""The study's analysis: the registered claims decided from the run summaries alone.

Input: ``registry.yaml`` (what to test and how), ``plan.json`` (which runs fill which cell) and
``runs/*.json`` (one small summary per finished run). Output: a JSON-able dict, also written to
``analysis.json``. Nothing here loads a checkpoint or touches data, so the analysis and the report
can be rebuilt in a later session from committed files.

Conventions:

* the unit is the seed; a comparison uses the seeds where both arms have a finite value;
* paired differences get a BCa bootstrap interval over seeds and an exact sign-flip p-value
  (one- or two-sided as registered); Holm adjusts the confirmatory family (claims 1 and 2) and,
  separately, the ladder family (each rung against naive);
* success rates also get a Wilson interval on the episodes pooled over seeds (which ignores the
  seed-to-seed variance, so it is the narrower of the two and never decides a claim);
* ρ uses :func:`~lensemble.study.gap.gap_recovery` and is undefined when the denominator's interval
  contains 0;
* every verdict comes from :func:`~lensemble.eval.stats.verdict`; a missing arm, too few seeds or an
  unmeasurable metric (e.g. drift on degenerate frames) makes a claim inconclusive, with the reason.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from lensemble.errors import EvaluationError
from lensemble.eval.stats import (
    bootstrap_ci,
    holm,
    paired_difference,
    paired_permutation_pvalue,
    verdict,
    wilson_interval,
)
from lensemble.study.files import atomic_write, load_failures, load_summaries
from lensemble.study.gap import gap_recovery
from lensemble.study.plan import LADDER
from lensemble.study.registry import load_registry
from lensemble.study.spec import ALL_ARMS

ROUND_METRICS = ("gauge/drift_angle_deg", "gauge/global_effective_dim", "gauge/global_latent_std",
                 "gauge/effective_dim", "gauge/pairwise_angle_deg", "gauge/angle_to_warmstart_deg", "loss/pred",
                 "loss/sigreg", "loss/anchor", "fed/comm_bytes", "fed/round_seconds")
LABELS = ("confirmed", "falsified", "inconclusive")


def _f(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


# ================================================================================== per-run values
def _run_values(summary: dict) -> dict:
    ev = summary.get("eval") or {}
    rounds = summary.get("rounds") or []
    drift = [_f(r.get("gauge/drift_angle_deg")) for r in rounds]
    curves = {m: [_f(r.get(m)) for r in rounds] for m in ROUND_METRICS}
    return {
        "success": _f(ev.get("success_rate")),
        "n_successes": ev.get("n_successes"),
        "n_episodes": ev.get("n_episodes"),
        "effective_dim": _f(ev.get("effective_dim")),
        "latent_std": _f(ev.get("latent_std")),
        "probe_r2": _f(ev.get("probe_r2")),
        "one_step_error": _f(ev.get("one_step_error")),
        "drift_final": drift[-1] if drift else None,
        # The mean over rounds only when every round was measurable: a mean over the measurable
        # rounds alone would silently drop the degenerate (often worst) ones.
        "drift_mean": _mean(drift) if drift and all(d is not None for d in drift) else None,
        "curves": curves,
        "seconds": summary.get("seconds") or {},
    }


def arm_values(cell: dict, arm: str, summaries: dict, local_reference: str = "mean") -> dict[int, dict]:
    """``{seed: values}`` of one arm in one cell; the local arm combines its silos (all must be done)."""
    out = {}
    for seed, ids in (cell.get("arms", {}).get(arm) or {}).items():
        if not ids or any(i not in summaries for i in ids):
            continue
        vals = [_run_values(summaries[i]) for i in ids]
        if arm != "local":
            out[int(seed)] = vals[0]
            continue
        succ = [v["success"] for v in vals]
        ok = all(s is not None for s in succ)
        combined = {
            "success_mean": float(np.mean(succ)) if ok else None,
            "success_best": float(np.max(succ)) if ok else None,
            "n_successes": sum(v["n_successes"] or 0 for v in vals),
            "n_episodes": sum(v["n_episodes"] or 0 for v in vals),
            "effective_dim": _mean([v["effective_dim"] for v in vals]),
            "latent_std": _mean([v["latent_std"] for v in vals]),
            "probe_r2": _mean([v["probe_r2"] for v in vals]),
            "one_step_error": _mean([v["one_step_error"] for v in vals]),
            "drift_final": None, "drift_mean": None, "curves": {},
            "silos": {str(k): v["success"] for k, v in enumerate(vals)},
            "seconds": {"train": sum(v["seconds"].get("train", 0) for v in vals),
                        "eval": sum(v["seconds"].get("eval", 0) for v in vals)},
        }
        combined["success"] = combined["success_best" if local_reference == "best" else "success_mean"]
        out[int(seed)] = combined
    return out


# ================================================================================== statistics
def _interval(values: list[float], n_boot: int) -> list[float] | None:
    if len(values) < 2:
        return None
    _, ci = bootstrap_ci(np.asarray(values, float), n_boot=n_boot, seed=0)
    return [ci.low, ci.high]


def _describe(per_seed: dict[int, dict], metric: str, n_boot: int) -> dict:
    vals = [v[metric] for _, v in sorted(per_seed.items()) if v.get(metric) is not None]
    return {"mean": _mean(vals), "ci": _interval(vals, n_boot), "n": len(vals),
            "min": min(vals) if vals else None, "max": max(vals) if vals else None}


def arm_stats(per_seed: dict[int, dict], n_boot: int) -> dict:
    """Means over seeds with bootstrap intervals, pooled Wilson success interval, round curves."""
    k = sum(int(v.get("n_successes") or 0) for v in per_seed.values())
    n = sum(int(v.get("n_episodes") or 0) for v in per_seed.values())
    out = {"seeds": sorted(per_seed), "n_seeds": len(per_seed)}
    for metric in ("success", "success_best", "effective_dim", "latent_std", "drift_final", "drift_mean",
                   "probe_r2", "one_step_error"):
        if any(metric in v for v in per_seed.values()):
            out[metric] = _describe(per_seed, metric, n_boot)
    out["pooled_success"] = ({"successes": k, "episodes": n, "rate": k / n,
                              "wilson": list(wilson_interval(k, n).as_tuple())} if n else None)
    curves = {}
    for m in ROUND_METRICS:
        rows = [v["curves"].get(m) or [] for v in per_seed.values()]
        length = max((len(r) for r in rows), default=0)
        if not length:
            continue
        cols = [[r[t] for r in rows if t < len(r) and r[t] is not None] for t in range(length)]
        if not any(cols):
            continue
        curves[m] = {"mean": [_mean(c) for c in cols], "low": [min(c) if c else None for c in cols],
                     "high": [max(c) if c else None for c in cols], "n": [len(c) for c in cols]}
    out["curves"] = curves
    out["per_seed"] = {str(s): {m: v.get(m) for m in ("success", "success_best", "effective_dim", "latent_std",
                                                      "drift_final", "drift_mean")}
                       for s, v in sorted(per_seed.items())}
    secs = [sum(v["seconds"].get(x, 0) or 0 for x in ("train", "eval")) for v in per_seed.values()]
    out["seconds_per_seed"] = _mean(secs)
    return out


def paired_comparison(t: dict[int, dict], c: dict[int, dict], metric: str, direction: str, *,
                      n_boot: int, alternative: str, min_seeds: int = 2) -> dict:
    """Mean paired difference treatment − control over the common seeds, CI and p-value."""
    seeds = sorted(s for s in set(t) & set(c) if t[s].get(metric) is not None and c[s].get(metric) is not None)
    res = {"metric": metric, "direction": direction, "seeds": seeds, "n": len(seeds),
           "treatment_mean": _mean([t[s][metric] for s in seeds]),
           "control_mean": _mean([c[s][metric] for s in seeds]),
           "estimate": None, "ci": None, "p_value": None, "sd": None}
    if len(seeds) < max(2, min_seeds):
        res["missing"] = (f"{len(seeds)} seed(s) with a finite {metric} in both arms; the registry asks for "
                          f"at least {max(2, min_seeds)}")
        return res
    a = np.array([t[s][metric] for s in seeds], float)
    b = np.array([c[s][metric] for s in seeds], float)
    pd = paired_difference(a, b, n_boot=n_boot, seed=0)
    alt = "two-sided" if alternative == "two-sided" else ("greater" if direction == "increase" else "less")
    res.update({"estimate": pd.estimate, "ci": [pd.ci.low, pd.ci.high], "ci_method": pd.ci.method,
                "sd": pd.sd, "p_value": paired_permutation_pvalue(a - b, alternative=alt), "test": alt})
    return res


def _decide(comp: dict, *, delta: float, alpha: float, p_adjusted: float | None) -> dict:
    if comp.get("estimate") is None:
        return {"label": "inconclusive", "reason": comp.get("missing", "not measured")}
    v = verdict(comp["estimate"], tuple(comp["ci"]), delta=delta, direction=comp["direction"],
                p_value=p_adjusted, alpha=alpha)
    _guard(v.label, comp["ci"], comp["direction"])
    return {"label": v.label, "reason": v.reason}


def _guard(label: str, ci, direction: str) -> None:
    """Never confirmed when the interval says otherwise (it must exclude 0 the registered way)."""
    if label != "confirmed":
        return
    lo, hi = ci
    if (direction == "increase" and not lo > 0) or (direction == "decrease" and not hi < 0):
        raise EvaluationError(f"internal: a claim was about to be confirmed with the interval {ci}")


def _rho(fed: dict, local: dict, central: dict, *, threshold: float, alpha: float, n_boot: int,
         min_seeds: int = 2) -> dict:
    seeds = sorted(s for s in set(fed) & set(local) & set(central)
                   if None not in (fed[s].get("success"), local[s].get("success"), central[s].get("success")))
    out = {"seeds": seeds, "n": len(seeds), "threshold": threshold, "rho": None, "rho_ci": None, "defined": False}
    if len(seeds) < max(2, min_seeds):
        out.update(label="inconclusive", reason=f"{len(seeds)} seed(s) with all three arms evaluated; the "
                                                f"registry asks for at least {max(2, min_seeds)}")
        return out
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
    _guard(v.label, (lo, hi), "increase")
    out.update(label=v.label, reason=v.reason)
    return out


def _holm(pvals: dict[str, float | None], alpha: float) -> dict[str, float | None]:
    keys = [k for k, p in pvals.items() if p is not None]
    adjusted = dict.fromkeys(pvals)
    if keys:
        res = holm([pvals[k] for k in keys], alpha=alpha)
        adjusted.update(dict(zip(keys, res.adjusted, strict=True)))
    return adjusted


def _combine(labels: list[str]) -> str:
    if labels and all(x == "confirmed" for x in labels):
        return "confirmed"
    if any(x == "falsified" for x in labels):
        return "falsified"
    return "inconclusive"


# ================================================================================== the analysis
def analyze(study_dir: str | Path, *, write: bool = True) -> dict:
    """Decide every registered claim from the study folder's summaries; write ``analysis.json``."""
    study_dir = Path(study_dir)
    reg = load_registry(study_dir)
    plan = json.loads((study_dir / "plan.json").read_text())
    summaries = load_summaries(study_dir)
    failures = load_failures(study_dir)
    an = reg["analysis"]
    alpha, n_boot, alt = float(an["alpha"]), int(an["n_boot"]), an["alternative"]
    min_seeds = int(an.get("min_seeds", 3))
    local_ref = an.get("local_reference", "mean")
    planned = plan["runs"]

    # -- per cell, per arm
    values: dict[str, dict[str, dict[str, dict]]] = {}
    groups: dict[str, dict[str, dict]] = {}
    for g, points in plan["groups"].items():
        for p, cell in points.items():
            arms = sorted(cell["arms"], key=lambda a: ALL_ARMS.index(a) if a in ALL_ARMS else len(ALL_ARMS))
            vals = {arm: arm_values(cell, arm, summaries, local_ref) for arm in arms}
            values.setdefault(g, {})[p] = vals
            groups.setdefault(g, {})[p] = {
                "key": cell["key"], "value": cell["value"], "budget": cell["budget"], "seeds": cell["seeds"],
                "arms": {arm: arm_stats(v, n_boot) for arm, v in vals.items()},
            }
    ladder = values.get(LADDER, {}).get("default", {})

    def comp_result(spec: dict, cell_vals: dict) -> dict:
        t, c = cell_vals.get(spec["treatment"]), cell_vals.get(spec["control"])
        if t is None or c is None:
            missing = [a for a, v in ((spec["treatment"], t), (spec["control"], c)) if v is None]
            return {**spec, "estimate": None, "n": 0, "missing": f"arm(s) {missing} not in this study"}
        return {**spec, **paired_comparison(t, c, spec["metric"], spec["direction"], n_boot=n_boot,
                                            alternative=alt, min_seeds=min_seeds)}

    # -- claims 1 and 2 (confirmatory family, Holm)
    claims_out = []
    by_id = {c["id"]: c for c in reg["claims"]}
    comps: dict[str, list[dict]] = {}
    claim_p: dict[str, float | None] = {}
    for cid in an.get("confirmatory_family", ["C1", "C2"]):
        spec = by_id.get(cid)
        if spec is None:
            continue
        rows = [comp_result(dict(x), ladder) for x in spec["components"]]
        comps[cid] = rows
        ps = [r.get("p_value") for r in rows]
        claim_p[cid] = max(ps) if ps and all(p is not None for p in ps) else None
    adjusted = _holm(claim_p, alpha)
    k = len(claim_p)
    for cid, rows in comps.items():
        for r in rows:
            # A claim with an unmeasured component has no claim p-value (and cannot be confirmed);
            # its measured components are then judged with a Bonferroni share, never unadjusted.
            p_adj = adjusted[cid]
            if p_adj is None and r.get("p_value") is not None:
                p_adj = min(1.0, r["p_value"] * k)
            r["p_adjusted"] = p_adj
            r.update(_decide(r, delta=float(r["delta"]), alpha=alpha, p_adjusted=p_adj))
        label = _combine([r["label"] for r in rows])
        claims_out.append({"id": cid, "title": by_id[cid]["title"], "label": label, "p_value": claim_p[cid],
                           "p_adjusted": adjusted[cid], "components": rows,
                           "reason": _claim_reason(label, rows)})

    # -- claim 3: ρ on the ladder
    c3 = by_id.get("C3")
    if c3:
        res = _rho_cell(ladder, c3["treatment"], threshold=float(c3["threshold"]), alpha=alpha, n_boot=n_boot, min_seeds=min_seeds)
        claims_out.append({"id": "C3", "title": c3["title"], "label": res["label"], "reason": res["reason"],
                           "rho": res})

    # -- claim 4: claims 2 and 3 at every sweep point (intersection-union)
    c4 = by_id.get("C4")
    if c4:
        points = []
        c2_spec = by_id["C2"]["components"][0] if "C2" in by_id else None
        for sweep in c4.get("sweeps", []):
            for p, cell_vals in values.get(sweep, {}).items():
                row = {"sweep": sweep, "value": p}
                if c2_spec:
                    comp = comp_result(dict(c2_spec), cell_vals)
                    comp.update(_decide(comp, delta=float(comp["delta"]), alpha=alpha, p_adjusted=comp.get("p_value")))
                    row["C2"] = comp
                row["C3"] = _rho_cell(cell_vals, c3["treatment"] if c3 else "anchor",
                                      threshold=float(c3["threshold"]) if c3 else 0.5, alpha=alpha, n_boot=n_boot, min_seeds=min_seeds)
                points.append(row)
        labels = [x["label"] for r in points for x in (r.get("C2"), r["C3"]) if x]
        if not points:
            label, reason = "inconclusive", "no severity or participant-count sweep ran in this study"
        else:
            label = _combine(labels)
            bad = [f"{r['sweep']}={r['value']}" for r in points
                   if any(x and x["label"] != "confirmed" for x in (r.get("C2"), r["C3"]))]
            reason = ("every sweep point confirms claims 2 and 3" if label == "confirmed" else
                      f"{'falsified' if label == 'falsified' else 'not confirmed'} at {', '.join(bad)}")
        claims_out.append({"id": "C4", "title": c4["title"], "label": label, "reason": reason, "points": points})

    # -- the ladder family (each rung against naive, Holm)
    lrows = [comp_result(dict(x), ladder) for x in reg.get("ladder_comparisons", [])]
    ladj = _holm({r["id"]: r.get("p_value") for r in lrows}, alpha)
    for r in lrows:
        r["p_adjusted"] = ladj[r["id"]]
        r.update(_decide(r, delta=float(r["delta"]), alpha=alpha, p_adjusted=ladj[r["id"]]))

    # -- sweeps: ρ and the headline numbers per point
    sweeps = {}
    anch = c3["treatment"] if c3 else "anchor"
    for g, points in values.items():
        if g == LADDER:
            continue
        rows = []
        for p, cell_vals in points.items():
            rows.append({"value": p, "key": groups[g][p]["key"],
                         "rho": _rho_cell(cell_vals, anch, threshold=float(c3["threshold"]) if c3 else 0.5,
                                          alpha=alpha, n_boot=n_boot, min_seeds=min_seeds) if c3 else None})
        sweeps[g] = rows

    done = [r for r in planned if r in summaries]
    missing = [r for r in planned if r not in summaries]
    out = {
        "schema_version": 1,
        "study": reg["study"],
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "registry_hash": reg.get("registry_hash"),
        "amendments": reg.get("amendments", []),
        "status": {"planned": len(planned), "done": len(done), "missing": missing,
                   "failed": {k: v.get("error") for k, v in failures.items() if k in missing},
                   "complete": not missing},
        "claims": claims_out,
        "ladder_comparisons": lrows,
        "groups": groups,
        "sweeps": sweeps,
        "cost": _cost(summaries),
        "hashes": {rid: {k: s.get(k) for k in ("config_hash", "manifest_hash", "checkpoint_hash",
                                                "warmstart_hash", "probe_hash", "git_sha")}
                   for rid, s in sorted(summaries.items())},
        "provenance": _provenance(summaries),
    }
    for c in out["claims"]:
        assert c["label"] in LABELS
    out = json.loads(json.dumps(out, default=_json_default))
    if write:
        atomic_write(study_dir / "analysis.json", json.dumps(out, indent=1, sort_keys=True))
    return out


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return str(x)


def _rho_cell(cell_vals: dict, anchored: str, *, threshold: float, alpha: float, n_boot: int,
              min_seeds: int = 2) -> dict:
    need = {"fed": anchored, "local": "local", "central": "central"}
    missing = [a for a in need.values() if a not in cell_vals]
    if missing:
        return {"label": "inconclusive", "reason": f"arm(s) {missing} not in this cell", "defined": False,
                "rho": None, "rho_ci": None, "n": 0, "threshold": threshold}
    return _rho(cell_vals[anchored], cell_vals["local"], cell_vals["central"], threshold=threshold,
                alpha=alpha, n_boot=n_boot, min_seeds=min_seeds)


def _claim_reason(label: str, rows: list[dict]) -> str:
    parts = [f"{r['id']}: {r['label']} ({r.get('reason', '')})" for r in rows]
    return "; ".join(parts)


def _provenance(summaries: dict) -> dict:
    """The code commits, warm starts and probes of the finished runs, each with its run count."""
    def count(key: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in summaries.values():
            if s.get("kind") == "warmstart" and key == "warmstart_hash":
                continue  # the warm start's own parent is the random init
            v = s.get(key) or "not recorded"
            out[v] = out.get(v, 0) + 1
        return dict(sorted(out.items()))

    return {"git_sha": count("git_sha"), "warmstart_hash": count("warmstart_hash"),
            "probe_hash": count("probe_hash")}


def _cost(summaries: dict) -> dict:
    by_kind: dict[str, list[float]] = {}
    total = 0.0
    for s in summaries.values():
        secs = s.get("seconds") or {}
        t = float(secs.get("total", secs.get("train", 0.0)) or 0.0)
        total += t
        key = s.get("kind", "?") + ("" if s.get("kind") == "warmstart" else f":{s.get('arm')}")
        by_kind.setdefault(key, []).append(t)
    return {"total_seconds": round(total, 1),
            "per_run_seconds": {k: {"mean": round(float(np.mean(v)), 2), "n": len(v)} for k, v in sorted(by_kind.items())}}


__all__ = ["analyze"]
