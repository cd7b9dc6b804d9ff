"""Running a study: plan, register, run what is missing (resumably, ``jobs`` at a time), report.

A study is a preset under ``configs/study/<preset>.yaml`` (see ``docs/study.md``) turned into a
*plan*: one entry per training run, each a list of Hydra overrides. The flow of :func:`run_study`:

1. plan every run (:func:`lensemble.study.plan.plan_study`) and write ``plan.json``;
2. write the pre-registration ``registry.yaml`` (:mod:`lensemble.study.registry`) **before any
   run**; a later change to it needs an amendment with its reason;
3. run what is missing: a run is done exactly when its summary ``runs/<run_id>.json`` exists in the
   study folder, so an interrupted study resumes without redoing finished runs (a federated run
   that died mid-way also resumes from its last committed round, from the scratch folder);
4. analyse the summaries against the registry (:mod:`lensemble.study.analysis`) and write the
   report (:mod:`lensemble.study.report`).

A run trains from the seed's warm start (single-site: ``train_local``; federated: the no-Flower
engine of ``run_federated_simulation``), then evaluates its final model with ``evaluate``.

Heavy outputs (checkpoints, data, optimizer state) go to a scratch folder
(``runs/study/<study>/<run_id>/``); the study folder (``docs/results/<study>/``) only receives
small JSON summaries, the registry, the analysis, figures and the report.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import sys
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
from rich.console import Console

from lensemble import errors
from lensemble.artifacts.checkpoint import read_header
from lensemble.artifacts.manifest import RunManifest, git_sha, library_versions
from lensemble.config.loader import load_config
from lensemble.config.rungs import RUNGS
from lensemble.data.store import data_dir, ensure_data
from lensemble.errors import ConfigError, LensembleError
from lensemble.eval.closed_loop import evaluate
from lensemble.eval.ladder import LadderSettings
from lensemble.federation.simulation import run_federated_simulation
from lensemble.numerics import numerics_record
from lensemble.observability.progress import progress_bar
from lensemble.study import warmstarts
from lensemble.study.datacheck import check_data
from lensemble.study.files import atomic_write, failure_path, load_summaries, now, summary_path, write_summary
from lensemble.study.plan import PlannedRun, StudyPlan, estimate_seconds, overrides_from_config, plan_study
from lensemble.study.registry import build_registry, sync_registry
from lensemble.study.report import rebuild_report
from lensemble.study.spec import BASELINES, EvaluationSpec, RegistrySpec, StudySpec, SweepSpec
from lensemble.training.trainer import train_local
from lensemble.training.warmstart import train_warmstart

SUMMARY_SCHEMA = 1


# ================================================================================== summaries
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


def _manifest_git_sha(run_dir: Path) -> str | None:
    """The code commit a run recorded in its manifest (``+dirty`` when tracked files had changed)."""
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("git_sha")


def study_engine(cfg) -> str:
    """The engine a study's federated run uses: the no-Flower one (same rounds, no threads or
    messages to pay for), except where only Flower can run the protocol: SecAgg+ runs as its real
    ClientApp and ServerApp mods on the in-process grid (the in-process engine refuses it)."""
    return "flower-inprocess" if cfg.federation.secure_aggregation else "inprocess"


# ================================================================================== one run
class _Runner:
    """Executes planned runs into scratch folders and writes their summaries."""

    def __init__(self, spec: StudySpec, plan: StudyPlan, study_dir: Path, scratch: Path, progress: bool):
        self.spec, self.plan, self.study_dir, self.scratch, self.progress = spec, plan, study_dir, scratch, progress
        self._warm_ckpt: dict[str, str] = {}

    def run_dir(self, run_id: str) -> Path:
        return self.scratch / run_id

    # -- warm start
    def warmstart_checkpoint(self, run_id: str, run: PlannedRun | None = None) -> str:
        """The warm start's checkpoint folder: the scratch copy, else the copy kept in the study
        folder (:mod:`lensemble.study.warmstarts`), else trained now (then its hash must equal the
        recorded one, or the arms of this study would not share it). Kept in the study folder."""
        if run_id in self._warm_ckpt:
            return self._warm_ckpt[run_id]
        recorded = summary_path(self.study_dir, run_id)
        if recorded.exists():
            rec = json.loads(recorded.read_text())
            folder = self.run_dir(run_id) / rec["checkpoint_rel"]
            scratch_ok = warmstarts.holds(folder, rec["checkpoint_hash"])  # by its weights, not its header
            if scratch_ok or warmstarts.restore(self.study_dir, run_id, folder, rec["checkpoint_hash"]):
                warmstarts.keep(self.study_dir, run_id, folder)
                self._warm_ckpt[run_id] = str(folder)
                return str(folder)
            summary = self._execute(run or self.plan.runs[run_id])
            if summary["checkpoint_hash"] != rec["checkpoint_hash"]:
                why = warmstarts.machine_difference(rec.get("numerics"), summary.get("numerics") or {})
                raise ConfigError(
                    f"the retrained warm start {run_id} hashes to {summary['checkpoint_hash'][:12]}…, the study "
                    f"recorded {rec['checkpoint_hash'][:12]}…: runs done so far used another warm start"
                    + (f" ({why}; training is not bit-identical across CPUs)" if why else "")
                    + f", and neither {folder} nor {warmstarts.kept_path(self.study_dir, run_id)} holds it",
                    remediation=f"restore {folder} from the machine that trained it, or run the missing arms "
                                "as a new study name with its own warm starts")
        else:
            summary = self._execute(run or self.plan.runs[run_id])
            write_summary(self.study_dir, run_id, summary)
        folder = self.run_dir(run_id) / summary["checkpoint_rel"]
        warmstarts.keep(self.study_dir, run_id, folder)
        self._warm_ckpt[run_id] = str(folder)
        return str(folder)

    # -- one run
    def _execute(self, run: PlannedRun) -> dict:
        rd = self.run_dir(run.run_id)
        started = time.perf_counter()
        seconds: dict[str, float] = {}
        summary: dict = {
            "schema_version": SUMMARY_SCHEMA, "study": self.spec.name, "run_id": run.run_id, "kind": run.kind,
            "arm": run.arm, "seed": run.seed, "silo": run.silo, "source": run.source,
            "overrides": run.overrides, "spec_hash": run.spec_hash, "cells": run.cells,
            # the collection depends on the simulator's and the image libraries' versions: kept with
            # every result so that a resume on other data can name what differs (study.datacheck)
            "library_versions": library_versions(),
            # and on MKL's code path, which differs by CPU unless pinned (lensemble/numerics.py)
            "numerics": numerics_record(),
        }
        if run.kind == "warmstart":
            cfg = load_config(run.overrides + [f"run_dir={rd}"])
            res = train_warmstart(cfg, run_dir=rd, progress=False)
            summary.update(self._single_fields(cfg, res, rd))
            # Its own step count: the warm start trains train.warmstart_steps steps, not train.steps.
            summary["steps"] = {"warmstart_steps": cfg.train.warmstart_steps, "batch_size": cfg.train.batch_size}
            summary["git_sha"] = _manifest_git_sha(rd)
            summary["seconds"] = {"train": round(time.perf_counter() - started, 2)}
            summary["finished_at"] = now()
            return summary

        ws = self.warmstart_checkpoint(self.plan.warmstart_of(run))
        if run.kind == "evaluate":
            # The warm-start-only arm: the warm start itself, evaluated on this seed's episodes.
            cfg = load_config(run.overrides + [f"run_dir={rd}"])
            header = read_header(ws)
            summary.update({
                "config_hash": cfg.config_hash(), "manifest_hash": None, "checkpoint_hash": header["content_hash"],
                "warmstart_hash": header["content_hash"],
                "probe_hash": (header.get("extra") or {}).get("data", {}).get("probe_hash"),
                "steps": {"train_steps": 0, "warmstart_steps": cfg.train.warmstart_steps,
                          "batch_size": cfg.train.batch_size},
            })
            ckpt = ws
        elif run.kind == "single":
            cfg = load_config(run.overrides + [f"run_dir={rd}"])
            res = train_local(cfg, source=run.source, run_dir=rd, init_checkpoint=ws, progress=False)
            summary.update(self._single_fields(cfg, res, rd))
            ckpt = res.checkpoint_dir
        else:
            cfg = load_config(run.overrides + [f"run_dir={rd}", f"federation.warmstart={ws}"])
            fed = run_federated_simulation(cfg, rd, engine=study_engine(cfg), progress=False)
            manifest = RunManifest.model_validate_json((rd / "manifest.json").read_text())
            ckpt = fed["final_checkpoint"]
            summary.update({
                "config_hash": cfg.config_hash(), "manifest_hash": manifest.manifest_hash(),
                "checkpoint_hash": fed["final_hash"], "warmstart_hash": fed["warmstart_hash"],
                "probe_hash": fed["probe_hash"], "probe_split": fed.get("probe_split"),
                "rounds_completed": fed["rounds_completed"],
                "rounds": [_scalars(r) for r in fed["rounds"]],
                "steps": {"rounds": cfg.federation.rounds, "inner_steps": cfg.federation.inner_steps,
                          "participant_steps": cfg.federation.rounds * cfg.federation.inner_steps,
                          "participants": cfg.data.num_silos},
            })
        # An evaluation-only run has no manifest of its own: the code that scores it is this checkout.
        summary["git_sha"] = _manifest_git_sha(rd) if run.kind != "evaluate" else git_sha()
        seconds["train"] = round(time.perf_counter() - started, 2)
        t_eval = time.perf_counter()
        summary["eval"] = self._evaluate(ckpt, cfg)
        seconds["eval"] = round(time.perf_counter() - t_eval, 2)
        seconds["total"] = round(time.perf_counter() - started, 2)
        summary["seconds"] = seconds
        summary["finished_at"] = now()
        return summary

    @staticmethod
    def _single_fields(cfg, res, rd: Path) -> dict:
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
        ev = self.spec.evaluation
        report = evaluate(checkpoint, cfg.env.id, cfg=cfg, split=ev.split, progress=False, ladder=ev.ladder,
                          parallel=ev.parallel,
                          ladder_settings=LadderSettings(intervention_pairs=ev.intervention_pairs,
                                                         max_probe_frames=ev.max_probe_frames))
        return json.loads(report.to_json())

    def run(self, run: PlannedRun) -> dict:
        if run.kind == "warmstart":
            self.warmstart_checkpoint(run.run_id, run)  # a worker's plan holds no runs: pass it
            return json.loads(summary_path(self.study_dir, run.run_id).read_text())
        summary = self._execute(run)
        write_summary(self.study_dir, run.run_id, summary)
        failure_path(self.study_dir, run.run_id).unlink(missing_ok=True)
        return summary


# ================================================================================== many runs
def _execute(spec, plan, todo, n_done, study_dir, scratch_dir, *, progress, keep_going, jobs) -> tuple[int, dict]:
    """Run ``todo`` (serially, or ``jobs`` at a time); return (runs executed, {run_id: error})."""
    runner = _Runner(spec, plan, study_dir, scratch_dir, progress)
    say = _Say(progress)
    failed: dict[str, str] = {}
    executed = 0
    # The finished runs count in the bar but not in its rate: a resumed study's ETA is for what is left.
    with progress_bar(f"study {spec.name}", n_done + len(todo), enabled=progress, initial=n_done) as advance:
        advance(0, info=f"{n_done} done, {len(todo)} left")

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

        if jobs == 1:
            for run in todo:
                advance(0, info=f"running {run.run_id}")
                summary, error, secs = guarded(run, lambda run=run: runner.run(run))
                finished(run, summary, error, secs, len(todo) - executed - len(failed) - 1)
            return executed, failed

        ctx = multiprocessing.get_context("spawn")
        seen_data: set = set()

        def in_pool(queue: list, warm: dict) -> None:
            # A sliding window of `jobs` runs in flight, in plan order (the ladder before the sweeps). The
            # parent collects a run's data just before submitting it, so two workers never race on one
            # data folder, and a study stopped early has not spent CPU collecting data for runs it never
            # reached.
            payload = {"spec": spec.model_dump(mode="json"),
                       "warmstart": {str(k): v for k, v in plan.warmstart.items()},
                       "warm": warm, "study_dir": str(study_dir), "scratch": str(scratch_dir)}
            queue = list(queue)
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

        # The warm starts first, `jobs` at a time (each reads only its own seed's public data), then
        # every other run from the warm start it names.
        in_pool([r for r in todo if r.kind == "warmstart"], {})
        rest = [r for r in todo if r.kind != "warmstart"]
        warm = {}
        for rid in sorted({plan.warmstart_of(r) for r in rest}):
            summary, error, _ = guarded(plan.runs[rid], lambda rid=rid: runner.warmstart_checkpoint(rid))
            if error is None:
                warm[rid] = summary
        ready = [r for r in rest if plan.warmstart_of(r) in warm]
        for r in rest:
            if r not in ready:
                finished(r, None, f"warm start {plan.warmstart_of(r)} failed", 0.0, 0)
        in_pool(ready, warm)
    return executed, failed


def _prepare_data(run: PlannedRun, configs: dict, seen: set) -> None:
    """Collect (or verify) ``run``'s data folder unless ``seen`` already holds it; then add it."""
    cfg = configs.get(run.run_id) or load_config(run.overrides)
    folder = data_dir(cfg)
    if folder not in seen:
        seen.add(folder)
        ensure_data(cfg, progress=False)


