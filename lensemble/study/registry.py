"""The study's pre-registration: ``registry.yaml``, written before any run.

For every claim it states the hypothesis with its effect size δ, the treatment and control arms,
the pairing, the metric, and the analysis (α, the test, the interval, the multiplicity correction
and the minimum detectable effect at the planned seeds and episodes). The analysis reads its
numbers from here, never from the preset, so the decision rule cannot drift after the data.

Changing the registry once a run has finished is allowed only as an *amendment*: the previous
values, the new ones, the reason and how many runs were already done are appended to
``amendments`` and shown in the report.

Power, briefly (all normal/t planning approximations, see :mod:`lensemble.eval.stats`):

* the experimental unit is the seed; a paired per-seed difference of success rates has variance
  ``2·p0(1-p0)/E + 2·σ_train²`` (E episodes per arm, σ_train the seed-to-seed SD of an arm's true
  success that pairing does not cancel); its MDE over n seeds uses Student-t quantiles;
* the exact sign-flip test over n seeds cannot give a p-value below ``2^-n`` (one-sided) or
  ``2^(1-n)`` (two-sided): a design whose floor is above the first Holm threshold α/k can never
  confirm anything, and the registry says so (``confirmable: false``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from lensemble.config.hashing import json_digest
from lensemble.config.loader import load_config
from lensemble.config.rungs import RUNGS
from lensemble.errors import ConfigError
from lensemble.eval.stats import mde_paired, mde_two_proportions, units_for_paired
from lensemble.study.files import atomic_write, now
from lensemble.study.plan import LADDER, PATH_KEYS, drop_keys
from lensemble.study.spec import FEDERATED_ARMS

SCHEMA_VERSION = 1
_VOLATILE = ("registered_at", "amendments", "registry_hash", "revisions_before_runs")

METRICS = {
    "success": "closed-loop latent-MPC success rate on held-out episodes (evaluate), per seed",
    "drift_final": "gauge/drift_angle_deg at the final round: mean geodesic angle (degrees) between "
                   "each participant's probe frame and the global model's",
    "drift_mean": "gauge/drift_angle_deg averaged over all rounds (degrees)",
    "effective_dim": "participation ratio of the final model's latent covariance on held-out frames (evaluate)",
    "latent_std": "per-dimension latent standard deviation on held-out frames (evaluate)",
    "rho": "gap recovery ρ = (S_anchored − S_local) / (S_central − S_local) on success rates",
}


def _finite_or_none(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _mde(sd: float, n: int, alpha: float, power: float, alternative: str) -> float | None:
    if n < 2:
        return None
    return _finite_or_none(mde_paired(sd, n, alpha=alpha, power=power, alternative=alternative, distribution="t"))


def _units(delta: float, sd: float, alpha: float, power: float, alternative: str) -> int | None:
    if sd == 0:
        return 2
    try:
        return units_for_paired(delta, sd, alpha=alpha, power=power, alternative=alternative, distribution="t")
    except Exception:  # noqa: BLE001 - an undetectable effect: say so instead of failing the plan
        return None


def power_analysis(spec, n_seeds: int, n_episodes: int, holm_k: int) -> dict:
    """MDEs and floors of the registered design (numbers, plus the formulas they came from)."""
    r = spec.registry
    p = r.planning
    alt = r.alternative
    a_first = r.alpha / max(holm_k, 1)           # the first Holm step's threshold
    sd_success = math.sqrt(2 * p.baseline_success * (1 - p.baseline_success) / n_episodes
                           + 2 * p.sd_train_success ** 2)
    floor = (1.0 if alt == "one-sided" else 2.0) / 2 ** n_seeds
    seeds_for_floor = next(n for n in range(2, 64) if (1.0 if alt == "one-sided" else 2.0) / 2 ** n <= a_first)
    comps = {}
    for metric, sd, delta, unit in (
        ("success", sd_success, r.delta.success, "rate"),
        ("drift", p.sd_drift_deg, r.delta.drift_deg, "degrees"),
        ("effective_dim", p.sd_effective_dim, r.delta.effective_dim, "dimensions"),
    ):
        comps[metric] = {
            "unit": unit, "sd_paired_difference": round(sd, 6), "delta": delta,
            "mde_at_alpha": _mde(sd, n_seeds, r.alpha, r.power, alt),
            "mde_at_first_holm_step": _mde(sd, n_seeds, a_first, r.power, alt),
            "seeds_for_delta": _units(delta, sd, a_first, r.power, alt),
        }
    comps["success"]["mde_episode_floor"] = _finite_or_none(
        mde_two_proportions(p.baseline_success, n_episodes * n_seeds, alpha=r.alpha, power=r.power,
                            alternative=alt, direction="decrease"))
    limitations = []
    if floor > a_first:
        limitations.append(f"the sign-flip p-value cannot go below {floor:.3g} with {n_seeds} seeds, above the "
                           f"first Holm threshold {a_first:.3g}: no claim can be confirmed (needs "
                           f"{seeds_for_floor} seeds)")
    for metric, c in comps.items():
        mde = c["mde_at_first_holm_step"]
        if mde is None or c["delta"] < mde:
            limitations.append(f"{metric}: the registered δ = {c['delta']} is below the MDE "
                               f"{'(undefined)' if mde is None else f'{mde:.3g}'} of this design, so a true effect "
                               f"of size δ is detected with less than {r.power:.0%} power "
                               f"(≈ {c['seeds_for_delta'] or '?'} seeds would be needed)")
    return {
        "limitations": limitations,
        "n_seeds": n_seeds, "n_episodes_per_arm_and_seed": n_episodes, "alpha": r.alpha, "power": r.power,
        "alternative": alt, "holm_family_size": holm_k, "first_holm_threshold": a_first,
        "assumptions": p.model_dump(mode="json"),
        "success_sd_formula": "sqrt(2·p0·(1-p0)/E + 2·sd_train_success²)",
        "mde_formula": "(t_{1-α',n-1} + t_{power,n-1}) · sd / sqrt(n)  (α' = α, or α/2 two-sided)",
        "permutation_p_floor": floor,
        "seeds_needed_for_floor": seeds_for_floor,
        "confirmable": floor <= a_first,
        "components": comps,
    }


def _claims(spec, plan) -> tuple[list[dict], list[dict]]:
    r = spec.registry
    d = r.delta
    anch = r.anchored_rung
    local = f"local ({r.local_reference} over silos)"
    pairing = ("by seed: seed s sets root_seed (silos, probe, batch order) and eval.seed (the held-out "
               "episodes) of every arm, and all arms of s start from the same warm start")
    sweeps4 = [s for s in r.claim4_sweeps if s in plan.groups]
    claims = [
        {
            "id": "C1", "title": "Naive FedAvg of an end-to-end JEPA degrades under non-IID silos",
            "hypothesis": (f"Against the anchored rung ({anch}) naive FedAvg ends with a frame drift at least "
                           f"{d.drift_deg}° larger, and against centralized training its success is at least "
                           f"{d.success:.0%} lower and its effective dimension at least {d.effective_dim} lower."),
            "decision": "intersection-union: confirmed if every component is confirmed, falsified if any is "
                        "falsified, else inconclusive; the claim's p-value is the largest component p-value",
            "group": "ladder", "pairing": pairing,
            "components": [
                {"id": "C1.drift", "metric": "drift_final", "treatment": "naive", "control": anch,
                 "direction": "increase", "delta": d.drift_deg, "unit": "degrees"},
                {"id": "C1.success", "metric": "success", "treatment": "naive", "control": "central",
                 "direction": "decrease", "delta": d.success, "unit": "rate"},
                {"id": "C1.effdim", "metric": "effective_dim", "treatment": "naive", "control": "central",
                 "direction": "decrease", "delta": d.effective_dim, "unit": "dimensions"},
            ],
        },
        {
            "id": "C2", "title": "Frame anchoring holds the latent frame",
            "hypothesis": (f"Averaged over the rounds, the anchored rung's ({anch}) frame drift is at least "
                           f"{d.drift_deg}° below naive FedAvg's."),
            "decision": "verdict of the single component", "group": "ladder", "pairing": pairing,
            "components": [
                {"id": "C2.drift", "metric": "drift_mean", "treatment": anch, "control": "naive",
                 "direction": "decrease", "delta": d.drift_deg, "unit": "degrees"},
            ],
        },
        {
            "id": "C3", "title": "Anchored federation recovers most of the centralized − local gap without moving data",
            "hypothesis": (f"ρ = (S_{anch} − S_local) / (S_central − S_local) reaches {r.rho_threshold} "
                           f"(S = success rate, S_local = {r.local_reference} over silos)."),
            "decision": ("stats.verdict on ρ and its paired-bootstrap interval with δ = the threshold; "
                         "inconclusive when ρ is undefined (the interval of S_central − S_local contains 0)"),
            "group": "ladder", "pairing": pairing,
            "metric": "rho", "treatment": anch, "control": local, "reference": "central",
            "threshold": r.rho_threshold, "direction": "increase", "residency": "no trajectory leaves a silo "
            "(INV-RESIDENCY, enforced by the participant egress allow-list)",
        },
        {
            "id": "C4", "title": "Claims 2 and 3 hold across non-IID severity and participant count",
            "hypothesis": ("At every value of the " + (", ".join(sweeps4) or "(none planned)") + " sweeps, the "
                           "C2 comparison and the C3 ρ test are confirmed."),
            "decision": ("intersection-union over sweep points (no multiplicity adjustment needed): confirmed "
                         "if every point confirms both, falsified if any point falsifies either, else "
                         "inconclusive; inconclusive when no sweep is planned"),
            "sweeps": sweeps4, "pairing": pairing,
            "per_point": ["C2.drift", "C3"],
        },
    ]
    ladder_family = []
    present = set(plan.groups.get(LADDER, {}).get("default", {}).get("arms", {}))
    naive = RUNGS[0]  # the rung without any gauge control: naive FedAvg
    # Every other federated arm of the ladder against naive FedAvg, in ladder order.
    for arm in [a for a in FEDERATED_ARMS if a != naive and a in present]:
        if naive not in present:
            break
        ladder_family.append({"id": f"L.{arm}.drift", "metric": "drift_final", "treatment": arm, "control": "naive",
                              "direction": "decrease", "delta": d.drift_deg, "unit": "degrees"})
        ladder_family.append({"id": f"L.{arm}.success", "metric": "success", "treatment": arm, "control": "naive",
                              "direction": "increase", "delta": d.success, "unit": "rate"})
    return claims, ladder_family


def build_registry(spec, plan) -> dict:
    """The registry for ``spec`` and its ``plan`` (a plain dict, YAML-ready)."""
    ladder = plan.groups.get(LADDER, {}).get("default")
    base_ov = ladder["overrides"] if ladder else list(spec.overrides)
    cfg = load_config(base_ov)
    e = cfg.eval
    claims, ladder_family = _claims(spec, plan)
    r = spec.registry
    n_seeds = len(spec.seeds)
    confirm_family = ["C1", "C2"]
    power = power_analysis(spec, n_seeds, e.episodes, len(confirm_family))
    for c in claims:
        c["analysis"] = {
            "alpha": r.alpha, "alternative": r.alternative, "unit": "seed", "n_seeds": n_seeds,
            "n_episodes": e.episodes, "n_boot": r.n_boot,
            "multiplicity": ("Holm across the confirmatory family " + str(confirm_family))
            if c["id"] in confirm_family else "none (interval decision / intersection-union)",
        }
        for comp in c.get("components", []):
            key = {"drift_final": "drift", "drift_mean": "drift", "success": "success",
                   "effective_dim": "effective_dim"}[comp["metric"]]
            comp["mde"] = power["components"][key]["mde_at_first_holm_step"]
            comp["metric_definition"] = METRICS[comp["metric"]]
    sweeps = {}
    for name, sw in spec.sweeps.items():
        pts = plan.groups.get(name, {})
        sweeps[name] = {"override": sw.override, "arms": list(sw.arms),
                        "values": [p["value"] for p in pts.values()],
                        "seeds": list(sw.seeds or spec.seeds), "keep_budget": sw.keep_budget}
    ladder_budget = ladder["budget"] if ladder else None
    return {
        "schema_version": SCHEMA_VERSION,
        "study": spec.name,
        "description": spec.description,
        "design": {
            "seeds": list(spec.seeds),
            "pairing": claims[0]["pairing"],
            "environment": cfg.env.id,
            "base_overrides": drop_keys(list(spec.overrides), PATH_KEYS),
            "arms": spec.ladder_arms(),
            "anchored_rung": r.anchored_rung,
            "warmstart": {"scope": spec.warmstart, "data": "public corpus only",
                          "steps": cfg.train.warmstart_steps,
                          "seed": spec.seeds[0] if spec.warmstart == "study" else "each study seed"},
            "step_budget": {
                **(ladder_budget or {}),
                "statement": ("every federated participant takes rounds × inner_steps AdamW steps; each local-only "
                              "model takes the same number; the centralized model takes "
                              + ("the same number (per participant)" if spec.budget == "per_participant"
                                 else "num_silos × that (the federation's total)")
                              + "; all with the same batch size, from the same warm start"),
            },
            "evaluation": {"split": spec.evaluation.split, "episodes": e.episodes, "planner": e.planner,
                           "num_samples": e.num_samples, "iterations": e.iterations, "horizon": e.horizon,
                           "budget": e.budget, "goal_offset": e.goal_offset, "ladder": spec.evaluation.ladder,
                           "episodes_seed": "eval.seed = the run's seed"},
            "sweeps": sweeps,
        },
        "analysis": {
            "alpha": r.alpha, "power": r.power, "alternative": r.alternative, "unit": "seed",
            "paired_test": "exact sign-flip permutation test of the mean per-seed difference",
            "interval": "95% BCa bootstrap over seeds of the mean paired difference; Wilson intervals for "
                        "pooled success counts; paired percentile bootstrap for ρ",
            "verdict": ("stats.verdict: falsified if the interval lies below δ; confirmed if it excludes 0 in the "
                        "hypothesised direction, the estimate reaches δ and the (Holm-adjusted) p ≤ α; "
                        "otherwise inconclusive; a missing or unmeasurable metric is inconclusive"),
            "confirmatory_family": confirm_family,
            "ladder_family": [c["id"] for c in ladder_family],
            "ladder_multiplicity": "Holm across the ladder family (each rung against naive)",
            "n_boot": r.n_boot,
            "local_reference": r.local_reference,
            "rho_threshold": r.rho_threshold,
            "deltas": r.delta.model_dump(mode="json"),
            "min_seeds": r.min_seeds,
            "power_analysis": power,
        },
        "claims": claims,
        "ladder_comparisons": ladder_family,
    }


def core_hash(registry: dict) -> str:
    body = {k: v for k, v in registry.items() if k not in _VOLATILE}
    return json_digest(body, compact=False, default=str)  # pinned: the committed registries carry it


def _diff(old, new, path="") -> list[dict]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            if k in _VOLATILE and not path:
                continue
            out += _diff(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))
        return out
    if old != new:
        return [{"path": path, "old": old, "new": new}]
    return []


def registry_path(study_dir: str | Path) -> Path:
    return Path(study_dir) / "registry.yaml"


def load_registry(study_dir: str | Path) -> dict:
    path = registry_path(study_dir)
    if not path.exists():
        raise ConfigError(f"no registry at {path}", remediation="run the study (it writes the registry first)")
    return yaml.safe_load(path.read_text())


def _write(path: Path, registry: dict) -> None:
    header = ("# Pre-registration of this study, written before any run (docs/study.md).\n"
              "# Do not edit by hand: change the preset and rerun with --amend '<reason>'.\n")
    atomic_write(path, header + yaml.safe_dump(registry, sort_keys=False, allow_unicode=True, width=110))


def sync_registry(study_dir: str | Path, registry: dict, *, runs_done: int, amend: str | None = None) -> dict:
    """Write ``registry`` unless an identical one is there; after runs, a change needs ``amend``.

    Returns the registry as stored (with ``registered_at``, ``registry_hash`` and ``amendments``).
    """
    path = registry_path(study_dir)
    new_hash = core_hash(registry)
    if not path.exists():
        stored = {**registry, "registered_at": now(), "registry_hash": new_hash, "amendments": []}
        _write(path, stored)
        return stored
    old = yaml.safe_load(path.read_text()) or {}
    if core_hash(old) == new_hash:
        return old
    changes = _diff({k: v for k, v in old.items() if k not in _VOLATILE}, registry)
    if runs_done == 0:
        stored = {**registry, "registered_at": now(), "registry_hash": new_hash,
                  "amendments": old.get("amendments", []),
                  "revisions_before_runs": int(old.get("revisions_before_runs", 0)) + 1}
        _write(path, stored)
        return stored
    if not amend:
        shown = ", ".join(c["path"] for c in changes[:6]) + (" …" if len(changes) > 6 else "")
        raise ConfigError(
            f"the registry would change after {runs_done} runs finished ({shown})",
            remediation="restore the preset, or record the change as an amendment: --amend '<reason>'")
    amendment = {"at": now(), "reason": amend, "runs_done": runs_done, "previous_hash": old.get("registry_hash"),
                 "new_hash": new_hash, "changes": json.loads(json.dumps(changes, default=str))}
    stored = {**registry, "registered_at": old.get("registered_at"), "registry_hash": new_hash,
              "amendments": list(old.get("amendments", [])) + [amendment]}
    if "revisions_before_runs" in old:
        stored["revisions_before_runs"] = old["revisions_before_runs"]
    _write(path, stored)
    return stored


__all__ = ["build_registry", "sync_registry"]
