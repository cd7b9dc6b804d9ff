"""Partition pilot (issue 17, step 1): which silo partition leaves federation something to recover?

Descriptive, before any study is registered. For each candidate partition factor f it composes
the CPU preset (configs/model/cpu.yaml, the default) with ``data.partition_factor=f
data.severity=1.0 data.num_silos=2`` plus the extra overrides, and trains, all with one torch
thread and the same batches per source:

    warm start   ``train_warmstart``: ``--warmstart-steps`` steps on the public corpus only (f's
                 ``public`` catalog values, which no silo and no evaluation task uses)
    central      ``train_local(source="pooled")`` from the warm start, ``--steps`` steps
    local-<c>    ``train_local(source="silo-<c>")`` from the warm start, ``--steps`` steps, per silo

Every trained arm starts from the warm start's weights through ``train_local(...,
init_checkpoint=<warm start>)`` (hash-verified; the checkpoint chain records the warm start as its
parent), exactly as the study's ``central`` and ``local`` baselines do. Every arm, the warm start
itself ("warm-start only") and the random-action floor are then scored by
:func:`lensemble.eval.evaluate` (``policy="mpc"`` / ``"random"``, ``split="heldout"``, no ladder)
on the SAME ``--episodes`` held-out tasks of f's config: the heldout split cycles through every
silo's factor values, so each task belongs to exactly one silo's conditions (its *owner*: the silo
whose home set holds the task's value; at severity 1 the silos own disjoint values).

Reported per candidate (``<out>/partition-pilot.md``, every per-episode outcome in
``<out>/partition-pilot.json``): success with a Wilson 95 % interval per arm, and per local model
on its own silo's tasks against the other silos'; the central − local gap (local = the mean of the
local models, each scored on every task) as a paired difference on the shared tasks (bootstrap
95 % interval, sign-flip p) with the exact McNemar test of central against each local model;
central − warm start (did federation's reference arm learn beyond the warm start?) and warm
start − random; the per-episode correlation (phi) between every pair of arms, which sets the power
of a paired study; and the candidates ranked by the gap. The partition to register is the one with
the largest gap whose interval excludes 0, provided central beats the warm start clearly; the
appearance-only control agent.color should show none (the CPU study measured ≈ 0).

The unit here is the task of one trained model per arm (one seed): intervals are for these
models on these tasks, not for the training procedure (docs/study.md "The analysis").

Commands (from the repository root; every stage is cached under --out, so re-running the same
command resumes where it stopped, and a finished stage is never retrained or re-scored):

    nice -n 19 .venv/bin/python examples/partition_pilot.py --plan-only      # the cost, then exit
    nice -n 19 .venv/bin/python examples/partition_pilot.py --out runs/partition-pilot
    # two cores: one process per half of the candidates, then the report over all of them
    nice -n 19 .venv/bin/python examples/partition_pilot.py --factors agent.region,door.position,agent.speed &
    nice -n 19 .venv/bin/python examples/partition_pilot.py --factors agent.radius,agent.color &
    wait; .venv/bin/python examples/partition_pilot.py --stage eval           # cached: report only

``--export DIR`` copies every stage record (no checkpoints, no data) and the report to DIR, which
is then itself a valid ``--out`` for ``--stage eval``: commit it, and a later session rebuilds the
report from it even after ``runs/`` is gone. ``--stage train`` only trains, ``--stage eval`` only
scores what is trained (a candidate with an untrained arm is skipped, with a message) and writes
the report; ``all`` (default) does both.
Extra arguments are config overrides for every arm of every candidate (after the candidate's own,
so ``data.severity=0.5`` wins). A finished stage whose settings differ from the current ones stops
the pilot (use a new --out) rather than mixing two configurations.

Defaults, and why:

    --factors agent.region,door.position,agent.speed,agent.radius,agent.color
        issue 17's coverage split (agent.region: each silo's episodes start, aim and stay in one
        room; the public corpus is a band around the door, the only episodes that cross it), its
        dynamics and layout candidates, and the appearance-only control whose gap the CPU study
        measured ≈ 0 (a usable partition must beat it)
    --warmstart-steps 300
        short on purpose: after the CPU study's 1500-step warm start every model stayed at the
        warm start's level (no arm could differ); 300 is the default run's warm start (README: it
        planned 6/20 there, against 62-72 % after 2000 central steps), so the arms' own steps
        carry the learning; central − warm start, reported per candidate, checks it
    --steps 1500
        per trained arm: planning beats its controls only after 1200-2000 central steps
        (docs/model.md), and 1500 keeps a candidate near 1.2 CPU-hours
    --episodes 100
        the planning pilot's task count: a Wilson half-width of at most 10 points, and ~50 tasks
        per silo's conditions for the own-vs-other split
    data.severity=1.0, data.num_silos=2
        disjoint silos (the largest shift a factor can make), each owning half of the factor's
        silo values (4 of 8 for the 12-value factors, 8 of 16 for agent.color)

Cost (``--plan-only`` prints it per candidate and in total; one torch thread, measured on the
2-core box: 2000 steps ≈ 1100 CPU-s, an MPC episode with CEM 300 × 30 ≈ 4.5 CPU-s):

    CPU-s = 0.55 × (warm-start steps + (1 + silos) × steps) + 4.5 × (2 + silos) × episodes

i.e. 0.55 × 4800 + 4.5 × 400 = 4440 CPU-s ≈ 1.23 CPU-hours per candidate at the defaults,
≈ 6.2 CPU-hours for the five (≈ 3.1 h of wall time as two processes on two free cores). Not in
the model: random actions (env steps only, no planning) and data collection (61 CPU-s for
agent.speed's collection with ``data.workers=1``; with the default 2 workers it runs in worker
processes, whose CPU this process does not see). The CPU seconds of this process
(``time.process_time``) and the wall seconds are recorded per stage (``data.json``, every
``train.json``, every evaluation in ``cache/``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from lensemble.config import load_config
from lensemble.config.hashing import json_digest
from lensemble.data.partition import plan_from_config
from lensemble.data.store import data_dir, ensure_data
from lensemble.eval.closed_loop import episode_specs, eval_factor_values, evaluate, goal_spec_hash
from lensemble.eval.stats import mcnemar_exact, mde_paired, paired_difference, wilson_interval
from lensemble.training.trainer import train_local
from lensemble.training.warmstart import train_warmstart

DEFAULT_FACTORS = "agent.region,door.position,agent.speed,agent.radius,agent.color"
CONTROL_FACTOR = "agent.color"  # appearance only: the silos see the same dynamics
#: The cost model (CPU seconds, one torch thread, the 2-core box).
CPU_S_PER_STEP = 0.55
CPU_S_PER_MPC_EPISODE = 4.5
#: Power: the gap the registered study should detect (docs/study.md, δ_success).
POWER_DELTA = 0.10


def cpu_seconds() -> float:
    return time.process_time()


def say(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------ configs
def candidate_overrides(factor: str) -> list[str]:
    """The overrides that make candidate ``factor`` (on top of the default CPU preset)."""
    return [f"data.partition_factor={factor}", "data.severity=1.0", "data.num_silos=2"]


def candidate_config(factor: str, args, out: Path):
    """The composed config of ``factor``'s candidate: the pilot's step counts, the candidate's
    partition, then the user's overrides."""
    return load_config([f"train.steps={args.steps}", f"train.warmstart_steps={args.warmstart_steps}",
                        "train.checkpoint_every=0", "train.threads=1", f"run_dir={out / factor}",
                        *candidate_overrides(factor), *args.overrides])


