"""The study's analysis: the registered claims decided from the run summaries alone.

Input: ``registry.yaml`` (what to test and how), ``plan.json`` (which runs fill which cell) and
``runs/*.json`` (one small summary per finished run). Output: a JSON-able dict, also written to
``analysis.json``. Nothing here loads a checkpoint or touches data, so the analysis and the report
can be rebuilt in a later session from committed files.

Conventions:

* the unit is the seed; a comparison uses the seeds where both arms have a finite value;
* a success difference of one seed is the mean over its *paired episodes* (the two reports share
  the goal_spec_hash and the records pair one to one); summaries written before episodes were
  recorded fall back to the per-seed rate difference (the same number when every episode pairs),
  and the analysis says so;
* each comparison is decided by two one-sided paired t tests over seeds (stats.paired_t_test):
  H0 "no effect" (confirmation) and H0 "an effect of δ or more" (falsification); Holm adjusts both,
  separately, over every component of the confirmatory family (claims 1 and 2) and over the
  ladder family (each rung against naive); a claim's p is the largest of its components' adjusted
  p (intersection-union); a Student-t 95% interval, and for success a hierarchical bootstrap
  (seeds, then paired episodes) with the within/between-seed variance split, are reported beside;
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
    hierarchical_bootstrap,
    holm,
    paired_t_test,
    test_verdict,
    wilson_interval,
)
from lensemble.study.files import REMEASURED, atomic_write, load_failures, load_remeasured, load_summaries
from lensemble.study.homes import home_split
from lensemble.study.plan import LADDER
from lensemble.study.power import replicate_spread
from lensemble.study.registry import load_registry
from lensemble.study.replicates import has_replicates, nested_bootstrap, seed_units
from lensemble.study.rho import rho_in_cell, rho_table
from lensemble.study.spec import ALL_ARMS

ROUND_METRICS = ("gauge/drift_angle_deg", "gauge/global_effective_dim", "gauge/global_latent_std",
                 "gauge/effective_dim", "gauge/pairwise_angle_deg", "gauge/angle_to_warmstart_deg",
                 "gauge/drift_rel_residual_before", "gauge/drift_rotation_share", "gauge/drift_subspace_angle_deg",
                 "gauge/pairwise_rel_residual_before", "gauge/pairwise_subspace_angle_deg",
                 "gauge/backstop_angle_deg", "gauge/backstop_aligned_angle_deg", "loss/pred",
                 "loss/sigreg", "loss/anchor", "fed/comm_bytes", "fed/round_seconds", "dp/epsilon")
RULES = ("corrected (issue 13): one-sided paired t tests for confirmation and falsification, Holm over every "
         "component, episode pairing for success")
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
    sub = [_f(r.get("gauge/drift_subspace_angle_deg")) for r in rounds]
    curves = {m: [_f(r.get(m)) for r in rounds] for m in ROUND_METRICS}
    return {
        "success": _f(ev.get("success_rate")),
        "route_valid_success": _f(ev.get("route_valid_success_rate")),
        "episodes": _episodes(ev),
        "goal_spec_hash": ev.get("goal_spec_hash"),
        "n_successes": ev.get("n_successes"),
        "n_episodes": ev.get("n_episodes"),
        "effective_dim": _f(ev.get("effective_dim")),
        "latent_std": _f(ev.get("latent_std")),
        "probe_r2": _f(ev.get("probe_r2")),
        "pixel_pca_r2": _f(ev.get("pixel_pca_r2")),
        "one_step_error": _f(ev.get("one_step_error")),
        "drift_final": drift[-1] if drift else None,
        # The mean over rounds only when every round was measurable: a mean over the measurable
        # rounds alone would silently drop the degenerate (often worst) ones.
        "drift_mean": _mean(drift) if drift and all(d is not None for d in drift) else None,
        "drift_subspace_final": sub[-1] if sub else None,
        "drift_subspace_mean": _mean(sub) if sub and all(d is not None for d in sub) else None,
        "curves": curves,
        "seconds": summary.get("seconds") or {},
    }


def _episodes(ev: dict) -> dict[tuple[int, int], float] | None:
    """{(episode index, episode seed): success 0/1} of one EvalReport, or None (not recorded)."""
    recs = ev.get("episodes")
    if not recs:
        return None
    return {(int(e["index"]), int(e["seed"])): float(bool(e["success"])) for e in recs}


def _combine_episodes(vals: list[dict], how: str) -> tuple[dict | None, str | None]:
    """The local arm's per-episode outcomes: the mean over silos (or the best silo's), when every
    silo recorded the same episodes."""
    eps = [v.get("episodes") for v in vals]
    hashes = {v.get("goal_spec_hash") for v in vals}
    if any(e is None for e in eps) or len(hashes) != 1 or len({frozenset(e) for e in eps}) != 1:
        return None, None
    if how == "best":
        best = max(range(len(vals)), key=lambda i: (vals[i]["success"] or 0.0, -i))
        return eps[best], vals[best].get("goal_spec_hash")
    return {k: float(np.mean([e[k] for e in eps])) for k in eps[0]}, next(iter(hashes))


def arm_values(cell: dict, arm: str, summaries: dict, local_reference: str = "mean") -> dict[int, dict]:
    """``{seed: values}`` of one arm in one cell; the local arm combines its silos (all must be done).

    A cell with training replicates (``cell["replicates"]``, docs/study.md "Replicates") gives a
    seed the mean of its finished replicates' values, the replicates themselves under
    ``"replicates"``; without, the values of the seed's one run, as before replicates existed."""
    if "replicates" in cell:
        return _replicated_values(cell, arm, summaries, local_reference)
    out = {}
    for seed, ids in (cell.get("arms", {}).get(arm) or {}).items():
        v = _seed_values(ids, arm, summaries, local_reference)
        if v is not None:
            out[int(seed)] = v
    return out


