"""Scoring a finished run: the federated model, the warm start and random actions on one task set.

:func:`evaluate_run` scores, after the rounds and from the committed checkpoints only, three
things on the same closed-loop episodes (same ``eval.seed``, hence the same goal-spec hash):

* ``federated``: the final global model (the last committed round), latent MPC;
* ``warmstart``: the public warm start every participant started from, latent MPC;
* ``random``: uniform random actions, the floor any planner must beat.

Each result is an :class:`~lensemble.eval.reports.EvalReport` written to
``<run>/eval/<arm>.json`` by :func:`evaluate_arm`, which the baselines
(:mod:`lensemble.report.baselines`) use too; a later call reuses a file whose checkpoint hash,
config hash, episode count and planner match, so rebuilding a report costs nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from lensemble.config.schema import LensembleConfig
from lensemble.errors import CheckpointIntegrityError, EvaluationError
from lensemble.eval.reports import EvalReport
from lensemble.observability.progress import say

EVAL_DIR = "eval"
ARMS = ("federated", "warmstart", "random")
#: How each arm is named in sentences and in tables.
ARM_TEXT = {"federated": "the federated model", "warmstart": "the warm start", "random": "random actions"}
ARM_LABEL = {"federated": "federated model", "warmstart": "warm start", "random": "random actions"}


@dataclass
class RunEvaluation:
    """The three EvalReports of a run, where they are, and whether they were reused."""

    episodes: int
    reports: dict[str, EvalReport]
    paths: dict[str, Path]
    reused: dict[str, bool] = field(default_factory=dict)

    @property
    def goal_spec_hash(self) -> str:
        return self.reports["federated"].goal_spec_hash


def load_summary(run_dir: str | Path) -> dict:
    """``<run>/summary.json`` (written by the coordinator when the rounds end)."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise EvaluationError(f"{run_dir} holds no summary.json", remediation="run `lensemble run` first")
    return json.loads(path.read_text())


def final_checkpoint(run_dir: str | Path, summary: dict) -> Path:
    """The last committed round's model folder (found from the run folder, not the recorded
    path, so a moved run folder still works)."""
    done = int(summary.get("rounds_completed") or 0)
    if done < 1:
        raise EvaluationError(f"{run_dir} has no committed round", remediation="run at least one round")
    return Path(run_dir) / "rounds" / f"round-{done - 1:04d}" / "model"


def warmstart_checkpoint(run_dir: str | Path, cfg: LensembleConfig) -> Path:
    """The warm start the run started from: ``federation.warmstart``, else the one it trained."""
    if cfg.federation.warmstart:
        return Path(cfg.federation.warmstart)
    return Path(run_dir) / "warmstart" / "checkpoints" / f"step-{cfg.train.warmstart_steps:06d}"


def _reusable(path: Path, *, checkpoint_hash: str, cfg: LensembleConfig, episodes: int, policy: str) -> EvalReport | None:
    if not path.is_file():
        return None
    try:
        rep = EvalReport.from_json(path.read_text())
    except Exception:  # noqa: BLE001 - an unreadable old file is simply recomputed
        return None
    planner = cfg.eval.planner if policy == "mpc" else "random"
    same = (rep.checkpoint_hash == checkpoint_hash and rep.config_hash == cfg.config_hash()
            and rep.n_episodes == episodes and rep.planner == planner and rep.seed == cfg.eval.seed
            and rep.env_id == cfg.env.id)
    return rep if same else None