def identity(cfg, *, warmstart: bool = False, **extra) -> str:
    """A training stage's identity: its composed config without what training never reads (the
    output folder, the evaluation settings; for the warm start also the arms' step count, which
    ``train_warmstart`` replaces by ``train.warmstart_steps``), plus ``extra``."""
    dump = cfg.model_dump(mode="json")
    for key in ("run_dir", "eval"):
        dump.pop(key, None)
    if warmstart:
        dump["train"] = {k: v for k, v in dump["train"].items() if k not in ("steps", "checkpoint_every")}
    return json_digest({"config": dump, **extra})


def local_arms(cfg) -> list[str]:
    return [f"local-{c}" for c in range(cfg.data.num_silos)]


def parse_factors(text: str) -> list[str]:
    factors = [f.strip() for f in text.split(",") if f.strip()]
    if not factors:
        raise SystemExit("--factors needs at least one factor, e.g. agent.speed")
    if len(set(factors)) != len(factors):
        raise SystemExit(f"--factors lists a factor twice: {text!r}")
    return factors


# ------------------------------------------------------------------------------- cost model
def cost_model(cfg, steps: int, warmstart_steps: int, episodes: int) -> dict:
    """CPU seconds of one candidate (module docstring): training and MPC evaluation."""
    trained = 1 + cfg.data.num_silos                     # central + one local model per silo
    mpc_arms = 1 + trained                               # + the warm start itself
    train_s = CPU_S_PER_STEP * (warmstart_steps + trained * steps)
    eval_s = CPU_S_PER_MPC_EPISODE * mpc_arms * episodes
    return {"trained_arms": trained, "mpc_arms": mpc_arms, "train_steps": warmstart_steps + trained * steps,
            "mpc_episodes": mpc_arms * episodes, "train_cpu_s": train_s, "eval_cpu_s": eval_s,
            "cpu_s": train_s + eval_s, "cpu_hours": (train_s + eval_s) / 3600.0}


