"""The study: baselines, the ablation ladder and the sweeps, planned, run, resumed and reported.

A study is a preset under ``configs/study/<preset>.yaml`` (see ``docs/study.md``) turned into a
*plan*: one entry per training run, each a list of Hydra overrides. The flow is

1. plan every run (:func:`plan_study`) and write ``plan.json``;
2. write the pre-registration ``registry.yaml`` (:mod:`lensemble.eval.registry`) **before any run**;
   a later change to it needs an amendment with its reason;
3. run what is missing: a run is done exactly when its summary ``runs/<run_id>.json`` exists in the
   study folder, so an interrupted study resumes without redoing finished runs (a federated run
   that died mid-way also resumes from its last committed round, from the scratch folder);
4. analyse the summaries against the registry (:mod:`lensemble.eval.analysis`) and write the
   report (:mod:`lensemble.eval.study_report`).

Arms (every arm of one seed shares one warm start, the seed's silos, probe and evaluation
episodes):

=============  ==========================================================================
``central``    ``train_local(source="pooled")`` from the warm start (upper bound)
``local``      ``train_local(source="silo-<i>")`` from the warm start, one run per silo
``fork_a``     federated, encoder frozen at the warm start (``model.encoder_frozen=true``)
rungs          federated, ``gauge=<rung>``; ``naive`` is also the naive-FedAvg baseline
=============  ==========================================================================

Step budget: a federated participant takes ``rounds × inner_steps`` AdamW steps; with
``budget: per_participant`` (default) every single-site model takes the same number, with
``budget: total`` the centralized model takes ``num_silos ×`` that (the federation's total).

Heavy outputs (checkpoints, data, optimizer state) go to a scratch folder
(``runs/study/<study>/<run_id>/``); the study folder (``docs/results/<study>/``) only receives
small JSON summaries, the registry, the analysis, figures and the report.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lensemble.errors import ConfigError, LensembleError

RUNGS = ("naive", "sketch", "backstop", "anchor", "distill")
BASELINES = ("central", "local", "fork_a")
FEDERATED_ARMS = RUNGS + ("fork_a",)
SINGLE_ARMS = ("central", "local")
ALL_ARMS = ("central", "local") + FEDERATED_ARMS
LADDER = "ladder"
SUMMARY_SCHEMA = 1

# Overrides that only say *where* things go: they never enter a run's identity.
_PATH_KEYS = ("run_dir", "data.root", "data.workers", "federation.warmstart", "federation.state_dir")
# (data.workers only sets collection parallelism: the collected bytes do not depend on it.)
# Keys a single-site run ignores (its identity must not depend on them, so sweeps over them share it).
_FEDERATION_PREFIXES = ("gauge", "federation", "privacy")


# ================================================================================== the preset
class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SweepSpec(_Spec):
    """One sweep: a Hydra multirun override and the arms run at each of its values."""

    override: str = Field(description="one Hydra multirun override, e.g. 'gauge.lambda_anc=0.1,0.3,1'")
    arms: list[str]
    seeds: list[int] | None = Field(None, description="default: the study's seeds")
    keep_budget: bool = Field(False, description="federation.inner_steps sweeps: rounds = budget / H")
    description: str = ""

    @model_validator(mode="after")
    def _check(self):
        bad = [a for a in self.arms if a not in ALL_ARMS]
        if bad:
            raise ValueError(f"unknown arms {bad}; use {list(ALL_ARMS)}")
        return self


class EvaluationSpec(_Spec):
    """How ``evaluate`` is called on every final model (the protocol itself is ``cfg.eval``)."""

    split: Literal["heldout", "factor"] = "heldout"
    parallel: int = Field(8, ge=1)
    ladder: bool = True
    intervention_pairs: int = Field(32, ge=1)
    max_probe_frames: int = Field(4096, ge=16)


class DeltaSpec(_Spec):
    """Registered effect sizes δ (smallest effects the claims assert)."""

    drift_deg: float = Field(10.0, gt=0, description="frame-drift angle difference, degrees")
    success: float = Field(0.10, gt=0, description="success-rate difference (0.10 = 10 points)")
    effective_dim: float = Field(2.0, gt=0, description="effective-dimension difference")


class PlanningSpec(_Spec):
    """Assumptions of the power analysis (set them from a pilot, before the study)."""

    baseline_success: float = Field(0.25, gt=0, lt=1)
    sd_train_success: float = Field(0.04, ge=0, description="seed-to-seed SD of an arm's true success")
    sd_drift_deg: float = Field(5.0, ge=0, description="SD of the per-seed drift difference")
    sd_effective_dim: float = Field(2.0, ge=0, description="SD of the per-seed effective-dim difference")


class RegistrySpec(_Spec):
    """What the registry pre-registers about the analysis."""

    alpha: float = Field(0.05, gt=0, lt=1)
    power: float = Field(0.8, gt=0, lt=1)
    alternative: Literal["one-sided", "two-sided"] = "one-sided"
    n_boot: int = Field(10_000, ge=100)
    anchored_rung: str = "anchor"
    rho_threshold: float = Field(0.5, gt=0, le=1, description="claim 3: ρ must reach this")
    local_reference: Literal["mean", "best"] = "mean"
    min_seeds: int = Field(3, ge=2, description="fewer paired seeds than this: inconclusive, whatever the interval")
    delta: DeltaSpec = DeltaSpec()
    planning: PlanningSpec = PlanningSpec()
    claim4_sweeps: list[str] = Field(default_factory=lambda: ["severity", "participants"])


class CostModel(_Spec):
    """CPU seconds per unit of work, for planning (``plan_only`` prints the estimate).

    Defaults: measured on the 2-core development box with one torch thread, CPU model preset
    (64 px, ViT 128×3, d = 64, batch 64). Scale them for another model or machine.
    """

    single_step: float = Field(0.5, ge=0, description="one train_local step")
    participant_step: dict[str, float] = Field(default_factory=lambda: {
        "naive": 0.54, "sketch": 0.56, "backstop": 0.8, "anchor": 0.8, "distill": 1.5, "fork_a": 0.4})
    episode: float = Field(4.5, ge=0, description="one closed-loop MPC episode (CEM 300×30, 8 in parallel)")
    ladder: float = Field(14.0, ge=0, description="the evaluation ladder of one model, with its set-up")


class StudySpec(_Spec):
    """A study preset (``configs/study/<preset>.yaml``), validated."""

    name: str
    description: str = ""
    overrides: list[str] = Field(default_factory=list, description="Hydra overrides of every run")
    seeds: list[int] = Field(min_length=1)
    warmstart: Literal["study", "seed"] = "study"
    budget: Literal["per_participant", "total"] = "per_participant"
    rungs: list[str] = Field(default_factory=lambda: list(RUNGS))
    baselines: list[str] = Field(default_factory=lambda: list(BASELINES))
    sweeps: dict[str, SweepSpec] = Field(default_factory=dict)
    evaluation: EvaluationSpec = EvaluationSpec()
    registry: RegistrySpec = RegistrySpec()
    cost_model: CostModel = CostModel()

    @model_validator(mode="after")
    def _check(self):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise ValueError(f"study name {self.name!r}: use letters, digits, '.', '_' or '-'")
        if bad := [r for r in self.rungs if r not in RUNGS]:
            raise ValueError(f"unknown rungs {bad}; use {list(RUNGS)}")
        if bad := [b for b in self.baselines if b not in BASELINES]:
            raise ValueError(f"unknown baselines {bad}; use {list(BASELINES)} (naive FedAvg is rung 'naive')")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be distinct")
        if self.registry.anchored_rung not in RUNGS:
            raise ValueError(f"registry.anchored_rung must be a rung, got {self.registry.anchored_rung!r}")
        for key in self.sweeps:
            if not re.fullmatch(r"[A-Za-z0-9_]+", key):
                raise ValueError(f"sweep name {key!r}: use letters, digits and '_'")
        return self

    def ladder_arms(self) -> list[str]:
        """Arms of the ladder group, in report order: baselines, then the rungs."""
        arms = [a for a in ("central", "local") if a in self.baselines]
        arms += [r for r in RUNGS if r in self.rungs]
        if "fork_a" in self.baselines:
            arms.append("fork_a")
        return arms


def preset_path(preset: str | Path) -> Path:
    """``configs/study/<preset>.yaml``, or ``preset`` itself when it is a YAML file."""
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
    from lensemble.config.loader import config_dir

    path = config_dir() / "study" / f"{preset}.yaml"
    if not path.is_file():
        known = sorted(x.stem for x in (config_dir() / "study").glob("*.yaml"))
        raise ConfigError(f"no study preset {preset!r}", remediation=f"use one of {known} or a YAML file path")
    return path


def load_study_spec(
    preset: str | Path,
    study_overrides: Sequence[str] = (),
    *,
    name: str | None = None,
    seeds: Sequence[int] | None = None,
    sweeps: Sequence[str] | None = None,
    run_overrides: Sequence[str] = (),
) -> StudySpec:
    """Read a preset, apply ``study.*`` dotted overrides (prefix stripped) and the explicit arguments.

    ``sweeps``: None keeps the preset's sweeps, ``[]`` or ``["none"]`` drops them all, otherwise
    keeps the named ones. ``run_overrides`` are appended to the preset's ``overrides``.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = preset_path(preset)
    try:
        conf = OmegaConf.load(path)
        if study_overrides:
            conf = OmegaConf.merge(conf, OmegaConf.from_dotlist(list(study_overrides)))
        raw = OmegaConf.to_container(conf, resolve=True)
    except (OmegaConfBaseException, ValueError) as exc:
        raise ConfigError(f"cannot read study preset {path}: {exc}",
                          remediation="check the YAML and the study.* overrides") from None
    raw = dict(raw or {})
    raw.setdefault("name", Path(path).stem)
    if name:
        raw["name"] = name
    if seeds is not None:
        raw["seeds"] = [int(s) for s in seeds]
    if sweeps is not None:
        wanted = [s for s in sweeps if s and s != "none"]
        have = raw.get("sweeps") or {}
        if missing := [s for s in wanted if s not in have]:
            raise ConfigError(f"the preset has no sweeps {missing}", remediation=f"choose among {sorted(have)}")
        raw["sweeps"] = {k: v for k, v in have.items() if k in wanted}
    raw["overrides"] = list(raw.get("overrides") or []) + list(run_overrides)
    try:
        return StudySpec.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"invalid study preset {path}: {problems}",
                          remediation="fix the preset or the study.* overrides") from None


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