def _replicated_values(cell: dict, arm: str, summaries: dict, local_reference: str) -> dict[int, dict]:
    out = {}
    for seed, reps in (cell["replicates"].get(arm) or {}).items():
        vals = [v for ids in reps if (v := _seed_values(ids, arm, summaries, local_reference)) is not None]
        if vals:
            out[int(seed)] = _replicate_mean(vals)
    return out


_SCALARS = ("success", "success_mean", "success_best", "route_valid_success", "effective_dim", "latent_std",
            "probe_r2", "pixel_pca_r2", "one_step_error", "drift_final", "drift_mean", "drift_subspace_final",
            "drift_subspace_mean")


def _replicate_mean(vals: list[dict]) -> dict:
    """One seed's values over its training replicates: scalars, round curves and (when every
    replicate played the same episodes) per-episode outcomes averaged; counts and seconds summed."""
    first = vals[0]
    out = {k: v for k, v in first.items() if k not in _SCALARS}
    for k in _SCALARS:
        if k in first:
            xs = [v.get(k) for v in vals]
            # like the mean over rounds: only when every replicate measured it
            out[k] = _mean(xs) if all(x is not None for x in xs) else None
    eps = [v.get("episodes") for v in vals]
    if all(e is not None for e in eps) and len({v.get("goal_spec_hash") for v in vals}) == 1 \
            and len({frozenset(e) for e in eps}) == 1:
        out["episodes"] = {key: float(np.mean([e[key] for e in eps])) for key in eps[0]}
    else:
        out["episodes"] = None
    for k in ("n_successes", "n_episodes"):
        out[k] = sum(int(v.get(k) or 0) for v in vals)
    curves = {}
    for m in {m for v in vals for m in (v.get("curves") or {})}:
        rows = [v["curves"].get(m) or [] for v in vals]
        length = max(len(r) for r in rows)
        curves[m] = [_mean([r[t] for r in rows if t < len(r)]) for t in range(length)]
    out["curves"] = curves
    if "silos" in first:
        out["silos"] = {k: _mean([v["silos"].get(k) for v in vals]) for k in first["silos"]}
    out["seconds"] = {x: sum(v["seconds"].get(x, 0) or 0 for v in vals) for x in ("train", "eval")}
    out["replicates"] = vals
    return out


