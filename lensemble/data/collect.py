"""Collection: run the envs with scripted policies and write silos, splits and the public probe.

One episode is a pure function of its seed: ``derive(root_seed, "collect", silo, episode)`` seeds
the env reset (start and target positions), the expert's noise level and every policy draw. So the
data do not depend on the number of worker processes or on scheduling, and re-running a
collection reproduces it bit for bit (the shard hashes match).

Actions mix a noisy scripted expert (directed, long-range motion: door crossings, pushes) with
held random actions (coverage of the action space) in segments; ``data.random_action_share`` is the
expected fraction of random steps. The expert's noise std is drawn per episode from
``EXPERT_NOISE`` so that the data span sharp and sloppy behaviour.

Layout written by :func:`collect_silos` under ``out_dir``::

    silo_000/RESIDENCY.json          marker: raw data of silo 0, not exportable
    silo_000/train-<sha256>.npz      training episodes of silo 0
    silo_000/heldout-<sha256>.npz    "episode" split of silo 0
    ...
    eval/transfer-<sha256>.npz       "factor" split: transfer values no silo sees
    public/probe-<sha256>.npz        public probe frames (P, 3, H, W)
    collection.json                  the summary (no raw data)

Workers: ``data.workers`` fresh processes (at least one; the caller's process never simulates), each
with one torch thread, its own cached env and MKL's ``COMPATIBLE`` code path, so that the frames
are the same on every CPU (:mod:`lensemble.numerics` says why and what was measured).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from lensemble.config.hashing import json_digest
from lensemble.config.seeds import derive
from lensemble.data.partition import SiloPlan, plan_from_config
from lensemble.data.probe import frames_from_episodes, save_probe
from lensemble.data.residency import mark_silo_folder
from lensemble.data.shards import EpisodeBatch, load_shard, save_shard, stack_episodes
from lensemble.data.workers import WorkerPool
from lensemble.envs.adapter import _import_swm, make_env, set_single_thread
from lensemble.envs.policies import HeldRandomPolicy, MixedPolicy, make_expert
from lensemble.numerics import cpu_model
from lensemble.observability.progress import progress_bar, say

#: Per-episode expert noise std is drawn uniformly from this range (action units, bounds ±1).
EXPERT_NOISE = (0.1, 0.7)
#: Probe episodes: frames taken every PROBE_STRIDE steps, PROBE_FRAMES_PER_EPISODE per episode.
#: Spacing the frames out keeps near-duplicates out of the probe.
PROBE_STRIDE = 4
PROBE_FRAMES_PER_EPISODE = 8
_FORMAT_VERSION = 1


def silo_folder(out_dir: str | Path, silo: int) -> Path:
    return Path(out_dir) / f"silo_{int(silo):03d}"


# ---------------------------------------------------------------------------------------- episodes
def behaviour_policy(env, rng: np.random.Generator, random_share: float, expert: str = "scripted") -> MixedPolicy:
    """The policy that collects the data (the behaviour policy): the env's scripted expert with a
    per-episode noise std drawn from ``EXPERT_NOISE``, mixed with held random actions so that
    ``random_share`` of the steps are random in expectation. Every draw comes from ``rng``, the
    noise std first. The evaluation's dataset-goal protocol builds its held-out episodes with it."""
    noise = float(rng.uniform(*EXPERT_NOISE))
    return MixedPolicy(make_expert(env, rng, noise, expert), HeldRandomPolicy(rng), random_share, rng)


def collect_episode(env, seed: int, factors: dict, steps: int, random_share: float,
                    expert: str = "scripted") -> dict:
    """Run one episode of ``steps`` actions on an :class:`~lensemble.envs.EnvAdapter`.

    ``seed`` seeds both the env reset and :func:`behaviour_policy`. The policy is causal, so the
    first k steps of an episode do not depend on ``steps``. Returns ``obs`` uint8 (T+1, H, W, 3),
    ``actions`` float32 (T, A), ``state`` float32 (T+1, S) and ``factors`` (the applied factor
    values, JSON-ready).
    """
    rng = np.random.default_rng(int(seed))
    policy = behaviour_policy(env, rng, random_share, expert)
    h = env.img_size
    obs = np.empty((steps + 1, h, h, 3), np.uint8)
    actions = np.empty((steps, env.info.action_dim), np.float32)
    state = np.empty((steps + 1, env.info.state_dim), np.float32)
    obs[0] = env.reset(seed, factors)
    state[0] = env.state()
    policy.reset(env)
    for t in range(steps):
        a = policy(env)
        actions[t] = a
        obs[t + 1], state[t + 1], _ = env.step(a)  # success does not end the episode: keep moving
    return {"obs": obs, "actions": actions, "state": state, "factors": env.factor_values(list(factors))}