def _drop_keys(overrides: Sequence[str], prefixes: Sequence[str]) -> list[str]:
    def hit(key: str) -> bool:
        k = key.lstrip("+~")
        return any(k == p or k.startswith(p + ".") for p in prefixes)

    return [o for o in overrides if not hit(_key(o))]


def expand_sweep(override: str) -> tuple[str, list[str]]:
    """(key, values) of one Hydra multirun override, expanded with Hydra's own parser.

    ``"gauge.lambda_anc=0.1,0.3"`` -> ``("gauge.lambda_anc", ["0.1", "0.3"])``; ``range(...)``,
    ``choice(...)`` and ``interval``-free sweeps work as in ``-m`` runs.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

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


def _is_sweep(override: str) -> bool:
    """Whether ``override`` is a Hydra multirun override (``key=a,b``, ``key=range(...)``, ...)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        (parsed,) = OverridesParser.create().parse_overrides([override])
    except (HydraException, ValueError):
        return False
    return parsed.is_sweep_override()


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


# Set per run by the study (seed, output folders), never copied from a base config.
_PER_RUN_FIELDS = ("root_seed", "run_dir", "federation.warmstart", "federation.state_dir")
# The flags that define an arm (rung presets and Fork A); never copied from a base config.
_ARM_FIELDS = {"gauge.rung", "gauge.shared_sketch", "gauge.backstop", "gauge.anchor", "gauge.lambda_anc",
               "gauge.distill", "model.encoder_frozen"}