def _seed_values(ids: list[str], arm: str, summaries: dict, local_reference: str) -> dict | None:
    """The values of one seed's run(s) of ``arm`` (the local arm's silos combined); None until done."""
    if not ids or any(i not in summaries for i in ids):
        return None
    vals = [_run_values(summaries[i]) for i in ids]
    if arm != "local":
        return vals[0]
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
        "pixel_pca_r2": _mean([v["pixel_pca_r2"] for v in vals]),
        "one_step_error": _mean([v["one_step_error"] for v in vals]),
        "drift_final": None, "drift_mean": None, "drift_subspace_final": None, "drift_subspace_mean": None,
        "curves": {},
        "silos": {str(k): v["success"] for k, v in enumerate(vals)},
        "route_valid_success": _mean([v["route_valid_success"] for v in vals]),
        "seconds": {"train": sum(v["seconds"].get("train", 0) for v in vals),
                    "eval": sum(v["seconds"].get("eval", 0) for v in vals)},
    }
    combined["success"] = combined["success_best" if local_reference == "best" else "success_mean"]
    combined["episodes"], combined["goal_spec_hash"] = _combine_episodes(vals, local_reference)
    return combined


# ================================================================================== statistics
def _interval(values: list[float], n_boot: int) -> list[float] | None:
    """95% Student-t interval of the mean over seeds (a bootstrap over a handful of seeds under-covers:
    benchmarks/study_stats_simulation.py)."""
    if len(values) < 2:
        return None
    from scipy import stats as _st

    x = np.asarray(values, float)
    half = float(_st.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return [float(x.mean() - half), float(x.mean() + half)]


def _describe(per_seed: dict[int, dict], metric: str, n_boot: int) -> dict:
    vals = [v[metric] for _, v in sorted(per_seed.items()) if v.get(metric) is not None]
    return {"mean": _mean(vals), "ci": _interval(vals, n_boot), "n": len(vals),
            "min": min(vals) if vals else None, "max": max(vals) if vals else None}


def arm_stats(per_seed: dict[int, dict], n_boot: int) -> dict:
    """Means over seeds with bootstrap intervals, pooled Wilson success interval, round curves."""
    k = sum(int(v.get("n_successes") or 0) for v in per_seed.values())
    n = sum(int(v.get("n_episodes") or 0) for v in per_seed.values())
    out = {"seeds": sorted(per_seed), "n_seeds": len(per_seed)}
    for metric in ("success", "success_best", "route_valid_success", "effective_dim", "latent_std", "drift_final",
                   "drift_mean", "drift_subspace_final", "drift_subspace_mean", "probe_r2", "pixel_pca_r2",
                   "one_step_error"):
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
                                                      "drift_final", "drift_mean", "drift_subspace_final",
                                                      "drift_subspace_mean")}
                       for s, v in sorted(per_seed.items())}
    secs = [sum(v["seconds"].get(x, 0) or 0 for x in ("train", "eval")) for v in per_seed.values()]
    out["seconds_per_seed"] = _mean(secs)
    if any("replicates" in v for v in per_seed.values()):
        out["replicates"] = _replicate_stats(per_seed)
    return out


def _replicate_stats(per_seed: dict[int, dict]) -> dict:
    """Per seed the replicates' success rates, and the measured replicate spread
    (:func:`lensemble.study.power.replicate_spread`: the between-replicate SD of success within
    a seed, the number to plan the next study with, ``registry.planning.sd_replicate_success``)."""
    rates, within = [], []
    for _, v in sorted(per_seed.items()):
        reps = [x for x in v.get("replicates") or [v] if x.get("success") is not None]
        rates.append([x["success"] for x in reps])
        within.append([x["success"] * (1 - x["success"]) / x["n_episodes"] if x.get("n_episodes") else 0.0
                       for x in reps])
    spread = replicate_spread(rates, within)
    return {"per_seed": {str(s): r for s, r in zip(sorted(per_seed), rates, strict=True)},
            "n": {str(s): len(r) for s, r in zip(sorted(per_seed), rates, strict=True)},
            "spread": {k: (None if isinstance(x, float) and not math.isfinite(x) else x) for k, x in spread.items()}}


