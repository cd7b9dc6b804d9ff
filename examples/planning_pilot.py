"""Planning pilot for the world model's levers (issue 14, items 2-3 and 5), on fixed tasks.

For each variant and training seed it trains one centralized (pooled) model for ``--steps``
optimizer steps, then scores every arm on the SAME ``--episodes`` held-out tasks (root seed 0's
data and eval seed, so one goal-spec hash for every arm, whatever seed trained it), beside the
floors on those tasks: random actions, an untrained model with the same planner (variant a's
architecture, init seed 123; with ``--untrained-like V`` also one of variant V's) and, with ``--oracle`` (TwoRoom, PushT, Reacher), the same planner on the true
dynamics. Every arm is scored by :func:`lensemble.eval.evaluate`. Reported per arm: successes with
a Wilson interval, route-valid successes (TwoRoom: every step entered the wall only through a
door), success on tasks whose goal lies across the wall, the ladder's one-step / copy error on
held-out episodes and on training episodes (a gap between them is overfitting),
linear position-probe R² on latents against the same probe on a 64-component PCA of the raw
pixels, effective dimension, latent std, and input robustness (how far the latents move under a
change of resize kernel or a +4/255 brightness shift, relative to the start-goal latent
distance). Per variant over seeds: the per-seed rates and the pooled count. Paired comparisons on
shared tasks: the exact McNemar test, Holm-adjusted over the variant-vs-variant pairs.

Variants (at one seed all start from the same initial weights and see the same batches):

    a  model.input_norm=pixel,  model.projector_norm=layernorm   (the CPU preset before issue 14)
    b  model.input_norm=global, model.projector_norm=layernorm
    c  model.input_norm=pixel,  model.projector_norm=batchnorm
    d  model.input_norm=global, model.projector_norm=batchnorm   (the CPU preset now)
    e  d + model.predictor_attention=banded train.clip_len=6
    f  d + objective.lambda_straight=0.1 (temporal straightening)
    g  d + data.episodes_per_silo=200 (5x the training trajectories, same steps)
    h  d + objective.lambda_rollout=1.0 (multi-step open-loop rollout loss)
    i  h + data.episodes_per_silo=200 (both)
    j  h + model.inverse_head=256 objective.lambda_inverse=1.0 (inverse-dynamics head)
    k  h + model.backbone=cnn (the residual CNN encoder, lensemble/model/cnn.py)
    l  j with objective.lambda_inverse=10.0

Seed s > 0 trains with ``root_seed=s`` (its own data collection, initial weights and batches)
under ``<out>/<variant>-s<s>``; seed 0 under ``<out>/<variant>``. The commands behind
docs/results/planning-pilot (from the repository root; every stage is cached under --out, so
re-running the same command resumes where it stopped):

    nice -n 19 .venv/bin/python examples/planning_pilot.py --out runs/planning-pilot \\
        --steps 2000 --episodes 100 --variants a,d,b,c                  # the normalisation pilot
    nice -n 19 .venv/bin/python examples/planning_pilot.py --out runs/planning-pilot \\
        --steps 2000 --episodes 100 --variants d --seeds 0,1,2 --oracle # the preset over seeds
    nice -n 19 .venv/bin/python examples/planning_pilot.py --out runs/planning-pilot-pusht \\
        --steps 2000 --episodes 50 --variants a,d env=pusht               # PushT

``--protocol dataset_goal`` scores the same checkpoints under the published protocol
(configs/eval/dataset_goal.yaml). ``--stage train`` only trains (to run two trainings side by side
in two processes), ``--stage eval`` only evaluates what has been trained; the default ``all`` does
both and writes ``<out>/pilot.json`` and ``<out>/pilot.md`` (``pilot-<protocol>.*`` for another protocol). Extra arguments are config overrides
for every arm (training and evaluation). CPU seconds (this process, one torch thread) are recorded
per training run and per evaluation.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lensemble.artifacts.checkpoint import load_checkpoint, save_checkpoint
from lensemble.config import load_config
from lensemble.config.seeds import derive
from lensemble.data.store import ensure_data
from lensemble.envs.adapter import make_env, resize_frame
from lensemble.envs.factors import TWOROOM
from lensemble.eval.closed_loop import (
    episode_specs,
    eval_factor_values,
    evaluate,
    goal_spec_hash,
    load_split,
    pose_goal,
)
from lensemble.eval.goals import GoalProtocol, pose_task
from lensemble.eval.ladder import (
    PROBE_DIMS,
    LadderSettings,
    pixel_pca_probe_r2,
    probe_train_frames,
    run_ladder,
)
from lensemble.eval.routes import DOOR_MARGIN, TwoRoomDynamics
from lensemble.eval.stats import holm, mcnemar_exact, wilson_interval
from lensemble.model.encoder import embed_frames
from lensemble.model.world_model import architecture, build_world_model, world_model_from_state
from lensemble.training.trainer import train_local

#: Variant -> the overrides that make it (on top of the CPU preset of the code under test). Each
#: variant names every lever it sets, so a preset change cannot silently change a variant: a-g set
#: the rollout loss off, h and i on (the preset's value since Pilot 3).
VARIANTS = {
    "a": ["objective.lambda_rollout=0.0", "model.input_norm=pixel", "model.projector_norm=layernorm"],
    "b": ["objective.lambda_rollout=0.0", "model.input_norm=global", "model.projector_norm=layernorm"],
    "c": ["objective.lambda_rollout=0.0", "model.input_norm=pixel", "model.projector_norm=batchnorm"],
    "d": ["objective.lambda_rollout=0.0", "model.input_norm=global", "model.projector_norm=batchnorm"],
    # d with the banded predictor (rotary positions, KV-cached rollouts): does it plan as well? On
    # clips that cover its context (5 latents at depth 2), as docs/model.md asks of banded models
    "e": ["objective.lambda_rollout=0.0", "model.input_norm=global", "model.projector_norm=batchnorm",
          "model.predictor_attention=banded", "train.clip_len=6"],
    # d with temporal straightening (shared/notes/planning-levers.md: Wall MPC 69 -> 96 %), at the top of
    # the published 1e-3..1e-1 range because a 4-latent clip holds only two curvature terms
    "f": ["objective.lambda_rollout=0.0", "model.input_norm=global", "model.projector_norm=batchnorm",
          "objective.lambda_straight=0.1"],
    # d on 5x the trajectories (200 per silo instead of 40): the same 2000 steps of 64 clips see each
    # distinct clip ~3.5 times instead of ~18 (the wall probe: d's predictions went through solid wall
    # from 21 % of the starts pushed at it)
    "g": ["objective.lambda_rollout=0.0", "model.input_norm=global", "model.projector_norm=batchnorm",
          "data.episodes_per_silo=200"],
    # d with the multi-step rollout loss (shared/notes/planning-levers.md: 2-6 unroll steps), 3 open-loop
    # steps per 4-latent clip at the one-step term's weight
    "h": ["model.input_norm=global", "model.projector_norm=batchnorm", "objective.lambda_rollout=1.0"],
    # the two levers that moved planning, together: h on g's 5x trajectories
    "i": ["model.input_norm=global", "model.projector_norm=batchnorm", "objective.lambda_rollout=1.0",
          "data.episodes_per_silo=200"],
    # h with an inverse-dynamics head (shared/notes/planning-levers.md: EB-JEPA 97 % -> 1 % without it;
    # PLDM weights it 1.07): the latents must keep what each action changed
    "j": ["model.input_norm=global", "model.projector_norm=batchnorm", "objective.lambda_rollout=1.0",
          "model.inverse_head=256", "objective.lambda_inverse=1.0"],
    # h with the residual CNN encoder (shared/notes/planning-levers.md: EB-JEPA's IMPALA CNN at 64 px),
    # its last grid flattened so where the agent and block sit reaches the latent
    "k": ["model.input_norm=global", "model.projector_norm=batchnorm", "objective.lambda_rollout=1.0",
          "model.backbone=cnn"],
    # j with the inverse term at 10x the weight: on PushT every trained variant's latents carry the
    # block's position (probe R² 0.41-0.87) but hardly the agent's (-0.11-0.34; k's CNN untrained:
    # 0.30-0.34), and an action moves only the agent, so the inverse term is the one that pays for it
    "l": ["model.input_norm=global", "model.projector_norm=batchnorm", "objective.lambda_rollout=1.0",
          "model.inverse_head=256", "objective.lambda_inverse=10.0"],
    # k and j's agent-focused levers together, for PushT at 96 px (the global override
    # model.img_size=96, so tasks, floors and data share the resolution): its agent (radius 15 of a
    # 512-unit workspace) is ~4 px across at 64 px and ~6 at 96, a larger target for the CNN's
    # 12x12 grid and for the inverse term (2000 steps at 96 px: 1487 CPU-s, k's at 64 px: 1145)
    "m": ["model.input_norm=global", "model.projector_norm=batchnorm", "objective.lambda_rollout=1.0",
          "model.backbone=cnn", "model.inverse_head=256", "objective.lambda_inverse=1.0"],
}
#: Planner energies an arm can be scored with (eval overrides; docs/evaluation.md "Planner energy").
COSTS = {
    "l1": [],
    "reach-public": ["eval.cost=reachability", "eval.reach_source=public"],
    "reach-pooled": ["eval.cost=reachability", "eval.reach_source=pooled"],
    "reach-public-min": ["eval.cost=reachability", "eval.reach_source=public", "eval.reach_aggregate=min"],
    "reach-pooled-min": ["eval.cost=reachability", "eval.reach_source=pooled", "eval.reach_aggregate=min"],
}
PCA_COMPONENTS = LadderSettings().pixel_pca_components  # the ladder's pixel baseline (64)
ROBUSTNESS_TASKS = 50
BRIGHTNESS = 4  # /255, added to every channel of both frames


def variant_overrides(v: str) -> list[str]:
    return list(VARIANTS[v])


def arm_key(v: str, seed: int) -> str:
    """The arm's folder under --out: the variant letter for seed 0 (as the first pilot stored it)."""
    return v if seed == 0 else f"{v}-s{seed}"