def overrides_from_config(cfg) -> list[str]:
    """Dotted overrides that rebuild ``cfg`` on top of the root config, arm flags excepted.

    Lets :func:`run_ablation_ladder` take a composed ``LensembleConfig``: every leaf is pinned
    except the gauge flags of the rung presets and ``model.encoder_frozen`` (the arms set those),
    the root seed (the study's seeds set it) and the per-run folders.
    """
    out = []

    def walk(prefix: str, node):
        for k, v in node.items():
            path = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(path + ".", v)
            elif path not in _ARM_FIELDS and path not in _PER_RUN_FIELDS:
                out.append(f"{path}={_hydra_value(v)}")

    walk("", cfg.model_dump(mode="json"))
    return out


def arm_overrides(arm: str) -> list[str]:
    """The overrides that make ``arm`` out of a base config."""
    if arm in RUNGS:
        return [f"gauge={arm}"]
    if arm == "fork_a":
        return ["gauge=naive", "model.encoder_frozen=true"]
    return []


# ================================================================================== the plan
@dataclass
class PlannedRun:
    """One training run (and the evaluation of its final model)."""

    run_id: str
    kind: Literal["warmstart", "single", "federated"]
    arm: str
    seed: int
    overrides: list[str]
    source: str | None = None        # train_local source for single-site runs
    silo: int | None = None
    spec_hash: str = ""
    cells: list[str] = field(default_factory=list)   # "<group>/<point>" that use this run


@dataclass
class StudyPlan:
    """Every run of a study, in execution order, and the cells (group, point) they fill."""

    name: str
    runs: dict[str, PlannedRun]
    # group -> point -> {"key", "value", "overrides", "seeds", "budget", "arms": {arm: {seed: [run_id]}}}
    groups: dict[str, dict[str, dict]]
    warmstart: dict[int, str]   # seed -> warm-start run id (a study-level warm start maps every seed)
    configs: dict[str, object] = field(default_factory=dict, repr=False)  # run id -> composed config

    def to_json(self) -> dict:
        return {"schema_version": 1, "study": self.name,
                "runs": {k: asdict(v) for k, v in self.runs.items()},
                "groups": self.groups, "warmstart": {str(k): v for k, v in self.warmstart.items()}}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def _identity(cfg) -> dict:
    """The composed config minus the settings that only say where things go."""
    d = cfg.model_dump(mode="json")
    for path in _PATH_KEYS:
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
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _budget(cfg, rule: str) -> dict:
    per = cfg.federation.rounds * cfg.federation.inner_steps
    return {"rule": rule, "rounds": cfg.federation.rounds, "inner_steps": cfg.federation.inner_steps,
            "participants": cfg.data.num_silos, "participant_steps": per,
            "central_steps": per * (cfg.data.num_silos if rule == "total" else 1), "local_steps": per,
            "batch_size": cfg.train.batch_size}


def plan_study(spec: StudySpec) -> StudyPlan:
    """Turn a study spec into runs. Runs with the same identity (kind, data source, composed
    config, evaluation settings) are planned once and shared by every cell that needs them: a
    sweep value equal to the ladder's setting, or the single-site baselines of an H or λ sweep,
    cost nothing extra. Every config is composed and validated here, before anything runs."""
    from lensemble.config import load_config

    runs: dict[str, PlannedRun] = {}
    by_hash: dict[str, str] = {}
    groups: dict[str, dict[str, dict]] = {}
    base = list(spec.overrides)

    composed: dict[tuple[str, ...], object] = {}

    def compose(overrides: list[str]):
        # Seeds differ between otherwise identical runs: compose once without them (Hydra is slow),
        # then set the two integer leaves, which no validator of the config looks at.
        seeds = {_key(o): int(o.split("=", 1)[1]) for o in overrides if _key(o) in ("root_seed", "eval.seed")}
        key = tuple(o for o in overrides if _key(o) not in seeds)
        if key not in composed:
            composed[key] = load_config(list(key))  # validates every run before anything runs
        cfg = composed[key]
        if seeds:
            cfg = cfg.model_copy(update={
                "root_seed": seeds.get("root_seed", cfg.root_seed),
                "eval": cfg.eval.model_copy(update={"seed": seeds.get("eval.seed", cfg.eval.seed)})})
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
        ov = _drop_keys(base, _FEDERATION_PREFIXES) + [f"root_seed={s}"]
        warm[s] = add(PlannedRun(rid, "warmstart", "warmstart", s, ov, source="public"), "")
    if spec.warmstart == "study":
        warm = {s: warm[spec.seeds[0]] for s in all_seeds}
    elif missing := [s for s in all_seeds if s not in warm]:
        raise ConfigError(f"sweep seeds {missing} are not study seeds; a per-seed warm start needs them in seeds")

    points: list[tuple[str, str, str | None, str | None, list[str], list[int], bool]] = [
        (LADDER, "default", None, None, spec.ladder_arms(), list(spec.seeds), False)]
    for sname, sw in spec.sweeps.items():
        key, values = expand_sweep(sw.override)
        for v in values:
            points.append((sname, v, key, v, list(sw.arms), list(sw.seeds or spec.seeds), sw.keep_budget))

    base_cfg = compose(normalize_overrides(base))
    base_budget = base_cfg.federation.rounds * base_cfg.federation.inner_steps
    for group, point, key, value, arms, seeds, keep_budget in points:
        ov = list(base) + ([f"{key}={value}"] if key else [])
        if keep_budget:
            h = compose(normalize_overrides(ov)).federation.inner_steps
            ov.append(f"federation.rounds={max(1, round(base_budget / h))}")
        cfg0 = compose(normalize_overrides(ov))
        budget = _budget(cfg0, spec.budget)
        cell = f"{group}/{point}"
        prefix = "" if group == LADDER else f"{group}-{_slug(point)}-"
        arm_runs: dict[str, dict[str, list[str]]] = {}
        for s in seeds:
            seed_ov = [f"root_seed={s}", f"eval.seed={s}"]
            for arm in arms:
                ids: list[str] = []
                if arm == "central":
                    single = _drop_keys(ov, _FEDERATION_PREFIXES) + seed_ov + [f"train.steps={budget['central_steps']}"]
                    ids.append(add(PlannedRun(f"{prefix}central-s{s}", "single", arm, s, single, source="pooled"), cell))
                elif arm == "local":
                    single = _drop_keys(ov, _FEDERATION_PREFIXES) + seed_ov + [f"train.steps={budget['local_steps']}"]
                    for i in range(cfg0.data.num_silos):
                        ids.append(add(PlannedRun(f"{prefix}local-silo{i}-s{s}", "single", arm, s, single,
                                                  source=f"silo-{i}", silo=i), cell))
                else:
                    fed = ov + arm_overrides(arm) + seed_ov
                    ids.append(add(PlannedRun(f"{prefix}{arm}-s{s}", "federated", arm, s, fed), cell))
                arm_runs.setdefault(arm, {})[str(s)] = ids
        groups.setdefault(group, {})[point] = {
            "key": key, "value": value, "overrides": normalize_overrides(ov), "seeds": seeds,
            "budget": budget, "arms": arm_runs,
        }
    configs = {rid: compose(run.overrides) for rid, run in runs.items()}
    return StudyPlan(spec.name, runs, groups, warm, configs)