def _paired_units(t: dict[int, dict], c: dict[int, dict], metric: str) -> tuple[list[int], list[float], list | None]:
    """Common seeds, their per-seed differences and, for success when every seed pairs its
    episodes, the per-seed arrays of paired episode differences (else None)."""
    seeds = sorted(s for s in set(t) & set(c) if t[s].get(metric) is not None and c[s].get(metric) is not None)
    if metric != "success":
        return seeds, [t[s][metric] - c[s][metric] for s in seeds], None
    per_seed: list | None = []
    for s in seeds:
        et, ec = t[s].get("episodes"), c[s].get("episodes")
        same = (et is not None and ec is not None and t[s].get("goal_spec_hash") == c[s].get("goal_spec_hash")
                and set(et) == set(ec))
        if not same:
            per_seed = None
            break
        per_seed.append(np.array([et[k] - ec[k] for k in sorted(et)], float))
    if per_seed is None:
        return seeds, [t[s][metric] - c[s][metric] for s in seeds], None
    return seeds, [float(a.mean()) for a in per_seed], per_seed


def paired_comparison(t: dict[int, dict], c: dict[int, dict], metric: str, direction: str, *,
                      delta: float, n_boot: int, alternative: str, min_seeds: int = 2) -> dict:
    """Treatment − control over the common seeds: the registered t tests (confirmation and
    falsification), a Student-t interval and, for success with paired episodes, a hierarchical
    bootstrap interval and the split of the variance into within-seed and between-seed parts."""
    seeds, diffs, per_seed = _paired_units(t, c, metric)
    pairing = ("episode" if per_seed is not None else "seed") if metric == "success" else "seed"
    res = {"metric": metric, "direction": direction, "seeds": seeds, "n": len(seeds),
           "treatment_mean": _mean([t[s][metric] for s in seeds]),
           "control_mean": _mean([c[s][metric] for s in seeds]),
           "estimate": None, "ci": None, "p_value": None, "p_falsify": None, "sd": None, "pairing": pairing}
    if metric == "success" and per_seed is None and seeds:
        res["pairing_note"] = "per-episode records missing: paired at the seed level (per-seed rates)"
    if len(seeds) < max(2, min_seeds):
        res["missing"] = (f"{len(seeds)} seed(s) with a finite {metric} in both arms; the registry asks for "
                          f"at least {max(2, min_seeds)}")
        return res
    test = paired_t_test(np.asarray(diffs, float), delta=delta, direction=direction,
                         two_sided=alternative == "two-sided")
    res.update({"estimate": test.estimate, "ci": [test.ci.low, test.ci.high], "ci_method": test.ci.method,
                "sd": test.sd, "se": test.se, "df": test.df, "p_value": test.p_confirm, "p_falsify": test.p_falsify,
                "test": "paired t, " + ("two-sided" if alternative == "two-sided" else f"one-sided ({direction})")})
    if metric == "success" and has_replicates(t, c):
        res.update(_replicated_interval(t, c, seeds, per_seed, test.sd ** 2, n_boot))
    elif per_seed is not None:
        est, ci, se = hierarchical_bootstrap(per_seed, n_boot=n_boot, seed=0)
        within = float(np.mean([a.var(ddof=1) / a.size if a.size > 1 else 0.0 for a in per_seed]))
        res.update({"n_episode_pairs": int(sum(a.size for a in per_seed)),
                    "hierarchical_ci": [ci.low, ci.high], "hierarchical_se": se,
                    "variance": {"per_seed_difference": test.sd ** 2, "within_seed_paired_episodes": within,
                                 "between_seed": max(0.0, test.sd ** 2 - within)}})
    return res


