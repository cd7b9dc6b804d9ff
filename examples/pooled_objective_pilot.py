"""Pooled-objective pilot (issue 31, "the federated objective must be the pooled objective"): descriptive.

SIGReg (a statistic of the batch's empirical characteristic function) and BatchNorm, computed on
one silo's batch, penalise every difference between the silos' latent distributions. This pilot
measures what that costs, centrally and under federation, in the room study's setting
(configs/study/region.yaml: agent.region at severity 1, 2 silos, a 300-step public warm start,
4 rounds x H = 50, the CPU preset; root_seed = eval.seed = the seed). Per seed it collects the
data and trains the warm start ONCE; every arm starts from that warm start:

    warmstart               the warm start itself (the floor)
    central-control         train_local(source="pooled"), 400 steps, train.silo_batches=true
                            (each batch is B/C clips from each silo)
    central-persilo         ... + train.silo_statistics=both (each silo's share gets its own
                            BatchNorm forward and SIGReg: the federation's statistics, no averaging)
    central-persilo-remedy  ... + objective.sigreg_scope=pooled objective.bn_scope=pooled
    central-twin            the data-parallel twin of the federation: 200 steps at batch 128
    fed-silo                `lensemble run --engine inprocess` (gauge naive) from the warm start:
                            today's objective
    fed-sigreg              objective.sigreg_scope=pooled (ECF summaries exchanged every round)
    fed-bn-pooled           objective.bn_scope=pooled
    fed-bn-frozen           objective.bn_scope=frozen (FixBN)
    fed-pooled              sigreg pooled + bn pooled
    fed-pooled-frozen       sigreg pooled + bn frozen
    fed-pooled-h10 / -h200  fed-pooled at H = 10 (20 rounds) and H = 200 (1 round): the summaries'
                            staleness at the same 200 steps per participant
    fed-pooled-anchor       fed-pooled on the anchored rung (gauge=anchor)
    fed-pooled-backstop     fed-pooled on rung 3 (shared sketch + Procrustes backstop, no anchor)
    fed-pooled-anchor-only  fed-pooled with the anchor but without the backstop
    random, oracle          the floors on the same tasks: random actions, and the true dynamics
                            (the environment's own simulator as the planner's model)

The room study's preset pins the per-silo objective (objective.sigreg_scope=silo, bn_scope=batch;
amendment 5), so fed-silo is the study's federation; the other arms switch the scopes on.

Every checkpoint is scored as the room study scores it (lensemble/study/runner.py: `evaluate`,
split heldout, the study's ladder settings, eval.episodes tasks; goal-spec hashes checked equal
across a seed's arms), plus two latent measures on each silo's held-out frames (in this partition
silo c's frames are room c's): the room separation (Mahalanobis distance between the two rooms'
latent centroids under the pooled within-room covariance with a 1 % ridge, i.e. + 0.01 * tr/d * I)
and the cross-room agent_x probe R² (`linear_probe_r2` fitted on one room's train frames, scored
on the other room's held-out frames; the mean of both directions).

Report (<out>/pilot.md, <out>/pilot.json): per arm and seed k/n with a Wilson 95 % interval and
pooled over seeds; exact McNemar on the shared tasks for central-persilo(-remedy) vs
central-control and every fed arm vs fed-silo; every fed arm's difference from central-twin and
from central-control (per seed: BCa bootstrap over tasks; pooled: the two-stage seed-then-task
bootstrap at >= 2 seeds, else the one seed's).

Arms whose options are not wired into lensemble/training or lensemble/federation yet (a schema
field alone is not enough: training would silently ignore it) are skipped with a message;
``--force`` runs them anyway. Every stage (data, warm start, arm, evaluation) is cached under
``--out`` by a key of its overrides, so re-running resumes and only missing stages run.

Commands (repository root):

    .venv/bin/python examples/pooled_objective_pilot.py --plan-only
    mkdir -p runs/pooled-pilot && nohup nice -n 19 .venv/bin/python examples/pooled_objective_pilot.py --seeds 0 \\
        --arms warmstart,central-twin,fed-silo > runs/pooled-pilot/log.txt 2>&1 &
    nice -n 19 .venv/bin/python examples/pooled_objective_pilot.py            # every arm, seeds 0,1,2

Cost (one torch thread; measured on the 2-core box: 0.36 CPU-s per central step at batch 64,
0.39 per participant step, 2.1 CPU-s per MPC episode, ~14 CPU-s per ladder): per seed the warm
start 300 x 0.36 = 108 CPU-s, a central arm 400 x 0.36 = 144 (the twin 200 x 0.72), a fed arm
2 x 200 x 0.39 = 156, each evaluation 50 x 2.1 + 14 = 119, i.e. about 49 CPU-minutes per seed at
every arm and ~2.4 CPU-hours for three seeds. Not in the model: data collection (~1 CPU-min per
seed, worker processes), the pooled statistics' own cost, the room measures (seconds).
Measured in the first run (seed 0, 2 cores shared with a second pilot process and a test run, load
2.3-4.6): data 52 s wall; warm start 163 s wall / 161 CPU-s; central-twin 319 s / 225 CPU-s;
fed-silo 293 s / 267 CPU-s (its subprocess); each evaluation 168-345 s wall / 167-225 CPU-s; i.e.
about 1.5x the model's CPU seconds under that contention. Each stage's record holds its wall,
CPU and child-CPU seconds and the code it ran (HEAD + a digest of uncommitted lensemble/ changes).
Two processes may share one --out (different --arms); each writes pilot.md with its own arms at its
end, so rebuild the combined report afterwards with ``--report-only``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lensemble.artifacts.checkpoint import load_checkpoint
from lensemble.config import load_config
from lensemble.config.hashing import json_digest
from lensemble.data.collect import load_silo
from lensemble.data.store import ensure_data
from lensemble.eval.closed_loop import evaluate
from lensemble.eval.ladder import LadderSettings, encode_frames, linear_probe_r2, probe_train_frames
from lensemble.eval.stats import hierarchical_bootstrap, mcnemar_exact, paired_difference, wilson_interval
from lensemble.model.world_model import world_model_from_state
from lensemble.study.gap import gap_recovery
from lensemble.study.spec import load_study_spec
from lensemble.training.trainer import train_local
from lensemble.training.warmstart import train_warmstart

SP, SB, BN = "objective.sigreg_scope=pooled", "train.silo_batches=true", "objective.bn_scope="
#: arm -> (kind, its overrides on top of the seed's base).
ARMS: dict[str, tuple[str, list[str]]] = {
    "warmstart": ("warm", []),
    "central-control": ("central", [SB]),
    "central-persilo": ("central", [SB, "train.silo_statistics=both"]),
    "central-persilo-remedy": ("central", [SB, "train.silo_statistics=both", SP, BN + "pooled"]),
    "central-persilo-sigreg-remedy": ("central", [SB, "train.silo_statistics=both", SP]),
    "central-twin": ("central", ["train.steps=200", "train.batch_size=128"]),
    # each silo alone for its participant's 200 steps: the local reference of ρ
    "local-0": ("local", ["train.steps=200"]),
    "local-1": ("local", ["train.steps=200"]),
    "fed-silo": ("fed", []),
    "fed-sigreg": ("fed", [SP]),
    "fed-bn-pooled": ("fed", [BN + "pooled"]),
    "fed-bn-frozen": ("fed", [BN + "frozen"]),
    "fed-pooled": ("fed", [SP, BN + "pooled"]),
    "fed-pooled-frozen": ("fed", [SP, BN + "frozen"]),
    # staleness of the summaries: H = 10 and 200 at the same 200 steps per participant
    "fed-sigreg-h10": ("fed", [SP, "federation.rounds=20", "federation.inner_steps=10"]),
    "fed-sigreg-h200": ("fed", [SP, "federation.rounds=1", "federation.inner_steps=200"]),
    "fed-pooled-h10": ("fed", [SP, BN + "pooled", "federation.rounds=20", "federation.inner_steps=10"]),
    # (a one-round run's participants take all 200 steps in one ask: the default 600 s deadline is too
    # short on a busy 2-core box, where seed 0's first try lost silo-1 at 600 s; so was it for the
    # anchored rung's 50 steps, whose inprocess participants run one after the other)
    "fed-pooled-h200": ("fed", [SP, BN + "pooled", "federation.rounds=1", "federation.inner_steps=200",
                                "federation.round_timeout_s=3600"]),
    # the anchored rung with the pooled objective: the new study's C3 arm (its seed spread plans the study)
    "fed-pooled-anchor": ("fed", [SP, BN + "pooled", "gauge=anchor", "federation.round_timeout_s=3600"]),
    # the anchored rung's parts, one at a time (issue 32: why the rung fails under the pooled objective):
    # rung 3 (shared sketch + Procrustes backstop, no anchor), and the anchor without the backstop
    "fed-pooled-backstop": ("fed", [SP, BN + "pooled", "gauge=backstop", "federation.round_timeout_s=3600"]),
    "fed-pooled-anchor-only": ("fed", [SP, BN + "pooled", "gauge=anchor", "gauge.backstop=false",
                                       "federation.round_timeout_s=3600"]),
    # the floors: the warm start's checkpoint played by another policy (its model unused)
    "random": ("floor", []),
    "oracle": ("floor", []),
}
#: The room study's pins of the per-silo objective (amendment 5) sit at the schema's defaults: the
#: configs and hashes are those of the stages cached before the pins, so cache keys leave them out.
PER_SILO_PINS = ("objective.sigreg_scope=silo", "objective.bn_scope=batch")
FED = [a for a, (k, _) in ARMS.items() if k == "fed"]
#: (A, B) pairs compared on shared tasks: A − B with exact McNemar.
COMPARISONS = ([("central-persilo", "central-control"), ("central-persilo-remedy", "central-control")]
               + [(f, "fed-silo") for f in FED if f != "fed-silo"]
               + [("central-persilo-sigreg-remedy", "central-control")]
               + [(f, ref) for f in FED for ref in ("central-twin", "central-control")])
#: ρ = (S_fed − S_local) / (S_ref − S_local) against both central arms, the twin the reference
RHO_REFERENCES = ("central-twin", "central-control")
LOCALS = ("local-0", "local-1")
CENTRAL_STEPS = 400
#: The cost model (CPU seconds, one torch thread, the 2-core box; configs/study/region.yaml).
CPU_S = {"central_step_b64": 0.36, "participant_step": 0.39, "episode": 2.1, "ladder": 14.0}
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.0f} s] {msg}", flush=True)


# ------------------------------------------------------------------------------------- configs
def base_overrides(seed: int, out: Path) -> list[str]:
    """The room study's overrides for ``seed`` (its preset, root_seed and eval.seed), one data root."""
    return [*load_study_spec("region").overrides, f"root_seed={seed}", f"eval.seed={seed}",
            f"data.root={out / 'data'}"]