# ================================================================================== summaries
def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _finite(x):
    """JSON-safe scalar: NaN/inf become None."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, (int,)):
        return int(x)
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _scalars(d: dict) -> dict:
    return {k: _finite(v) for k, v in d.items() if isinstance(v, (int, float, bool, str)) or v is None}


def summary_path(study_dir: Path, run_id: str) -> Path:
    return Path(study_dir) / "runs" / f"{run_id}.json"


def load_summaries(study_dir: str | Path) -> dict[str, dict]:
    """Every finished run's summary in the study folder, by run id."""
    out = {}
    for p in sorted((Path(study_dir) / "runs").glob("*.json")):
        if p.name.endswith(".failed.json"):
            continue
        out[p.stem] = json.loads(p.read_text())
    return out


def load_failures(study_dir: str | Path) -> dict[str, dict]:
    return {p.name[: -len(".failed.json")]: json.loads(p.read_text())
            for p in sorted((Path(study_dir) / "runs").glob("*.failed.json"))}


def _manifest_git_sha(run_dir: Path) -> str | None:
    """The code commit a run recorded in its manifest (``+dirty`` when tracked files had changed)."""
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("git_sha")


# ================================================================================== execution
class _Runner:
    """Executes planned runs into scratch folders and writes their summaries."""

    def __init__(self, spec: StudySpec, plan: StudyPlan, study_dir: Path, scratch: Path, progress: bool):
        self.spec, self.plan, self.study_dir, self.scratch, self.progress = spec, plan, study_dir, scratch, progress
        self._warm_ckpt: dict[str, str] = {}

    def run_dir(self, run_id: str) -> Path:
        return self.scratch / run_id

    # -- warm start
    def warmstart_checkpoint(self, run_id: str) -> str:
        """The warm start's checkpoint folder, training it if its scratch folder is gone (then
        its hash must equal the recorded one, or the arms of this study would not share it)."""
        if run_id in self._warm_ckpt:
            return self._warm_ckpt[run_id]
        from lensemble.artifacts.checkpoint import read_header

        recorded = summary_path(self.study_dir, run_id)
        if recorded.exists():
            rec = json.loads(recorded.read_text())
            folder = self.run_dir(run_id) / rec["checkpoint_rel"]
            if (folder / "header.json").exists() and read_header(folder)["content_hash"] == rec["checkpoint_hash"]:
                self._warm_ckpt[run_id] = str(folder)
                return str(folder)
            summary = self._execute(self.plan.runs[run_id])
            if summary["checkpoint_hash"] != rec["checkpoint_hash"]:
                raise ConfigError(
                    f"the retrained warm start {run_id} hashes to {summary['checkpoint_hash'][:12]}…, the study "
                    f"recorded {rec['checkpoint_hash'][:12]}…: runs done so far used another warm start",
                    remediation=f"restore {self.run_dir(run_id)} or start a new study name")
        else:
            summary = self._execute(self.plan.runs[run_id])
            _atomic_write(recorded, json.dumps(summary, indent=1, sort_keys=True))
        folder = self.run_dir(run_id) / summary["checkpoint_rel"]
        self._warm_ckpt[run_id] = str(folder)
        return str(folder)

    # -- one run
    def _execute(self, run: PlannedRun) -> dict:
        from lensemble.config import load_config

        rd = self.run_dir(run.run_id)
        started = time.perf_counter()
        seconds: dict[str, float] = {}
        summary: dict = {
            "schema_version": SUMMARY_SCHEMA, "study": self.spec.name, "run_id": run.run_id, "kind": run.kind,
            "arm": run.arm, "seed": run.seed, "silo": run.silo, "source": run.source,
            "overrides": run.overrides, "spec_hash": run.spec_hash, "cells": run.cells,
        }
        if run.kind == "warmstart":
            from lensemble.training.warmstart import train_warmstart

            cfg = load_config(run.overrides + [f"run_dir={rd}"])
            res = train_warmstart(cfg, run_dir=rd, progress=False)
            summary.update(self._single_fields(cfg, res, rd))
            summary["git_sha"] = _manifest_git_sha(rd)
            summary["seconds"] = {"train": round(time.perf_counter() - started, 2)}
            summary["finished_at"] = _now()
            return summary

        ws = self.warmstart_checkpoint(self.plan.warmstart[run.seed])
        if run.kind == "single":
            from lensemble.training.trainer import train_local

            cfg = load_config(run.overrides + [f"run_dir={rd}"])
            res = train_local(cfg, source=run.source, run_dir=rd, init_checkpoint=ws, progress=False)
            summary.update(self._single_fields(cfg, res, rd))
            ckpt = res.checkpoint_dir
        else:
            from lensemble.artifacts.manifest import RunManifest
            from lensemble.federation.inprocess import run_inprocess

            cfg = load_config(run.overrides + [f"run_dir={rd}", f"federation.warmstart={ws}"])
            fed = run_inprocess(cfg, rd, progress=False)
            manifest = RunManifest.model_validate_json((rd / "manifest.json").read_text())
            ckpt = fed["final_checkpoint"]
            summary.update({
                "config_hash": cfg.config_hash(), "manifest_hash": manifest.manifest_hash(),
                "checkpoint_hash": fed["final_hash"], "warmstart_hash": fed["warmstart_hash"],
                "probe_hash": fed["probe_hash"], "rounds_completed": fed["rounds_completed"],
                "rounds": [_scalars(r) for r in fed["rounds"]],
                "steps": {"rounds": cfg.federation.rounds, "inner_steps": cfg.federation.inner_steps,
                          "participant_steps": cfg.federation.rounds * cfg.federation.inner_steps,
                          "participants": cfg.data.num_silos},
            })
        summary["git_sha"] = _manifest_git_sha(rd)
        seconds["train"] = round(time.perf_counter() - started, 2)
        t_eval = time.perf_counter()
        summary["eval"] = self._evaluate(ckpt, cfg)
        seconds["eval"] = round(time.perf_counter() - t_eval, 2)
        seconds["total"] = round(time.perf_counter() - started, 2)
        summary["seconds"] = seconds
        summary["finished_at"] = _now()
        return summary

    @staticmethod
    def _single_fields(cfg, res, rd: Path) -> dict:
        from lensemble.artifacts.checkpoint import read_header

        header = read_header(res.checkpoint_dir)
        return {
            "config_hash": cfg.config_hash(), "manifest_hash": res.manifest_hash,
            "checkpoint_hash": res.checkpoint_hash, "checkpoint_rel": str(Path(res.checkpoint_dir).relative_to(rd)),
            "warmstart_hash": header.get("parent_hash"),
            "probe_hash": (header.get("extra") or {}).get("data", {}).get("probe_hash"),
            "steps": {"train_steps": cfg.train.steps, "batch_size": cfg.train.batch_size},
            "train": _scalars(res.final_metrics),
        }

    def _evaluate(self, checkpoint, cfg) -> dict:
        from lensemble.eval.harness import evaluate
        from lensemble.eval.ladder import LadderSettings

        ev = self.spec.evaluation
        report = evaluate(checkpoint, cfg.env.id, cfg=cfg, split=ev.split, progress=False, ladder=ev.ladder,
                          parallel=ev.parallel,
                          ladder_settings=LadderSettings(intervention_pairs=ev.intervention_pairs,
                                                         max_probe_frames=ev.max_probe_frames))
        return json.loads(report.to_json())

    def run(self, run: PlannedRun) -> dict:
        if run.kind == "warmstart":
            self.warmstart_checkpoint(run.run_id)
            return json.loads(summary_path(self.study_dir, run.run_id).read_text())
        summary = self._execute(run)
        _atomic_write(summary_path(self.study_dir, run.run_id), json.dumps(summary, indent=1, sort_keys=True))
        failed = summary_path(self.study_dir, run.run_id).with_name(f"{run.run_id}.failed.json")
        failed.unlink(missing_ok=True)
        return summary