_ENVS: dict = {}


def _cached_env(env_id: str, img_size: int):
    key = (env_id, img_size)
    if key not in _ENVS:
        _ENVS[key] = make_env(env_id, img_size, single_thread=False)
    return _ENVS[key]


def _run_task(task: tuple) -> dict:
    env_id, img_size, seed, factors, steps, share, expert = task
    return collect_episode(_cached_env(env_id, img_size), seed, factors, steps, share, expert)


def _worker_setup() -> None:
    """A collection worker's start (lensemble/data/workers.py): one thread, the simulator imported."""
    set_single_thread()
    _import_swm()


class _Runner:
    """Runs episode tasks in order on ``workers`` fresh worker processes
    (:class:`lensemble.data.workers.WorkerPool`: MKL's ``COMPATIBLE`` path, so that the frames do
    not depend on the CPU or on what the caller computed before). The price is the simulator's
    import in every worker, about 4 s each, in parallel, paid once per collection."""
    def __init__(self, workers: int):
        self.workers = max(1, int(workers))
        self.pool = None

    def __enter__(self):
        self.pool = WorkerPool(self.workers)
        return self

    def map(self, tasks: list[tuple]):
        yield from self.pool.map(tasks)

    def __exit__(self, *exc):
        self.pool.close(kill=exc[0] is not None)


# ---------------------------------------------------------------------------------------- silos
def _collection_key(cfg) -> str:
    # Everything that changes the collected bytes, and nothing else (not workers, not the folder).
    d = cfg.data.model_dump(mode="json")
    d.pop("workers", None)
    d.pop("root", None)
    blob = {"v": _FORMAT_VERSION, "env": cfg.env.id, "img": cfg.model.img_size,
            "seed": cfg.root_seed, "data": d, "noise": EXPERT_NOISE,
            "probe": [PROBE_STRIDE, PROBE_FRAMES_PER_EPISODE]}
    return json_digest(blob, compact=False)  # pinned: every collected folder is named by it


def _groups(cfg, plan: SiloPlan) -> list[dict]:
    """Every batch of episodes to collect, in a fixed order, with their seeds and factors."""
    d, root = cfg.data, cfg.root_seed
    env_id, img, T, share = cfg.env.id, cfg.model.img_size, d.steps_per_episode, d.random_action_share

    def task(seed, index, steps=T):
        return (env_id, img, seed, plan.factors(index), steps, share, d.expert)

    groups = []
    for c in range(plan.num_silos):
        n_train = len(plan.train[c])
        seeds = [derive(root, "collect", c, i) for i in range(n_train + len(plan.heldout[c]))]
        groups.append({"kind": "silo", "silo": c, "split": "train", "stem": "train",
                       "seeds": seeds[:n_train],
                       "tasks": [task(s, v) for s, v in zip(seeds[:n_train], plan.train[c], strict=True)]})
        if plan.heldout[c]:
            groups.append({"kind": "silo", "silo": c, "split": "episode", "stem": "heldout",
                           "seeds": seeds[n_train:],
                           "tasks": [task(s, v) for s, v in
                                     zip(seeds[n_train:], plan.heldout[c], strict=True)]})
    n_transfer = d.heldout_episodes * plan.num_silos
    if n_transfer and plan.transfer:
        seeds = [derive(root, "collect", "transfer", i) for i in range(n_transfer)]
        values = [plan.transfer[i % len(plan.transfer)] for i in range(n_transfer)]
        groups.append({"kind": "eval", "silo": None, "split": "factor", "stem": "transfer",
                       "seeds": seeds, "tasks": [task(s, v) for s, v in zip(seeds, values, strict=True)]})
    n_probe = math.ceil(d.probe_frames / PROBE_FRAMES_PER_EPISODE)
    probe_steps = PROBE_STRIDE * (PROBE_FRAMES_PER_EPISODE - 1)
    seeds = [derive(root, "collect", "probe", i) for i in range(n_probe)]
    values = [plan.public[i % len(plan.public)] for i in range(n_probe)]
    groups.append({"kind": "probe", "silo": None, "split": "probe", "stem": "probe",
                   "seeds": seeds,
                   "tasks": [task(s, v, probe_steps) for s, v in zip(seeds, values, strict=True)]})
    # The public corpus the warm start trains on: public factor values, seeds disjoint from the
    # probe's, so the probe frames themselves are never trained on.
    if d.public_episodes:
        seeds = [derive(root, "collect", "public", i) for i in range(d.public_episodes)]
        values = [plan.public[i % len(plan.public)] for i in range(d.public_episodes)]
        groups.append({"kind": "public", "silo": None, "split": "public", "stem": "episodes",
                       "seeds": seeds, "tasks": [task(s, v) for s, v in zip(seeds, values, strict=True)]})
    return groups


