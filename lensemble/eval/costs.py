"""The planner's energy for one checkpoint: L1 to the goal latent, or a fitted reachability head.

``eval.cost=reachability`` fits a :class:`~lensemble.model.reachability.ReachabilityHead` on the
checkpoint's frozen latents of logged trajectories (``eval.reach_source``: the public corpus or
the pooled silo train splits), once per evaluation, before any episode runs; the fit is
deterministic in ``eval.seed``, so two evaluations of one checkpoint plan with the same head.
The head sees frames only (images and their timing), never the simulator's state.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from lensemble.config.schema import EvalConfig, LensembleConfig
from lensemble.config.seeds import derive
from lensemble.data.collect import load_public_episodes, load_silo
from lensemble.data.store import ensure_data
from lensemble.eval.mpc import CostFn
from lensemble.model.encoder import embed_frames
from lensemble.model.reachability import fit_reachability, reachability_cost


def trajectory_latents(model, batches) -> list[torch.Tensor]:
    """Every frame of every episode of ``batches`` (EpisodeBatch, obs (E, T+1, H, W, 3) uint8)
    through the model's encoder: one (T+1, d) float32 tensor per episode, in time order."""
    out = []
    with torch.inference_mode():
        for b in batches:
            e, t1 = b.obs.shape[:2]
            frames = torch.from_numpy(np.ascontiguousarray(b.obs.reshape(e * t1, *b.obs.shape[2:]))).permute(0, 3, 1, 2)
            z = embed_frames(model.encoder, frames).float().reshape(e, t1, -1)
            out.extend(z[i].clone() for i in range(e))
    return out


def reach_batches(cfg: LensembleConfig, source: str, *, progress: bool = False) -> list:
    """The trajectories of ``source`` ("public" or "pooled") in ``cfg``'s collection."""
    folder, summary = ensure_data(cfg, progress=progress)
    if source == "public":
        return [load_public_episodes(folder, summary)]
    return [load_silo(folder, s["silo"], "train", summary) for s in summary["silos"]]


def planning_cost(model, cfg: LensembleConfig, eval_cfg: EvalConfig, *,
                  progress: bool = False) -> tuple[CostFn | None, dict]:
    """(cost_fn, description) for ``eval_cfg.cost``; ``cost_fn`` None means the planner's L1.

    The description is JSON-able: ``{"cost": "l1"}``, or for the reachability head its source,
    aggregate, episodes, max gap, final fit loss (latent steps²), the held-out rank correlation
    between predicted and true gaps, and the fit's wall seconds.
    """
    if eval_cfg.cost == "l1":
        return None, {"cost": "l1"}
    t0 = time.perf_counter()
    # The collection must match what the checkpoint sees: its resolution.
    data_cfg = cfg.model_copy(update={"model": model.cfg})
    latents = trajectory_latents(model, reach_batches(data_cfg, eval_cfg.reach_source, progress=progress))
    fit = fit_reachability(latents, action_block=model.cfg.action_block, max_gap=eval_cfg.reach_max_gap,
                           steps=eval_cfg.reach_steps, seed=derive(eval_cfg.seed, "eval", "reachability"))
    info = {"cost": "reachability", "source": eval_cfg.reach_source, "aggregate": eval_cfg.reach_aggregate,
            "episodes": fit.episodes, "max_gap": fit.max_gap, "final_loss": round(fit.final_loss, 4),
            "holdout_spearman": round(fit.holdout_spearman, 4), "fit_seconds": round(time.perf_counter() - t0, 1)}
    if progress:
        print(f"reachability head: {info}", file=sys.stderr, flush=True)
    return reachability_cost(fit.head, eval_cfg.reach_aggregate), info


__all__ = ["planning_cost", "trajectory_latents", "reach_batches"]
