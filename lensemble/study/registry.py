"""The study's pre-registration: ``registry.yaml``, written before any run.

For every claim it states the hypothesis with its effect size δ, the treatment and control arms,
the pairing, the metric, and the analysis (α, the test, the interval, the multiplicity correction
and the minimum detectable effect at the planned seeds and episodes). The analysis reads its
numbers from here, never from the preset, so the decision rule cannot drift after the data.

Changing the registry once a run has finished is allowed only as an *amendment*: the previous
values, the new ones, the reason and how many runs were already done are appended to
``amendments`` and shown in the report.

Power (:mod:`lensemble.study.power`): the MDEs and powers come from the registered test itself, a
one-sided paired t test on per-seed differences: exact (noncentral t) for a metric modelled as
normal per seed, simulated for success (binary episodes paired across arms, a treatment × seed
spread). For every Holm family the registry states before any run whether it *can confirm at the
planned size*: whether some hypothesis in it reaches the registered power at its δ at the family's
first Holm threshold.
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
from lensemble.eval.stats import mde_two_proportions
from lensemble.study import power as pw
from lensemble.study.files import atomic_write, now
from lensemble.study.plan import LADDER, PATH_KEYS, drop_keys
from lensemble.study.spec import FEDERATED_ARMS

SCHEMA_VERSION = 1
_VOLATILE = ("registered_at", "amendments", "registry_hash", "revisions_before_runs")

METRICS = {
    "success": "closed-loop latent-MPC success rate on held-out episodes (evaluate; the env's own flag), per "
               "seed; paired episode by episode across arms",
    "drift_final": "gauge/drift_angle_deg at the final round: mean over participants of the geodesic angle "
                   "(degrees) of the rotation mapping the participant's unaligned frame onto the new global "
                   "model's, measured on the probe's measurement frames (never the anchor's landmarks)",
    "drift_mean": "gauge/drift_angle_deg averaged over all rounds (degrees)",
    "drift_subspace_final": "gauge/drift_subspace_angle_deg at the final round: mean over participants of the "
                            "geodesic angle (degrees) of that rotation within the new global model's 95 %-energy "
                            "principal subspace (the polar factor of its block), on the probe's measurement "
                            "frames; measured whenever the block is identified, also when the full rotation "
                            "is not (lensemble.gauge.drift, degenerate='mask')",
    "drift_subspace_mean": "gauge/drift_subspace_angle_deg averaged over all rounds (degrees)",
    "effective_dim": "participation ratio of the final model's latent covariance on held-out frames (evaluate)",
    "latent_std": "per-dimension latent standard deviation on held-out frames (evaluate)",
    "rho": "gap recovery ρ = (S_anchored − S_local) / (S_central − S_local) on success rates",
}


def _finite_or_none(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


_SEED_GRID = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)
_SIM_REPS = 2000  # Monte-Carlo SE of a power near 0.8: 0.009


class _Metric:
    """Power of the registered test for one metric under the registry's planning numbers."""

    def __init__(self, name: str, spec, n_seeds: int, n_episodes: int, replicates: int = 1):
        r, p = spec.registry, spec.registry.planning
        self.name, self.n, self.e = name, n_seeds, n_episodes
        self.p = p
        self.delta = {"success": r.delta.success, "drift": r.delta.drift_deg, "effective_dim": r.delta.effective_dim}[name]
        self.unit = {"success": "rate", "drift": "degrees", "effective_dim": "dimensions"}[name]
        # The replicate level (issue 44) enters only when the study has replicates or a measured spread:
        # the calls, and so every number, of a study without either are those of before.
        sd_rep = getattr(p, "sd_replicate_success", None)
        self.rep = {} if replicates == 1 and sd_rep is None else {"replicates": replicates, "sd_replicate": sd_rep}
        self.sd = (pw.success_sd(p.baseline_success, n_episodes, p.sd_train_success, p.episode_correlation, **self.rep)
                   if name == "success" else {"drift": p.sd_drift_deg, "effective_dim": p.sd_effective_dim}[name])
        self.method = ("simulation of the t test on binary episodes (2000 replicates, seed 0): per-seed spread "
                       "2·sd_train², episode correlation between arms as planned" if name == "success"
                       else "noncentral t (normal per-seed differences)")
        if name == "success" and self.rep:
            self.method += (f"; {replicates} training replicate(s) per arm and seed, each adding its own spread "
                            f"sd_replicate_success = {sd_rep or 0.0} and playing the seed's same episodes; a seed's "
                            "difference is that of its replicate means")

    def power(self, delta: float, alpha: float, n: int | None = None) -> float:
        n = self.n if n is None else n
        if self.name == "success":
            return pw.simulated_success_power(delta, n_seeds=n, n_episodes=self.e, baseline=self.p.baseline_success,
                                              sd_train=self.p.sd_train_success,
                                              episode_correlation=self.p.episode_correlation, alpha=alpha,
                                              reps=_SIM_REPS, **self.rep)
        return pw.t_power(delta, self.sd, n, alpha)

    def mde(self, alpha: float, power: float) -> float | None:
        if self.name == "success":
            return pw.simulated_success_mde(n_seeds=self.n, n_episodes=self.e, baseline=self.p.baseline_success,
                                            sd_train=self.p.sd_train_success,
                                            episode_correlation=self.p.episode_correlation, alpha=alpha, power=power,
                                            reps=_SIM_REPS, **self.rep)
        return pw.t_mde(self.sd, self.n, alpha, power)

    def seeds_for_delta(self, alpha: float, power: float) -> int | None:
        return next((n for n in _SEED_GRID if self.power(self.delta, alpha, n) >= power), None)