def _cached_summary(out_dir: Path, key: str) -> dict | None:
    path = out_dir / "collection.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    files = [s["train"]["path"] for s in summary.get("silos", [])]
    files += [s["heldout"]["path"] for s in summary.get("silos", []) if s.get("heldout")]
    files += [summary["probe"]["path"]]
    if summary.get("public"):
        files.append(summary["public"]["path"])
    if summary.get("splits", {}).get("factor", {}).get("path"):
        files.append(summary["splits"]["factor"]["path"])
    if summary.get("collection_key") != key or not all((out_dir / f).is_file() for f in files):
        return None
    summary["cached"] = True
    return summary


def collect_silos(cfg, out_dir: str | Path, *, progress: bool = True, reuse: bool = True) -> dict:
    """Collect every silo, the held-out splits and the public probe into ``out_dir``.

    Uses ``cfg.env.id``, ``cfg.model.img_size``, ``cfg.root_seed`` and the ``cfg.data`` section.
    Returns (and writes to ``out_dir/collection.json``) a summary of paths (relative to
    ``out_dir``), content hashes, factor values per silo and split, the partition plan, and the
    throughput (``frames``, ``seconds``, ``frames_per_second``). With ``reuse=True`` an existing
    collection made from the same settings is returned as is (``cached: True``); shards are still
    verified whenever they are loaded.
    """
    out_dir = Path(out_dir)
    key = _collection_key(cfg)
    if reuse and (cached := _cached_summary(out_dir, key)) is not None:
        return cached
    plan = plan_from_config(cfg)
    groups = _groups(cfg, plan)
    total = sum(len(g["tasks"]) for g in groups)
    out_dir.mkdir(parents=True, exist_ok=True)
    for c in range(plan.num_silos):
        mark_silo_folder(silo_folder(out_dir, c), c)

    summary: dict = {
        "format_version": _FORMAT_VERSION, "collection_key": key, "env_id": cfg.env.id,
        "img_size": cfg.model.img_size, "root_seed": cfg.root_seed, "factor": plan.factor,
        "severity": plan.severity, "num_silos": plan.num_silos,
        "steps_per_episode": cfg.data.steps_per_episode,
        "random_action_share": cfg.data.random_action_share, "expert": cfg.data.expert,
        "silos": [{"silo": c, "folder": silo_folder(out_dir, c).name,
                   "home_values": [plan.values[i] for i in plan.home[c]],
                   "values": [plan.values[i] for i in sorted(plan.seen_by(c))],
                   "train": None, "heldout": None} for c in range(plan.num_silos)],
        "splits": {"episode": {"per_silo": cfg.data.heldout_episodes},
                   "factor": {"values": [plan.values[i] for i in plan.transfer]},
                   "silo": {"held_out_silo": plan.held_out_silo}},
        "plan": plan.to_dict(),
    }
    frames = 0
    t0 = time.perf_counter()
    with _Runner(cfg.data.workers) as runner:
        # Throughput is measured from here: the simulator import and pool start-up are a fixed
        # cost per call, reported separately as startup_seconds.
        start = time.perf_counter()
        with progress_bar("collecting", total, enabled=progress) as advance:
            for g in groups:
                episodes = []
                label = f"silo {g['silo']} {g['split']}" if g["kind"] == "silo" else g["split"]
                advance(0, description=f"collecting {label}")
                for ep in runner.map(g["tasks"]):
                    episodes.append(ep)
                    frames += ep["obs"].shape[0]
                    rate = frames / max(time.perf_counter() - start, 1e-9)
                    advance(1, info=f"{rate:,.0f} frames/s")
                _write_group(out_dir, cfg, plan, g, episodes, summary)
    seconds = time.perf_counter() - start
    summary.update(frames=frames, seconds=round(seconds, 3), startup_seconds=round(start - t0, 3),
                   frames_per_second=round(frames / max(seconds, 1e-9), 1),
                   workers=cfg.data.workers, cached=False,
                   # what made the frames CPU-independent, and the CPU they were made on
                   numerics={"mkl_mode": sorted(set(runner.pool.mkl_modes)), "cpu": cpu_model()})
    (out_dir / "collection.json").write_text(json.dumps(summary, indent=1) + "\n")
    say(f"collected {frames:,} frames in {seconds:.1f} s ({summary['frames_per_second']:,.0f} frames/s, "
        f"{cfg.data.workers} workers)", enabled=progress)
    return summary


