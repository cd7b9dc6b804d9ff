"""How finely a Reacher checkpoint's latents tell arm poses apart, beside how well it predicts (issue 35).

Planning reaches a Reacher goal only when the latent distance ranks poses within the success
tolerance (0.05 rad per joint) and the predictor is accurate at that scale. This separates the two:

* **pose resolution** — for ``--goals`` random goal poses, the arm is drawn at the goal and at poses
  a max-joint distance δ away (δ in ``--deltas`` rad, a random direction per pose, at rest, as goal
  images are drawn); the table gives the latent MSE (mean over latent dimensions, the ladder's unit)
  between each pose's latent and the goal's: median and 10-90 % range over goals;
* **the predictor's error in pose units** — ``--one-step`` (the checkpoint's held-out one-step
  error from its evaluation ladder, same unit) is placed on that curve: the δ whose median latent
  MSE equals it, i.e. how far apart two poses are whose latents differ as much as a one-step
  prediction misses by.

    .venv/bin/python examples/reacher_pose_resolution.py runs/reacher-pilot/i/central/checkpoints/step-002000 --one-step 0.076
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np
import torch

#: max-joint pose distances (rad) probed by default: half, one and two tolerances, then coarser
DELTAS = (0.025, 0.05, 0.1, 0.2, 0.5, 1.0)


def pose_resolution(encode: Callable[[np.ndarray], torch.Tensor], draw: Callable[[np.ndarray], np.ndarray],
                    goals: np.ndarray, deltas: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """Latent MSE between each goal pose and poses ``delta`` away: (len(goals), len(deltas)) float64.

    ``encode``: uint8 frames (N, H, W, 3) -> latents (N, d); ``draw``: a pose (2,) in rad -> frame
    (H, W, 3). A pose δ away is goal + δ·u with u a random direction scaled to max |u| = 1, so its
    largest joint error (the success rule's quantity) is exactly δ.
    """
    out = np.zeros((len(goals), len(deltas)))
    for i, goal in enumerate(goals):
        poses = [goal]
        for d in deltas:
            u = rng.normal(size=2)
            poses.append(goal + d * u / np.abs(u).max())
        z = encode(np.stack([draw(p) for p in poses])).double()
        out[i] = ((z[1:] - z[0]) ** 2).mean(dim=-1).numpy()
    return out


def pose_equivalent(mse: float, deltas: Sequence[float], median_mse: Sequence[float]) -> float | None:
    """The δ at which the median curve reaches ``mse`` (log-log interpolation between probed points);
    None when ``mse`` lies outside the probed range."""
    d, m = np.log(np.asarray(deltas, float)), np.log(np.maximum(np.asarray(median_mse, float), 1e-300))
    if not m[0] <= np.log(mse) <= m[-1]:
        return None
    order = np.argsort(m)  # the median curve is increasing on a usable encoder; sort to be safe
    return float(np.exp(np.interp(np.log(mse), m[order], d[order])))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--goals", type=int, default=30)
    ap.add_argument("--deltas", type=float, nargs="+", default=list(DELTAS))
    ap.add_argument("--one-step", type=float, default=None, help="the checkpoint's held-out one-step error")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from lensemble.artifacts.checkpoint import load_checkpoint
    from lensemble.envs.adapter import make_env
    from lensemble.eval.ladder import encode_frames
    from lensemble.model.world_model import world_model_from_state

    ck = load_checkpoint(args.checkpoint)
    model = world_model_from_state(ck.architecture, ck.tensors).eval()
    env = make_env("swm/ReacherDMControl-v0", model.cfg.img_size)
    rng = np.random.default_rng(args.seed)
    try:
        env.reset(args.seed)

        def draw(pose):
            env.set_state(np.array([pose[0], pose[1], 0.0, 0.0, 0.0, 0.0]))  # at rest, like a goal image
            return env.render()

        # shoulder anywhere, wrist inside its ±160° range with room for the largest δ
        goals = np.stack([rng.uniform(-np.pi, np.pi, args.goals), rng.uniform(-1.6, 1.6, args.goals)], axis=1)
        with torch.inference_mode():
            mse = pose_resolution(lambda f: encode_frames(model.encoder, f), draw, goals, args.deltas, rng)
    finally:
        env.close()
    med = np.median(mse, axis=0)
    lo, hi = np.percentile(mse, 10, axis=0), np.percentile(mse, 90, axis=0)
    print(f"checkpoint {args.checkpoint} ({ck.header['content_hash'][:12]}), {args.goals} goal poses")
    print("| δ (rad, max joint) | latent MSE to the goal, median | 10-90 % |")
    print("|---|---|---|")
    for d, m, a, b in zip(args.deltas, med, lo, hi, strict=True):
        print(f"| {d:g} | {m:.4f} | {a:.4f}-{b:.4f} |")
    if args.one_step is not None:
        eq = pose_equivalent(args.one_step, args.deltas, med)
        where = "outside the probed range" if eq is None else f"≈ {eq:.2f} rad"
        print(f"one-step error {args.one_step:g} = the latent distance of poses {where} apart")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