def power_analysis(spec, n_seeds: int, n_episodes: int, holm_k: int, *, ladder_k: int = 0,
                   ladder_metrics: tuple[str, ...] = ("drift", "success"),
                   confirm_metrics: tuple[str, ...] = ("drift", "success", "effective_dim"),
                   replicates: int | None = None) -> dict:
    """Power, MDEs and, per Holm family, whether it can confirm at the planned size
    (``replicates``: training replicates per arm and seed; default the spec's, else 1)."""
    r = spec.registry
    p = r.planning
    alt = r.alternative
    replicates = int(replicates if replicates is not None else getattr(spec, "replicates", 1))
    # A two-sided registration halves the one-sided level every comparison is run at.
    side = 1.0 if alt == "one-sided" else 0.5
    a_first = side * r.alpha / max(holm_k, 1)
    a_ladder = side * r.alpha / max(ladder_k, 1)
    metrics = {m: _Metric(m, spec, n_seeds, n_episodes, replicates) for m in ("success", "drift", "effective_dim")}
    comps = {}
    for name, m in metrics.items():
        comps[name] = {
            "unit": m.unit, "sd_paired_difference": round(m.sd, 6), "delta": m.delta, "method": m.method,
            "mde_at_alpha": _finite_or_none(m.mde(side * r.alpha, r.power)),
            "mde_at_first_holm_step": _finite_or_none(m.mde(a_first, r.power)),
            "power_at_delta_at_alpha": round(m.power(m.delta, side * r.alpha), 4),
            "power_at_delta_first_holm_step": round(m.power(m.delta, a_first), 4),
            "seeds_for_delta": m.seeds_for_delta(a_first, r.power),
        }
    comps["success"]["mde_episode_floor"] = _finite_or_none(
        mde_two_proportions(p.baseline_success, n_episodes * n_seeds, alpha=r.alpha, power=r.power,
                            alternative=alt, direction="decrease"))

    def family(m_size: int, first: float, used: tuple[str, ...]) -> dict:
        powers = {name: (comps[name]["power_at_delta_first_holm_step"] if first == a_first
                         else round(metrics[name].power(metrics[name].delta, first), 4)) for name in used}
        powered = sorted(name for name, v in powers.items() if v >= r.power)
        mdes = {name: (comps[name]["mde_at_first_holm_step"] if first == a_first
                       else _finite_or_none(metrics[name].mde(first, r.power))) for name in used}
        # The t test's p has no floor (unlike an exact sign-flip test over n seeds, 2^-n), so the
        # family can confirm at any n >= 2; whether it is likely to is the power at δ.
        return {"size": m_size, "first_holm_threshold": first, "last_holm_threshold": side * r.alpha,
                "p_floor": 0.0, "can_confirm": n_seeds >= 2 and 0.0 <= first,
                "power_at_delta_first_holm_step": powers, "mde_first_holm_step": mdes,
                "powered_at_delta": powered}

    families = {"confirmatory": family(holm_k, a_first, confirm_metrics)}
    if ladder_k:
        families["ladder"] = family(ladder_k, a_ladder, ladder_metrics)
    limitations = []
    for fname, f in families.items():
        if not f["can_confirm"]:
            limitations.append(f"the {fname} family cannot confirm anything with {n_seeds} seed(s)")
        elif not f["powered_at_delta"]:
            limitations.append(f"the {fname} family ({f['size']} hypotheses, first Holm threshold "
                               f"{f['first_holm_threshold']:.3g}) can confirm, but no metric reaches {r.power:.0%} "
                               f"power at its registered δ: it confirms only effects above its MDEs "
                               f"{ {k: (None if v is None else round(v, 3)) for k, v in f['mde_first_holm_step'].items()} }")
    for name, c in comps.items():
        if c["power_at_delta_first_holm_step"] < r.power:
            limitations.append(f"{name}: a true effect of the registered δ = {c['delta']} is detected with "
                               f"{c['power_at_delta_first_holm_step']:.0%} power at the first Holm step (MDE "
                               f"{'undefined' if c['mde_at_first_holm_step'] is None else format(c['mde_at_first_holm_step'], '.3g')}; "
                               f"≈ {c['seeds_for_delta'] or '> 64'} seeds would be needed)")
    return {
        "test": "one-sided paired t test on per-seed differences (success: the mean over the seed's paired "
                "episodes); falsification: the same t test of H0 effect >= δ",
        "limitations": limitations,
        "n_seeds": n_seeds, "n_episodes_per_arm_and_seed": n_episodes, "alpha": r.alpha, "power": r.power,
        "alternative": alt, "holm_family_size": holm_k, "first_holm_threshold": a_first,
        "assumptions": p.model_dump(mode="json"),
        # named only with replicates or a replicate spread: registries hashed before them stay valid
        **({"n_replicates": replicates} if metrics["success"].rep else {}),
        "success_sd_formula": ("sqrt(2·p0·(1-p0)·(1-ρ_episode)/(E·R) + 2·sd_train² + 2·sd_replicate²/R), R = "
                               "replicates" if metrics["success"].rep else
                               "sqrt(2·p0·(1-p0)·(1-ρ_episode)/E + 2·sd_train²)"),
        "mde_formula": "power of the registered t test: noncentral t for normal metrics, simulated for success",
        "permutation_p_floor": 0.0,
        "seeds_needed_for_floor": 2,
        "confirmable": families["confirmatory"]["can_confirm"],
        "families": families,
        "components": comps,
    }