@dataclass
class StudyResult:
    """What :func:`run_study` did and where it left things."""

    study_dir: Path
    planned: int
    executed: int
    skipped: int
    failed: dict[str, str]
    analysis: dict | None
    report: Path | None


def _check_done(plan: StudyPlan, done: dict[str, dict]) -> None:
    changed = [rid for rid, s in done.items() if rid in plan.runs and s.get("spec_hash") != plan.runs[rid].spec_hash]
    if changed:
        raise ConfigError(
            f"{len(changed)} finished runs were made with other settings than this plan ({', '.join(changed[:4])}"
            f"{', …' if len(changed) > 4 else ''}): mixing them would break the study's pairing",
            remediation="undo the change, or run it as a new study (--name), or delete those summaries to redo them")


def estimate_seconds(spec: StudySpec, plan: StudyPlan) -> dict:
    """CPU seconds the runs of ``plan`` should take under ``spec.cost_model`` (planning aid)."""
    from lensemble.config import load_config

    cm = spec.cost_model
    per_kind: dict[str, float] = {}
    total = 0.0
    for run in plan.runs.values():
        cfg = plan.configs.get(run.run_id) or load_config(run.overrides)
        if run.kind == "warmstart":
            sec = cfg.train.warmstart_steps * cm.single_step
        elif run.kind == "single":
            sec = cfg.train.steps * cm.single_step
        else:
            per = cm.participant_step.get(run.arm, max(cm.participant_step.values(), default=cm.single_step))
            sec = cfg.federation.rounds * cfg.federation.inner_steps * cfg.data.num_silos * per
        if run.kind != "warmstart":
            sec += cfg.eval.episodes * cm.episode + (cm.ladder if spec.evaluation.ladder else 0.0)
        total += sec
        key = run.kind if run.kind == "warmstart" else f"{run.kind}:{run.arm}"
        per_kind[key] = per_kind.get(key, 0.0) + sec
    return {"cpu_seconds": round(total), "cpu_hours": round(total / 3600, 2),
            "per_kind_seconds": {k: round(v) for k, v in sorted(per_kind.items())},
            "cost_model": cm.model_dump(mode="json")}