def keyed(overrides: list[str]) -> list[str]:
    return [o for o in overrides if o not in PER_SILO_PINS]


def arm_overrides(arm: str) -> list[str]:
    kind, extra = ARMS[arm]
    return ([f"train.steps={CENTRAL_STEPS}"] if kind == "central" else []) + extra


# ---------------------------------------------------------------------------------- cost model
def arm_cost(arm: str, cfg) -> dict:
    kind = ARMS[arm][0]
    if kind == "floor":  # no model to train or probe; the episodes cost about a planned one's
        return {"train_cpu_s": 0.0, "eval_cpu_s": cfg.eval.episodes * CPU_S["episode"],
                "cpu_s": cfg.eval.episodes * CPU_S["episode"]}
    if kind == "warm":
        train = cfg.train.warmstart_steps * CPU_S["central_step_b64"]
    elif kind in ("central", "local"):
        c = load_config([*base_overrides(0, Path("/tmp")), *arm_overrides(arm)])
        train = c.train.steps * CPU_S["central_step_b64"] * c.train.batch_size / 64
    else:
        train = cfg.federation.rounds * cfg.federation.inner_steps * cfg.data.num_silos * CPU_S["participant_step"]
    ev = cfg.eval.episodes * CPU_S["episode"] + CPU_S["ladder"]
    return {"train_cpu_s": train, "eval_cpu_s": ev, "cpu_s": train + ev}


