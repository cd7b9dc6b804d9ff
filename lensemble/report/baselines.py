"""The baselines of a run (``lensemble run --baselines``): what the federation is measured against.

After the rounds, and from the warm start the federation started from, two kinds of model are
trained with :func:`~lensemble.training.trainer.train_local` into ``<run>/baselines/<arm>/``:

* ``local-<c>``, one per silo: silo c's data alone for its participant's total inner steps,
  rounds × H, at the participants' batch B. What each party gets without federating.
* ``twin``, the data-parallel central twin: the federation's sequential steps, rounds × H, at
  C × B clips per step on all silos' data pooled. The same number of optimizer steps and clips per
  step as the federation, with the data moved instead of the weights: the reference the
  pooled-objective pilot registered for ρ (docs/results/pooled-pilot).

Each is scored like the federated model (:func:`lensemble.report.run_eval.evaluate_arm`: the
run's ``cfg.eval`` and ``eval.seed``, so the same held-out tasks; ``<run>/eval/<arm>.json``), and
every goal-spec hash is checked equal to the federated model's.

**Gap recovery** ρ = (S_fed − S_local) / (S_twin − S_local) (:func:`gap_over_tasks`). S_local on a
task is the mean success of the C local models there: the chance that one party's own model solves
it. A run is one seed, so the interval cannot come from seeds: it is a paired bootstrap over the
tasks, each replicate drawing task indices once and using them for all three arms (the arms' outcomes
on a task are correlated, and stay so in every replicate), via :func:`lensemble.study.gap.gap_recovery`
with the tasks as its units. It therefore says how sure these tasks make ρ for this seed's models,
not how ρ varies between training seeds (the study's seed bootstrap). ρ is undefined, not huge, when
the 95 % interval of S_twin − S_local contains 0.

Both steps are resumable: a baseline whose ``baseline.json`` records this config hash and warm
start, and whose checkpoint header still carries the recorded hash, is not retrained; its
EvalReport is reused on the same terms as the federated model's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lensemble.artifacts.checkpoint import read_header
from lensemble.config.schema import LensembleConfig
from lensemble.errors import ArtifactError, CheckpointIntegrityError, EvaluationError
from lensemble.eval.reports import EvalReport, pair_episodes
from lensemble.observability.progress import format_duration, say
from lensemble.report.run_eval import EVAL_DIR, evaluate_arm, load_summary, warmstart_checkpoint
from lensemble.study.files import atomic_write
from lensemble.study.gap import GapRecovery, gap_recovery

BASELINE_DIR = "baselines"
TWIN = "twin"
#: ρ's bootstrap: replicates, and the seed of the generator that draws them (recorded in the result).
N_BOOT = 10_000
BOOT_SEED = 0
#: What GapRecovery.method says for this run-level interval (the study's says "paired-seed").
TASK_METHOD = "paired-task bootstrap, percentile (one seed: tasks are the units)"


def local_arm(silo: int) -> str:
    return f"local-{silo}"


def baseline_arms(cfg: LensembleConfig) -> list[str]:
    """``local-0 … local-(C−1)`` then ``twin``: the order they are trained, scored and tabled."""
    return [local_arm(c) for c in range(cfg.data.num_silos)] + [TWIN]


def arm_label(arm: str) -> str:
    """How an arm is named in tables and figures."""
    return "data-parallel twin" if arm == TWIN else f"local model of {source_of(arm)}"


def baseline_config(cfg: LensembleConfig, arm: str, rounds: int) -> LensembleConfig:
    """The config ``arm`` trains with: ``rounds × H`` steps, at ``C × B`` clips per step for the
    twin and ``B`` for a local model; one final checkpoint (only it is scored)."""
    steps = int(rounds) * cfg.federation.inner_steps
    update: dict = {"steps": steps, "checkpoint_every": 0}
    if arm == TWIN:
        update["batch_size"] = cfg.data.num_silos * cfg.train.batch_size
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=update)})


def source_of(arm: str) -> str:
    """The ``train_local`` source: the pooled silos for the twin, silo c for ``local-c``."""
    return "pooled" if arm == TWIN else arm.replace("local-", "silo-")


@dataclass(frozen=True)
class TrainedBaseline:
    """One trained baseline: its checkpoint, hash, budget and the wall seconds it took (0 when reused)."""

    arm: str
    checkpoint: Path
    checkpoint_hash: str
    steps: int
    batch_size: int
    seconds: float
    reused: bool


def _reusable_baseline(folder: Path, arm_cfg: LensembleConfig, warm_hash: str) -> TrainedBaseline | None:
    record = folder / "baseline.json"
    if not record.is_file():
        return None
    rec = json.loads(record.read_text())
    if rec.get("config_hash") != arm_cfg.config_hash() or rec.get("warmstart_hash") != warm_hash:
        return None
    checkpoint = folder / "checkpoints" / f"step-{arm_cfg.train.steps:06d}"
    try:
        header = read_header(checkpoint)
    except ArtifactError:
        return None
    if header.get("content_hash") != rec.get("checkpoint_hash"):
        return None
    return TrainedBaseline(rec["arm"], checkpoint, rec["checkpoint_hash"], arm_cfg.train.steps,
                           arm_cfg.train.batch_size, float(rec.get("seconds", 0.0)), True)


def train_baselines(run_dir: str | Path, cfg: LensembleConfig, summary: dict, warm: Path, *,
                    progress: bool = True) -> dict[str, TrainedBaseline]:
    """Train (or reuse) every baseline of :func:`baseline_arms` from ``warm``, whose hash must be
    ``summary["warmstart_hash"]``; ``summary["rounds_completed"]`` sets the budget. Returns arm -> result."""
    from lensemble.training.trainer import train_local

    run_dir = Path(run_dir)
    rounds = int(summary.get("rounds_completed") or 0)
    warm_hash = summary.get("warmstart_hash")
    if rounds < 1 or not warm_hash:
        raise EvaluationError(f"{run_dir} has no committed round or no recorded warm start: no budget to match",
                              remediation="run at least one round before --baselines")
    arms = baseline_arms(cfg)
    out = {}
    for i, arm in enumerate(arms, 1):
        arm_cfg = baseline_config(cfg, arm, rounds)
        folder = run_dir / BASELINE_DIR / arm
        done = _reusable_baseline(folder, arm_cfg, warm_hash)
        if done is not None:
            say(f"baseline {i}/{len(arms)}: reused {BASELINE_DIR}/{arm} (same config and warm start)", enabled=progress)
            out[arm] = done
            continue
        data = "all silos' data pooled" if arm == TWIN else f"{source_of(arm)}'s data alone"
        say(f"baseline {i}/{len(arms)}: training {arm_label(arm)} from the warm start: {arm_cfg.train.steps} steps "
            f"({rounds} rounds × H = {cfg.federation.inner_steps}) at {arm_cfg.train.batch_size} clips per step on "
            f"{data}", enabled=progress)
        started = time.perf_counter()
        res = train_local(arm_cfg, source=source_of(arm), run_dir=folder, init_checkpoint=warm, progress=progress)
        seconds = time.perf_counter() - started
        parent = read_header(res.checkpoint_dir).get("parent_hash")
        if parent != warm_hash:  # one final checkpoint: its parent is the checkpoint it started from
            raise CheckpointIntegrityError(f"{arm} started from {str(parent)[:12]}…, the federation from "
                                           f"{warm_hash[:12]}…", remediation=f"delete {folder} and rerun")
        atomic_write(folder / "baseline.json", json.dumps({
            "arm": arm, "source": source_of(arm), "steps": arm_cfg.train.steps,
            "batch_size": arm_cfg.train.batch_size, "warmstart_hash": warm_hash,
            "config_hash": arm_cfg.config_hash(), "checkpoint_hash": res.checkpoint_hash,
            "seconds": round(seconds, 1)}, indent=1, sort_keys=True))
        say(f"baseline {i}/{len(arms)}: {arm} trained in {format_duration(seconds)}", enabled=progress)
        out[arm] = TrainedBaseline(arm, res.checkpoint_dir, res.checkpoint_hash, arm_cfg.train.steps,
                                   arm_cfg.train.batch_size, seconds, False)
    return out


# ================================================================================== ρ over tasks
def task_successes(reference: EvalReport, other: EvalReport) -> np.ndarray:
    """``other``'s per-task success (0/1, shape (n,)) in the order of ``reference``'s tasks
    (sorted by episode index); EvaluationError unless both ran the same tasks."""
    return np.array([float(b.success) for _, b in pair_episodes(reference, other)])


def gap_over_tasks(fed: EvalReport, locals_: list[EvalReport], twin: EvalReport, *, n_boot: int = N_BOOT,
                   seed: int = BOOT_SEED, alpha: float = 0.05) -> GapRecovery:
    """ρ = (S_fed − S_local) / (S_twin − S_local) on one seed's shared tasks, with the paired
    bootstrap over tasks (module docstring). S_local on a task is the mean over ``locals_``.

    Scores are success rates in [0, 1]; the result's ``n_seeds`` counts the resampled units, here
    the tasks, and its ``method`` says so. Needs >= 2 tasks, every report with its episode records
    and one goal-spec hash (else EvaluationError).
    """
    if not locals_:
        raise EvaluationError("gap recovery needs at least one local model")
    s_fed = task_successes(fed, fed)
    s_local = np.mean([task_successes(fed, r) for r in locals_], axis=0)
    s_twin = task_successes(fed, twin)
    if s_fed.size < 2:
        raise EvaluationError(f"gap recovery over tasks needs at least 2 tasks, got {s_fed.size}",
                              remediation="pass --eval-episodes 2 or more")
    gap = gap_recovery(s_fed, s_local, s_twin, n_boot=n_boot, seed=seed, alpha=alpha)
    # the study's words name its central arm; here the reference is the twin
    reason = gap.reason.replace("S_central", "S_twin") if gap.reason else None
    return gap.model_copy(update={"method": TASK_METHOD, "reason": reason})


@dataclass(frozen=True)
class BaselineResult:
    """The baselines' EvalReports (arm -> report, in :func:`baseline_arms` order), their training,
    and ρ over the shared tasks (None, with ``gap_error`` saying why, when it cannot be computed)."""

    reports: dict[str, EvalReport]
    trained: dict[str, TrainedBaseline]
    gap: GapRecovery | None
    gap_error: str | None = None

    @property
    def locals(self) -> list[EvalReport]:
        return [r for a, r in self.reports.items() if a != TWIN]

    @property
    def twin(self) -> EvalReport:
        return self.reports[TWIN]

    @property
    def local_rate(self) -> float:
        """Mean success rate of the local models (S_local over all tasks), in [0, 1]."""
        return float(np.mean([r.success_rate for r in self.locals]))


def run_baselines(run_dir: str | Path, cfg: LensembleConfig, fed: EvalReport, episodes: int, *,
                  progress: bool = True, parallel: int = 8) -> BaselineResult:
    """Train and score every baseline on the federated model's tasks and compute ρ.

    ``fed`` is the federated model's EvalReport (:func:`~lensemble.report.run_eval.evaluate_run`);
    ``episodes`` its task count. Raises EvaluationError when a baseline ran other tasks.
    """
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    trained = train_baselines(run_dir, cfg, summary, warmstart_checkpoint(run_dir, cfg), progress=progress)
    reports = {}
    for arm, t in trained.items():
        rep, reused = evaluate_arm(run_dir, cfg, arm, t.checkpoint, "mpc", t.checkpoint_hash, episodes,
                                   label=f"the {arm_label(arm)}", progress=progress, parallel=parallel)
        if reused:
            say(f"reused {EVAL_DIR}/{arm}.json (same checkpoint, config and episodes)", enabled=progress)
        if rep.goal_spec_hash != fed.goal_spec_hash:
            raise EvaluationError(f"{arm} was scored on other tasks than the federated model (goal-spec hash "
                                  f"{rep.goal_spec_hash[:12]}… against {fed.goal_spec_hash[:12]}…)",
                                  remediation=f"delete {run_dir / EVAL_DIR / (arm + '.json')} and rerun")
        reports[arm] = rep
    try:
        gap, error = gap_over_tasks(fed, [reports[a] for a in reports if a != TWIN], reports[TWIN]), None
    except EvaluationError as exc:  # e.g. one task: the report says why ρ is missing
        gap, error = None, str(exc)
    return BaselineResult(reports, trained, gap, error)


__all__ = ["BASELINE_DIR", "TWIN", "BaselineResult", "TrainedBaseline", "arm_label", "baseline_arms",
           "baseline_config", "gap_over_tasks", "run_baselines", "task_successes", "train_baselines"]