def _replicated_interval(t: dict[int, dict], c: dict[int, dict], seeds: list[int], per_seed: list | None,
                         var_seed_diff: float, n_boot: int) -> dict:
    """The hierarchical interval of a success difference with training replicates: seeds, then
    each arm's replicates, then the seed's paired episodes (lensemble.study.replicates), and the
    split of the per-seed difference's variance into episodes, replicates and seeds."""
    units, levels = seed_units([t, c], seeds)
    boot = nested_bootstrap(units, n_boot=n_boot, seed=0)
    d = boot[:, 0] - boot[:, 1]
    low, high = np.quantile(d, [0.025, 0.975])
    # the replicate part of a seed's difference: each arm's between-replicate variance of its
    # success rates over its replicate count (the rates hold their episode noise: an upper end)
    rep_var = float(np.mean([sum(float(np.var(y.mean(1), ddof=1)) / y.shape[0] for y in arms if y.shape[0] > 1)
                             for arms in units]))
    within = (float(np.mean([a.var(ddof=1) / a.size if a.size > 1 else 0.0 for a in per_seed]))
              if per_seed is not None else None)
    out = {"hierarchical_ci": [float(low), float(high)], "hierarchical_se": float(d.std(ddof=1)),
           "hierarchical_levels": levels,
           "replicates": {"treatment": {str(s): len(t[s].get("replicates") or [t[s]]) for s in seeds},
                          "control": {str(s): len(c[s].get("replicates") or [c[s]]) for s in seeds}},
           "variance": {"per_seed_difference": var_seed_diff, "between_replicate_in_seed_mean": rep_var,
                        **({"within_seed_paired_episodes": within} if within is not None else {}),
                        "between_seed": max(0.0, var_seed_diff - rep_var - (within or 0.0))}}
    if per_seed is not None:
        out["n_episode_pairs"] = int(sum(a.size for a in per_seed))
    return out


def _decide(comp: dict, *, alpha: float, p_adjusted: float | None, p_falsify_adjusted: float | None) -> dict:
    if comp.get("estimate") is None:
        return {"label": "inconclusive", "reason": comp.get("missing", "not measured")}
    v = test_verdict(comp["estimate"], tuple(comp["ci"]), delta=float(comp["delta"]), direction=comp["direction"],
                     p_confirm=1.0 if p_adjusted is None else p_adjusted,
                     p_falsify=1.0 if p_falsify_adjusted is None else p_falsify_adjusted, alpha=alpha)
    _guard(v.label, comp, alpha)
    return {"label": v.label, "reason": v.reason}


def _guard(label: str, comp: dict, alpha: float) -> None:
    """Never confirmed unless the one-sided (1 − α) t bound excludes 0 on the registered side."""
    if label != "confirmed":
        return
    from scipy import stats as _st

    q = float(_st.t.ppf(1 - alpha, comp["df"])) if comp.get("df") else 0.0
    bound = comp["estimate"] - q * comp["se"] if comp["direction"] == "increase" else -(comp["estimate"] + q * comp["se"])
    if not bound > 0:
        raise EvaluationError(f"internal: {comp.get('id')} was about to be confirmed with a bound {bound} <= 0")


def _superseded(summaries: dict, reg: dict, plan: dict, registered_test: str) -> list[str]:
    """Why a study's design predates the corrected instruments (empty for a current study)."""
    out = []
    fed = [s for s in summaries.values() if s.get("kind") == "federated"]
    if fed and any("probe_split" not in s for s in fed):
        out.append("drift was measured on every probe frame, the anchor's 128 landmarks included (no landmark / "
                   "measurement split), with magnitudes that weight every direction alike (the variance-weighted "
                   "measures were not recorded); the backstop's removed angle was not logged")
    evals = [s for s in summaries.values() if s.get("eval")]
    if evals and any(not s["eval"].get("episodes") for s in evals):
        out.append("the EvalReports hold no per-episode outcomes: success pairs at the seed level only, and route "
                   "validity (TwoRoom checks the door at a step's end point only) was not recorded")
    if "t test" not in registered_test:
        out.append(f"the registry registered '{registered_test}' with MDEs from a t approximation, BCa intervals over "
                   "seeds and 'falsified' read off an interval, with no multiplicity adjustment of falsification")
    ladder = plan.get("groups", {}).get(LADDER, {}).get("default", {})
    if ladder and "warmstart_only" not in ladder.get("arms", {}):
        out.append("there is no warm-start-only arm")
    budget = ladder.get("budget") or {}
    if budget.get("rule") == "per_participant" and budget.get("participants", 1) > 1:
        out.append(f"the centralized arm took {budget.get('central_steps')} steps, one participant's budget, not the "
                   f"federation's total ({budget.get('participant_steps', 0) * budget.get('participants', 1)})")
    return out