def print_plan(arms: list[str], seeds: list[int], episodes: int) -> dict:
    cfg = load_config([*base_overrides(0, Path("/tmp")), f"eval.episodes={episodes}"])
    rows = {a: arm_cost(a, cfg) for a in arms}
    say(f"Pooled-objective pilot plan: {len(seeds)} seed(s) {seeds}, {episodes} tasks per model; "
        + ", ".join(f"{k} {v}" for k, v in CPU_S.items()) + " CPU-s")
    print(f"{'arm':24s} {'train CPU-min':>13s} {'eval CPU-min':>12s} {'per seed':>9s} {'all seeds':>9s}")
    for a, r in rows.items():
        print(f"{a:24s} {r['train_cpu_s'] / 60:13.1f} {r['eval_cpu_s'] / 60:12.1f} {r['cpu_s'] / 60:9.1f} "
              f"{r['cpu_s'] * len(seeds) / 60:9.1f}")
    total = sum(r["cpu_s"] for r in rows.values()) * len(seeds) / 60
    print(f"{'total':24s} {'':13s} {'':12s} {total / len(seeds):9.1f} {total:9.1f} CPU-minutes "
          f"(+ ~1 CPU-min of collection per seed)")
    return {"arms": rows, "total_cpu_minutes": total}


# -------------------------------------------------------------------------------------- stages
def code_state() -> dict:
    """The code a stage ran: HEAD and a digest of the uncommitted changes under lensemble/ (the
    package may be edited while the pilot runs; the cache key deliberately leaves it out)."""
    root = Path(__file__).resolve().parents[1]

    def git(*a):
        return subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout
    untracked = git("ls-files", "--others", "--exclude-standard", "lensemble").split()
    blob = git("diff", "HEAD", "--", "lensemble") + "".join((root / f).read_text() for f in untracked)
    return {"git_head": git("rev-parse", "HEAD").strip(), "lensemble_diff": json_digest({"diff": blob})[:12]}