def print_plan(factors: list[str], args, out: Path) -> dict:
    rows = {f: cost_model(candidate_config(f, args, out), args.steps, args.warmstart_steps, args.episodes)
            for f in factors}
    say(f"Partition pilot plan: warm start {args.warmstart_steps} steps, {args.steps} steps per trained arm, "
        f"{args.episodes} held-out tasks per arm; {CPU_S_PER_STEP} CPU-s per training step, "
        f"{CPU_S_PER_MPC_EPISODE} CPU-s per MPC episode (one thread).")
    say(f"{'candidate':16s} {'train steps':>11s} {'MPC episodes':>12s} {'train CPU-h':>11s} "
        f"{'eval CPU-h':>10s} {'CPU-hours':>9s}")
    for f, r in rows.items():
        say(f"{f:16s} {r['train_steps']:11d} {r['mpc_episodes']:12d} {r['train_cpu_s'] / 3600:11.2f} "
            f"{r['eval_cpu_s'] / 3600:10.2f} {r['cpu_hours']:9.2f}")
    total = sum(r["cpu_hours"] for r in rows.values())
    say(f"{'total':16s} {sum(r['train_steps'] for r in rows.values()):11d} "
        f"{sum(r['mpc_episodes'] for r in rows.values()):12d} "
        f"{sum(r['train_cpu_s'] for r in rows.values()) / 3600:11.2f} "
        f"{sum(r['eval_cpu_s'] for r in rows.values()) / 3600:10.2f} {total:9.2f}")
    say(f"Total: {total:.2f} CPU-hours ({total / 2:.2f} h of wall time as two processes on two free cores); "
        "data collection (~1 CPU-min per candidate) and random actions are not included.")
    return {"candidates": rows, "total_cpu_hours": total}


# ----------------------------------------------------------------------------------- training
def _cached_stage(path: Path, ident: str, what: str) -> dict | None:
    if not path.exists():
        return None
    rec = json.loads(path.read_text())
    if rec.get("identity") != ident:
        raise SystemExit(f"{path}: {what} was trained under other settings (identity "
                         f"{str(rec.get('identity'))[:12]} != {ident[:12]}); use a new --out or remove "
                         f"{path.parent}")
    return rec


def arm_source(arm: str) -> str:
    """The data an arm trains on: ``central`` the pooled silos, ``local-<c>`` silo c."""
    return "pooled" if arm == "central" else "silo-" + arm.split("-", 1)[1]


def warm_identity(cfg) -> str:
    return identity(cfg, warmstart=True, stage="warmstart", steps=cfg.train.warmstart_steps)


def arm_identity(cfg, arm: str, warm: dict) -> str:
    return identity(cfg, stage=arm, source=arm_source(arm), steps=cfg.train.steps, init=warm["checkpoint_hash"])


def _checkpoint(rec: dict, folder: Path) -> Path:
    """A stage's checkpoint folder (stored relative to the candidate folder)."""
    return folder / rec["checkpoint"]


def collect(factor: str, cfg, folder: Path) -> dict:
    path = folder / "data.json"
    if path.exists():
        rec = json.loads(path.read_text())
        if rec["data_folder"] == str(data_dir(cfg)):
            return rec
    c0, w0 = cpu_seconds(), time.perf_counter()
    data_folder, _ = ensure_data(cfg, progress=False)
    rec = {"data_folder": str(data_folder), "cpu_seconds": round(cpu_seconds() - c0, 1),
           "wall_seconds": round(time.perf_counter() - w0, 1)}
    path.write_text(json.dumps(rec, indent=1))
    say(f"[{factor}] data {data_folder}: {rec['cpu_seconds']} CPU-s (this process), {rec['wall_seconds']} s wall")
    return rec


def train_warm(factor: str, cfg, folder: Path) -> dict:
    """The candidate's public warm start (or the cached one)."""
    path = folder / "warmstart" / "train.json"
    ident = warm_identity(cfg)
    rec = _cached_stage(path, ident, "the warm start")
    if rec is not None:
        return rec
    say(f"[{factor}] warm start: {cfg.train.warmstart_steps} steps on the public corpus ...")
    return _timed_training(factor, "warmstart", path, folder,
                           lambda: train_warmstart(cfg, run_dir=folder / "warmstart" / "run", progress=False),
                           {"identity": ident, "source": "public", "steps": cfg.train.warmstart_steps})


def _timed_training(factor: str, arm: str, path: Path, folder: Path, train, fields: dict) -> dict:
    """Run ``train()`` (a TrainResult), record its checkpoint, CPU and wall seconds in ``path``."""
    c0, w0 = cpu_seconds(), time.perf_counter()
    res = train()
    rec = {"arm": arm, **fields,
           "checkpoint": str(res.checkpoint_dir.relative_to(folder)), "checkpoint_hash": res.checkpoint_hash,
           "cpu_seconds": round(cpu_seconds() - c0, 1), "wall_seconds": round(time.perf_counter() - w0, 1),
           "final_metrics": res.final_metrics}
    path.write_text(json.dumps(rec, indent=1))
    say(f"[{factor}] {arm}: {rec['cpu_seconds']} CPU-s, {rec['wall_seconds']} s wall, "
        f"pred {res.final_metrics.get('loss/pred', float('nan')):.4f}")
    return rec


def train_arm(factor: str, arm: str, cfg, folder: Path, warm: dict) -> dict:
    """Train (or reuse) one arm from the warm start: central on the pooled silos, local-<c> on silo c."""
    source = arm_source(arm)
    path = folder / arm / "train.json"
    ident = arm_identity(cfg, arm, warm)
    rec = _cached_stage(path, ident, arm)
    if rec is not None:
        return rec
    say(f"[{factor}] {arm}: {cfg.train.steps} steps on {source} from the warm start ...")
    return _timed_training(factor, arm, path, folder,
                           lambda: train_local(cfg, source=source, run_dir=folder / arm / "run",
                                               init_checkpoint=_checkpoint(warm, folder), progress=False),
                           {"identity": ident, "source": source, "steps": cfg.train.steps,
                            "init_checkpoint_hash": warm["checkpoint_hash"]})