def _adjust(rows: list[dict], alpha: float) -> None:
    """Holm over ``rows`` (one family), for the confirmation p and, separately, the falsification
    p. An unmeasured row counts as p = 1 (it stays in the family it was registered in)."""
    for raw, adj in (("p_value", "p_adjusted"), ("p_falsify", "p_falsify_adjusted")):
        ps = [r.get(raw) for r in rows]
        if not rows:
            continue
        res = holm([1.0 if p is None else p for p in ps], alpha=alpha)
        for r, p, a in zip(rows, ps, res.adjusted, strict=True):
            r[adj] = None if p is None else a


def _power_now(reg: dict) -> dict:
    """The registry's power statement; for a registry written before families were stated, the
    same statement computed now from its registered planning numbers (and marked so)."""
    pa = reg["analysis"].get("power_analysis", {})
    if "families" in pa:
        return {"source": "registry", **pa["families"]}
    from types import SimpleNamespace

    from lensemble.study.registry import power_analysis
    from lensemble.study.spec import DeltaSpec, PlanningSpec, RegistrySpec

    an = reg["analysis"]
    rs = RegistrySpec(alpha=an["alpha"], power=an["power"], alternative=an["alternative"],
                      delta=DeltaSpec(**an["deltas"]), planning=PlanningSpec(**pa.get("assumptions", {})))
    k = len([c for cl in reg["claims"] if cl["id"] in an.get("confirmatory_family", []) for c in cl["components"]])
    now = power_analysis(SimpleNamespace(registry=rs), int(pa.get("n_seeds", len(reg["design"]["seeds"]))),
                         int(pa.get("n_episodes_per_arm_and_seed", reg["design"]["evaluation"]["episodes"])), k,
                         ladder_k=len(reg.get("ladder_comparisons", [])), replicates=int(pa.get("n_replicates", 1)))
    return {"source": "computed at re-analysis from the registered planning numbers (not registered before the runs)",
            **now["families"], "components": now["components"]}


def _combine(labels: list[str]) -> str:
    if labels and all(x == "confirmed" for x in labels):
        return "confirmed"
    if any(x == "falsified" for x in labels):
        return "falsified"
    return "inconclusive"


def fill_remeasured(summaries: dict[str, dict], remeasured: dict[str, dict[int, dict]]) -> tuple[dict, dict]:
    """Summaries with re-measured round metrics filled in where the run recorded none.

    A recorded value is never replaced. Returns (summaries, {run_id: [rounds filled]}); a filled
    round carries ``"remeasured": true``."""
    out, filled = dict(summaries), {}
    for rid, by_round in remeasured.items():
        if rid not in out:
            continue
        rounds = [dict(r) for r in out[rid].get("rounds") or []]
        for t, metrics in sorted(by_round.items()):
            if not 0 <= t < len(rounds):
                continue
            new = {k: v for k, v in metrics.items() if rounds[t].get(k) is None and _f(v) is not None}
            if new:
                rounds[t].update(new, remeasured=True)
                filled.setdefault(rid, []).append(t)
        out[rid] = {**out[rid], "rounds": rounds}
    return out, filled