def cached(path: Path, fn) -> dict:
    """``path``'s record, or run ``fn()`` (a dict), time it (wall, this process's and its
    children's CPU) and write it there."""
    if path.exists():
        return json.loads(path.read_text())
    code = code_state()
    w0, c0 = time.perf_counter(), time.process_time()
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = fn()
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec.update(wall_seconds=round(time.perf_counter() - w0, 1), cpu_seconds=round(time.process_time() - c0, 1),
               child_cpu_seconds=round(ch1.ru_utime + ch1.ru_stime - ch0.ru_utime - ch0.ru_stime, 1), code=code)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1, default=str))
    return rec


def collect(seed: int, base: list[str], folder: Path) -> dict:
    cfg = load_config(base)

    def run():
        data_folder, _ = ensure_data(cfg, progress=False)
        return {"data_folder": str(data_folder)}
    key = json_digest({"stage": "data", "overrides": keyed(base)})[:12]
    rec = cached(folder / f"data-{key}.json", run)
    say(f"seed {seed}: data {rec['data_folder']} ({rec['wall_seconds']} s wall)")
    return rec


def train_warm(seed: int, base: list[str], folder: Path) -> dict:
    key = json_digest({"stage": "warmstart", "overrides": keyed(base)})[:12]
    run_dir = folder / f"warmstart-{key}"

    def run():
        say(f"seed {seed}: warm start ({load_config(base).train.warmstart_steps} steps on the public corpus) ...")
        res = train_warmstart(load_config([*base, f"run_dir={run_dir}"]), run_dir=run_dir, progress=False)
        return {"arm": "warmstart", "overrides": base, "checkpoint": str(res.checkpoint_dir),
                "checkpoint_hash": res.checkpoint_hash, "final_metrics": res.final_metrics}
    rec = cached(run_dir / "stage.json", run)
    say(f"seed {seed}: warm start {rec['checkpoint_hash'][:12]} ({rec['wall_seconds']} s wall, {rec['cpu_seconds']} CPU-s)")
    return rec