def rebuild_report(study_dir: str | Path, *, progress: bool = True) -> tuple[dict, Path]:
    """Analysis and report from a study folder alone (registry, plan and run summaries)."""
    from lensemble.eval.analysis import analyze
    from lensemble.eval.study_report import write_report

    study_dir = Path(study_dir)
    for need in ("registry.yaml", "plan.json"):
        if not (study_dir / need).exists():
            raise ConfigError(f"{study_dir} holds no {need}", remediation="run the study first")
    analysis = analyze(study_dir)
    report = write_report(study_dir, analysis)
    _Say(progress)(f"report: {report}")
    return analysis, report


def run_study(
    spec: StudySpec,
    *,
    out: str | Path = "docs/results",
    scratch: str | Path | None = None,
    progress: bool = True,
    amend: str | None = None,
    plan_only: bool = False,
    report_only: bool = False,
    keep_going: bool = True,
    jobs: int = 1,
) -> StudyResult:
    """Plan, register, run what is missing, analyse and report one study (see the module doc).

    Args:
        spec: the study (:func:`load_study_spec`).
        out: parent of the study folder (``<out>/<spec.name>/``: registry, summaries, report).
        scratch: parent of the heavy run folders (default ``runs/study/<spec.name>``).
        amend: the reason for changing the registry after runs have finished; required then.
        plan_only: write ``plan.json`` and ``registry.yaml``, print the cost estimate and stop.
        report_only: rebuild the analysis and report from the study folder; plan and run nothing.
        keep_going: a run that fails (not fail-closed) is recorded in ``runs/<id>.failed.json``
            and the study goes on; it is retried on the next call.
        jobs: runs executed at once in worker processes (one torch thread each). Warm starts
            and data collection happen first, in this process, so workers never race on them.
    """
    from lensemble.eval.registry import build_registry, sync_registry

    study_dir = Path(out) / spec.name
    if report_only:
        analysis, report = rebuild_report(study_dir, progress=progress)
        n = analysis["status"]["planned"]
        return StudyResult(study_dir, n, 0, analysis["status"]["done"], {}, analysis, report)
    if isinstance(jobs, bool) or int(jobs) != jobs or jobs < 1:
        raise ConfigError(f"jobs must be a positive integer, got {jobs!r}")
    scratch_dir = Path(scratch) if scratch is not None else Path("runs") / "study" / spec.name
    study_dir.mkdir(parents=True, exist_ok=True)
    plan = plan_study(spec)
    done = {k: v for k, v in load_summaries(study_dir).items() if k in plan.runs}
    _check_done(plan, done)
    registry = build_registry(spec, plan)
    estimate = estimate_seconds(spec, plan)
    # Insertion order is meaningful here (arms in ladder order, sweep values as given): no sort_keys.
    _atomic_write(study_dir / "plan.json", json.dumps({**plan.to_json(), "estimate": estimate}, indent=1))
    sync_registry(study_dir, registry, runs_done=len(done), amend=amend)
    todo = [r for r in plan.runs.values() if r.run_id not in done]
    say = _Say(progress)
    left_est = sum(estimate["per_kind_seconds"].values()) * (len(todo) / max(len(plan.runs), 1))
    say(f"study [bold]{spec.name}[/]: {len(plan.runs)} runs planned, {len(done)} done, {len(todo)} left "
        f"(≈ {estimate['cpu_hours']} CPU-hours in all, ≈ {left_est / 3600 / jobs:.1f} h left at jobs={jobs})"
        + (" — registry amended" if amend and done else ""))
    failed: dict[str, str] = {}
    executed = 0
    if not plan_only and todo:
        executed, failed = _execute(spec, plan, todo, len(done), study_dir, scratch_dir, progress=progress,
                                    keep_going=keep_going, jobs=int(jobs))
    analysis = report = None
    if not plan_only:
        analysis, report = rebuild_report(study_dir, progress=progress)
    return StudyResult(study_dir, len(plan.runs), executed, len(done), failed, analysis, report)


