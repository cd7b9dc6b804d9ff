"""Does the predictor use its history? One-step error by history length and by the state's speed.

A latent is one frame, so the velocity of what moves is visible to the predictor only through its
history (the last W latents). If its one-step error with W latents is no lower than with one, it
predicts as if the scene were at rest, and its error grows with the speed of the state; that is
the limit to remove before more data, width or steps (issue 35: Reacher's predictor misses goal
poses by about six times the success tolerance, docs/model.md).

On ``--episodes`` fresh episodes of the behaviour policy (the held-out episodes behind the
dataset-goal protocol's tasks 0, 1, …: ``goals.dataset_episode_seed``, a seed label no training
collection uses; default factor values), encoded at the model's action block:

* **by history** — the teacher-forced one-step MSE (the ladder's unit) of predicting z_{t+1} from
  the last k true latents, k = 1..W, over the SAME targets (t ≥ W − 1, so every k has its history),
  beside copying z_t;
* **by speed** — the same errors at k = W and k = 1 and copying, per tercile of the state's speed
  at t (the norm of the velocity entries ``--velocity`` of the env's state vector).

    .venv/bin/python examples/predictor_history.py runs/reacher-96/i/central/checkpoints/step-002000
"""

from __future__ import annotations

import argparse

import numpy as np
import torch


@torch.no_grad()
def errors_by_history(predictor, z: torch.Tensor, a: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Squared one-step errors per target for every history length.

    z: (E, L+1, d) latents; a: (E, L, A·b) action blocks. With W = ``predictor.history``, targets
    are z_{t+1} for t = W−1..L−1. Returns (err (W, E, L−W+1) float64: row k−1 uses the last k
    latents, copy (E, L−W+1): copying z_t), each the mean over latent dimensions.
    """
    w = int(predictor.history)
    n = a.shape[1]
    if n < w:
        raise ValueError(f"episodes of {n} latent steps are shorter than the history {w}")
    err = np.zeros((w, z.shape[0], n - w + 1))
    for j, t in enumerate(range(w - 1, n)):
        target = z[:, t + 1].double()
        for k in range(1, w + 1):
            past = a[:, t - k + 1 : t] if k > 1 else None
            pred = predictor.rollout(z[:, t - k + 1 : t + 1], a[:, t : t + 1], past_actions=past)[:, 0]
            err[k - 1, :, j] = ((pred.double() - target) ** 2).mean(dim=-1).numpy()
    copy = ((z[:, w - 1 : n] - z[:, w : n + 1]).double() ** 2).mean(dim=-1).numpy()
    return err, copy


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--env", default="swm/ReacherDMControl-v0")
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--steps", type=int, default=None, help="env steps per episode (default data.steps_per_episode)")
    ap.add_argument("--velocity", default="2,3", help="indices of the state's velocity entries (Reacher: 2,3)")
    ap.add_argument("--expert", default="scripted")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from lensemble.artifacts.checkpoint import load_checkpoint
    from lensemble.config.schema import DataConfig
    from lensemble.data.collect import collect_episode
    from lensemble.envs.adapter import make_env
    from lensemble.eval.goals import dataset_episode_seed
    from lensemble.eval.ladder import latent_sequences
    from lensemble.model.world_model import world_model_from_state

    ck = load_checkpoint(args.checkpoint)
    model = world_model_from_state(ck.architecture, ck.tensors).eval()
    data = DataConfig()
    steps = args.steps or data.steps_per_episode
    env = make_env(args.env, model.cfg.img_size)
    try:
        eps = [collect_episode(env, dataset_episode_seed(i), {}, steps, data.random_action_share, args.expert)
               for i in range(args.episodes)]
    finally:
        env.close()
    block = model.cfg.action_block
    obs = np.stack([e["obs"] for e in eps])
    z, a = latent_sequences(model.encoder, obs, np.stack([e["actions"] for e in eps]), block)
    err, copy = errors_by_history(model.predictor, z, a)
    w = err.shape[0]
    vel = [int(i) for i in args.velocity.split(",")]
    state = np.stack([e["state"] for e in eps])[:, : a.shape[1] * block + 1 : block]  # (E, L+1, S)
    speed = np.linalg.norm(state[:, w - 1 : a.shape[1], vel], axis=-1)  # at t, like the targets' inputs
    print(f"checkpoint {args.checkpoint} ({ck.header['content_hash'][:12]}), {args.env}, "
          f"{args.episodes} held-out episodes × {err.shape[2]} targets, history W = {w}")
    print("| history k | one-step MSE | / copy |")
    print("|---|---|---|")
    for k in range(w):
        print(f"| {k + 1} | {err[k].mean():.4f} | {err[k].mean() / copy.mean():.2f} |")
    print(f"| copy z_t | {copy.mean():.4f} | 1.00 |")
    edges = np.quantile(speed, [1 / 3, 2 / 3])
    bins = np.digitize(speed, edges)
    print(f"\n| speed tercile (|v| at t) | k = {w} | k = 1 | copy | k = {w} / copy |")
    print("|---|---|---|---|---|")
    for b, name in enumerate(["slow", "middle", "fast"]):
        m = bins == b
        lo, hi = speed[m].min(), speed[m].max()
        print(f"| {name} ({lo:.2f}-{hi:.2f}) | {err[-1][m].mean():.4f} | {err[0][m].mean():.4f} | "
              f"{copy[m].mean():.4f} | {err[-1][m].mean() / copy[m].mean():.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