def variant_label(v: str, seed: int = 0) -> str:
    desc = ", ".join(o.split(".", 1)[1] for o in VARIANTS[v])
    return f"({arm_key(v, seed)}) {desc}"


def cpu_seconds() -> float:
    return time.process_time()


# ----------------------------------------------------------------------------------- training
def train_variant(v: str, seed: int, base: list[str], out: Path, steps: int) -> dict:
    """Train (or reuse) variant v at root seed ``seed`` (its own data collection, initial weights
    and batches); returns {checkpoint, hash, cpu_seconds, wall_seconds, ...}."""
    key = arm_key(v, seed)
    rec_path = out / key / "train.json"
    if rec_path.exists():
        return json.loads(rec_path.read_text())
    cfg = load_config([f"train.steps={steps}", "train.checkpoint_every=0", f"run_dir={out / key}",
                       "train.threads=1", f"root_seed={seed}", *base, *variant_overrides(v)])
    ensure_data(cfg, progress=False)  # collected before the clock starts (shared by every arm of this seed)
    c0, w0 = cpu_seconds(), time.perf_counter()
    res = train_local(cfg, source="pooled", run_dir=out / key / "central", progress=False)
    rec = {"variant": v, "seed": seed, "overrides": variant_overrides(v),
           "checkpoint": str(res.checkpoint_dir), "checkpoint_hash": res.checkpoint_hash,
           "config_hash": cfg.config_hash(), "steps": steps,
           "cpu_seconds": round(cpu_seconds() - c0, 1), "wall_seconds": round(time.perf_counter() - w0, 1),
           "final_metrics": res.final_metrics}
    rec_path.write_text(json.dumps(rec, indent=1))
    print(f"trained {variant_label(v, seed)}: {rec['cpu_seconds']} CPU-s, {rec['wall_seconds']} s wall, "
          f"pred {res.final_metrics.get('loss/pred'):.4f}", flush=True)
    return rec