def _worker_init() -> None:
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
    """The worker's error as the same LensembleError subclass (fail-closed ones stay fail-closed)."""
    cls = getattr(errors, data.get("type", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, LensembleError)):
        cls = LensembleError
    return cls(data["text"] + "\n" + data.get("traceback", ""))


def _record_failure(study_dir: Path, run: PlannedRun, exc: BaseException | None, *, text: str | None = None,
                    tb: str | None = None) -> str:
    text = text or f"{type(exc).__name__}: {exc}"
    atomic_write(failure_path(study_dir, run.run_id), json.dumps({
        "run_id": run.run_id, "arm": run.arm, "seed": run.seed, "error": text, "at": now(),
        "traceback": tb or traceback.format_exc(limit=6)[-4000:],
    }, indent=1))
    print(f"run {run.run_id} failed: {text}", file=sys.stderr, flush=True)
    return text


class _Say:
    """Progress messages on stderr, when enabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str) -> None:
        if self.enabled:
            Console(stderr=True).print(text)


# ================================================================================== the study
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
    first: Sequence[str] = (),
) -> StudyResult:
    """Plan, register, run what is missing, analyse and report one study (see the module doc).

    Args:
        spec: the study (:func:`lensemble.study.spec.load_study_spec`).
        out: parent of the study folder (``<out>/<spec.name>/``: registry, summaries, report).
        scratch: parent of the heavy run folders (default ``runs/study/<spec.name>``).
        amend: the reason for changing the registry after runs have finished; required then.
        plan_only: write ``plan.json`` and ``registry.yaml``, print the cost estimate and stop.
        report_only: rebuild the analysis and report from the study folder; plan and run nothing.
        keep_going: a run that fails (not fail-closed) is recorded in ``runs/<id>.failed.json``
            and the study goes on; it is retried on the next call.
        jobs: runs executed at once in worker processes (one torch thread each). Warm starts
            and data collection happen first, in this process, so workers never race on them.
        first: groups (``severity``, ``dp``, ...) whose missing runs go first, in the order given;
            the rest follow in plan order. Only the order changes: the plan and registry do not,
            so a study stopped early has spent its time on the groups that matter most to it.
    """
    study_dir = Path(out) / spec.name
    if report_only:
        return report_result(study_dir, progress=progress)
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
    atomic_write(study_dir / "plan.json", json.dumps({**plan.to_json(), "estimate": estimate}, indent=1))
    sync_registry(study_dir, registry, runs_done=len(done), amend=amend)
    todo = _prioritised([r for r in plan.runs.values() if r.run_id not in done], plan, first)
    say = _Say(progress)
    left_est = sum(estimate["per_kind_seconds"].values()) * (len(todo) / max(len(plan.runs), 1))
    say(f"study [bold]{spec.name}[/]: {len(plan.runs)} runs planned, {len(done)} done, {len(todo)} left "
        f"(≈ {estimate['cpu_hours']} CPU-hours in all, ≈ {left_est / 3600 / jobs:.1f} h left at jobs={jobs})"
        + (" — registry amended" if amend and done else ""))
    say("  CPU-hours per group: " + ", ".join(f"{g} {h}" for g, h in estimate["per_group_hours"].items()))
    for line in _power_lines(registry):
        say("  " + line)
    failed: dict[str, str] = {}
    executed = 0
    if spec.stopped and todo and not plan_only:
        say(f"  [bold]stopped[/]: {spec.stopped} ({len(todo)} planned runs will not run; the report says so)")
        todo = []
    if not plan_only and todo:
        check_data(plan, done, todo)
        executed, failed = _execute(spec, plan, todo, len(done), study_dir, scratch_dir, progress=progress,
                                    keep_going=keep_going, jobs=int(jobs))
    analysis = report = None
    if not plan_only:
        analysis, report = rebuild_report(study_dir, progress=progress)
    return StudyResult(study_dir, len(plan.runs), executed, len(done), failed, analysis, report)


def _prioritised(todo: list[PlannedRun], plan: StudyPlan, first: Sequence[str]) -> list[PlannedRun]:
    """``todo`` with the runs of the ``first`` groups moved ahead (stable: plan order otherwise).

    A run shared by several cells (a sweep point equal to the ladder's setting) ranks by its
    earliest listed group.
    """
    first = list(first)
    if unknown := [g for g in first if g not in plan.groups]:
        raise ConfigError(f"--first names groups this study does not plan: {unknown}; planned: {list(plan.groups)}")
    if not first:
        return todo

    def rank(run: PlannedRun) -> int:
        groups = [c.split("/", 1)[0] for c in run.cells]
        return min((first.index(g) for g in groups if g in first), default=len(first))

    return sorted(todo, key=rank)


def _power_lines(registry: dict) -> list[str]:
    """What the registered test can detect at the planned size (the registry's power analysis)."""
    pa = registry["analysis"]["power_analysis"]
    reps = f" × {pa['n_replicates']} replicates" if "n_replicates" in pa else ""
    lines = [f"power of the registered test at {pa['n_seeds']} seeds × {pa['n_episodes_per_arm_and_seed']} "
             f"episodes{reps} (α = {pa['alpha']}, first Holm step {pa['first_holm_threshold']:.3g}):"]
    for name, c in pa["components"].items():
        mde = c["mde_at_first_holm_step"]
        lines.append(f"  {name}: δ = {c['delta']} {c['unit']}, MDE {'undefined' if mde is None else format(mde, '.3g')}, "
                     f"power at δ {c['power_at_delta_first_holm_step']:.0%}")
    lines += [f"  limitation: {x}" for x in pa["limitations"]]
    return lines


def report_result(study_dir: str | Path, *, progress: bool = True) -> StudyResult:
    """Rebuild the analysis and report of a finished (or partial) study folder; plan and run nothing."""
    study_dir = Path(study_dir)
    analysis, report = rebuild_report(study_dir, progress=progress)
    st = analysis["status"]
    return StudyResult(study_dir, st["planned"], 0, st["done"], {}, analysis, report)


def _spec_from_config(cfg, *, name: str, seeds, rungs, baselines, sweeps, evaluation, registry) -> StudySpec:
    overrides = list(cfg) if isinstance(cfg, (list, tuple)) else overrides_from_config(cfg)
    return StudySpec(
        name=name, overrides=overrides, seeds=list(seeds), rungs=list(rungs),
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


__all__ = ["StudyResult", "lambda_anc_sweep", "run_ablation_ladder", "run_study"]