def evaluate_arm(run_dir: Path, cfg: LensembleConfig, arm: str, checkpoint: Path, policy: str,
                 expected_hash: str | None, episodes: int, *, label: str, progress: bool = True,
                 parallel: int = 8) -> tuple[EvalReport, bool]:
    """Score one arm on the run's held-out tasks into ``<run>/eval/<arm>.json``, or reuse that file
    (same checkpoint hash, config hash, episodes, planner, seed, env); returns (report, reused).

    ``cfg`` is the run's config whatever config trained ``checkpoint``: its ``eval`` section and
    ``eval.seed`` fix the tasks, so every arm scored with it shares one goal-spec hash.
    ``expected_hash`` (None: not checked) must equal the evaluated checkpoint's verified hash.
    """
    from lensemble.eval.closed_loop import evaluate

    path = run_dir / EVAL_DIR / f"{arm}.json"
    rep = (_reusable(path, checkpoint_hash=expected_hash, cfg=cfg, episodes=episodes, policy=policy)
           if expected_hash else None)
    if rep is not None:
        return rep, True
    say(f"evaluating {label} on {episodes} held-out episodes ({policy})", enabled=progress)
    rep = evaluate(checkpoint, cfg.env.id, cfg=cfg, episodes=episodes, split="heldout", policy=policy,
                   ladder=False, progress=progress, parallel=parallel)
    if expected_hash and rep.checkpoint_hash != expected_hash:
        raise CheckpointIntegrityError(
            f"{checkpoint} has hash {rep.checkpoint_hash[:12]}…, the run records {expected_hash[:12]}…",
            remediation="the run folder was changed after the run; rerun it in a new folder")
    rep.write(path)
    return rep, False


def evaluate_run(run_dir: str | Path, cfg: LensembleConfig, episodes: int | None = None, *,
                 progress: bool = True, parallel: int = 8) -> RunEvaluation:
    """Score the final global model, the warm start and random actions on the same episodes.

    ``episodes`` defaults to ``cfg.eval.episodes``. The checkpoints are the committed ones; each
    report's verified checkpoint hash must equal the one ``summary.json`` records (else
    CheckpointIntegrityError). Nothing here touches training: it runs after the rounds.
    """
    import torch

    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    n = int(episodes if episodes is not None else cfg.eval.episodes)
    if n < 1:
        raise EvaluationError(f"--eval-episodes must be >= 1, got {n}", remediation="pass N >= 1 or --no-eval")
    torch.set_num_threads(cfg.train.threads)
    final = final_checkpoint(run_dir, summary)
    warm = warmstart_checkpoint(run_dir, cfg)
    plan = {"federated": (final, "mpc", summary.get("final_hash")),
            "warmstart": (warm, "mpc", summary.get("warmstart_hash")),
            "random": (final, "random", summary.get("final_hash"))}
    reports, paths, reused = {}, {}, {}
    for arm in ARMS:
        checkpoint, policy, expected = plan[arm]
        paths[arm] = run_dir / EVAL_DIR / f"{arm}.json"
        reports[arm], reused[arm] = evaluate_arm(run_dir, cfg, arm, checkpoint, policy, expected, n,
                                                 label=ARM_TEXT[arm], progress=progress, parallel=parallel)
    if any(reused.values()):
        say("reused " + ", ".join(f"{EVAL_DIR}/{a}.json" for a in ARMS if reused[a])
            + " (same checkpoint, config and episodes)", enabled=progress)
    hashes = {rep.goal_spec_hash for rep in reports.values()}
    if len(hashes) != 1:
        raise EvaluationError("the run's evaluations were scored on different tasks (goal-spec hashes differ)",
                              remediation=f"delete {run_dir / EVAL_DIR} and rerun")
    return RunEvaluation(n, reports, paths, reused)


def load_run_evaluation(run_dir: str | Path) -> RunEvaluation | None:
    """The EvalReports already in ``<run>/eval/``, or None when any arm is missing."""
    run_dir = Path(run_dir)
    paths = {arm: run_dir / EVAL_DIR / f"{arm}.json" for arm in ARMS}
    if not all(p.is_file() for p in paths.values()):
        return None
    reports = {arm: EvalReport.from_json(p.read_text()) for arm, p in paths.items()}
    return RunEvaluation(reports["federated"].n_episodes, reports, paths, {a: True for a in ARMS})


__all__ = ["ARMS", "ARM_LABEL", "ARM_TEXT", "EVAL_DIR", "RunEvaluation", "evaluate_arm", "evaluate_run",
           "final_checkpoint", "load_run_evaluation", "load_summary", "warmstart_checkpoint"]