def train_candidate(factor: str, cfg, folder: Path) -> dict[str, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    collect(factor, cfg, folder)  # before any clock of a training stage starts
    warm = train_warm(factor, cfg, folder)
    recs = {"warmstart": warm}
    for arm in ["central", *local_arms(cfg)]:
        recs[arm] = train_arm(factor, arm, cfg, folder, warm)
    return recs


def trained_records(cfg, folder: Path) -> dict[str, dict] | None:
    """The candidate's training records, or None when an arm is missing."""
    warm = _cached_stage(folder / "warmstart" / "train.json", warm_identity(cfg), "the warm start")
    if warm is None:
        return None
    recs = {"warmstart": warm}
    for arm in ["central", *local_arms(cfg)]:
        rec = _cached_stage(folder / arm / "train.json", arm_identity(cfg, arm, warm), arm)
        if rec is None:
            return None
        recs[arm] = rec
    return recs


# ---------------------------------------------------------------------------------- the tasks
def task_table(cfg, episodes: int) -> tuple[list[dict], str]:
    """Per held-out task: index, env seed, the partition factor's value and the silo whose
    conditions it is (the silo whose home set holds the value; None if no silo owns it), as
    :func:`lensemble.eval.evaluate` poses them; and the tasks' goal-spec hash."""
    values, _ = eval_factor_values(cfg, cfg.env.id, "heldout")
    specs = episode_specs(cfg.eval.seed, episodes, values)
    plan = plan_from_config(cfg)
    key = cfg.data.partition_factor
    owner_of = {json.dumps(plan.values[i]): c for c, home in enumerate(plan.home) for i in home}
    rows = [{"index": s.index, "seed": s.seed, "value": s.factors.get(key),
             "owner": owner_of.get(json.dumps(s.factors.get(key)))} for s in specs]
    gsh = goal_spec_hash(cfg.env.id, cfg.eval.goal_offset, cfg.eval.budget, specs, cfg.eval.goal_source)
    return rows, gsh


def closed_loop(factor: str, arm: str, ckpt: Path, ckpt_hash: str, cfg, episodes: int, policy: str,
                cache: Path, split: str = "heldout") -> dict:
    """Per-episode outcomes of ``policy`` with ``ckpt`` on the candidate's first ``episodes`` tasks
    of ``split`` (cached under ``cache`` by checkpoint, episodes, split and the eval and data settings)."""
    key = json_digest({"eval": cfg.eval.model_dump(mode="json"), "data": cfg.data.model_dump(mode="json"),
                       "env": cfg.env.id, "checkpoint": ckpt_hash, "policy": policy, "episodes": episodes,
                       "split": split})
    tag = "" if split == "heldout" else f"{split}-"  # heldout keeps its earlier cache names
    path = cache / f"loop-{arm}-{policy}-{tag}n{episodes}-{key[:12]}.json"
    if path.exists():
        return json.loads(path.read_text())
    say(f"[{factor}] evaluating {arm} ({policy}) on {episodes} {split} tasks ...")
    c0, w0 = cpu_seconds(), time.perf_counter()
    rep = evaluate(ckpt, cfg.env.id, cfg=cfg, episodes=episodes, policy=policy, ladder=False, split=split,
                   progress=False)
    eps = sorted(rep.episodes, key=lambda e: e.index)
    value = {"arm": arm, "policy": policy, "checkpoint_hash": rep.checkpoint_hash,
             "goal_spec_hash": rep.goal_spec_hash, "index": [e.index for e in eps],
             "success": [bool(e.success) for e in eps], "route_valid": [e.route_valid for e in eps],
             "cross_wall": [e.cross_wall for e in eps], "final_distance": [e.final_distance for e in eps],
             "start_distance": [e.start_distance for e in eps], "time_per_action_ms": rep.time_per_action_ms,
             "cpu_seconds": round(cpu_seconds() - c0, 1), "wall_seconds": round(time.perf_counter() - w0, 1)}
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1))
    k = sum(value["success"])
    say(f"[{factor}] {arm} ({policy}): {k}/{episodes}, {value['cpu_seconds']} CPU-s, {value['wall_seconds']} s wall")
    return value


# ------------------------------------------------------------------------------------- stats
def rate(successes) -> dict:
    k, n = int(sum(bool(s) for s in successes)), len(successes)
    if n == 0:
        return {"n": 0, "successes": 0, "rate": None, "wilson_95": [None, None]}
    ci = wilson_interval(k, n)
    return {"n": n, "successes": k, "rate": k / n, "wilson_95": [ci.low, ci.high]}