def _execute(spec, plan, todo, n_done, study_dir, scratch_dir, *, progress, keep_going, jobs) -> tuple[int, dict]:
    """Run ``todo`` (serially, or ``jobs`` at a time); return (runs executed, {run_id: error})."""
    from lensemble.observability.progress import progress_bar

    runner = _Runner(spec, plan, study_dir, scratch_dir, progress)
    say = _Say(progress)
    failed: dict[str, str] = {}
    executed = 0
    with progress_bar(f"study {spec.name}", n_done + len(todo), enabled=progress) as advance:
        advance(n_done, info=f"{n_done} done, {len(todo)} left")

        def finished(run, summary, error, seconds, remaining):
            nonlocal executed
            if error is None:
                executed += 1
                ok = (summary or {}).get("eval", {}).get("success_rate")
                say(f"  {run.run_id}: {seconds:.1f} s" + (f", success {ok:.2f}" if isinstance(ok, (int, float)) else ""))
            else:
                failed[run.run_id] = error
            advance(1, info=f"{n_done + executed} done, {len(failed)} failed, {remaining} left")

        def guarded(run, fn):
            started = time.perf_counter()
            try:
                summary = fn()
            except LensembleError as exc:
                if exc.fail_closed or not keep_going:
                    raise
                return None, _record_failure(study_dir, run, exc), time.perf_counter() - started
            except Exception as exc:  # a bug in one run must not cost the finished ones
                if not keep_going:
                    raise
                return None, _record_failure(study_dir, run, exc), time.perf_counter() - started
            return summary, None, time.perf_counter() - started

        serial = todo if jobs == 1 else [r for r in todo if r.kind == "warmstart"]
        for run in serial:
            advance(0, info=f"running {run.run_id}")
            summary, error, secs = guarded(run, lambda run=run: runner.run(run))
            finished(run, summary, error, secs, len(todo) - executed - len(failed) - 1)
        if jobs == 1:
            return executed, failed

        rest = [r for r in todo if r.kind != "warmstart"]
        # The warm starts every worker reads are made here first, serially.
        warm = {}
        for rid in sorted({plan.warmstart[r.seed] for r in rest}):
            summary, error, _ = guarded(plan.runs[rid], lambda rid=rid: runner.warmstart_checkpoint(rid))
            if error is None:
                warm[rid] = summary
        ready = [r for r in rest if plan.warmstart[r.seed] in warm]
        for r in rest:
            if r not in ready:
                finished(r, None, f"warm start {plan.warmstart[r.seed]} failed", 0.0, 0)
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        ctx = multiprocessing.get_context("spawn")
        payload = {"spec": spec.model_dump(mode="json"), "warmstart": {str(k): v for k, v in plan.warmstart.items()},
                   "warm": warm, "study_dir": str(study_dir), "scratch": str(scratch_dir)}
        # A sliding window of `jobs` runs in flight, in plan order (the ladder before the sweeps). The
        # parent collects a run's data just before submitting it, so two workers never race on one data
        # folder, and a study stopped early has not spent CPU collecting data for runs it never reached.
        queue = list(ready)
        seen_data: set = set()
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init) as pool:
            in_flight: dict = {}

            def submit_next() -> None:
                while queue and len(in_flight) < jobs:
                    run = queue.pop(0)
                    _prepare_data(run, plan.configs, seen_data)
                    in_flight[pool.submit(_worker_run, payload, asdict(run))] = run

            try:
                submit_next()
                while in_flight:
                    finished_now, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
                    for fut in finished_now:
                        run = in_flight.pop(fut)
                        status, data, secs = fut.result()
                        remaining = len(queue) + len(in_flight)
                        if status == "ok":
                            finished(run, data, None, secs, remaining)
                        elif status == "fail-closed" or not keep_going:
                            raise _rebuild_error(data)
                        else:
                            finished(run, None, _record_failure(study_dir, run, None, text=data["text"],
                                                                tb=data["traceback"]), secs, remaining)
                    submit_next()
            except BaseException:
                for f in in_flight:
                    f.cancel()
                raise
    return executed, failed


def _prepare_data(run: PlannedRun, configs: dict, seen: set) -> None:
    """Collect (or verify) ``run``'s data folder unless ``seen`` already holds it; then add it."""
    from lensemble.config import load_config
    from lensemble.data.store import data_dir, ensure_data

    cfg = configs.get(run.run_id) or load_config(run.overrides)
    folder = data_dir(cfg)
    if folder not in seen:
        seen.add(folder)
        ensure_data(cfg, progress=False)


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


def _worker_run(payload: dict, run: dict) -> tuple[str, dict, float]:
    """One run in a worker process: ("ok", summary, s) or ("failed" | "fail-closed", error, s)."""
    started = time.perf_counter()
    spec = StudySpec.model_validate(payload["spec"])
    plan = StudyPlan(spec.name, {}, {}, {int(k): v for k, v in payload["warmstart"].items()})
    runner = _Runner(spec, plan, Path(payload["study_dir"]), Path(payload["scratch"]), False)
    runner._warm_ckpt.update(payload["warm"])
    try:
        summary = runner.run(PlannedRun(**run))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which decides
        closed = isinstance(exc, LensembleError) and exc.fail_closed
        return ("fail-closed" if closed else "failed",
                {"type": type(exc).__name__, "text": f"{type(exc).__name__}: {exc}",
                 "traceback": traceback.format_exc(limit=6)[-4000:]}, time.perf_counter() - started)
    return "ok", summary, time.perf_counter() - started


def _rebuild_error(data: dict) -> LensembleError:
    from lensemble import errors

    cls = getattr(errors, data.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, LensembleError)):
        cls = LensembleError
    return cls(data["text"] + "\n" + data.get("traceback", ""))


def _record_failure(study_dir: Path, run: PlannedRun, exc: BaseException | None, *, text: str | None = None,
                    tb: str | None = None) -> str:
    text = text or f"{type(exc).__name__}: {exc}"
    _atomic_write(summary_path(study_dir, run.run_id).with_name(f"{run.run_id}.failed.json"), json.dumps({
        "run_id": run.run_id, "arm": run.arm, "seed": run.seed, "error": text, "at": _now(),
        "traceback": tb or traceback.format_exc(limit=6)[-4000:],
    }, indent=1))
    print(f"run {run.run_id} failed: {text}", file=sys.stderr, flush=True)
    return text


class _Say:
    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str) -> None:
        if self.enabled:
            from rich.console import Console

            Console(stderr=True).print(text)


# ================================================================================== public API
def _spec_from_config(cfg, *, name: str, seeds, rungs, baselines, sweeps, evaluation, registry) -> StudySpec:
    return StudySpec(
        name=name, overrides=overrides_from_config(cfg), seeds=list(seeds), rungs=list(rungs),
        baselines=list(baselines), sweeps=sweeps or {}, evaluation=evaluation or EvaluationSpec(),
        registry=registry or RegistrySpec(),
    )