def _write_group(out_dir: Path, cfg, plan: SiloPlan, g: dict, episodes: list[dict], summary: dict) -> None:
    meta = {"env_id": cfg.env.id, "img_size": cfg.model.img_size, "silo": g["silo"], "split": g["split"],
            "factor": plan.factor, "root_seed": cfg.root_seed, "episode_seeds": g["seeds"],
            "random_action_share": cfg.data.random_action_share, "expert": cfg.data.expert,
            "format_version": _FORMAT_VERSION}
    if g["kind"] == "probe":
        obs = np.stack([e["obs"] for e in episodes])
        probe_frames = frames_from_episodes(obs, cfg.data.probe_frames, PROBE_STRIDE)
        public = [plan.values[i] for i in plan.public]
        probe = save_probe(out_dir / "public", probe_frames,
                           {**meta, "public_values": public, "stride": PROBE_STRIDE})
        summary["probe"] = {"path": str(probe.path.relative_to(out_dir)), "content_hash": probe.content_hash,
                            "frames": len(probe), "public_values": public}
        return
    batch = stack_episodes(episodes, meta)
    if g["kind"] == "silo":
        folder = silo_folder(out_dir, g["silo"])
    else:
        folder = out_dir / ("public" if g["kind"] == "public" else "eval")
    path = save_shard(folder, batch, g["stem"])
    record = {"path": str(path.relative_to(out_dir)), "hash": batch.content_hash,
              "episodes": batch.num_episodes}
    if g["kind"] == "public":
        summary["public"] = {**record, "values": [plan.values[i] for i in plan.public]}
    elif g["kind"] == "silo":
        summary["silos"][g["silo"]]["train" if g["split"] == "train" else "heldout"] = record
    else:
        summary["splits"]["factor"].update(record)


# ---------------------------------------------------------------------------------------- loading
def load_silo(out_dir: str | Path, silo: int, split: str = "train",
              summary: dict | None = None) -> EpisodeBatch:
    """Load (and verify) silo ``silo``'s ``train`` or ``heldout`` shard from a collection."""
    out_dir = Path(out_dir)
    summary = summary or json.loads((out_dir / "collection.json").read_text())
    record = summary["silos"][silo]["train" if split == "train" else "heldout"]
    if record is None:
        raise FileNotFoundError(f"silo {silo} has no {split} shard")
    return load_shard(out_dir / record["path"], expected_hash=record["hash"])


def load_public_episodes(out_dir: str | Path, summary: dict | None = None) -> EpisodeBatch:
    """Load (and verify) the public corpus: episodes with public factor values only."""
    out_dir = Path(out_dir)
    summary = summary or json.loads((out_dir / "collection.json").read_text())
    record = summary.get("public")
    if not record:
        raise FileNotFoundError(f"{out_dir} has no public corpus (data.public_episodes was 0)")
    return load_shard(out_dir / record["path"], expected_hash=record["hash"])