def phi(a, b) -> float | None:
    """The phi coefficient (Pearson correlation of two 0/1 vectors); None when either is constant."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.size < 2 or x.std() == 0 or y.std() == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def paired(treatment, control, seed: int = 0) -> dict:
    """Mean per-task difference ``treatment - control`` on shared tasks: bootstrap 95 % interval
    (BCa over tasks), two-sided sign-flip p, the SD of the differences, the MDE at this many tasks
    (two-sided α 0.05, power 0.8, normal) and the tasks that would detect POWER_DELTA."""
    t, c = np.asarray(treatment, dtype=float), np.asarray(control, dtype=float)
    if t.size < 2:
        return {"estimate": float(np.mean(t - c)) if t.size else None, "ci_95": [None, None], "p_two_sided": None,
                "sd": None, "n": int(t.size), "mde": None, "tasks_for_delta": None}
    r = paired_difference(t, c, n_boot=10_000, seed=seed)
    z = 1.959963984540054 + 0.8416212335729143  # z_{α/2} + z_{power}
    need = None if r.sd == 0 else int(math.ceil((z * r.sd / POWER_DELTA) ** 2))
    return {"estimate": r.estimate, "ci_95": [r.ci.low, r.ci.high], "ci_method": r.ci.method,
            "p_two_sided": r.p_value, "sd": r.sd, "n": r.n, "mde": mde_paired(r.sd, r.n),
            "tasks_for_delta": need, "delta": POWER_DELTA}


def mcnemar(a, b) -> dict:
    r = mcnemar_exact(a, b)
    return {"a_only": r.a_only, "b_only": r.b_only, "p_two_sided": r.p_value}


def analyse_candidate(factor: str, cfg, tasks: list[dict], loops: dict[str, dict], recs: dict[str, dict]) -> dict:
    """Every number of one candidate from its per-episode outcomes."""
    locals_ = local_arms(cfg)
    succ = {arm: [bool(s) for s in loop["success"]] for arm, loop in loops.items()}
    n = len(tasks)
    if any(len(s) != n for s in succ.values()):
        raise SystemExit(f"[{factor}] arms were scored on different task counts")
    owners = [t["owner"] for t in tasks]
    arms = {}
    for arm, loop in loops.items():
        row = {"policy": loop["policy"], "rate": rate(succ[arm]), "success": succ[arm],
               "route_valid": loop["route_valid"], "cross_wall": loop["cross_wall"],
               "final_distance": loop["final_distance"], "mean_final_distance": float(np.mean(loop["final_distance"])),
               "by_silo": {str(c): rate([s for s, o in zip(succ[arm], owners, strict=True) if o == c])
                           for c in range(cfg.data.num_silos)},
               "eval_cpu_seconds": loop["cpu_seconds"], "eval_wall_seconds": loop["wall_seconds"],
               "time_per_action_ms": loop["time_per_action_ms"], "checkpoint_hash": loop["checkpoint_hash"]}
        rv = [bool(s and (v is None or v)) for s, v in zip(succ[arm], loop["route_valid"], strict=True)]
        row["route_valid_rate"] = rate(rv)
        if arm in recs:
            row.update(train_cpu_seconds=recs[arm]["cpu_seconds"], train_wall_seconds=recs[arm]["wall_seconds"],
                       train_steps=recs[arm]["steps"], final_train_metrics=recs[arm]["final_metrics"])
        if arm in locals_:
            c = int(arm.split("-", 1)[1])
            row["own"] = rate([s for s, o in zip(succ[arm], owners, strict=True) if o == c])
            row["other"] = rate([s for s, o in zip(succ[arm], owners, strict=True) if o is not None and o != c])
        arms[arm] = row
    local_mean = np.mean([succ[a] for a in locals_], axis=0)
    # Every local model on its own silo's tasks / on the other silos' tasks, pooled over models.
    own = [s for a in locals_ for s, o in zip(succ[a], owners, strict=True) if o == int(a.split("-")[1])]
    other = [s for a in locals_ for s, o in zip(succ[a], owners, strict=True)
             if o is not None and o != int(a.split("-")[1])]
    # Per task: the local model of the task's own silo (the "home" local) and the mean of the others.
    home = [succ[f"local-{o}"][i] if o is not None else None for i, o in enumerate(owners)]
    keep = [i for i, h in enumerate(home) if h is not None]
    away = [float(np.mean([succ[a][i] for a in locals_ if a != f"local-{owners[i]}"])) for i in keep]
    result = {
        "factor": factor, "overrides": candidate_overrides(factor), "tasks": tasks, "arms": arms,
        "local_mean_rate": float(local_mean.mean()),
        "gap": paired(succ["central"], local_mean),
        "gap_mcnemar": {a: mcnemar(succ["central"], succ[a]) for a in locals_},
        "central_minus_warmstart": {**paired(succ["central"], succ["warmstart"]),
                                    "mcnemar": mcnemar(succ["central"], succ["warmstart"])},
        "local_minus_warmstart": paired(local_mean, succ["warmstart"]),
        "warmstart_minus_random": {**paired(succ["warmstart"], succ["random"]),
                                   "mcnemar": mcnemar(succ["warmstart"], succ["random"])},
        "local_own": rate(own), "local_other": rate(other),
        # own-silo local minus the other silos' locals on the same tasks: what a silo loses off its
        # own conditions (the partition's non-IID-ness as the models see it)
        "home_minus_away": paired([float(home[i]) for i in keep], away) if keep else None,
        "phi": [{"a": a, "b": b, "phi": phi(succ[a], succ[b])} for a, b in itertools.combinations(succ, 2)],
        "train_cpu_seconds": round(sum(r["cpu_seconds"] for r in recs.values()), 1),
        "eval_cpu_seconds": round(sum(loop["cpu_seconds"] for loop in loops.values()), 1),
    }
    cw = result["central_minus_warmstart"]
    result["central_beats_warmstart"] = bool(cw["ci_95"][0] is not None and cw["ci_95"][0] > 0)
    result["gap_excludes_zero"] = bool(result["gap"]["ci_95"][0] is not None and result["gap"]["ci_95"][0] > 0)
    return result


# ------------------------------------------------------------------------------------ report
def pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def num(x, f: str = "+.2f") -> str:
    return "–" if x is None else format(x, f)


def ci(pair) -> str:
    lo, hi = pair
    return "–" if lo is None else f"[{lo:+.2f}, {hi:+.2f}]"


def rate_cell(r: dict) -> str:
    if not r["n"]:
        return "–"
    return f"{r['successes']}/{r['n']} = {r['rate']:.0%} [{pct(r['wilson_95'][0])}, {pct(r['wilson_95'][1])}]"


def ranking(candidates: dict[str, dict]) -> list[dict]:
    """Candidates by the central − local gap (largest first)."""
    rows = [{"factor": f, "gap": c["gap"]["estimate"], "ci_95": c["gap"]["ci_95"],
             "gap_excludes_zero": c["gap_excludes_zero"], "central_beats_warmstart": c["central_beats_warmstart"],
             "central_minus_warmstart": c["central_minus_warmstart"]["estimate"]}
            for f, c in candidates.items()]
    return sorted(rows, key=lambda r: -(r["gap"] if r["gap"] is not None else -math.inf))


def choice(rank: list[dict]) -> str:
    ok = [r for r in rank if r["gap_excludes_zero"] and r["central_beats_warmstart"]]
    if ok:
        return (f"{ok[0]['factor']}: the largest central − local gap whose interval excludes 0 "
                f"({ok[0]['gap']:+.2f} {ci(ok[0]['ci_95'])}), with central above the warm start.")
    return ("none: no candidate has a central − local gap whose interval excludes 0 while central beats the "
            "warm start clearly; change the warm start or the step budget before registering.")


def write_report(out: Path, result: dict) -> None:
    (out / "partition-pilot.json").write_text(json.dumps(result, indent=1, default=str))
    s = result["settings"]
    lines = [f"# Partition pilot (issue 17, step 1): {s['warmstart_steps']}-step public warm start, "
             f"{s['steps']} steps per arm, {s['episodes']} held-out tasks per candidate", "",
             f"Candidates: {', '.join(result['candidates'])}; overrides {' '.join(s['overrides']) or '(none)'}. "
             "One trained model per arm (one seed): the intervals are for these models on these tasks.", "",
             f"**Choice:** {result['choice']}", "",
             "## Ranking by the central − local gap", "",
             "| rank | candidate | central − local | 95 % (bootstrap) | central − warm start | central beats warm start |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(result["ranking"], 1):
        lines.append(f"| {i} | {r['factor']} | {num(r['gap'])} | {ci(r['ci_95'])} | {num(r['central_minus_warmstart'])} "
                     f"| {'yes' if r['central_beats_warmstart'] else 'no'} |")
    for f, c in result["candidates"].items():
        lines += ["", f"## {f}" + (" (appearance-only control)" if f == CONTROL_FACTOR else ""), "",
                  f"Goal-spec {c['goal_spec_hash'][:12]}; tasks per silo's conditions: "
                  + ", ".join(f"silo {o}: {sum(t['owner'] == o for t in c['tasks'])}"
                              for o in sorted({t['owner'] for t in c['tasks']}, key=lambda o: (o is None, o))) + ".", "",
                  "| arm | success, Wilson 95 % | " + " | ".join(f"silo {k}'s tasks" for k in c["arms"]["central"]["by_silo"])
                  + " | route-valid | train CPU-s | eval CPU-s |",
                  "|---|---|" + "---|" * len(c["arms"]["central"]["by_silo"]) + "---|---|---|"]
        for arm, a in c["arms"].items():
            lines.append(f"| {arm} | {rate_cell(a['rate'])} | "
                         + " | ".join(rate_cell(r) for r in a["by_silo"].values())
                         + f" | {a['route_valid_rate']['successes']} | {a.get('train_cpu_seconds', '–')} "
                           f"| {a['eval_cpu_seconds']} |")
        g, cw, ws, lw = c["gap"], c["central_minus_warmstart"], c["warmstart_minus_random"], c["local_minus_warmstart"]
        hm = c["home_minus_away"] or {"estimate": None, "ci_95": [None, None], "p_two_sided": None}
        lines += ["", "| paired on the shared tasks | difference | 95 % (bootstrap) | sign-flip p | SD | MDE | tasks for δ = "
                  f"{POWER_DELTA:.2f} |", "|---|---|---|---|---|---|---|"]
        for name, d in (("central − local (mean of the local models)", g), ("central − warm start", cw),
                        ("local (mean) − warm start", lw), ("warm start − random", ws),
                        ("per task: its own silo's local − the other silos' locals", hm)):
            lines.append(f"| {name} | {num(d['estimate'])} | {ci(d['ci_95'])} | {num(d['p_two_sided'], '.3g')} "
                         f"| {num(d.get('sd'), '.2f')} | {num(d.get('mde'), '.2f')} | {d.get('tasks_for_delta') or '–'} |")
        tr = c.get("transfer")
        if tr:
            n_tr = tr["arms"]["central"]["rate"]["n"]
            lines += ["", f"Transfer tasks ({n_tr}, the factor split: values no silo owns"
                      + ("; for agent.region the whole arena, so goals may lie across the wall" if f == "agent.region"
                         else "") + f"; goal-spec {tr['goal_spec_hash'][:12]}):", "",
                      "| arm | success, Wilson 95 % | on cross-wall tasks |", "|---|---|---|"]
            for arm, a in tr["arms"].items():
                lines.append(f"| {arm} | {rate_cell(a['rate'])} | {rate_cell(a['cross_wall_rate'])} |")
            for name, d in (("central − local (mean)", tr["gap"]), ("central − warm start", tr["central_minus_warmstart"])):
                lines.append(f"\n{name} on the transfer tasks: {num(d['estimate'])} {ci(d['ci_95'])}, "
                             f"sign-flip p {num(d['p_two_sided'], '.3g')}.")
        lines += ["", "Exact McNemar (A only / B only, p): "
                  + "; ".join(f"central vs {a}: {m['a_only']} / {m['b_only']}, {m['p_two_sided']:.3g}"
                              for a, m in c["gap_mcnemar"].items())
                  + f"; central vs warm start: {cw['mcnemar']['a_only']} / {cw['mcnemar']['b_only']}, "
                    f"{cw['mcnemar']['p_two_sided']:.3g}.",
                  f"Local models on their own silo's tasks {rate_cell(c['local_own'])}; on the other silo's "
                  f"{rate_cell(c['local_other'])}.", "",
                  "Per-task correlation (phi) between arms (– where an arm's outcomes are constant): "
                  + "; ".join(f"{p['a']}–{p['b']} {num(p['phi'], '.2f')}" for p in c["phi"]) + "."]
    lines += ["", f"Cost: training {result['train_cpu_seconds']} CPU-s, evaluation {result['eval_cpu_seconds']} CPU-s "
              f"(this process, one thread). MDE: two-sided α 0.05, power 0.8 over tasks of these fixed models."]
    (out / "partition-pilot.md").write_text("\n".join(lines) + "\n")


# -------------------------------------------------------------------------------------- main
def score_arms(factor: str, cfg, folder: Path, recs: dict, episodes: int, split: str) -> dict[str, dict]:
    """Every arm (MPC) and random actions on the first ``episodes`` tasks of ``split``."""
    cache = folder / "cache"
    loops = {}
    for arm in ["warmstart", "central", *local_arms(cfg)]:
        loops[arm] = closed_loop(factor, arm, _checkpoint(recs[arm], folder), recs[arm]["checkpoint_hash"],
                                 cfg, episodes, "mpc", cache, split)
    warm = recs["warmstart"]
    loops["random"] = closed_loop(factor, "random", _checkpoint(warm, folder), warm["checkpoint_hash"], cfg,
                                  episodes, "random", cache, split)
    hashes = {loop["goal_spec_hash"] for loop in loops.values()}
    if len(hashes) != 1:
        raise SystemExit(f"[{factor}] the arms were scored on different {split} tasks: {sorted(hashes)}")
    return loops


def analyse_transfer(loops: dict[str, dict], locals_: list[str]) -> dict:
    """The transfer split (factor values no silo owns; for agent.region the whole arena, i.e.
    cross-room tasks): per-arm success and the paired central − local and central − warm start."""
    succ = {arm: [bool(s) for s in loop["success"]] for arm, loop in loops.items()}
    local_mean = np.mean([succ[a] for a in locals_], axis=0)
    return {"goal_spec_hash": next(iter(loops.values()))["goal_spec_hash"],
            "arms": {arm: {"rate": rate(succ[arm]), "success": succ[arm], "cross_wall": loop["cross_wall"],
                           "cross_wall_rate": rate([s for s, w in zip(succ[arm], loop["cross_wall"], strict=True) if w]),
                           "eval_cpu_seconds": loop["cpu_seconds"]} for arm, loop in loops.items()},
            "gap": paired(succ["central"], local_mean),
            "central_minus_warmstart": paired(succ["central"], succ["warmstart"]),
            "eval_cpu_seconds": round(sum(loop["cpu_seconds"] for loop in loops.values()), 1)}


def evaluate_candidate(factor: str, cfg, folder: Path, episodes: int, transfer_episodes: int = 0) -> dict | None:
    recs = trained_records(cfg, folder)
    if recs is None:
        say(f"[{factor}] not every arm is trained yet: skipped (run --stage train or all)")
        return None
    tasks, gsh = task_table(cfg, episodes)
    loops = score_arms(factor, cfg, folder, recs, episodes, "heldout")
    if loops["central"]["goal_spec_hash"] != gsh:
        raise SystemExit(f"[{factor}] the arms were scored on goal-spec {loops['central']['goal_spec_hash'][:12]}, "
                         f"the candidate's tasks are {gsh[:12]}")
    res = analyse_candidate(factor, cfg, tasks, loops, recs)
    res["goal_spec_hash"] = gsh
    if transfer_episodes:
        res["transfer"] = analyse_transfer(score_arms(factor, cfg, folder, recs, transfer_episodes, "factor"),
                                           local_arms(cfg))
    g = res["gap"]
    say(f"[{factor}] central {res['arms']['central']['rate']['successes']}/{episodes}, local mean "
        f"{res['local_mean_rate']:.0%}, warm start {res['arms']['warmstart']['rate']['successes']}/{episodes}, "
        f"random {res['arms']['random']['rate']['successes']}/{episodes}; gap {num(g['estimate'])} {ci(g['ci_95'])}")
    return res


def export_records(out: Path, dest: Path) -> list[Path]:
    """Copy every stage record under ``out`` (each candidate's ``data.json``, ``<arm>/train.json``
    and ``cache/*.json``, and the report) to ``dest``, leaving checkpoints and data behind. The
    copy is itself a valid ``--out`` for ``--stage eval``: the report is rebuilt from the cached
    per-episode outcomes without a checkpoint, so a session that lost ``runs/`` resumes from what
    was committed (training a missing arm still needs its warm start's checkpoint)."""
    copied = []
    for src in sorted(out.rglob("*.json")) + sorted(out.glob("partition-pilot.md")):
        rel = src.relative_to(out)
        if "run" in rel.parts[:-1] or "data" in rel.parts[:1]:  # checkpoint folders, collections
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(src.read_bytes())
        copied.append(target)
    return copied


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/partition-pilot")
    ap.add_argument("--factors", default=DEFAULT_FACTORS,
                    help="candidate partition factors (default: issue 17's dynamics/layout ones + the colour control)")
    ap.add_argument("--warmstart-steps", type=int, default=300,
                    help="public warm-start steps per candidate (default 300: short, so the arms carry the learning)")
    ap.add_argument("--steps", type=int, default=1500,
                    help="steps per trained arm, central and each local (default 1500: planning needs 1200-2000)")
    ap.add_argument("--episodes", type=int, default=100,
                    help="held-out tasks, shared by every arm (default 100: Wilson half-width <= 10 points)")
    ap.add_argument("--transfer-episodes", type=int, default=0,
                    help="also score every arm on this many tasks of the factor split (values no silo owns; "
                         "for agent.region the whole arena: cross-room tasks); 0 skips it")
    ap.add_argument("--stage", choices=("all", "train", "eval"), default="all")
    ap.add_argument("--plan-only", action="store_true", help="print the cost model and exit")
    ap.add_argument("--export", metavar="DIR", help="copy every stage record and the report under --out to DIR "
                    "(e.g. docs/results/partition-pilot, to commit), then exit")
    ap.add_argument("overrides", nargs="*", help="config overrides for every arm of every candidate")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmstart_steps < 1 or args.episodes < 1:
        raise SystemExit("--steps, --warmstart-steps and --episodes must be positive")
    if args.transfer_episodes < 0:
        raise SystemExit("--transfer-episodes must be >= 0")
    factors = parse_factors(args.factors)
    out = Path(args.out)
    if args.plan_only:
        print_plan(factors, args, out)
        return None
    if args.export:
        copied = export_records(out, Path(args.export))
        say(f"exported {len(copied)} records from {out} to {args.export}")
        return None
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    configs = {f: candidate_config(f, args, out) for f in factors}  # every candidate validated first

    if args.stage in ("all", "train"):
        for f in factors:
            train_candidate(f, configs[f], out / f)
    if args.stage == "train":
        return None

    candidates = {}
    for f in factors:
        res = evaluate_candidate(f, configs[f], out / f, args.episodes, args.transfer_episodes)
        if res is not None:
            candidates[f] = res
    if not candidates:
        say("nothing to report yet")
        return None
    rank = ranking(candidates)
    result = {"settings": {"steps": args.steps, "warmstart_steps": args.warmstart_steps, "episodes": args.episodes,
                           "transfer_episodes": args.transfer_episodes,
                           "factors": factors, "overrides": args.overrides, "severity": {f: configs[f].data.severity
                                                                                         for f in candidates},
                           "eval": configs[factors[0]].eval.model_dump(mode="json"),
                           "cost_model": {"cpu_s_per_step": CPU_S_PER_STEP, "cpu_s_per_mpc_episode": CPU_S_PER_MPC_EPISODE}},
              "candidates": candidates, "ranking": rank, "choice": choice(rank),
              "train_cpu_seconds": round(sum(c["train_cpu_seconds"] for c in candidates.values()), 1),
              "eval_cpu_seconds": round(sum(c["eval_cpu_seconds"] + (c.get("transfer") or {}).get("eval_cpu_seconds", 0)
                                            for c in candidates.values()), 1)}
    write_report(out, result)
    say((out / "partition-pilot.md").read_text())
    return result


if __name__ == "__main__":
    main()