# ================================================================================== the analysis
def analyze(study_dir: str | Path, *, write: bool = True) -> dict:
    """Decide every registered claim from the study folder's summaries; write ``analysis.json``."""
    study_dir = Path(study_dir)
    reg = load_registry(study_dir)
    plan = json.loads((study_dir / "plan.json").read_text())
    summaries, remeasured = fill_remeasured(load_summaries(study_dir), load_remeasured(study_dir))
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
                "runs": {arm: cell["arms"][arm] for arm in arms},  # seed -> run ids (shared runs share ids)
                # training replicates: seed -> one list of run ids per replicate (replicate 0 is "runs")
                **({"replicate_runs": {arm: cell["replicates"][arm] for arm in arms if arm in cell["replicates"]}}
                   if "replicates" in cell else {}),
            }
    ladder = values.get(LADDER, {}).get("default", {})

    def comp_result(spec: dict, cell_vals: dict) -> dict:
        t, c = cell_vals.get(spec["treatment"]), cell_vals.get(spec["control"])
        if t is None or c is None:
            missing = [a for a, v in ((spec["treatment"], t), (spec["control"], c)) if v is None]
            return {**spec, "estimate": None, "n": 0, "missing": f"arm(s) {missing} not in this study"}
        return {**spec, **paired_comparison(t, c, spec["metric"], spec["direction"], delta=float(spec["delta"]),
                                            n_boot=n_boot, alternative=alt, min_seeds=min_seeds)}

    # -- claims 1 and 2 (confirmatory family): Holm over every component, confirmations and
    # falsifications separately; a claim's p is the largest adjusted p of its components.
    claims_out = []
    by_id = {c["id"]: c for c in reg["claims"]}
    comps: dict[str, list[dict]] = {}
    for cid in an.get("confirmatory_family", ["C1", "C2"]):
        spec = by_id.get(cid)
        if spec is None:
            continue
        comps[cid] = [comp_result(dict(x), ladder) for x in spec["components"]]
    family = [r for rows in comps.values() for r in rows]
    _adjust(family, alpha)
    for cid, rows in comps.items():
        for r in rows:
            r.update(_decide(r, alpha=alpha, p_adjusted=r["p_adjusted"], p_falsify_adjusted=r["p_falsify_adjusted"]))
        label = _combine([r["label"] for r in rows])
        p_claim = max((r["p_adjusted"] for r in rows), default=None) if all(r["p_adjusted"] is not None for r in rows) else None
        p_fals = min((r["p_falsify_adjusted"] for r in rows if r["p_falsify_adjusted"] is not None), default=None)
        claims_out.append({"id": cid, "title": by_id[cid]["title"], "label": label,
                           "p_value": max((r["p_value"] for r in rows if r.get("p_value") is not None), default=None),
                           "p_adjusted": p_claim, "p_falsify_adjusted": p_fals, "components": rows,
                           "reason": _claim_reason(label, rows)})

    # -- claim 3: ρ on the ladder
    c3 = by_id.get("C3")
    reference = (c3 or {}).get("reference", "central")  # registries before the option: the centralized arm
    if c3:
        res = rho_in_cell(ladder, c3["treatment"], threshold=float(c3["threshold"]), alpha=alpha, n_boot=n_boot,
                          min_seeds=min_seeds, reference=reference)
        claims_out.append({"id": "C3", "title": c3["title"], "label": res["label"], "reason": res["reason"],
                           "rho": res})

    # -- descriptive: ρ of every federated arm of the ladder against each reference that ran
    rho_rows = rho_table(ladder, threshold=float(c3["threshold"]) if c3 else 0.5, alpha=alpha, n_boot=n_boot,
                         min_seeds=min_seeds)

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
                    # Intersection-union over the sweep points: each point at α, no adjustment.
                    comp["p_adjusted"], comp["p_falsify_adjusted"] = comp.get("p_value"), comp.get("p_falsify")
                    comp.update(_decide(comp, alpha=alpha, p_adjusted=comp["p_adjusted"],
                                        p_falsify_adjusted=comp["p_falsify_adjusted"]))
                    row["C2"] = comp
                row["C3"] = rho_in_cell(cell_vals, c3["treatment"] if c3 else "anchor",
                                        threshold=float(c3["threshold"]) if c3 else 0.5, alpha=alpha, n_boot=n_boot,
                                        min_seeds=min_seeds, reference=reference)
                points.append(row)
        labels = [x["label"] for r in points for x in (r.get("C2"), r["C3"]) if x]
        if not points:
            label, reason = "inconclusive", "no claim-4 sweep ran in this study"
        else:
            label = _combine(labels)
            # name the points that decided the label: the falsifying ones, or those not confirmed
            worst = "falsified" if label == "falsified" else None
            bad = [f"{r['sweep']}={r['value']}" for r in points
                   if any(x and (x["label"] == worst if worst else x["label"] != "confirmed")
                          for x in (r.get("C2"), r["C3"]))]
            reason = ("every sweep point confirms claims 2 and 3" if label == "confirmed" else
                      f"{'falsified' if label == 'falsified' else 'not confirmed'} at {', '.join(bad)}")
        claims_out.append({"id": "C4", "title": c4["title"], "label": label, "reason": reason, "points": points})

    # -- the ladder family (each rung against naive, Holm)
    lrows = [comp_result(dict(x), ladder) for x in reg.get("ladder_comparisons", [])]
    _adjust(lrows, alpha)
    for r in lrows:
        r.update(_decide(r, alpha=alpha, p_adjusted=r["p_adjusted"], p_falsify_adjusted=r["p_falsify_adjusted"]))

    # -- sweeps: ρ and the headline numbers per point
    sweeps = {}
    anch = c3["treatment"] if c3 else "anchor"
    for g, points in values.items():
        if g == LADDER:
            continue
        rows = []
        for p, cell_vals in points.items():
            rows.append({"value": p, "key": groups[g][p]["key"],
                         "rho": rho_in_cell(cell_vals, anch, threshold=float(c3["threshold"]) if c3 else 0.5,
                                            alpha=alpha, n_boot=n_boot, min_seeds=min_seeds,
                                            reference=reference) if c3 else None})
        sweeps[g] = rows

    done = [r for r in planned if r in summaries]
    missing = [r for r in planned if r not in summaries]
    all_rows = family + lrows
    success_rows = [r for r in all_rows if r.get("metric") == "success" and r.get("n")]
    by_pairing = {k: sum(1 for r in success_rows if r.get("pairing") == k) for k in ("episode", "seed")}
    notes = []
    if remeasured:
        notes.append(f"{sum(len(v) for v in remeasured.values())} round(s) of {len(remeasured)} run(s) had no recorded "
                     "value for some round metric (e.g. a degenerate full rotation) and were re-measured by replaying "
                     "those rounds, verified against what the runs kept (the committed global model's hash, the "
                     "inner-optimizer states bitwise where kept) "
                     f"({REMEASURED}/): " + ", ".join(f"{k} {v}" for k, v in sorted(remeasured.items())))
    if by_pairing["seed"]:
        notes.append(f"{by_pairing['seed']} of {len(success_rows)} success comparisons could not pair episodes "
                     "(their summaries hold no per-episode records): they are paired at the seed level, whose "
                     "difference equals the episode-paired one when every episode pairs, but the hierarchical "
                     "interval and the within/between-seed variance split need the episodes")
    registered_test = str(an.get("paired_test", ""))
    if "t test" not in registered_test:
        notes.append(f"this analysis applies the corrected rules ({RULES}) after the runs, so its verdicts are a "
                     "re-analysis, not the registered confirmatory result")
    out = {
        "superseded": _superseded(summaries, reg, plan, registered_test),
        "schema_version": 2,
        "rules": RULES,
        "notes": notes,
        "pairing": by_pairing,
        "remeasured": {k: v for k, v in sorted(remeasured.items())},
        "power_at_analysis": _power_now(reg),
        "study": reg["study"],
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "registry_hash": reg.get("registry_hash"),
        "amendments": reg.get("amendments", []),
        "status": {"planned": len(planned), "done": len(done), "missing": missing,
                   "failed": {k: v.get("error") for k, v in failures.items() if k in missing},
                   "complete": not missing, "stopped": reg.get("stopped")},
        "claims": claims_out,
        "ladder_comparisons": lrows,
        "groups": groups,
        "home_split": home_split(plan, summaries),
        "sweeps": sweeps,
        "rho_table": rho_rows,
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
