"""The study preset: :class:`StudySpec` and its parts, read from ``configs/study/<preset>.yaml``.

A preset names the arms, seeds, sweeps, how every final model is evaluated, what the registry
pre-registers and the cost model used for planning (``docs/study.md``). Validation here is only
about the preset itself; composing and validating each run's config is the plan's job
(:func:`lensemble.study.plan.plan_study`).

Arms (every arm of one seed shares one warm start, the seed's silos, probe and evaluation
episodes):

=============  ==========================================================================
``warmstart_only`` the warm start scored as it is (no training): what federation starts from
``central``    ``train_local(source="pooled")`` from the warm start (upper bound); by default
               it takes the federation's total optimizer steps (C × rounds × H)
``local``      ``train_local(source="silo-<i>")`` from the warm start, one run per silo
``fork_a``     federated, encoder frozen at the warm start (``model.encoder_frozen=true``)
rungs          federated, ``gauge=<rung>`` (the rung table, :mod:`lensemble.config.rungs`);
               ``naive`` is also the naive-FedAvg baseline
=============  ==========================================================================

Opt-in baselines (issue 32: the pooled objective's study names them; the default set is above):

===================  ====================================================================
``twin``             the data-parallel twin of the federation: ``train_local(source="pooled")``
                     for one participant's steps (rounds × H) at C × the batch, i.e. the
                     federation's sequential steps on the same examples per step
``central_persilo``  the per-silo central control: the centralized arm's steps, every batch
                     B/C clips per silo, BatchNorm and SIGReg computed on each silo's share
                     alone (``train.silo_batches``, ``train.silo_statistics=both``, the per-silo
                     objective): what the silos' own batch statistics cost without averaging
``naive_silo``       naive FedAvg with the per-silo objective
                     (``objective.sigreg_scope=silo objective.bn_scope=batch``)
===================  ====================================================================
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Sequence

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from lensemble.config.loader import config_dir
from lensemble.config.rungs import RUNGS
from lensemble.errors import ConfigError

BASELINES = ("warmstart_only", "central", "local", "fork_a")  # the default set
OPT_IN_BASELINES = ("twin", "central_persilo", "naive_silo")
KNOWN_BASELINES = BASELINES + OPT_IN_BASELINES
FEDERATED_ARMS = ("naive_silo",) + RUNGS + ("fork_a",)
EVAL_ONLY_ARMS = ("warmstart_only",)
SINGLE_ARMS = ("central", "twin", "central_persilo", "local")
# report order: warm start, single-site baselines, naive with the per-silo objective, rungs, Fork A
ALL_ARMS = EVAL_ONLY_ARMS + SINGLE_ARMS + FEDERATED_ARMS
#: the arms ρ may take as its centralized reference
RHO_REFERENCES = ("central", "twin")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SweepSpec(_Spec):
    """One sweep: a Hydra multirun override and the arms run at each of its values."""

    override: str = Field(description="one Hydra multirun override, e.g. 'gauge.lambda_anc=0.1,0.3,1'")
    arms: list[str]
    seeds: list[int] | None = Field(None, description="default: the study's seeds")
    keep_budget: bool = Field(False, description="federation.inner_steps sweeps: rounds = budget / H")
    keep_data: bool = Field(False, description="data.num_silos sweeps: episodes_per_silo = the base config's "
                            "num_silos × episodes_per_silo / C, so every point shares one total of data")
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
    episode_correlation: float = Field(0.0, ge=0, lt=1, description="correlation of two arms' outcomes on the "
                                       "same episode (0: unknown, the conservative choice)")
    sd_replicate_success: float | None = Field(
        None, ge=0, description="between-replicate SD of an arm's true success within a seed (training "
        "replicates, docs/study.md 'Replicates'; measured: lensemble.study.power.replicate_spread). Unset: the "
        "planning model has no replicate level and sd_train_success holds all training spread; set: "
        "sd_train_success is the spread of the seed means alone")

    @model_serializer(mode="wrap")
    def _omit_unset_replicate_spread(self, handler):
        # Added after registries were hashed with these assumptions: left out while unset.
        out = handler(self)
        if out.get("sd_replicate_success") is None:
            out.pop("sd_replicate_success", None)
        return out


class RegistrySpec(_Spec):
    """What the registry pre-registers about the analysis."""

    alpha: float = Field(0.05, gt=0, lt=1)
    power: float = Field(0.8, gt=0, lt=1)
    alternative: Literal["one-sided", "two-sided"] = "one-sided"
    n_boot: int = Field(10_000, ge=100)
    anchored_rung: str = "anchor"
    rho_threshold: float = Field(0.5, gt=0, le=1, description="claim 3: ρ must reach this")
    rho_reference: Literal["central", "twin"] = Field(
        "central", description="claim 3's centralized reference S_ref in ρ = (S_fed − S_local) / (S_ref − S_local): "
        "'central' (the centralized arm) or 'twin' (the data-parallel twin, the federation's sequential steps at "
        "C × the batch; it must be among the baselines)")
    local_reference: Literal["mean", "best"] = "mean"
    min_seeds: int = Field(3, ge=2, description="fewer paired seeds than this: inconclusive, whatever the interval")
    delta: DeltaSpec = DeltaSpec()
    planning: PlanningSpec = PlanningSpec()
    claim4_sweeps: list[str] = Field(default_factory=lambda: ["severity", "participants"])
    drift_metric: Literal["angle", "subspace"] = Field(
        "angle", description="what the drift claims measure: 'angle', the geodesic angle of the full "
        "d x d rotation (unmeasured in a round where some participant's rotation is not identifiable); "
        "'subspace', its angle within the global frame's 95 %-energy principal subspace (measured "
        "whenever that block is identified, and blind to noise in the weak directions: docs/gauge.md)")


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
    sweep_step_factor: dict[str, float] = Field(
        default_factory=dict, description="sweep name -> multiplier on the training seconds of its runs "
        "(a wider model's steps cost more; measured, e.g. width: 2.5)")


class StudySpec(_Spec):
    """A study preset (``configs/study/<preset>.yaml``), validated."""

    name: str
    description: str = ""
    overrides: list[str] = Field(default_factory=list, description="Hydra overrides of every run")
    seeds: list[int] = Field(min_length=1)
    warmstart: Literal["study", "seed"] = "study"
    replicates: int = Field(
        1, ge=1, le=100, description="training replicates per seed and arm (docs/study.md, 'Replicates'): "
        "replicate r > 0 of a run is the same run with train.replicate=r (another batch order, the same warm "
        "start, data and evaluation episodes); 1 plans exactly the runs of a study without replicates")
    budget: Literal["per_participant", "total"] = Field(
        "total", description="central steps: the federation's total C × rounds × H (total) or one participant's")
    rungs: list[str] = Field(default_factory=lambda: list(RUNGS))
    baselines: list[str] = Field(default_factory=lambda: list(BASELINES))
    sweeps: dict[str, SweepSpec] = Field(default_factory=dict)
    evaluation: EvaluationSpec = EvaluationSpec()
    registry: RegistrySpec = RegistrySpec()
    cost_model: CostModel = CostModel()
    stopped: str | None = Field(
        None, description="why the study ends before all its planned runs (e.g. their inputs are lost): "
        "set after runs only with --amend; no further run starts and the report says stopped, not partial")

    @model_validator(mode="after")
    def _check(self):
        if self.stopped is not None and not self.stopped.strip():
            raise ValueError("stopped must say why the study stops (a sentence), or be left out")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise ValueError(f"study name {self.name!r}: use letters, digits, '.', '_' or '-'")
        if bad := [r for r in self.rungs if r not in RUNGS]:
            raise ValueError(f"unknown rungs {bad}; use {list(RUNGS)}")
        if bad := [b for b in self.baselines if b not in KNOWN_BASELINES]:
            raise ValueError(f"unknown baselines {bad}; use {list(KNOWN_BASELINES)} (naive FedAvg is rung 'naive')")
        # (the default reference may be absent, as before it was an option: C3 is then inconclusive)
        if self.registry.rho_reference != "central" and self.registry.rho_reference not in self.baselines:
            raise ValueError(f"registry.rho_reference {self.registry.rho_reference!r} is not among the baselines "
                             f"{self.baselines}: claim 3 would have no reference arm")
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
        arms = [a for a in EVAL_ONLY_ARMS + SINGLE_ARMS if a in self.baselines]
        if "naive_silo" in self.baselines:
            arms.append("naive_silo")
        arms += [r for r in RUNGS if r in self.rungs]
        if "fork_a" in self.baselines:
            arms.append("fork_a")
        return arms


def preset_path(preset: str | Path) -> Path:
    """``configs/study/<preset>.yaml``, or ``preset`` itself when it is a YAML file."""
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return p
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


__all__ = ["KNOWN_BASELINES", "RHO_REFERENCES", "StudySpec", "SweepSpec", "load_study_spec", "preset_path"]