# ---------------------------------------------------------------------------------- the tasks
def task_geometry(cfg, specs) -> list[dict]:
    """Per task: start and goal agent positions and whether the goal lies across the wall
    (stable-worldmodel's own ``check_other_room`` rule), posed under ``cfg``'s protocol
    (``eval.goal_source``) on a separate env, exactly as :func:`lensemble.eval.evaluate` poses it."""
    env = make_env(cfg.env.id, cfg.model.img_size)
    protocol = GoalProtocol.from_config(cfg)
    rows = []
    try:
        for spec in specs:
            task = pose_task(env, spec, protocol, cfg.eval.seed)
            rows.append({"index": spec.index, "start": env.agent_position().tolist(),
                         "goal": env.goal_state().tolist(), "cross_wall": bool(task.cross_wall)})
    finally:
        env.close()
    return rows


def native_pairs(cfg, specs, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(start, goal) at the env's native 224 px for the first n tasks (for the robustness test)."""
    env = make_env(cfg.env.id, cfg.model.img_size)
    pairs = []
    try:
        for spec in specs[:n]:
            pose_goal(env, spec, cfg.eval.goal_offset, cfg.eval.seed)
            start = np.asarray(env.env.render())
            goal = env.unwrapped._target_img.detach().cpu().numpy().transpose(1, 2, 0)
            pairs.append((np.ascontiguousarray(start), np.ascontiguousarray(goal)))
    finally:
        env.close()
    return pairs


def closed_loop(ckpt, cfg, episodes: int, policy: str, parallel: int = 8) -> dict:
    """Per-episode outcomes of ``policy`` ("mpc", "random" or "oracle") on the protocol's first
    ``episodes`` tasks, through :func:`lensemble.eval.evaluate` (the framework's own closed loop;
    random and oracle only read the checkpoint's action block)."""
    c0, w0 = cpu_seconds(), time.perf_counter()
    rep = evaluate(ckpt, cfg.env.id, cfg=cfg, episodes=episodes, policy=policy, ladder=False,
                   progress=False, parallel=parallel)
    eps = sorted(rep.episodes, key=lambda e: e.index)
    return {"success": [bool(e.success) for e in eps], "route_valid": [e.route_valid for e in eps],
            "final_distance": [e.final_distance for e in eps], "start_distance": [e.start_distance for e in eps],
            "goal_spec_hash": rep.goal_spec_hash, "time_per_action_ms": rep.time_per_action_ms,
            "planning_cost": rep.planning_cost,
            "cpu_seconds": round(cpu_seconds() - c0, 1), "wall_seconds": round(time.perf_counter() - w0, 1)}


# ------------------------------------------------------------------------------ measurements
def pixel_pca_probe(cfg) -> dict:
    """The ladder's pixel baseline (lensemble.eval.ladder.pixel_pca_probe_r2) on this protocol's
    frames: the linear position probe on a PCA of raw pixels, same frames and ridge as the latent
    probe (train frames evenly subsampled to 4096, scored on the held-out episodes)."""
    eval_batch, train = load_split(cfg, "heldout", progress=False)
    settings = LadderSettings()
    obs_tr, st_tr = probe_train_frames(train, settings.max_probe_frames)
    dims = list(PROBE_DIMS[cfg.env.id])
    obs_te = eval_batch.obs.reshape(-1, *eval_batch.obs.shape[-3:])
    s_te = eval_batch.state.reshape(-1, eval_batch.state.shape[-1])[:, dims]
    r2, per_dim = pixel_pca_probe_r2(obs_tr, torch.from_numpy(st_tr[:, dims]), obs_te, torch.from_numpy(s_te),
                                     components=settings.pixel_pca_components, ridge=settings.probe_ridge)
    return {"probe_r2": r2, "per_dim": per_dim, "components": PCA_COMPONENTS,
            "train_frames": int(obs_tr.shape[0]), "test_frames": int(obs_te.shape[0])}


def ladder(ckpt, cfg) -> dict:
    ck = load_checkpoint(ckpt)
    model = world_model_from_state(ck.architecture, ck.tensors).eval()
    eval_batch, train = load_split(cfg, "heldout", progress=False)
    r = run_ladder(model, eval_batch, train, split="heldout", env=None, seed=derive(cfg.eval.seed, "ladder"))
    return {"one_step_error": r.one_step_error, "copy_last_error": r.copy_last_error,
            "train_one_step_error": r.train_one_step_error, "train_copy_last_error": r.train_copy_last_error,
            "rollout_composite": r.rollout_composite, "probe_r2": r.probe_r2,
            "probe_r2_per_dim": r.probe_r2_per_dim, "effective_dim": r.effective_dim, "latent_std": r.latent_std}


def robustness(ckpt, pairs, img_size: int) -> dict:
    """Latent shift under (i) bilinear (antialiased, the Encoder.forward path for native frames)
    instead of the training's area kernel, (ii) +BRIGHTNESS/255 on area-resized frames; each as
    ||Δz|| / ||z_start - z_goal|| per task (median and 90th percentile over tasks)."""
    ck = load_checkpoint(ckpt)
    enc = world_model_from_state(ck.architecture, ck.tensors).eval().encoder

    def chw(frames):
        return torch.from_numpy(np.ascontiguousarray(np.stack(frames))).permute(0, 3, 1, 2)

    starts = [resize_frame(s, img_size) for s, _ in pairs]
    goals = [resize_frame(g, img_size) for _, g in pairs]
    area_s, area_g = chw(starts), chw(goals)
    z_s, z_g = embed_frames(enc, area_s), embed_frames(enc, area_g)
    native = chw([s for s, _ in pairs]).float() / 255.0
    bilinear = F.interpolate(native, size=(img_size, img_size), mode="bilinear", antialias=True,
                             align_corners=False)
    z_bil = embed_frames(enc, bilinear)
    bright = (area_s.int() + BRIGHTNESS).clamp(0, 255).to(torch.uint8)
    z_bright = embed_frames(enc, bright)
    sg = (z_s - z_g).norm(dim=1).clamp_min(1e-12)
    pix = (bilinear - area_s.float() / 255.0).abs().mean().item() * 255.0
    out = {"tasks": len(pairs), "bilinear_mean_pixel_change_255": round(pix, 2)}
    for name, z in (("resize", z_bil), ("brightness", z_bright)):
        ratio = ((z - z_s).norm(dim=1) / sg).numpy()
        out[f"{name}_ratio_median"] = float(np.median(ratio))
        out[f"{name}_ratio_p90"] = float(np.quantile(ratio, 0.9))
    return out


WALL_BAND = (10.0, 30.0)  # start |x - wall| in px: close enough that 4 latent steps reach the wall
BLOCKED_OFF_DOOR = 40.0   # |y - door y| beyond this the wall is solid for any radius and speed
DOOR_ON = 6.0             # |y - door y| below this the way through is open
WALL_STEPS = 4            # latent steps of the push (20 env steps at action_block 5)


def closer_to_alternative(z_pred: torch.Tensor, z_true: torch.Tensor, z_alt: torch.Tensor) -> torch.Tensor:
    """(N,) bool: the predicted latent lies nearer the alternative outcome's latent than the true one's."""
    return (z_pred - z_alt).norm(dim=-1) < (z_pred - z_true).norm(dim=-1)


def wall_probe(ckpt, cfg, max_starts: int = 100) -> dict:
    """Does the model know the wall? From held-out frames near TwoRoom's wall, push straight at it
    for WALL_STEPS latent steps and compare the predicted final latent, in the model's own latent
    space, with the latents of two rendered outcomes from the same start and actions: the true one
    (the env's own dynamics, routes.TwoRoomDynamics) and the alternative a model that got the wall
    wrong would predict. "blocked" starts face solid wall: the truth stops at it, the alternative
    passes through it (free motion); "door" starts face the opening: the truth passes, the
    alternative stops as if the door were shut. Reported per kind: the share of starts whose
    prediction lies nearer the alternative (0 for a model that knows the wall), and the median
    distance to the truth relative to the distance between the two outcomes. Frames are rendered
    with each start's own episode factors (agent colour) through the adapter's render (area
    resize, as in training). Diagnostic only: the state is read here, never in training or cost."""
    ck = load_checkpoint(ckpt)
    model = world_model_from_state(ck.architecture, ck.tensors).eval()
    eval_batch, _ = load_split(cfg, "heldout", progress=False)
    n_ep, t1 = eval_batch.obs.shape[:2]
    obs = eval_batch.obs.reshape(n_ep * t1, *eval_batch.obs.shape[2:])
    st = eval_batch.state.reshape(n_ep * t1, -1)
    episode = np.arange(n_ep * t1) // t1
    chw = lambda o: torch.from_numpy(np.ascontiguousarray(np.stack(o))).permute(0, 3, 1, 2)  # noqa: E731
    env = make_env(cfg.env.id, cfg.model.img_size)
    out = {"steps": WALL_STEPS, "measure": "nearer the alternative outcome's latent than the true one's"}
    try:
        env.reset(seed=0)
        base = TwoRoomDynamics.from_envs([env])
        size = float(env.unwrapped.door_sizes[0])
        wall = base.center
        gap = np.abs(st[:, 0] - wall)
        near = (gap >= WALL_BAND[0]) & (gap <= WALL_BAND[1]) & (st[:, 4] == wall)  # the vertical wall's door
        off = np.abs(st[:, 1] - st[:, 5])
        block = model.cfg.action_block
        for name, sel in (("blocked", near & (off > BLOCKED_OFF_DOOR)), ("door", near & (off < DOOR_ON))):
            idx = np.flatnonzero(sel)
            if not len(idx):
                out[name] = {"n": 0}
                continue
            idx = idx[np.linspace(0, len(idx) - 1, min(max_starts, len(idx))).round().astype(int)]
            n = len(idx)
            toward = torch.from_numpy(np.where(st[idx, 0] < wall, 1.0, -1.0).astype(np.float32))
            acts = torch.zeros(n, WALL_STEPS, block, 2)
            acts[..., 0] = toward[:, None, None]
            acts = acts.reshape(n, WALL_STEPS, block * 2)
            start = torch.from_numpy(st[idx, :2])
            door_y = torch.from_numpy(st[idx, 5]).double()[:, None]
            dyn = base.take(torch.zeros(n, dtype=torch.long))
            dyn.door_lo, dyn.door_hi = door_y - size - DOOR_MARGIN, door_y + size + DOOR_MARGIN
            truth = dyn.rollout(start, acts, block)[:, -1]
            if name == "blocked":  # free motion straight through the wall, inside the borders
                lo, hi = base.border + dyn.radius, base.img - base.border - dyn.radius
                free_x = start[:, 0].double() + toward.double() * dyn.speed.double() * WALL_STEPS * block
                alt = torch.stack([torch.minimum(torch.maximum(free_x, lo), hi).float(), start[:, 1]], 1)
            else:  # the same push with the door shut
                shut = base.take(torch.zeros(n, dtype=torch.long))
                shut.door_lo = torch.full_like(dyn.door_lo, torch.inf)
                shut.door_hi = torch.full_like(dyn.door_hi, -torch.inf)
                alt = shut.rollout(start, acts, block)[:, -1]
            frames = {"truth": [], "alt": []}
            for k, i in enumerate(idx):
                env.reset(seed=0, factors=eval_batch.factors[episode[i]])
                for key, pos in (("truth", truth[k]), ("alt", alt[k])):
                    env.set_state(pos.numpy())
                    frames[key].append(env.render())
            with torch.inference_mode():
                z_true, z_alt = embed_frames(model.encoder, chw(frames["truth"])), embed_frames(model.encoder, chw(frames["alt"]))
                z_pred = model.predictor.rollout(embed_frames(model.encoder, chw(obs[idx]))[:, None], acts)[:, -1]
            rel = ((z_pred - z_true).norm(dim=-1) / (z_alt - z_true).norm(dim=-1).clamp_min(1e-12)).numpy()
            out[name] = {"n": n, "nearer_alternative": float(closer_to_alternative(z_pred, z_true, z_alt).float().mean()),
                         "median_error_to_truth_rel": float(np.median(rel)),
                         "true_moved_px": float((truth - start).norm(dim=1).mean()),
                         "alternative_moved_px": float((alt - start).norm(dim=1).mean())}
    finally:
        env.close()
    return out


# ------------------------------------------------------------------------------------- stats
def rate(successes: list[bool]) -> dict:
    k, n = int(sum(successes)), len(successes)
    ci = wilson_interval(k, n)
    return {"n": n, "successes": k, "rate": k / n, "wilson_95": [ci.low, ci.high]}


def mcnemar(a: list[bool], b: list[bool]) -> dict:
    """Exact McNemar: a two-sided binomial test on the discordant pairs (a only vs b only)."""
    r = mcnemar_exact(a, b)
    return {"a_only": r.a_only, "b_only": r.b_only, "p_two_sided": r.p_value}


# ------------------------------------------------------------------------------------ report
def fmt(x, f: str = ".3f") -> str:
    return "–" if x is None else format(x, f)


def report_stem(protocol: str) -> str:
    """``pilot`` for the strict protocol (as the first pilot wrote it), ``pilot-<protocol>`` else."""
    return "pilot" if protocol == "strict" else f"pilot-{protocol}"


def write_report(out: Path, result: dict) -> None:
    stem = report_stem(result["protocol"])
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    lines = [f"# Planning pilot ({result['protocol']} protocol, {result['steps']} training steps, "
             f"{result['episodes']} tasks, goal-spec {result['goal_spec_hash'][:12]})", "",
             f"Tasks whose goal lies across the wall: {result['cross_wall_tasks']} of {result['episodes']}. "
             f"Linear position probe on a {PCA_COMPONENTS}-component PCA of raw pixels: "
             f"R² {result['pixel_pca_probe']['probe_r2']:.3f}.", "",
             "| arm | success | Wilson 95 % | route-valid | cross-wall | probe R² | eff. dim | latent std "
             "| one-step / copy | on train episodes | resize shift | brightness shift | through solid wall | stops at door "
             "| ms / action | train CPU-s | eval CPU-s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, arm in result["arms"].items():
        r, lad, rob = arm["rate"], arm.get("ladder") or {}, arm.get("robustness") or {}
        wall = arm.get("wall") or {}
        leak, door = (wall.get(k, {}).get("nearer_alternative") for k in ("blocked", "door"))
        cw, rv = arm.get("cross_wall_rate"), arm["route_valid_rate"]
        lines.append(
            f"| {name} | {r['successes']}/{r['n']} = {r['rate']:.0%} | [{r['wilson_95'][0]:.0%}, {r['wilson_95'][1]:.0%}] "
            f"| {rv['successes']} | {'–' if not cw or not cw[1] else f'{cw[0]}/{cw[1]}'} | {fmt(lad.get('probe_r2'))} "
            f"| {fmt(lad.get('effective_dim'), '.1f')} | {fmt(lad.get('latent_std'))} "
            f"| {fmt(lad.get('one_step_error'))} / {fmt(lad.get('copy_last_error'))} "
            f"| {fmt(lad.get('train_one_step_error'))} / {fmt(lad.get('train_copy_last_error'))} "
            f"| {fmt(rob.get('resize_ratio_median'), '.2f')} | {fmt(rob.get('brightness_ratio_median'), '.2f')} "
            f"| {fmt(leak, '.0%')} | {fmt(door, '.0%')} "
            f"| {fmt(arm.get('time_per_action_ms'), '.1f')} | {arm.get('train_cpu_seconds', '–')} | {arm.get('eval_cpu_seconds', '–')} |")
    probed = {name: arm["ladder"]["probe_r2_per_dim"] for name, arm in result["arms"].items()
              if (arm.get("ladder") or {}).get("probe_r2_per_dim")}
    if probed:
        dims = list(next(iter(probed.values())))
        pca = result["pixel_pca_probe"].get("per_dim") or []
        lines += ["", "Linear probe R² per state dimension on held-out frames (what the latents carry of each; "
                  "the same probe on the pixel PCA for scale):", "",
                  "| arm | " + " | ".join(dims) + " |", "|---|" + "---|" * len(dims)]
        if len(pca) == len(dims):
            lines.append(f"| pixel PCA ({PCA_COMPONENTS} components) | " + " | ".join(fmt(x) for x in pca) + " |")
        for name, per in probed.items():
            lines.append(f"| {name} | " + " | ".join(fmt(per.get(d)) for d in dims) + " |")
    if result.get("pooled"):
        lines += ["", "Per variant over training seeds (each seed on the same tasks; the pooled interval treats "
                  "every seed x task as independent, so it is optimistic when seeds differ):", "",
                  "| variant | seeds | per-seed success | pooled | Wilson 95 % |", "|---|---|---|---|---|"]
        for row in result["pooled"]:
            pr = row["pooled"]
            lines.append(f"| {row['variant']} | {', '.join(map(str, row['seeds']))} | "
                         f"{', '.join(f'{x:.0%}' for x in row['per_seed_rate'])} | {pr['successes']}/{pr['n']} = "
                         f"{pr['rate']:.0%} | [{pr['wilson_95'][0]:.0%}, {pr['wilson_95'][1]:.0%}] |")
    lines += ["", "Through solid wall / shut door: held-out starts near the wall pushed straight at it for "
              f"{WALL_STEPS} latent steps; the share whose predicted final latent lies nearer the latent of the "
              "wrong outcome (rendered: passing through solid wall / stopping at an open door) than of the true one "
              "(the env's own dynamics). 0 % for a model that knows the wall (wall_probe)."]
    lines += ["", "One-step / copy on train episodes: the same teacher-forced errors on up to 40 of the silos' "
              "training episodes; well below 1 there but not on held-out episodes means the model fitted its "
              "training episodes without learning the dynamics."]
    lines += ["", "Shifts: median over tasks of ||Δz|| / ||z_start − z_goal||. Paired comparisons on the shared "
              "tasks (exact McNemar, two-sided; Holm over the variant pairs):", "",
              "| A vs B | A only | B only | p | p (Holm) |", "|---|---|---|---|---|"]
    for row in result["paired"]:
        holm_p = row.get("p_holm")
        lines.append(f"| {row['a']} vs {row['b']} | {row['a_only']} | {row['b_only']} | {row['p_two_sided']:.3g} "
                     f"| {'–' if holm_p is None else format(holm_p, '.3g')} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def untrained_checkpoint(folder: Path, variant: str, overrides: list[str]) -> Path:
    """``folder``, holding (written once) an untrained model of ``variant``'s architecture at init
    seed 123, with ``overrides`` applied (they carry the env's action dimension)."""
    if not (folder / "header.json").exists():
        model_cfg = load_config([*overrides, *VARIANTS[variant]]).model
        save_checkpoint(folder, build_world_model(model_cfg, init_seed=123).state_dict(),
                        kind="world_model", architecture=architecture(model_cfg))
    return folder


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds or any(x < 0 for x in seeds):
        raise SystemExit(f"--seeds needs at least one non-negative seed, got {text!r}")
    return seeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/planning-pilot")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--variants", default="a,d,b,c")
    ap.add_argument("--seeds", default="0", help="root seeds of the training replicates, e.g. 0,1,2")
    ap.add_argument("--protocol", default="strict", choices=("strict", "dataset_goal"),
                    help="evaluation protocol (configs/eval/<protocol>.yaml); training is unaffected")
    ap.add_argument("--oracle", action="store_true", help="also score the true-simulator oracle")
    ap.add_argument("--costs", default="l1",
                    help=f"planner energies to score every trained arm with, comma-separated, of {sorted(COSTS)}")
    ap.add_argument("--untrained-like", default=None, choices=sorted(VARIANTS), metavar="VARIANT",
                    help="also score an untrained model of this variant's architecture (init seed 123): the "
                    "floor for a variant whose encoder is not variant a's (k's CNN)")
    ap.add_argument("--stage", choices=("all", "train", "eval"), default="all")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    seeds = parse_seeds(args.seeds)
    costs = [c.strip() for c in args.costs.split(",") if c.strip()]
    if not costs or any(c not in COSTS for c in costs):
        raise SystemExit(f"--costs takes a comma-separated subset of {sorted(COSTS)}, got {args.costs!r}")
    torch.set_num_threads(1)

    if args.stage in ("all", "train"):
        for seed in seeds:
            for v in variants:
                train_variant(v, seed, args.overrides, out, args.steps)
    if args.stage == "train":
        return

    # The eval protocol, data and tasks are root seed 0's for every arm, so all arms share tasks.
    protocol = [] if args.protocol == "strict" else [f"eval={args.protocol}"]
    cfg = load_config([f"run_dir={out}", *args.overrides, *protocol])
    values, _ = eval_factor_values(cfg, cfg.env.id, "heldout")
    specs = episode_specs(cfg.eval.seed, args.episodes, values)
    cache = out / "cache"
    cache.mkdir(exist_ok=True)

    def cached(name: str, fn):
        path = cache / f"{name}.json"
        if path.exists():
            return json.loads(path.read_text())
        value = fn()
        path.write_text(json.dumps(value, indent=1, default=str))
        return value

    untrained_dir = untrained_checkpoint(out / "untrained", "a", args.overrides)  # the first pilot's

    # name -> (checkpoint, policy, cache key, config); the floors' keys are the first pilot's.
    runs = {"random actions": (untrained_dir, "random", "random-actions", cfg),
            "untrained model, CEM": (untrained_dir, "mpc", "untrained-model-CEM", cfg)}
    floors = ["random actions", "untrained model, CEM"]
    if args.untrained_like and args.untrained_like != "a":
        like = args.untrained_like
        like_dir = untrained_checkpoint(out / f"untrained-{like}", like, args.overrides)
        floors.append(f"untrained model ({like}), CEM")
        runs[floors[-1]] = (like_dir, "mpc", f"untrained-{like}-model-CEM", cfg)
    if args.oracle:  # the env's own dynamics (lensemble.eval.oracle_sim)
        runs["oracle (true dynamics), CEM"] = (untrained_dir, "oracle", "oracle-(true-dynamics)-CEM", cfg)
    cost_cfgs = {c: load_config([f"run_dir={out}", *args.overrides, *protocol, *COSTS[c]]) for c in costs}
    trained: dict[str, dict] = {}
    for seed in seeds:
        for v in variants:
            key = arm_key(v, seed)
            rec_path = out / key / "train.json"
            if rec_path.exists():
                trained[key] = json.loads(rec_path.read_text())
                for c in costs:  # l1 keeps the first pilot's name and cache key
                    suffix = ("", "") if c == "l1" else (f" + {c}", f"+{c}")
                    runs[variant_label(v, seed) + suffix[0]] = (trained[key]["checkpoint"], "mpc", key + suffix[1],
                                                                cost_cfgs[c])

    tag = f"{args.protocol}-{args.episodes}"
    first = cached(f"loop-random-actions-{tag}", lambda: closed_loop(untrained_dir, cfg, args.episodes, "random"))
    gsh = first["goal_spec_hash"]
    if args.protocol == "strict":  # the goal-spec hash the first pilot's tasks were posed under
        assert gsh == goal_spec_hash(cfg.env.id, cfg.eval.goal_offset, cfg.eval.budget, specs)
    tworoom = cfg.env.id == TWOROOM  # PushT has no wall (no cross-wall split, no route validity)
    geometry = cached(f"geometry-v2-{gsh[:12]}", lambda: task_geometry(cfg, specs)) if tworoom else \
        [{"index": s.index, "cross_wall": False} for s in specs]
    cross = [g["cross_wall"] for g in geometry]
    pca = cached("pixel-pca-probe", lambda: pixel_pca_probe(cfg))
    pairs = native_pairs(cfg, specs, ROBUSTNESS_TASKS) if tworoom else None

    arms: dict[str, dict] = {}
    for name, (ckpt, policy, key, arm_cfg) in runs.items():
        loop = cached(f"loop-{key}-{tag}", lambda c=ckpt, p=policy, k=arm_cfg: closed_loop(c, k, args.episodes, p))
        if loop["goal_spec_hash"] != gsh:
            raise SystemExit(f"{name}: scored on goal-spec {loop['goal_spec_hash'][:12]}, the pilot's is {gsh[:12]}")
        valid = [bool(s and (r is None or r)) for s, r in zip(loop["success"], loop["route_valid"], strict=True)]
        arm = {"rate": rate(loop["success"]), "success": loop["success"], "route_valid_rate": rate(valid),
               "eval_cpu_seconds": loop["cpu_seconds"], "eval_wall_seconds": loop["wall_seconds"],
               "time_per_action_ms": loop["time_per_action_ms"],
               "mean_final_distance": float(np.mean(loop["final_distance"])),
               "cross_wall_rate": [int(sum(s for s, c in zip(loop["success"], cross, strict=True) if c)), int(sum(cross))]}
        if loop.get("planning_cost"):
            arm["planning_cost"] = loop["planning_cost"]
        if policy == "mpc":  # an untrained floor's ladder too: what its latents carry before training
            # v2: with the training-episode one-step rung (lensemble.eval.ladder)
            arm["ladder"] = cached(f"ladder-v2-{key}", lambda c=ckpt: ladder(c, cfg))
        if policy == "mpc" and key in trained:
            if tworoom:
                arm["wall"] = cached(f"wall-v2-{key}", lambda c=ckpt: wall_probe(c, cfg))
            if pairs is not None:
                arm["robustness"] = cached(f"robustness-{key}-{ROBUSTNESS_TASKS}-{gsh[:12]}",
                                           lambda c=ckpt: robustness(c, pairs, cfg.model.img_size))
            arm["train_cpu_seconds"] = trained[key]["cpu_seconds"]
            arm["train_wall_seconds"] = trained[key]["wall_seconds"]
            arm["checkpoint_hash"] = trained[key]["checkpoint_hash"]
            arm["final_train_metrics"] = trained[key]["final_metrics"]
        arms[name] = arm
        print(f"{name:34s} {arm['rate']['successes']}/{arm['rate']['n']} "
              f"[{arm['rate']['wilson_95'][0]:.2f}, {arm['rate']['wilson_95'][1]:.2f}]  "
              f"route-valid {arm['route_valid_rate']['successes']}  eval {loop['cpu_seconds']} CPU-s", flush=True)

    pooled = pool_seeds(arms, variants, seeds, trained)
    paired = []
    names = [variant_label(v, seeds[0]) for v in variants if arm_key(v, seeds[0]) in trained]
    for a, b in itertools.combinations(names, 2):
        paired.append({"a": a, "b": b, **mcnemar(arms[a]["success"], arms[b]["success"])})
    if paired:
        adj = holm([p["p_two_sided"] for p in paired])
        for row, p in zip(paired, adj.adjusted, strict=True):
            row["p_holm"] = float(p)
    for a in [n for n in arms if n.startswith("(")]:  # every trained arm against the floors
        for floor in floors:
            paired.append({"a": a, "b": floor, **mcnemar(arms[a]["success"], arms[floor]["success"])})

    result = {"steps": args.steps, "episodes": args.episodes, "protocol": args.protocol, "goal_spec_hash": gsh,
              "eval_seed": cfg.eval.seed, "seeds": seeds, "overrides": args.overrides,
              "cross_wall_tasks": int(sum(cross)), "pixel_pca_probe": pca,
              "arms": arms, "pooled": pooled, "paired": paired, "tasks": geometry}
    write_report(out, result)
    print((out / f"{report_stem(args.protocol)}.md").read_text())


def pool_seeds(arms: dict, variants: list[str], seeds: list[int], trained: dict) -> list[dict]:
    """Per variant over its trained seeds: successes pooled over seeds x tasks (a Wilson interval
    that treats every (seed, task) as independent, so it is optimistic when seeds differ) and the
    per-seed rates, whose spread shows the seed-to-seed variation."""
    rows = []
    for v in variants:
        labels = [variant_label(v, s) for s in seeds if arm_key(v, s) in trained]
        if not labels:
            continue
        per_seed = [arms[n]["rate"]["rate"] for n in labels]
        flat = [x for n in labels for x in arms[n]["success"]]
        rows.append({"variant": v, "seeds": [s for s in seeds if arm_key(v, s) in trained], "per_seed_rate": per_seed,
                     "pooled": rate(flat), "per_seed_sd": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else None})
    return rows


if __name__ == "__main__":
    main()