# How claim 4's title names a sweep (by its preset name); others are named as they are.
_SWEEP_PHRASES = {"severity": "non-IID severity", "participants": "participant count",
                  "width": "a wider encoder (the scale step)"}


def _sweep_phrase(names) -> str:
    """``["severity", "participants"]`` -> ``"non-IID severity and participant count"``."""
    parts = [_SWEEP_PHRASES.get(n, n) for n in names] or ["(no sweep)"]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def drift_metrics(registry_spec) -> tuple[str, str]:
    """(final-round, mean-over-rounds) metric names the drift claims use under ``drift_metric``."""
    if registry_spec.drift_metric == "subspace":
        return "drift_subspace_final", "drift_subspace_mean"
    return "drift_final", "drift_mean"


def _claims(spec, plan) -> tuple[list[dict], list[dict]]:
    r = spec.registry
    d = r.delta
    drift_final, drift_mean = drift_metrics(r)
    frame = " within the global frame's principal subspace" if r.drift_metric == "subspace" else ""
    anch = r.anchored_rung
    local = f"local ({r.local_reference} over silos)"
    pairing = ("by seed: seed s sets root_seed (silos, probe, batch order) and eval.seed (the held-out "
               "episodes) of every arm, and all arms of s start from the same warm start")
    sweeps4 = [s for s in r.claim4_sweeps if s in plan.groups]
    claims = [
        {
            "id": "C1", "title": "Naive FedAvg of an end-to-end JEPA degrades under non-IID silos",
            "hypothesis": (f"Against the anchored rung ({anch}) naive FedAvg ends with a frame drift{frame} at "
                           f"least {d.drift_deg}° larger, and against centralized training its success is at least "
                           f"{d.success:.0%} lower and its effective dimension at least {d.effective_dim} lower."),
            "decision": "intersection-union: confirmed if every component is confirmed, falsified if any is "
                        "falsified, else inconclusive; the claim's p-value is the largest component p-value",
            "group": "ladder", "pairing": pairing,
            "components": [
                {"id": "C1.drift", "metric": drift_final, "treatment": "naive", "control": anch,
                 "direction": "increase", "delta": d.drift_deg, "unit": "degrees"},
                {"id": "C1.success", "metric": "success", "treatment": "naive", "control": "central",
                 "direction": "decrease", "delta": d.success, "unit": "rate"},
                {"id": "C1.effdim", "metric": "effective_dim", "treatment": "naive", "control": "central",
                 "direction": "decrease", "delta": d.effective_dim, "unit": "dimensions"},
            ],
        },
        {
            "id": "C2", "title": "Frame anchoring holds the latent frame",
            "hypothesis": (f"Averaged over the rounds, the anchored rung's ({anch}) frame drift{frame} is at "
                           f"least {d.drift_deg}° below naive FedAvg's."),
            "decision": "verdict of the single component", "group": "ladder", "pairing": pairing,
            "components": [
                {"id": "C2.drift", "metric": drift_mean, "treatment": anch, "control": "naive",
                 "direction": "decrease", "delta": d.drift_deg, "unit": "degrees"},
            ],
        },
        {
            "id": "C3", "title": "Anchored federation recovers most of the centralized − local gap without moving data",
            "hypothesis": (f"ρ = (S_{anch} − S_local) / (S_{r.rho_reference} − S_local) reaches {r.rho_threshold} "
                           f"(S = success rate, S_local = {r.local_reference} over silos"
                           + ("; S_twin: the data-parallel twin, the federation's sequential steps at C × the "
                              "batch)." if r.rho_reference == "twin" else ").")),
            "decision": ("stats.verdict on ρ and its paired-bootstrap interval with δ = the threshold; "
                         "inconclusive when ρ is undefined (the interval of S_central − S_local contains 0)"),
            "group": "ladder", "pairing": pairing,
            "metric": "rho", "treatment": anch, "control": local, "reference": r.rho_reference,
            "threshold": r.rho_threshold, "direction": "increase", "residency": "no trajectory leaves a silo "
            "(INV-RESIDENCY, enforced by the participant egress allow-list)",
        },
        {
            "id": "C4", "title": "Claims 2 and 3 hold across " + _sweep_phrase(r.claim4_sweeps),
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
    # The objective: naive FedAvg with the pooled objective against the per-silo one (issue 32).
    if naive in present and "naive_silo" in present:
        ladder_family.append({"id": "L.objective.success", "metric": "success", "treatment": naive,
                              "control": "naive_silo", "direction": "increase", "delta": d.success, "unit": "rate"})
    for arm in [a for a in FEDERATED_ARMS if a not in (naive, "naive_silo") and a in present]:
        if naive not in present:
            break
        ladder_family.append({"id": f"L.{arm}.drift", "metric": drift_final, "treatment": arm, "control": "naive",
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
    confirm_components = [comp["id"] for c in claims if c["id"] in confirm_family for comp in c["components"]]
    power = power_analysis(spec, n_seeds, e.episodes, len(confirm_components), ladder_k=len(ladder_family))
    for c in claims:
        c["analysis"] = {
            "alpha": r.alpha, "alternative": r.alternative, "unit": "seed", "n_seeds": n_seeds,
            "n_episodes": e.episodes, "n_boot": r.n_boot,
            "multiplicity": ("Holm across every component of the confirmatory family " + str(confirm_components)
                             + ", confirmations and falsifications separately; the claim's p is the largest "
                             "of its components' adjusted p (intersection-union)")
            if c["id"] in confirm_family else "none (interval decision / intersection-union)",
        }
        for comp in c.get("components", []):
            key = "drift" if comp["metric"].startswith("drift_") else comp["metric"]  # one power per drift metric
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
        # only when set, so the registries of studies that never stopped keep their hashes
        **({"stopped": spec.stopped} if spec.stopped else {}),
        "design": {
            "seeds": list(spec.seeds),
            # only with replicates, so the registries of studies without them keep their hashes
            **({"replicates": {
                "per_seed_and_arm": spec.replicates,
                "statement": ("every trained arm runs replicates r = 0..R-1 per seed: replicate r > 0 is run r = 0 "
                              "with train.replicate=r, another order of the same batches (the batch stream's seed "
                              "gets the label ('replicate', r)), with the same warm start, silos, probe and "
                              "evaluation episodes; the warm-start-only arm trains nothing and has one"),
            }} if spec.replicates > 1 else {}),
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
                              + ("the same number (per participant, budget: per_participant)"
                                 if spec.budget == "per_participant"
                                 else "num_silos × rounds × inner_steps, the federation's total optimizer steps "
                                      "(budget: total)")
                              + "; the warm-start-only arm takes none (the warm start scored as it is); all with "
                                "the same batch size, from the same warm start"),
            },
            "evaluation": {"split": spec.evaluation.split, "episodes": e.episodes, "planner": e.planner,
                           "num_samples": e.num_samples, "iterations": e.iterations, "horizon": e.horizon,
                           "budget": e.budget, "goal_offset": e.goal_offset, "ladder": spec.evaluation.ladder,
                           "episodes_seed": "eval.seed = the run's seed",
                           # named only off the strict default: registries hashed before it stay valid
                           **({"goal_source": e.goal_source} if e.goal_source != "expert" else {})},
            "sweeps": sweeps,
        },
        "analysis": {
            "alpha": r.alpha, "power": r.power, "alternative": r.alternative, "unit": "seed",
            "paired_test": ("one-sided paired t test of the mean per-seed difference (stats.paired_t_test); a "
                            "success difference is the mean over the seed's paired episodes (same goal_spec_hash), "
                            "falling back to the per-seed rates when episodes were not recorded"),
            "interval": ("95% Student-t interval over seeds of the mean paired difference; for success also a "
                         "hierarchical bootstrap (seeds, then paired episodes), reported, not deciding; Wilson "
                         "intervals for pooled success counts; paired percentile bootstrap for ρ"
                         + ("" if spec.replicates == 1 else
                            f"; with {spec.replicates} training replicates per seed a seed's value is the mean of "
                            "its replicates (the t test's unit stays the seed), and the success and ρ bootstraps "
                            "resample seeds, then each arm's replicates within the seed, then the seed's episodes "
                            "(shared by every arm and replicate)")),
            "verdict": ("confirmed if the Holm-adjusted p of H0 'effect <= 0' is <= α and the estimate reaches δ; "
                        "falsified if the Holm-adjusted p of H0 'effect >= δ' is <= α; otherwise inconclusive; "
                        "a missing or unmeasurable metric is inconclusive"),
            "validation": "benchmarks/study_stats_simulation.py (coverage, level, falsification level, power)",
            "confirmatory_family": confirm_family,
            "confirmatory_components": confirm_components,
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


def diff_paths(old, new, path: str = "", *, into_lists: bool = False) -> list[dict]:
    """{"path", "old", "new"} for each value that differs, descending into dicts (the top level's
    volatile keys skipped). With ``into_lists`` it descends into lists too: a list of records with
    a unique ``id`` each is matched by id (``claims[C1].title``), other lists of the same length by
    index; otherwise a changed list is one change (how amendments are recorded)."""
    def at(key) -> str:
        return f"{path}.{key}" if path else str(key)

    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(set(old) | set(new), key=str) if not (k in _VOLATILE and not path)
                for c in diff_paths(old.get(k), new.get(k), at(k), into_lists=into_lists)]
    if into_lists and isinstance(old, list) and isinstance(new, list):
        ids_old = [x.get("id") if isinstance(x, dict) else None for x in old]
        ids_new = [x.get("id") if isinstance(x, dict) else None for x in new]
        if None not in ids_old + ids_new and len(set(ids_old)) == len(old) and len(set(ids_new)) == len(new):
            by_old, by_new = dict(zip(ids_old, old, strict=True)), dict(zip(ids_new, new, strict=True))
            return [c for i in dict.fromkeys(ids_old + ids_new)
                    for c in diff_paths(by_old.get(i), by_new.get(i), f"{path}[{i}]", into_lists=True)]
        if len(old) == len(new):
            return [c for i, (a, b) in enumerate(zip(old, new, strict=True))
                    for c in diff_paths(a, b, f"{path}[{i}]", into_lists=True)]
    return [] if old == new else [{"path": path, "old": old, "new": new}]


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
    changes = diff_paths({k: v for k, v in old.items() if k not in _VOLATILE}, registry)
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


__all__ = ["build_registry", "diff_paths", "sync_registry"]