def train_arm(seed: int, arm: str, base: list[str], folder: Path, warm: dict, engine: str) -> dict:
    kind, over = ARMS[arm][0], arm_overrides(arm)
    key = json_digest({"stage": arm, "kind": kind, "overrides": keyed([*base, *over]), "warm": warm["checkpoint_hash"]})[:12]
    run_dir = folder / f"{arm}-{key}"

    def central():
        cfg = load_config([*base, *over, f"run_dir={run_dir}"])
        source = f"silo-{arm.rsplit('-', 1)[1]}" if kind == "local" else "pooled"
        say(f"seed {seed}: {arm}: {cfg.train.steps} steps at batch {cfg.train.batch_size} on {source} ...")
        res = train_local(cfg, source=source, run_dir=run_dir / "run", init_checkpoint=warm["checkpoint"],
                          progress=False)
        return {"arm": arm, "overrides": over, "checkpoint": str(res.checkpoint_dir),
                "checkpoint_hash": res.checkpoint_hash, "final_metrics": res.final_metrics}

    def federated():
        rd = run_dir / "run"
        args = [sys.executable, "-m", "lensemble", "run", "--no-eval", "--engine", engine, f"run_dir={rd}",
                f"federation.warmstart={warm['checkpoint']}", *base, *over]
        env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
               "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        say(f"seed {seed}: {arm}: `lensemble run` ({' '.join(over) or 'no extra overrides'}) ...")
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "run.log", "a") as log:
            proc = subprocess.run(args, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        if proc.returncode:
            raise RuntimeError(f"lensemble run failed (rc {proc.returncode}); see {run_dir / 'run.log'}")
        s = json.loads((rd / "summary.json").read_text())
        last = {k: v for k, v in (s["rounds"][-1] if s["rounds"] else {}).items() if isinstance(v, (int, float))}
        return {"arm": arm, "overrides": over, "command": args[1:], "checkpoint": s["final_checkpoint"],
                "checkpoint_hash": s["final_hash"], "warmstart_hash": s["warmstart_hash"],
                "rounds_completed": s["rounds_completed"], "final_metrics": last}
    rec = cached(run_dir / "stage.json", federated if kind == "fed" else central)
    if kind == "fed" and rec.get("warmstart_hash") != warm["checkpoint_hash"]:
        raise SystemExit(f"{arm}: the federation started from {rec.get('warmstart_hash')}, not the seed's warm start")
    say(f"seed {seed}: {arm} trained ({rec['wall_seconds']} s wall, {rec['cpu_seconds'] + rec['child_cpu_seconds']:.0f}"
        f" CPU-s), pred {rec['final_metrics'].get('loss/pred', float('nan')):.4f}")
    return rec


def room_measures(model, cfg, data_folder: Path) -> dict:
    """Room separation and the cross-room agent_x probe R² on each silo's held-out frames."""
    summary = json.loads((data_folder / "collection.json").read_text())
    z, x, z_tr, x_tr = {}, {}, {}, {}
    with torch.no_grad():
        for c in range(cfg.data.num_silos):
            held = load_silo(data_folder, c, "heldout", summary)
            z[c] = encode_frames(model.encoder, held.obs).reshape(-1, model.latent_dim).double()
            x[c] = torch.from_numpy(held.state.reshape(-1, held.state.shape[-1])[:, :1].astype(np.float64))
            obs, st = probe_train_frames([load_silo(data_folder, c, "train", summary)], 4096)
            z_tr[c] = encode_frames(model.encoder, obs).double()
            x_tr[c] = torch.from_numpy(st[:, :1].astype(np.float64))
    a, b = z[0], z[1]
    within = ((a - a.mean(0)).T @ (a - a.mean(0)) + (b - b.mean(0)).T @ (b - b.mean(0))) / (len(a) + len(b) - 2)
    d = within.shape[0]
    cov = within + 0.01 * torch.trace(within) / d * torch.eye(d, dtype=torch.float64)
    delta = a.mean(0) - b.mean(0)
    maha = float(torch.sqrt(delta @ torch.linalg.solve(cov, delta)))
    cross = {f"{i}->{j}": linear_probe_r2(z_tr[i], x_tr[i], z[j], x[j])[0] for i, j in ((0, 1), (1, 0))}
    own = {f"{i}->{i}": linear_probe_r2(z_tr[i], x_tr[i], z[i], x[i])[0] for i in (0, 1)}
    vals = [v for v in cross.values() if v is not None]
    return {"room_separation": maha, "cross_room_x_r2": float(np.mean(vals)) if vals else None,
            "cross_room_x_r2_by_direction": cross, "own_room_x_r2": own,
            "heldout_frames": [len(a), len(b)]}


def score(seed: int, arm: str, rec: dict, cfg, folder: Path, data_folder: Path, episodes: int) -> dict:
    """The study's evaluation of ``rec``'s checkpoint, plus the room measures (cached)."""
    ev = load_study_spec("region").evaluation
    floor = ARMS[arm][0] == "floor"
    key = json_digest({"checkpoint": rec["checkpoint_hash"], "eval": cfg.eval.model_dump(mode="json"),
                       "data": cfg.data.model_dump(mode="json"), "episodes": episodes,
                       "settings": ev.model_dump(mode="json"), **({"policy": arm} if floor else {})})[:12]

    def run_floor():
        say(f"seed {seed}: playing the {ev.split} tasks with {arm} actions ...")
        rep = evaluate(rec["checkpoint"], cfg.env.id, cfg=cfg, episodes=episodes, policy=arm, ladder=False,
                       split=ev.split, progress=False, parallel=ev.parallel)
        eps = sorted(rep.episodes, key=lambda e: e.index)
        return {"arm": arm, "checkpoint_hash": rec["checkpoint_hash"], "goal_spec_hash": rep.goal_spec_hash,
                "success": [bool(e.success) for e in eps], "report": {}, "room_separation": None,
                "cross_room_x_r2": None, "own_room_x_r2": {}}

    def run():
        say(f"seed {seed}: evaluating {arm} on {episodes} {ev.split} tasks (+ ladder) ...")
        rep = evaluate(rec["checkpoint"], cfg.env.id, cfg=cfg, episodes=episodes, split=ev.split, progress=False,
                       ladder=ev.ladder, parallel=ev.parallel,
                       ladder_settings=LadderSettings(intervention_pairs=ev.intervention_pairs,
                                                      max_probe_frames=ev.max_probe_frames))
        eps = sorted(rep.episodes, key=lambda e: e.index)
        ck = load_checkpoint(rec["checkpoint"])
        rooms = room_measures(world_model_from_state(ck.architecture, ck.tensors).eval(), cfg, data_folder)
        scal = {k: v for k, v in json.loads(rep.to_json()).items() if isinstance(v, (int, float, str)) or v is None}
        return {"arm": arm, "checkpoint_hash": rec["checkpoint_hash"], "goal_spec_hash": rep.goal_spec_hash,
                "success": [bool(e.success) for e in eps], "report": scal, **rooms}
    r = cached(folder / "eval" / f"{arm}-{key}.json", run_floor if floor else run)
    say(f"seed {seed}: {arm}: {sum(r['success'])}/{len(r['success'])}, probe R² {fmt(r['report'].get('probe_r2'))}, "
        f"room separation {fmt(r['room_separation'])}, cross-room x R² {fmt(r['cross_room_x_r2'])} "
        f"({r['wall_seconds']} s wall)")
    return r


# ---------------------------------------------------------------------------------------- stats
def fmt(x, f: str = ".2f") -> str:
    return "–" if x is None else format(x, f)


def rate(succ: list[bool]) -> dict:
    k, n = int(sum(succ)), len(succ)
    ci = wilson_interval(k, n)
    return {"k": k, "n": n, "rate": k / n, "wilson_95": [ci.low, ci.high]}


def compare(a: str, b: str, evals: dict[int, dict]) -> dict | None:
    """A − B on the tasks both were scored on, per seed and pooled over the seeds that have both."""
    seeds = [s for s, e in evals.items() if a in e and b in e]
    if not seeds:
        return None
    per, diffs, xa, xb = {}, [], [], []
    for s in seeds:
        sa, sb = evals[s][a]["success"], evals[s][b]["success"]
        d = paired_difference(np.asarray(sa, float), np.asarray(sb, float), n_boot=10_000, seed=s)
        m = mcnemar_exact(sa, sb)
        per[s] = {"difference": d.estimate, "ci_95": [d.ci.low, d.ci.high], "a_only": m.a_only, "b_only": m.b_only,
                  "mcnemar_p": m.p_value}
        diffs.append(np.asarray(sa, float) - np.asarray(sb, float))
        xa += sa
        xb += sb
    m = mcnemar_exact(xa, xb)
    if len(seeds) >= 2:
        est, ci, _ = hierarchical_bootstrap(diffs, n_boot=10_000, seed=0)
        pooled_ci = [ci.low, ci.high]
    else:
        est, pooled_ci = per[seeds[0]]["difference"], per[seeds[0]]["ci_95"]
    return {"a": a, "b": b, "seeds": seeds, "per_seed": per,
            "pooled": {"difference": est, "ci_95": pooled_ci, "a_only": m.a_only, "b_only": m.b_only,
                       "mcnemar_p": m.p_value}}


def write_report(out: Path, evals: dict[int, dict], trained: dict[int, dict], args) -> dict:
    arms = [a for a in ARMS if any(a in e for e in evals.values())]
    table = {}
    for a in arms:
        per = {s: {**rate(e[a]["success"]), **{k: e[a][k] for k in ("room_separation", "cross_room_x_r2")},
                   "own_room_x_r2": float(np.mean([v for v in e[a]["own_room_x_r2"].values() if v is not None] or [np.nan])),
                   "probe_r2": e[a]["report"].get("probe_r2"), "effective_dim": e[a]["report"].get("effective_dim"),
                   "train_wall_s": (trained[s].get(a) or {}).get("wall_seconds"),
                   "eval_wall_s": e[a]["wall_seconds"]} for s, e in evals.items() if a in e}
        table[a] = {"per_seed": per, "pooled": rate([x for s in per for x in evals[s][a]["success"]])}
    comps = [c for c in (compare(a, b, evals) for a, b in COMPARISONS) if c]
    rho = gap_table(evals)
    result = {"settings": {"seeds": sorted(evals), "episodes": args.episodes, "engine": args.engine,
                           "base_overrides": base_overrides(0, out)[:-3] + ["root_seed=<seed>", "eval.seed=<seed>"],
                           "arms": {a: arm_overrides(a) for a in arms}, "cost_model": CPU_S},
              "goal_spec_hash": {s: next(iter(e.values()))["goal_spec_hash"] for s, e in evals.items()},
              "arms": table, "comparisons": comps, "rho": rho,
              "evaluations": {s: {a: {k: v for k, v in r.items()} for a, r in e.items()} for s, e in evals.items()},
              "training": trained}
    (out / "pilot.json").write_text(json.dumps(result, indent=1, default=str))
    lines = [f"# Pooled-objective pilot (issue 31): room study setting, {args.episodes} held-out tasks per model", "",
             "Descriptive. Seeds " + ", ".join(str(s) for s in sorted(evals)) + "; every arm of a seed starts from "
             "the seed's warm start and plays the same tasks (goal-spec " + ", ".join(
                 f"s{s} {h[:12]}" for s, h in result["goal_spec_hash"].items()) + "). The intervals are for these "
             "models on these tasks.", "",
             "| arm | seed | success, Wilson 95 % | probe R² | room separation | cross-room x R² | own-room x R² "
             "| eff. dim | train s | eval s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for a, t in table.items():
        for s, r in t["per_seed"].items():
            lines.append(f"| {a} | {s} | {r['k']}/{r['n']} = {r['rate']:.0%} [{r['wilson_95'][0]:.0%}, "
                         f"{r['wilson_95'][1]:.0%}] | {fmt(r['probe_r2'], '.3f')} | {fmt(r['room_separation'])} | "
                         f"{fmt(r['cross_room_x_r2'], '.3f')} | {fmt(r['own_room_x_r2'], '.3f')} | {fmt(r['effective_dim'], '.1f')} | "
                         f"{fmt(r['train_wall_s'], '.0f')} | {fmt(r['eval_wall_s'], '.0f')} |")
        if len(t["per_seed"]) > 1:
            p = t["pooled"]
            lines.append(f"| {a} | pooled | {p['k']}/{p['n']} = {p['rate']:.0%} [{p['wilson_95'][0]:.0%}, "
                         f"{p['wilson_95'][1]:.0%}] | | | | | | | |")
    lines += ["", "Paired on the shared tasks (A − B; per seed a BCa bootstrap over tasks, pooled the seed-then-task "
              "bootstrap at ≥ 2 seeds; exact McNemar on the discordant tasks):", "",
              "| A | B | seed | A − B | 95 % | A only / B only | McNemar p |", "|---|---|---|---|---|---|---|"]
    for c in comps:
        rows = list(c["per_seed"].items()) + ([("pooled", c["pooled"])] if len(c["seeds"]) > 1 else [])
        for s, r in rows:
            lines.append(f"| {c['a']} | {c['b']} | {s} | {r['difference']:+.2f} | [{fmt(r['ci_95'][0], '+.2f')}, "
                         f"{fmt(r['ci_95'][1], '+.2f')}] | {r['a_only']} / {r['b_only']} | {r['mcnemar_p']:.3g} |")
    if rho:
        lines += ["", "Gap recovery ρ = (S_fed − S_local) / (S_ref − S_local), S_local the mean of the two local models "
                  "(each silo alone for its participant's 200 steps); per seed the point estimate, over seeds the "
                  "registered paired seed bootstrap (lensemble.study.gap.gap_recovery, ≥ 2 seeds):", "",
                  "| fed arm | reference | per seed ρ | seeds | ρ [95 %] | gap S_ref − S_local [95 %] |",
                  "|---|---|---|---|---|---|"]
        for r in rho:
            g = r.get("over_seeds")
            over = ("–", "–") if g is None else (
                (f"{g['rho']:+.2f} [{g['rho_ci'][0]:+.2f}, {g['rho_ci'][1]:+.2f}]" if g["defined"] else f"undefined: {g['reason']}"),
                f"{g['gap']:+.2f} [{g['gap_ci'][0]:+.2f}, {g['gap_ci'][1]:+.2f}]")
            per = ", ".join(f"s{s} {fmt(v, '+.2f')}" for s, v in r["per_seed"].items())
            lines.append(f"| {r['fed']} | {r['reference']} | {per} | {len(r['per_seed'])} | {over[0]} | {over[1]} |")
    lines += ["", "Room separation: Mahalanobis distance between the two rooms' (silos') latent centroids on their "
              "held-out frames, under the pooled within-room covariance + 1 % of its mean eigenvalue. Cross-room x "
              "R²: ridge probe of agent_x fitted on one room's train frames, scored on the other room's held-out "
              "frames (mean of both directions); the rooms split agent_x (seed 0: room 0 x ≈ 112-203, room 1 ≈ 21-110), "
              "so it asks whether one linear x direction holds in both rooms, and R² is taken around the test room's "
              "own mean: an offset between the rooms' x codes alone drives it far below 0. Own-room x R²: the same "
              "probe fitted and scored within a room. Probe R² and effective dimension: the evaluation ladder's."]
    (out / "pilot.md").write_text("\n".join(lines) + "\n")
    return result


def gap_table(evals: dict[int, dict]) -> list[dict]:
    """ρ of every fed arm against each reference, per seed (point) and over seeds (bootstrap)."""
    out = []
    for fed in FED:
        for ref in RHO_REFERENCES:
            seeds = [s for s, e in evals.items() if all(a in e for a in (fed, ref, *LOCALS))]
            if not seeds:
                continue
            f = np.array([np.mean(evals[s][fed]["success"]) for s in seeds])
            c = np.array([np.mean(evals[s][ref]["success"]) for s in seeds])
            loc = np.array([np.mean([np.mean(evals[s][a]["success"]) for a in LOCALS]) for s in seeds])
            per = {s: (float((fi - li) / (ci - li)) if ci != li else None) for s, fi, ci, li in zip(seeds, f, c, loc, strict=True)}
            row = {"fed": fed, "reference": ref, "per_seed": per, "over_seeds": None}
            if len(seeds) >= 2:
                g = gap_recovery(f, loc, c, n_boot=10_000, seed=0)
                row["over_seeds"] = {"defined": g.defined, "rho": g.rho, "rho_ci": list(g.rho_ci) if g.rho_ci else None,
                                     "gap": g.denominator, "gap_ci": list(g.denominator_ci), "reason": g.reason}
            out.append(row)
    return out


# ----------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/pooled-pilot")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of: " + ", ".join(ARMS))
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--engine", default="inprocess", choices=("inprocess", "flower-inprocess", "ray"))
    ap.add_argument("--plan-only", action="store_true", help="print the cost model and exit")
    ap.add_argument("--report-only", action="store_true", help="rebuild the report from cached stages only")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not seeds or args.episodes < 1:
        raise SystemExit(f"unknown arms {unknown} (known: {', '.join(ARMS)}), or no seeds, or --episodes < 1")
    if args.plan_only:
        print_plan(arms, seeds, args.episodes)
        return
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    evals: dict[int, dict] = {}
    trained: dict[int, dict] = {}
    failed = []
    for seed in seeds:
        folder = out / f"seed-{seed}"
        base = [*base_overrides(seed, out), f"eval.episodes={args.episodes}"]
        cfg = load_config([*base, f"run_dir={folder / 'eval-run'}"])
        evals[seed], trained[seed] = {}, {}
        if args.report_only:
            for p in sorted((folder / "eval").glob("*.json")):
                r = json.loads(p.read_text())
                if r["arm"] in arms and len(r["success"]) == args.episodes:
                    evals[seed][r["arm"]] = r
            for p in sorted(folder.glob("*/stage.json")):
                r = json.loads(p.read_text())
                if any(e["checkpoint_hash"] == r["checkpoint_hash"] for e in evals[seed].values()):
                    trained[seed][r["arm"]] = r
            continue
        data_folder = Path(collect(seed, base, folder)["data_folder"])
        warm = train_warm(seed, base, folder)
        trained[seed]["warmstart"] = warm
        for arm in arms:
            try:
                rec = warm if ARMS[arm][0] in ("warm", "floor") else train_arm(seed, arm, base, folder, warm,
                                                                               args.engine)
                if ARMS[arm][0] != "floor":  # a floor trains nothing: its rec is the warm start
                    trained[seed][arm] = rec
                evals[seed][arm] = score(seed, arm, rec, cfg, folder, data_folder, args.episodes)
            except Exception as exc:  # noqa: BLE001 — one arm's failure must not lose the others
                failed.append(f"seed {seed} {arm}: {type(exc).__name__}: {exc}")
                say(f"seed {seed}: {arm} FAILED: {type(exc).__name__}: {exc}")
        if len({r["goal_spec_hash"] for r in evals[seed].values()}) > 1:
            raise SystemExit(f"seed {seed}: the arms were scored on different tasks")
    evals = {s: e for s, e in evals.items() if e}
    if not evals:
        say("nothing evaluated yet")
        return
    write_report(out, evals, trained, args)
    say(f"report: {out / 'pilot.md'} and {out / 'pilot.json'}")
    print((out / "pilot.md").read_text())
    if failed:
        raise SystemExit("failed stages:\n" + "\n".join(failed))


if __name__ == "__main__":
    main()
