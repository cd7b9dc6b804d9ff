"""The study plan: a preset turned into one entry per training run, each a list of Hydra overrides.

:func:`plan_study` composes and validates every run's config before anything runs, gives each run
an identity (what it trains on, its composed config, how it is evaluated) and plans runs with equal
identities once, shared by every cell (group, sweep point) that needs them.

The arms are made from a base config by :func:`arm_overrides`: a rung is its Hydra group
``gauge=<rung>`` (the rung table, :mod:`lensemble.config.rungs`); Fork A is the naive rung with the
encoder frozen at the warm start; the single-site baselines add nothing (they ignore the
federation settings, which are dropped from their identity).

Step budget: a federated participant takes ``rounds × inner_steps`` AdamW steps; every local-only
model takes the same number; with ``budget: total`` (default) the centralized model takes
``num_silos ×`` that, the federation's total optimizer steps, with ``budget: per_participant``
the same as one participant. The warm-start-only arm takes no step: it evaluates the warm start.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Literal, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from lensemble.config.hashing import json_digest
from lensemble.config.loader import load_config
from lensemble.config.rungs import RUNG_FLAGS, RUNGS
from lensemble.config.schema import schema_defaults
from lensemble.errors import ConfigError
from lensemble.study.spec import EvaluationSpec, StudySpec, SweepSpec

LADDER = "ladder"  # the group of the ablation ladder and baselines (its one point: "default")

# Overrides that only say *where* things go: they never enter a run's identity.
PATH_KEYS = ("run_dir", "data.root", "data.workers", "federation.warmstart", "federation.state_dir")
# (data.workers only sets collection parallelism: the collected bytes do not depend on it.)
# Keys a single-site run ignores (its identity must not depend on them, so sweeps over them share it).
FEDERATION_PREFIXES = ("gauge", "federation", "privacy")
# Set per run by the study (seed, output folders), never copied from a base config.
_PER_RUN_FIELDS = ("root_seed", "run_dir", "federation.warmstart", "federation.state_dir", "train.replicate")
# The flags that define an arm (the rung table's gauge flags and Fork A's frozen encoder); never
# copied from a base config.
_ARM_FIELDS = ({"gauge.rung", "model.encoder_frozen"}
               | {f"gauge.{flag}" for flags in RUNG_FLAGS.values() for flag in flags})


# ================================================================================== overrides
def _key(override: str) -> str:
    """The key an override sets (``gauge`` for ``gauge=anchor``; prefixes such as ``+`` kept)."""
    return override.split("=", 1)[0].strip()


def normalize_overrides(overrides: Sequence[str]) -> list[str]:
    """Last value per key wins, sorted by key: the same config as the input, in canonical form.

    Hydra applies group overrides before value overrides whatever their order, so sorting keeps
    the meaning; only repeated keys depended on order, and the last one is what Hydra uses.
    """
    last: dict[str, str] = {}
    for o in overrides:
        if "=" not in o and not o.startswith("~"):
            raise ConfigError(f"override {o!r} is not key=value", remediation="write e.g. gauge=anchor")
        last[_key(o)] = o.strip()
    return [last[k] for k in sorted(last)]


def drop_keys(overrides: Sequence[str], prefixes: Sequence[str]) -> list[str]:
    """``overrides`` without those whose key is one of ``prefixes`` or lies under one."""
    def hit(key: str) -> bool:
        k = key.lstrip("+~")
        return any(k == p or k.startswith(p + ".") for p in prefixes)

    return [o for o in overrides if not hit(_key(o))]


def expand_sweep(override: str) -> tuple[str, list[str]]:
    """(key, values) of one Hydra multirun override, expanded with Hydra's own parser.

    ``"gauge.lambda_anc=0.1,0.3"`` -> ``("gauge.lambda_anc", ["0.1", "0.3"])``; ``range(...)``,
    ``choice(...)`` and ``interval``-free sweeps work as in ``-m`` runs.
    """
    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
    except (HydraException, ValueError) as exc:
        raise ConfigError(f"cannot parse sweep override {override!r}: {exc}",
                          remediation="write a Hydra multirun override, e.g. data.severity=0,0.5,1") from None
    key = parsed.get_key_element()
    if parsed.is_sweep_override():
        values = list(parsed.sweep_string_iterator())
    else:
        values = [parsed.get_value_element_as_str()]
    if not values:
        raise ConfigError(f"sweep override {override!r} has no values")
    return key, values


def is_sweep(override: str) -> bool:
    """Whether ``override`` is a Hydra multirun override (``key=a,b``, ``key=range(...)``, ...)."""
    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
    except (HydraException, ValueError):
        return False
    return parsed.is_sweep_override()


def slug(text: str) -> str:
    """``text`` made file-safe (runs of other characters become one ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def with_ladder_sweeps(spec: StudySpec, overrides: Sequence[str]) -> StudySpec:
    """``spec`` plus one sweep over every ladder arm per multirun override in ``overrides``
    (named after its key, dots as ``_``: ``federation.outer_lr=0.5,0.7`` -> ``federation_outer_lr``)."""
    if not overrides:
        return spec
    extra = {slug(expand_sweep(o)[0]).replace(".", "_"): SweepSpec(override=o, arms=spec.ladder_arms())
             for o in overrides}
    spec = spec.model_copy(update={"sweeps": {**spec.sweeps, **extra}})
    return StudySpec.model_validate(spec.model_dump())


def _hydra_value(value) -> str:
    """A config leaf as Hydra override text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value if re.fullmatch(r"[A-Za-z0-9_./:-]+", value) and value not in ("null", "true", "false") \
            else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    raise ConfigError(f"cannot express {value!r} as a Hydra override")


def overrides_from_config(cfg) -> list[str]:
    """Dotted overrides that rebuild ``cfg`` on top of the root config, arm flags excepted.

    Lets :func:`~lensemble.study.runner.run_ablation_ladder` take a composed ``LensembleConfig``:
    every leaf is pinned except the gauge flags of the rung presets and ``model.encoder_frozen``
    (the arms set those), the root seed (the study's seeds set it) and the per-run folders.
    """
    out = []

    def walk(prefix: str, node):
        for k, v in node.items():
            path = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(path + ".", v)
            elif path not in _ARM_FIELDS and path not in _PER_RUN_FIELDS:
                out.append(f"{path}={_hydra_value(v)}")

    # The dump leaves out fields at their added-later defaults (to keep old hashes); laid over the
    # schema defaults it gives every field's value, so those are pinned too (a micro model's
    # model.input_norm=pixel must not turn into the root preset's global).
    walk("", _full_values(schema_defaults(), cfg.model_dump(mode="json")))
    return out


def _full_values(defaults: dict, dump: dict) -> dict:
    out = dict(defaults)
    for k, v in dump.items():
        out[k] = _full_values(defaults[k], v) if isinstance(v, dict) and isinstance(defaults.get(k), dict) else v
    return out


#: The per-silo objective (each silo's own SIGReg ECF and BatchNorm moments: the room study's).
PER_SILO_OBJECTIVE = ["objective.sigreg_scope=silo", "objective.bn_scope=batch"]


def arm_overrides(arm: str) -> list[str]:
    """The overrides that make a federated ``arm`` out of a base config (Fork A: naive, encoder
    frozen; naive_silo: naive with the per-silo objective)."""
    if arm in RUNGS:
        return [f"gauge={arm}"]
    if arm == "fork_a":
        return ["gauge=naive", "model.encoder_frozen=true"]
    if arm == "naive_silo":
        return ["gauge=naive", *PER_SILO_OBJECTIVE]
    return []


def single_overrides(arm: str, budget: dict) -> list[str]:
    """The step budget (and batch) of a single-site ``arm`` under the point's ``budget``.

    central: the centralized steps of the study's budget rule; twin: one participant's steps at
    C × the batch (the federation's sequential steps, each on as many examples as the C
    participants' batches together); central_persilo: the centralized steps, each batch B/C clips
    per silo with each share's own BatchNorm and SIGReg (the per-silo objective); local: one
    participant's steps on its silo.
    """
    if arm == "central":
        return [f"train.steps={budget['central_steps']}"]
    if arm == "twin":
        return [f"train.steps={budget['participant_steps']}",
                f"train.batch_size={budget['batch_size'] * budget['participants']}"]
    if arm == "central_persilo":
        return [f"train.steps={budget['central_steps']}", "train.silo_batches=true", "train.silo_statistics=both",
                *PER_SILO_OBJECTIVE]
    if arm == "local":
        return [f"train.steps={budget['local_steps']}"]
    raise ConfigError(f"{arm!r} is not a single-site arm")


# ================================================================================== the plan
@dataclass
class PlannedRun:
    """One training run (and the evaluation of its final model)."""

    run_id: str
    kind: Literal["warmstart", "single", "federated", "evaluate"]
    arm: str
    seed: int
    overrides: list[str]
    source: str | None = None        # train_local source for single-site runs
    silo: int | None = None
    spec_hash: str = ""
    cells: list[str] = field(default_factory=list)   # "<group>/<point>" that use this run
    warmstart: str | None = None     # run id of the warm start it starts from (None: the seed's)


@dataclass
class StudyPlan:
    """Every run of a study, in execution order, and the cells (group, point) they fill."""

    name: str
    runs: dict[str, PlannedRun]
    # group -> point -> {"key", "value", "overrides", "seeds", "budget", "arms": {arm: {seed: [run_id]}}}
    groups: dict[str, dict[str, dict]]
    warmstart: dict[int, str]   # seed -> warm-start run id (a study-level warm start maps every seed)
    configs: dict[str, object] = field(default_factory=dict, repr=False)  # run id -> composed config

    def warmstart_of(self, run: PlannedRun) -> str:
        """The warm start ``run`` starts from: its own (a sweep point with another model) or its seed's."""
        return run.warmstart or self.warmstart[run.seed]

    def to_json(self) -> dict:
        return {"schema_version": 1, "study": self.name,
                "runs": {k: asdict(v) for k, v in self.runs.items()},
                "groups": self.groups, "warmstart": {str(k): v for k, v in self.warmstart.items()}}


def _identity(cfg) -> dict:
    """The composed config minus the settings that only say where things go."""
    d = cfg.model_dump(mode="json")
    for path in PATH_KEYS:
        node = d
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.get(p, {})
        node.pop(leaf, None)
    return d


def _spec_hash(kind: str, source: str | None, cfg, evaluation: EvaluationSpec) -> str:
    """A run's identity: what it trains on (kind, source), its composed config and, for runs that
    are evaluated, how. Equal identities are one run, however their overrides were spelled."""
    blob = {"kind": kind, "source": source, "config": _identity(cfg),
            "evaluation": evaluation.model_dump(mode="json") if kind != "warmstart" else None}
    return json_digest(blob, compact=False)  # pinned: committed study summaries carry it


def _budget(cfg, rule: str) -> dict:
    per = cfg.federation.rounds * cfg.federation.inner_steps
    return {"rule": rule, "rounds": cfg.federation.rounds, "inner_steps": cfg.federation.inner_steps,
            "participants": cfg.data.num_silos, "participant_steps": per,
            "central_steps": per * (cfg.data.num_silos if rule == "total" else 1), "local_steps": per,
            "batch_size": cfg.train.batch_size}


#: [precision] what a study's runs train and plan in unless its spec says otherwise: fp32, not the
#: shipped ``auto`` (bf16 where the CPU has bf16 matrix units), so a study resumed on another
#: machine runs the same numerics as its committed runs. fp32 is left out of the config dump, so
#: pinning it moves no hash of a study registered before ``auto`` existed.
STUDY_PRECISION = ("train.precision=fp32", "eval.precision=fp32")


def pinned_precision(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with :data:`STUDY_PRECISION` in front for each precision key they leave unset."""
    own = {_key(o) for o in overrides}
    return [*(o for o in STUDY_PRECISION if _key(o) not in own), *overrides]


def plan_study(spec: StudySpec) -> StudyPlan:
    """Turn a study spec into runs. Runs with the same identity (kind, data source, composed
    config, evaluation settings) are planned once and shared by every cell that needs them: a
    sweep value equal to the ladder's setting, or the single-site baselines of an H or λ sweep,
    cost nothing extra. Every config is composed and validated here, before anything runs."""
    runs: dict[str, PlannedRun] = {}
    by_hash: dict[str, str] = {}
    groups: dict[str, dict[str, dict]] = {}
    base = pinned_precision(spec.overrides)
    if any(_key(o).lstrip("+~") == "train.replicate" for o in base):
        raise ConfigError("train.replicate is set per run by the study: an override of every run cannot set it",
                          remediation="drop train.replicate from the overrides; set the study's replicates "
                                      "(study.replicates=N) for N training replicates per seed")

    composed: dict[tuple[str, ...], object] = {}

    def compose(overrides: list[str]):
        # Seeds (and replicates) differ between otherwise identical runs: compose once without them
        # (Hydra is slow), then set the integer leaves, which no validator of the config looks at.
        seeds = {_key(o): int(o.split("=", 1)[1]) for o in overrides
                 if _key(o) in ("root_seed", "eval.seed", "train.replicate")}
        key = tuple(o for o in overrides if _key(o) not in seeds)
        if key not in composed:
            composed[key] = load_config(list(key))  # validates every run before anything runs
        cfg = composed[key]
        if seeds:
            cfg = cfg.model_copy(update={
                "root_seed": seeds.get("root_seed", cfg.root_seed),
                "eval": cfg.eval.model_copy(update={"seed": seeds.get("eval.seed", cfg.eval.seed)})})
        if "train.replicate" in seeds:  # 1 <= r < spec.replicates <= 100: within the field's range
            cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"replicate": seeds["train.replicate"]})})
        return cfg

    def add(run: PlannedRun, cell: str) -> str:
        run.overrides = normalize_overrides(run.overrides)
        run.spec_hash = _spec_hash(run.kind, run.source, compose(run.overrides), spec.evaluation)
        rid = by_hash.get(run.spec_hash)
        if rid is None:
            if run.run_id in runs:
                raise ConfigError(f"two different runs would be named {run.run_id}")
            runs[run.run_id] = run
            by_hash[run.spec_hash] = rid = run.run_id
        if cell and cell not in runs[rid].cells:
            runs[rid].cells.append(cell)
        return rid

    # The warm start: trained on public data only, with the study's base model and data settings.
    warm: dict[int, str] = {}
    ws_seeds = [spec.seeds[0]] if spec.warmstart == "study" else list(spec.seeds)
    all_seeds = sorted(set(spec.seeds) | {s for sw in spec.sweeps.values() for s in (sw.seeds or [])})
    for s in ws_seeds:
        rid = "warmstart" if spec.warmstart == "study" else f"warmstart-s{s}"
        ov = drop_keys(base, FEDERATION_PREFIXES) + [f"root_seed={s}"]
        warm[s] = add(PlannedRun(rid, "warmstart", "warmstart", s, ov, source="public"), "")
    if spec.warmstart == "study":
        warm = {s: warm[spec.seeds[0]] for s in all_seeds}
    elif missing := [s for s in all_seeds if s not in warm]:
        raise ConfigError(f"sweep seeds {missing} are not study seeds; a per-seed warm start needs them in seeds")

    points: list[tuple[str, str, str | None, str | None, list[str], list[int], bool, bool]] = [
        (LADDER, "default", None, None, spec.ladder_arms(), list(spec.seeds), False, False)]
    for sname, sw in spec.sweeps.items():
        key, values = expand_sweep(sw.override)
        for v in values:
            points.append((sname, v, key, v, list(sw.arms), list(sw.seeds or spec.seeds), sw.keep_budget,
                           sw.keep_data))

    base_cfg = compose(normalize_overrides(base))
    base_budget = base_cfg.federation.rounds * base_cfg.federation.inner_steps
    base_data = base_cfg.data.num_silos * base_cfg.data.episodes_per_silo
    for group, point, key, value, arms, seeds, keep_budget, keep_data in points:
        ov = list(base) + ([f"{key}={value}"] if key else [])
        if keep_budget:
            h = compose(normalize_overrides(ov)).federation.inner_steps
            ov.append(f"federation.rounds={max(1, round(base_budget / h))}")
        if keep_data:
            c = compose(normalize_overrides(ov)).data.num_silos
            ov.append(f"data.episodes_per_silo={max(1, round(base_data / c))}")
        cfg0 = compose(normalize_overrides(ov))
        budget = _budget(cfg0, spec.budget)
        cell = f"{group}/{point}"
        prefix = "" if group == LADDER else f"{group}-{slug(point)}-"
        # A point with another model (a wider encoder) cannot start from the study's warm start: it
        # gets its own, trained like the study's (public data, same steps, same seed scope).
        point_warm: dict[int, str] = {}  # seed -> this point's own warm start (none: the seed's)
        if cfg0.model != base_cfg.model:
            for s in (ws_seeds if spec.warmstart == "study" else seeds):  # only the seeds this point runs
                rid = f"{prefix}warmstart" if spec.warmstart == "study" else f"{prefix}warmstart-s{s}"
                w_ov = drop_keys(ov, FEDERATION_PREFIXES) + [f"root_seed={s}"]
                point_warm[s] = add(PlannedRun(rid, "warmstart", "warmstart", s, w_ov, source="public"), cell)
            if spec.warmstart == "study":
                point_warm = {s: point_warm[spec.seeds[0]] for s in all_seeds}
        arm_runs: dict[str, dict[str, list[str]]] = {}
        replicate_runs: dict[str, dict[str, list[list[str]]]] = {}
        for s in seeds:
            ws = point_warm.get(s)
            for arm in arms:
                for r in range(spec.replicates):
                    ids = _arm_runs(add, cell, prefix, arm, s, r, ov, budget, cfg0.data.num_silos, ws)
                    if r == 0:
                        arm_runs.setdefault(arm, {})[str(s)] = ids
                    if spec.replicates > 1:
                        reps = replicate_runs.setdefault(arm, {}).setdefault(str(s), [])
                        if ids not in reps:  # an arm that trains nothing (warmstart_only) has one replicate
                            reps.append(ids)
        groups.setdefault(group, {})[point] = {
            "key": key, "value": value, "overrides": normalize_overrides(ov), "seeds": seeds,
            "budget": budget, "arms": arm_runs,
            # only with replicates, so a plan without them is the plan of before (arms: replicate 0)
            **({"replicates": replicate_runs} if spec.replicates > 1 else {}),
        }
    configs = {rid: compose(run.overrides) for rid, run in runs.items()}
    return StudyPlan(spec.name, runs, groups, warm, configs)


def _arm_runs(add, cell: str, prefix: str, arm: str, s: int, r: int, ov: list[str], budget: dict, silos: int,
              ws: str | None) -> list[str]:
    """Plan replicate ``r`` of ``arm`` at seed ``s`` in ``cell``; its run ids (one per silo for local).

    Replicate 0 is the run of a study without replicates (its id, overrides and identity); r > 0
    adds ``train.replicate=r`` (another batch order, nothing else) and ``-r<r>`` to the id. The
    warm-start-only arm trains nothing, so every replicate is its one evaluation."""
    seed_ov = [f"root_seed={s}", f"eval.seed={s}"]
    rep_ov, rep_id = ([f"train.replicate={r}"], f"-r{r}") if r else ([], "")
    if arm == "warmstart_only":
        # The warm start scored as it is: nothing trains, the seed's episodes are played.
        single = drop_keys(ov, FEDERATION_PREFIXES) + seed_ov
        return [add(PlannedRun(f"{prefix}warmstart_only-s{s}", "evaluate", arm, s, single,
                               source="warmstart", warmstart=ws), cell)]
    if arm in ("central", "twin", "central_persilo"):
        single = drop_keys(ov, FEDERATION_PREFIXES) + seed_ov + single_overrides(arm, budget) + rep_ov
        return [add(PlannedRun(f"{prefix}{arm}-s{s}{rep_id}", "single", arm, s, single, source="pooled",
                               warmstart=ws), cell)]
    if arm == "local":
        single = drop_keys(ov, FEDERATION_PREFIXES) + seed_ov + single_overrides(arm, budget) + rep_ov
        return [add(PlannedRun(f"{prefix}local-silo{i}-s{s}{rep_id}", "single", arm, s, single,
                               source=f"silo-{i}", silo=i, warmstart=ws), cell) for i in range(silos)]
    fed = ov + arm_overrides(arm) + seed_ov + rep_ov
    return [add(PlannedRun(f"{prefix}{arm}-s{s}{rep_id}", "federated", arm, s, fed, warmstart=ws), cell)]


def estimate_seconds(spec: StudySpec, plan: StudyPlan) -> dict:
    """CPU seconds the runs of ``plan`` should take under ``spec.cost_model`` (planning aid)."""
    cm = spec.cost_model
    per_kind: dict[str, float] = {}
    per_group: dict[str, float] = {}  # a shared run counts in the first cell that needs it
    total = 0.0
    for run in plan.runs.values():
        cfg = plan.configs.get(run.run_id) or load_config(run.overrides)
        group = run.cells[0].split("/", 1)[0] if run.cells else "warmstart"
        if run.kind == "warmstart":
            sec = cfg.train.warmstart_steps * cm.single_step
        elif run.kind == "single":
            # single_step is one step at the study's batch: a wider batch (the twin's) costs in proportion
            base_batch = plan.groups[LADDER]["default"]["budget"]["batch_size"] if LADDER in plan.groups else None
            sec = cfg.train.steps * cm.single_step * (cfg.train.batch_size / base_batch if base_batch else 1.0)
        elif run.kind == "evaluate":
            sec = 0.0
        else:
            per = cm.participant_step.get(run.arm, max(cm.participant_step.values(), default=cm.single_step))
            sec = cfg.federation.rounds * cfg.federation.inner_steps * cfg.data.num_silos * per
        sec *= cm.sweep_step_factor.get(group, 1.0)  # training only: evaluation is added below
        if run.kind != "warmstart":
            sec += cfg.eval.episodes * cm.episode + (cm.ladder if spec.evaluation.ladder else 0.0)
        total += sec
        key = run.kind if run.kind == "warmstart" else f"{run.kind}:{run.arm}"
        per_kind[key] = per_kind.get(key, 0.0) + sec
        per_group[group] = per_group.get(group, 0.0) + sec
    return {"cpu_seconds": round(total), "cpu_hours": round(total / 3600, 2),
            "per_kind_seconds": {k: round(v) for k, v in sorted(per_kind.items())},
            "per_group_hours": {k: round(v / 3600, 2) for k, v in per_group.items()},
            "cost_model": cm.model_dump(mode="json")}


__all__ = ["PER_SILO_OBJECTIVE", "arm_overrides", "single_overrides", "expand_sweep", "normalize_overrides", "overrides_from_config", "plan_study"]