def run_ablation_ladder(
    cfg,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    name: str = "ladder",
    rungs: Sequence[str] = RUNGS,
    baselines: Sequence[str] = BASELINES,
    sweeps: dict[str, SweepSpec] | None = None,
    evaluation: EvaluationSpec | None = None,
    registry: RegistrySpec | None = None,
    out: str | Path = "docs/results",
    scratch: str | Path | None = None,
    progress: bool = True,
    amend: str | None = None,
    jobs: int = 1,
) -> StudyResult:
    """The baselines and the five rungs on ``cfg`` (a ``LensembleConfig`` or a list of Hydra
    overrides), paired over ``seeds``, then the claims analysis and the report.

    Every arm of a seed shares the warm start, silos, probe and evaluation episodes; the rung
    flags and ``model.encoder_frozen`` of ``cfg`` are ignored (the arms set them).
    """
    if isinstance(cfg, (list, tuple)):
        spec = StudySpec(name=name, overrides=list(cfg), seeds=list(seeds), rungs=list(rungs),
                         baselines=list(baselines), sweeps=sweeps or {}, evaluation=evaluation or EvaluationSpec(),
                         registry=registry or RegistrySpec())
    else:
        spec = _spec_from_config(cfg, name=name, seeds=seeds, rungs=rungs, baselines=baselines, sweeps=sweeps,
                                 evaluation=evaluation, registry=registry)
    return run_study(spec, out=out, scratch=scratch, progress=progress, amend=amend, jobs=jobs)


def lambda_anc_sweep(
    cfg,
    values: Sequence[float] = (0.1, 0.3, 1.0, 3.0, 10.0),
    *,
    seeds: Sequence[int] = (0, 1, 2),
    name: str = "lambda-anc",
    evaluation: EvaluationSpec | None = None,
    registry: RegistrySpec | None = None,
    out: str | Path = "docs/results",
    scratch: str | Path | None = None,
    progress: bool = True,
    jobs: int = 1,
) -> StudyResult:
    """Frame drift and MPC success of the anchored rung against λ_anc (plus the naive rung as
    the unanchored reference), paired over ``seeds``."""
    sweep = {"lambda_anc": SweepSpec(override="gauge.lambda_anc=" + ",".join(repr(float(v)) for v in values),
                                     arms=["anchor"], description="frame drift and success against λ_anc")}
    return run_ablation_ladder(cfg, seeds=seeds, name=name, rungs=("naive",), baselines=(), sweeps=sweep,
                               evaluation=evaluation, registry=registry, out=out, scratch=scratch,
                               progress=progress, jobs=jobs)


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-5"`` (inclusive) or a mix, e.g. ``"0-2,7"`` -> a list of ints."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        try:
            out += list(range(int(m.group(1)), int(m.group(2)) + 1)) if m else [int(part)]
        except ValueError:
            raise ConfigError(f"cannot read seeds {text!r}", remediation="write e.g. 0,1,2 or 0-5") from None
    if not out:
        raise ConfigError(f"no seeds in {text!r}", remediation="write e.g. 0,1,2 or 0-5")
    return out


def study_command(
    overrides: Sequence[str] | None = None,
    *,
    name: str = "tiny",
    preset: str | None = None,
    seeds: Sequence[int] | str | None = None,
    sweeps: Sequence[str] | str | None = None,
    out: str | Path = "docs/results",
    scratch: str | Path | None = None,
    progress: bool = True,
    amend: str | None = None,
    plan_only: bool = False,
    report_only: bool = False,
    jobs: int = 1,
) -> StudyResult:
    """``lensemble study [--name N] [--preset P] [--seeds 0,1,2] [--sweeps a,b|none] [--out DIR]
    [--scratch DIR] [--jobs J] [--amend REASON] [--plan-only] [--report-only] [--no-progress]
    [OVERRIDES...]``.

    ``overrides`` starting with ``study.`` change the preset (``study.registry.rho_threshold=0.6``,
    ``study.evaluation.parallel=4``); all others are Hydra overrides appended to every run
    (``eval.episodes=50``), except multirun ones (``federation.outer_lr=0.5,0.7``), which add a
    sweep over every ladder arm. ``seeds`` may be a string (``"0-5"``, ``"0,2,4"``) and ``sweeps`` a
    comma list or ``"none"``. The preset defaults to ``configs/study/<name>.yaml``. With
    ``report_only`` nothing is planned or run: the report is rebuilt from ``<out>/<name>/``.
    """
    if report_only:
        study_dir = Path(out) / name
        analysis, report = rebuild_report(study_dir, progress=progress)
        st = analysis["status"]
        return StudyResult(study_dir, st["planned"], 0, st["done"], {}, analysis, report)
    seeds = parse_seeds(seeds) if isinstance(seeds, str) else seeds
    if isinstance(sweeps, str):
        sweeps = [x.strip() for x in sweeps.split(",") if x.strip()]
    overrides = list(overrides or [])
    study_ov = [o[len("study."):] for o in overrides if o.startswith("study.")]
    run_ov = [o for o in overrides if not o.startswith("study.")]
    # A multirun override on the command line (key=a,b,c) becomes one more sweep over every ladder arm.
    adhoc = [o for o in run_ov if _is_sweep(o)]
    run_ov = [o for o in run_ov if o not in adhoc]
    spec = load_study_spec(preset or name, study_ov, name=name, seeds=seeds, sweeps=sweeps, run_overrides=run_ov)
    if adhoc:
        extra = {_slug(expand_sweep(o)[0]).replace(".", "_"): SweepSpec(override=o, arms=spec.ladder_arms())
                 for o in adhoc}
        spec = spec.model_copy(update={"sweeps": {**spec.sweeps, **extra}})
        spec = StudySpec.model_validate(spec.model_dump())
    return run_study(spec, out=out, scratch=scratch, progress=progress, amend=amend, plan_only=plan_only,
                     jobs=jobs)


__all__ = [
    "RUNGS", "BASELINES", "FEDERATED_ARMS", "ALL_ARMS", "LADDER",
    "SweepSpec", "EvaluationSpec", "DeltaSpec", "PlanningSpec", "RegistrySpec", "CostModel", "StudySpec",
    "PlannedRun", "StudyPlan", "StudyResult",
    "preset_path", "load_study_spec", "normalize_overrides", "expand_sweep", "overrides_from_config",
    "arm_overrides", "plan_study", "estimate_seconds", "load_summaries", "load_failures", "summary_path",
    "run_study", "rebuild_report",
    "run_ablation_ladder", "lambda_anc_sweep", "parse_seeds", "study_command",
]
